"""The request pipeline, in one place.

``/v1/messages`` (Anthropic in):
    auth → read + decode + check → model allowed → record opened →
    for each target in failover order:
        [openai channel]    hygiene (billing header) → convert to Chat → send
        [anthropic channel] passthrough (model mapped) → send
        retryable failure before the first byte → next target
    → relay (stream state machine or one-shot conversion) → usage in Anthropic semantics
    → record closed and submitted

``/v1/chat/completions`` (OpenAI in): the same, with the body passed through (model mapped,
usage always requested upstream, hidden from a client that did not ask for it).

The protocol details live in ``protocol/`` and ``convert/``; the channel choice in
``routing/``; the relays in ``relay.py``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from prefixgate import relay
from prefixgate.auth import Authenticator, Principal
from prefixgate.config import ChannelConfig, Config
from prefixgate.convert.request import ConvertOptions, anthropic_to_openai, convert, plain
from prefixgate.errors import GatewayError, InvalidRequest, NotFound, RequestTooLarge, UpstreamError
from prefixgate.hygiene import strip_billing_header
from prefixgate.hygiene.billing import strip_billing_header_typed
from prefixgate.identify import client_of, session_of_chat, session_of_messages
from prefixgate.metrics import GatewayMetrics
from prefixgate.protocol import anthropic as anthropic_proto
from prefixgate.protocol import openai as openai_proto
from prefixgate.protocol.common import decode_body
from prefixgate.protocol.messages_body import MessagesBody, decode_messages_body
from prefixgate.ratelimit import make_limiter
from prefixgate.record import Record
from prefixgate.routing.channels import ChannelRouter, Target
from prefixgate.upstream import Upstream, UpstreamRejected, UpstreamResponse
from prefixgate.usage import Usage

log = logging.getLogger("prefixgate")
_encode = msgspec.json.encode
_decode = msgspec.json.decode


class _NullRecorder:
    def submit(self, record: Record) -> None:
        pass


class Gateway:
    def __init__(
        self,
        config: Config,
        *,
        upstream: Upstream | None = None,
        recorder=None,
        capture: Callable[..., None] | None = None,
        token_counter: Callable[[dict, ChannelConfig | None], int] | None = None,
    ) -> None:
        self.config = config
        self.auth = Authenticator(config)
        self.router = ChannelRouter(config.channels)
        self.upstream = upstream or Upstream()
        self.recorder = recorder or _NullRecorder()
        self.metrics = GatewayMetrics(recorder)
        self.capture = capture
        self.token_counter = token_counter or _estimate_tokens
        self.limiter = make_limiter(config.rate_limits_shared)
        self._admitted: dict[str, Principal] = {}  # request id -> rate-limited principal
        self._captures: dict[str, tuple] = {}  # request id -> pending capture arguments
        self._model_lists: dict[str, tuple[float, list[str]]] = {}  # channel -> (until, ids)
        self._background: set[asyncio.Task] = set()
        # Requests taken and not yet recorded: an answer's record is closed just after
        # its last byte went out (relay.Answer), so a client can be a moment ahead.
        self.open_records = 0

    # -- entry points ------------------------------------------------------------------
    async def messages(self, request: Request) -> Response:
        return await self._serve(
            request,
            "messages",
            decode_messages_body,
            _checked,
            session_of_messages,
            anthropic_proto.error_bytes,
            self._messages_route,
        )

    async def chat(self, request: Request) -> Response:
        return await self._serve(
            request,
            "chat",
            openai_proto.decode_chat_body,
            openai_proto.check_chat_request,
            session_of_chat,
            openai_proto.error_bytes,
            self._chat_route,
        )

    async def _serve(
        self, request: Request, endpoint: str, decode, check, session_of, shape, route
    ):
        """The steps both entry points share: auth, read, decode, check, record, model
        allowed, limits; then ``route`` plans and fails over. Errors in the caller's shape."""
        rec = self._open_record(request, endpoint)
        try:
            principal = self.auth.authenticate(request.headers)
            rec.key_name, rec.key_owner = principal.name, principal.owner
            raw = await self._read(request)
            body = decode(raw, self.config.limits)
            check(body, self.config.limits)
            rec.requested_model = body["model"]
            rec.stream = bool(body.get("stream"))
            rec.session_id, rec.session_kind = session_of(body, request.headers)
            self.auth.authorize_model(principal, body["model"])
            await self._admit(principal, rec)
            return await route(request, body, rec, principal, raw)
        except GatewayError as err:
            return self._fail(rec, err, shape)
        except asyncio.CancelledError:
            # The client left (the server cancels its request) before an answer: the
            # upstream request is closed on the way out; the record says so.
            if rec.done_at is None:
                rec.status, rec.error_type = 499, "client_disconnected"
                self.finish(rec)
            raise
        except Exception:
            log.exception("internal error on %s (request %s)", request.url.path, rec.request_id)
            return self._fail(rec, GatewayError("internal error"), shape)

    async def _messages_route(self, request, body, rec, principal, raw) -> Response:
        outs: dict[str, dict] = {}  # channel -> converted request, built once
        targets = await self._plan(
            body["model"],
            rec.session_id,
            kinds=("openai", "anthropic"),
            prompt=lambda ch: plain(self._chat_request(body, ch, outs)),
        )
        return await self._messages_failover(request, body, targets, rec, principal, outs, raw)

    async def _chat_route(self, request, body, rec, principal, raw) -> Response:
        targets = await self._plan(
            body["model"],
            rec.session_id,
            kinds=("openai",),
            prompt=lambda ch: openai_proto.materialize(body)[0],
        )
        return await self._chat_failover(body, targets, rec, principal, raw)

    async def count_tokens(self, request: Request) -> Response:
        try:
            principal = self.auth.authenticate(request.headers)
            body = decode_body(await self._read(request), self.config.limits)
            anthropic_proto.check_count_tokens_request(body, self.config.limits)
            self.auth.authorize_model(principal, body["model"])
            targets = self._targets(body["model"], None, kinds=("openai", "anthropic"))
            channel = targets[0].channel
            if channel.kind == "openai":
                body, _ = self._hygiene(body, channel)
            return JSONResponse({"input_tokens": self.token_counter(body, channel)})
        except GatewayError as err:
            return _error_response(err, anthropic_proto.error_bytes)
        except Exception:
            log.exception("internal error on /v1/messages/count_tokens")
            return _error_response(GatewayError("internal error"), anthropic_proto.error_bytes)

    async def models(self, request: Request) -> Response:
        try:
            principal = self.auth.authenticate(request.headers)
        except GatewayError as err:
            fmt = anthropic_proto if "anthropic-version" in request.headers else openai_proto
            return _error_response(err, fmt.error_bytes)
        names = dict.fromkeys(self.router.models())
        for ch in self.config.channels:
            if not ch.models:  # serves any model: what its upstream says it has
                names.update(dict.fromkeys(await self._upstream_models(ch, request.headers)))
        names = [m for m in names if principal.allows(m)]
        if "anthropic-version" in request.headers:
            data = [
                {"type": "model", "id": m, "display_name": m, "created_at": "1970-01-01T00:00:00Z"}
                for m in names
            ]
            return JSONResponse(
                {
                    "data": data,
                    "has_more": False,
                    "first_id": names[0] if names else None,
                    "last_id": names[-1] if names else None,
                }
            )
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": 0, "owned_by": "prefixgate"}
                    for m in names
                ],
            }
        )

    async def _upstream_models(self, ch: ChannelConfig, incoming) -> list[str]:
        """The model ids a channel that accepts any model lists upstream (``GET …/models``),
        kept for a minute (ten seconds after a failure, which lists none)."""
        now = time.monotonic()
        cached = self._model_lists.get(ch.name)
        if cached is not None and cached[0] > now:
            return cached[1]
        ids: list[str] = []
        ttl = 10.0
        urls = [u for u in ch.urls() if self.router.healthy(u)] or list(ch.urls())
        if ch.kind == "openai":
            url, headers = urls[0] + "/models", _bearer(ch)
        else:
            url = _anthropic_url(urls[0]).removesuffix("/messages") + "/models"
            headers = _anthropic_headers(ch, incoming)
        try:
            doc = await self.upstream.get_json(url, timeouts=ch.timeouts, extra_headers=headers)
            data = doc.get("data") if isinstance(doc, dict) else None
            if isinstance(data, list):
                ids = [
                    m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)
                ]
                ttl = 60.0
        except GatewayError as err:
            log.info("channel %s: no model list from upstream (%s)", ch.name, err.message)
        self._model_lists[ch.name] = (now + ttl, ids)
        return ids

    # -- failover loops ----------------------------------------------------------------
    async def _messages_failover(
        self,
        request: Request,
        body: dict,
        targets: list[Target],
        rec: Record,
        principal: Principal,
        outs: dict[str, dict] | None = None,
        raw: bytes | None = None,
    ) -> Response:
        last: GatewayError | None = None
        outs = {} if outs is None else outs
        for target in targets:
            ch = target.channel
            if ch.kind == "openai":
                out = self._chat_request(body, ch, outs)
                url = target.base_url + "/chat/completions"
                headers = _bearer(ch)
            else:
                out = {**body.whole(), "model": ch.upstream_model(body["model"])}
                url = _anthropic_url(target.base_url)
                headers = _anthropic_headers(ch, request.headers)
            rec.channel, rec.replica, rec.upstream_model = ch.name, target.base_url, out["model"]
            data = _encode(out)
            if self.capture is not None:
                self._capture_soon(rec, body, out, ch, principal, raw, data)
            self.router.acquire(target, rec.request_id)  # in flight until finish()
            try:
                resp, first = await self._open(target, url, out, headers, rec, data)
                if not rec.stream:
                    first = await relay.read_json(resp, first, ch.timeouts.idle)
            except UpstreamError as err:
                last = self._failed_attempt(target, rec, err)
                continue
            except BaseException:
                self.router.release(rec.request_id)
                raise
            if ch.kind == "anthropic":
                return relay.anthropic_passthrough(
                    self, resp, first, rec, body["model"], out["model"]
                )
            if rec.stream:
                return relay.messages_stream(self, resp, first, rec, body, ch)
            return relay.messages_once(self, first, rec, body, ch)
        raise last or NotFound(f"no channel serves model {body['model']!r}")

    async def _chat_failover(
        self,
        body: dict,
        targets: list[Target],
        rec: Record,
        principal: Principal,
        raw: bytes | None = None,
    ) -> Response:
        last: GatewayError | None = None
        want_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        for target in targets:
            ch = target.channel
            out = {**body, "model": ch.upstream_model(body["model"])}
            if rec.stream:
                out["stream_options"] = {
                    **(body.get("stream_options") or {}),
                    "include_usage": True,
                }
            rec.channel, rec.replica, rec.upstream_model = ch.name, target.base_url, out["model"]
            data = _encode(out)
            if self.capture is not None:
                self._capture_soon(rec, body, out, ch, principal, raw, data)
            self.router.acquire(target, rec.request_id)  # in flight until finish()
            try:
                resp, first = await self._open(
                    target, target.base_url + "/chat/completions", out, _bearer(ch), rec, data
                )
                if not rec.stream:
                    first = await relay.read_json(resp, first, ch.timeouts.idle)
            except UpstreamError as err:
                last = self._failed_attempt(target, rec, err)
                continue
            except BaseException:
                self.router.release(rec.request_id)
                raise
            if rec.stream:
                return relay.chat_stream(self, resp, first, rec, body["model"], want_usage)
            return relay.chat_once(self, first, rec, body["model"])
        raise last or NotFound(f"no channel serves model {body['model']!r}")

    async def _open(
        self, target: Target, url: str, out: dict, headers: dict, rec: Record, data: bytes
    ) -> tuple[UpstreamResponse, bytes]:
        """Send ``data`` (``out`` encoded), and wait for the first body bytes, so that an
        upstream that accepts the connection and then fails can still be failed over."""
        ch = target.channel
        try:
            resp = await self.upstream.open(url, data, timeouts=ch.timeouts, extra_headers=headers)
        except UpstreamRejected as err:
            if err.overflow is None or "max_tokens" not in out:
                raise
            # The prompt fits; only max_tokens pushed it over the window: clamp and resend.
            room = err.overflow.max_tokens_room
            if room < 1 or room >= out["max_tokens"]:
                raise
            out["max_tokens"] = room
            resp = await self.upstream.open(
                url, _encode(out), timeouts=ch.timeouts, extra_headers=headers
            )
        await _expect_content_type(resp, stream=bool(out.get("stream")))
        first = await relay.first_chunk(resp, ch.timeouts.first_byte)
        self.router.report_success(target)
        return resp, first

    def _failed_attempt(self, target: Target, rec: Record, err: UpstreamError) -> UpstreamError:
        self.router.release(rec.request_id)
        if not err.retryable:
            raise err
        log.warning("channel %s (%s) failed: %s", target.name, target.base_url, err.message)
        self.router.report_failure(target)
        rec.retries += 1
        return err

    # -- helpers -----------------------------------------------------------------------
    def _hygiene(self, body: dict, ch: ChannelConfig) -> tuple[dict, bool]:
        if ch.strip_billing_header:
            return strip_billing_header(body)
        return body, False

    def _chat_request(self, body: MessagesBody, ch: ChannelConfig, outs: dict[str, dict]) -> dict:
        """The OpenAI chat request a channel receives for an Anthropic request, converted
        once per channel (the ``prefix`` policy and the send share it); texts stay raw."""
        out = outs.get(ch.name)
        if out is None:
            typed = body.typed
            if ch.kind == "openai" and ch.strip_billing_header:
                typed, _ = strip_billing_header_typed(typed)
            out = outs[ch.name] = convert(
                typed,
                ConvertOptions(ch.upstream_model(body["model"]), ch.thinking, ch.history_thinking),
            )
        return out

    async def _plan(
        self, model: str, affinity: str | None, *, kinds: tuple[str, ...], prompt
    ) -> list[Target]:
        """The failover order of one request (channel by priority, replica by policy)."""
        targets = await self.router.plan(model, affinity, kinds=kinds, prompt=prompt)
        if not targets:
            raise NotFound(f"model {model!r} is not served here")
        return targets

    def _targets(self, model: str, affinity: str | None, *, kinds: tuple[str, ...]) -> list[Target]:
        targets = [t for t in self.router.candidates(model, affinity) if t.channel.kind in kinds]
        if not targets:
            raise NotFound(f"model {model!r} is not served here")
        return targets

    async def _read(self, request: Request) -> bytes:
        limit = self.config.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise RequestTooLarge(f"request body is {declared} bytes; the limit is {limit} bytes")
        parts: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestTooLarge(f"request body exceeds the limit of {limit} bytes")
            if chunk:  # (Starlette ends the stream with an empty one)
                parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)  # one piece: not copied

    def _open_record(self, request: Request, endpoint: str) -> Record:
        client, version = client_of(request.headers.get("user-agent"))
        self.open_records += 1
        return Record(
            request_id=os.urandom(16).hex(),  # 128 random bits, as a uuid4's
            received_at=time.time(),
            endpoint=endpoint,
            client=client,
            client_version=version,
        )

    def _fail(self, rec: Record, err: GatewayError, shape) -> Response:
        rec.status, rec.error_type = err.status, err.kind
        self.finish(rec)
        return _error_response(err, shape)

    async def _admit(self, principal: Principal, rec: Record) -> None:
        """Per-key rate and concurrency limits (429 with Retry-After when over)."""
        if principal.limits.any:
            await self.limiter.admit(principal.name, principal.limits)
            self._admitted[rec.request_id] = principal

    def _limits_done(self, rec: Record) -> None:
        principal = self._admitted.pop(rec.request_id, None)
        if principal is None:
            return
        tokens = (rec.prompt_tokens or 0) + (rec.completion_tokens or 0)
        task = asyncio.get_running_loop().create_task(
            self.limiter.done(principal.name, principal.limits, tokens)
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _capture_soon(self, rec: Record, *args) -> None:
        """Segment capture hashes the whole prompt (about 1 ms for Claude Code's 50 KB
        request): it runs on the event loop's next turn, when the request is on its way
        upstream and the gateway waits for the first byte, not before sending it.
        ``finish`` runs it first if it is still pending; a retry replaces it."""
        pending = rec.request_id in self._captures
        self._captures[rec.request_id] = (rec, *args)
        if not pending:
            asyncio.get_running_loop().call_soon(self._capture_now, rec.request_id)

    def _capture_now(self, request_id: str) -> None:
        args = self._captures.pop(request_id, None)
        if args is None or self.capture is None:
            return
        try:
            self.capture(*args)
        except Exception:  # the capture must never break the request path
            log.exception("segment capture failed (request %s)", request_id)

    def finish(self, rec: Record, usage: Usage | None = None) -> None:
        if rec.done_at is not None:
            return
        self.open_records -= 1
        if self._captures:
            self._capture_now(rec.request_id)
        self.router.release(rec.request_id)
        rec.done_at = time.time()
        rec.latency_ms = (rec.done_at - rec.received_at) * 1000.0
        if rec.first_byte_at is not None:
            rec.ttft_ms = (rec.first_byte_at - rec.received_at) * 1000.0
        if usage is not None:
            rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens = (
                usage.prompt_tokens,
                usage.cached_tokens,
                usage.completion_tokens,
            )
        try:
            self._limits_done(rec)
            self.metrics.observe(rec)
            self.recorder.submit(rec)
        except Exception:  # the record must never break the request path
            log.exception("recorder refused a record")


async def _expect_content_type(resp: UpstreamResponse, *, stream: bool) -> None:
    """A stream must come as SSE and a one-shot answer as JSON; anything else (an HTML
    error page from a proxy, say) is a retryable failure before the first byte."""
    ctype = (resp.headers.get("content-type") or "").lower()
    want = "text/event-stream" if stream else "json"
    if want not in ctype:
        await resp.aclose()
        raise UpstreamError(f"upstream answered with content type {ctype or 'none'!r}, not {want}")


def _error_response(err: GatewayError, shape) -> Response:
    headers = {}
    retry_after = getattr(err, "retry_after", None)
    if retry_after is not None:
        headers["retry-after"] = str(int(retry_after))
    return Response(
        shape(err), status_code=err.status, media_type="application/json", headers=headers
    )


def _bearer(ch: ChannelConfig) -> dict:
    key = ch.api_key()
    return {"authorization": f"Bearer {key}"} if key else {}


def _anthropic_url(base: str) -> str:
    return base + ("/messages" if base.endswith("/v1") else "/v1/messages")


_PASS_HEADERS = ("anthropic-version", "anthropic-beta")


def _anthropic_headers(ch: ChannelConfig, incoming) -> dict:
    headers = {h: incoming[h] for h in _PASS_HEADERS if h in incoming}
    headers.setdefault("anthropic-version", "2023-06-01")
    key = ch.api_key()
    if key:
        headers["x-api-key"] = key
    return headers


def _checked(body: MessagesBody, limits) -> None:
    """A Messages request is checked as it is decoded (``decode_messages_body``)."""


def _estimate_tokens(body: dict, channel: ChannelConfig | None) -> int:
    """The prompt's tokens as the cache model renders it for the channel (the approximate
    tokenizer: about 4 characters a token)."""
    from prefixgate.cache import ApproxTokenizer, ChatRenderer

    order = channel.render_order if channel is not None else "tools_first"
    upstream = anthropic_to_openai({"max_tokens": 1, **body}, ConvertOptions(upstream_model=""))
    text = ChatRenderer(order=order).render(upstream["messages"], upstream.get("tools"))
    return max(1, ApproxTokenizer().count(text))


__all__ = ["Gateway", "InvalidRequest"]
