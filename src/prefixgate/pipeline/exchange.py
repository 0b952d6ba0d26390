"""The exchange: one request's state on its way through the gateway, and the one place
that finishes its record.

An :class:`Exchange` is made when a request arrives (its record opens then) and is handed
to every step of its endpoint's pipeline; the steps fill it in (who is calling, the decoded
body, the failover order, the request sent upstream, the open upstream response), and the
relay answers from it. :meth:`Exchange.finish` closes the record exactly once, whatever
ended the request: an answer sent in full, an error answered, or the client going away
(then the record says ``499 client_disconnected``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.requests import ClientDisconnect
from starlette.responses import Response

from prefixgate.errors import GatewayError
from prefixgate.identify import client_of
from prefixgate.pipeline.finish import FINISH_STEPS, close
from prefixgate.record import Record
from prefixgate.record.reason import failed
from prefixgate.record.record import new_request_id

SETTLE_WAIT = 3.0  # seconds an answer that asked waits for its miss ledger at its end

if TYPE_CHECKING:
    from starlette.requests import Request

    from prefixgate.admission import Gate
    from prefixgate.auth import Principal
    from prefixgate.config import ChannelConfig
    from prefixgate.diagnostics.request import Asked
    from prefixgate.diagnostics.verdict import Verdict
    from prefixgate.gateway import Gateway
    from prefixgate.routing.channels import Target
    from prefixgate.spend.keeper import Hold
    from prefixgate.upstream import UpstreamResponse
    from prefixgate.usage import Usage


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What differs between the entry points: the protocol the client speaks (its error
    shape and request-id header), the channel kinds that can serve it, the prompt a
    channel would receive (for the ``prefix`` routing policy), and the ordered steps."""

    name: str  # the record's endpoint: "messages" | "chat" | "responses"
    error_bytes: Callable[[GatewayError], bytes]
    request_id_header: str
    kinds: tuple[str, ...]
    prompt: Callable[[Exchange, ChannelConfig], dict]
    steps: tuple
    overloaded_status: int = 503  # the status of the protocol's "overloaded" answer


class Exchange:
    """One request's state. Steps read and write its attributes; see the module doc."""

    __slots__ = (
        "gateway",
        "live",
        "request",
        "endpoint",
        "record",
        "principal",
        "admitted",
        "raw",
        "body",
        "targets",
        "target",
        "hygienic",
        "prepared",
        "out",
        "url",
        "headers",
        "data",
        "upstream",
        "first",
        "gate",
        "channel_gate",
        "hold",
        "reply_headers",
        "ask",
        "params",
        "prev",
        "verdict",
        "ledger",
    )

    def __init__(self, gateway: Gateway, request: Request, endpoint: Endpoint) -> None:
        self.gateway = gateway
        # The config and its services this request runs on to its end (live.py), even
        # if a reload swaps them meanwhile.
        self.live = live = gateway.live
        live.inflight += 1
        self.request = request
        self.endpoint = endpoint
        client, version = client_of(request.headers.get("user-agent"))
        self.record = Record(
            request_id=new_request_id(),  # time-ordered, 74 random bits
            received_at=time.time(),
            endpoint=endpoint.name,
            client=client,
            client_version=version,
        )
        gateway.open_records += 1
        self.principal: Principal | None = None
        self.admitted = False  # holds a rate-limit slot, given back by finish()
        self.raw = b""  # the body as received
        self.body: Any = None  # decoded: a MessagesBody, a ResponsesBody or a chat dict
        self.targets: list[Target] = []  # the failover order
        self.target: Target | None = None  # the one being tried
        self.hygienic: dict[str, Any] = {}  # channel -> the typed request after hygiene
        self.prepared: dict[str, dict] = {}  # channel -> its upstream request, made once
        self.out: dict | None = None  # the upstream request for ``target``
        self.url = ""
        self.headers: dict[str, str] = {}
        self.data = b""  # ``out`` encoded
        self.upstream: UpstreamResponse | None = None  # open once ``send`` succeeded
        self.first: Any = None  # the first body chunk (a stream) or the JSON object
        self.gate: Gate | None = None  # the worker's admission slot, given back by finish()
        self.channel_gate: Gate | None = None  # the target channel's, when it has a cap
        self.hold: Hold | None = None  # what the request holds of its budgets until finish()
        self.reply_headers: dict[str, str] | None = None  # on every answer (the budget's)
        # diagnostics (pipeline/diagnose.py): what the client asked, its parameters'
        # digests, the earlier request found, and the comparison's verdict
        self.ask: Asked | None = None
        self.params: dict[str, str] = {}
        self.prev: tuple | None = None
        self.verdict: Verdict | None = None
        # its miss ledger, computed before the answer's end when the client asked
        # (:meth:`settle`): resolved with the Ledger, or None when there is none
        self.ledger: asyncio.Future | None = None

    @property
    def channel(self) -> ChannelConfig:
        assert self.target is not None
        return self.target.channel

    # -- answers ---------------------------------------------------------------------------
    def id_headers(self) -> dict[str, str]:
        """The header that names this request's record, and what is left of its budgets,
        on every answer."""
        h = {self.endpoint.request_id_header: self.record.request_id}
        if self.reply_headers:
            h.update(self.reply_headers)
        return h

    def fail(self, err: GatewayError) -> Response:
        """Answer ``err`` in the client's protocol and finish the record with it."""
        failed(self.record, err)
        self.finish()
        return error_response(err, self.endpoint.error_bytes, self.id_headers())

    def finish(self, usage: Usage | None = None) -> None:
        """Close the record, once: :func:`~.finish.close`, then the steps of
        :data:`~.finish.FINISH_STEPS` in order (the way out; a failing one is logged and
        the rest skipped), then the configuration generation let go."""
        rec = self.record
        if rec.done_at is not None:
            return
        close(self, usage)
        try:
            for step in FINISH_STEPS:
                step(self, rec)
        except Exception:  # the record must never break the request path
            self.gateway.log.exception("recorder refused a record")
        self.gateway.done_with(self.live)

    async def settle(self, usage: Usage, wait: float | None = None) -> None:
        """For a request that asked why its cache missed: its miss ledger computed now,
        once the engine's usage is known and before the answer's last bytes go out, so
        that the answer's end can carry it. The request goes to the ledger worker's queue
        as its finish would send it (one computation, in the order of the requests: the
        one the answer shows is the one stored); the answer waits for it at most ``wait``
        seconds (:data:`SETTLE_WAIT`; then the answer goes without it and the ledger is
        still computed and kept)."""
        if self.verdict is None or self.ledger is not None or usage.prompt_tokens is None:
            return
        rec, gw = self.record, self.gateway
        rec.prompt_tokens, rec.cached_tokens = usage.prompt_tokens, usage.cached_tokens
        fut = asyncio.get_running_loop().create_future()

        def done(ledger) -> None:
            if not fut.done():
                fut.set_result(ledger)

        blocks = self.target.blocks if self.target is not None else None
        try:
            gw.ledger.feed(rec, self.out, done, blocks=blocks)
        except Exception:  # the ledger must never break the request path
            gw.log.exception("ledger worker refused a request")
            return
        self.ledger = fut
        if not fut.done():
            await asyncio.wait((fut,), timeout=SETTLE_WAIT if wait is None else wait)

    def release_channel(self) -> None:
        """Give back the channel's admission slot (the request is done with the target)."""
        gate, self.channel_gate = self.channel_gate, None
        if gate is not None:
            gate.give()

    async def close(self, usage: Usage | None = None) -> None:
        """Close the upstream response (cancelling the request upstream if unfinished)
        and finish the record."""
        if self.upstream is not None:
            await self.upstream.aclose()
        self.finish(usage)


def error_response(
    err: GatewayError, error_bytes: Callable[[GatewayError], bytes], headers: dict | None = None
) -> Response:
    """An error answer: the protocol's body, its status, ``retry-after`` when known."""
    headers = dict(headers or ())
    retry_after = getattr(err, "retry_after", None)
    if retry_after is not None:
        headers["retry-after"] = str(int(retry_after))
    return Response(
        error_bytes(err), status_code=err.status, media_type="application/json", headers=headers
    )


def handler(gateway: Gateway, endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
    """The route handler of an endpoint: an exchange per request, run through its steps."""

    async def handle(request: Request) -> Response:
        return await run(Exchange(gateway, request, endpoint))

    handle.__name__ = handle.__qualname__ = endpoint.name
    return handle


async def run(x: Exchange) -> Response:
    """Run the endpoint's steps in order until one answers. Errors are answered in the
    client's protocol; a client that leaves before the answer leaves a 499 record."""
    try:
        for step in x.endpoint.steps:
            answer = await step(x)
            if answer is not None:
                return answer
        raise GatewayError("the request's steps ended without an answer")
    except GatewayError as err:
        return x.fail(err)
    except ClientDisconnect:
        # The client left while its body was arriving (or the server timed the body out):
        # nobody to answer; the record says 499.
        x.finish()
        return Response(status_code=499)
    except asyncio.CancelledError:
        # The server cancels a request whose client left: the upstream request is closed
        # on the way out (the failing step's own cleanup); the record says so.
        x.finish()
        raise
    except Exception:
        x.gateway.log.exception(
            "internal error on %s (request %s)", x.request.url.path, x.record.request_id
        )
        return x.fail(GatewayError("internal error"))
