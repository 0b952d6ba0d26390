"""``POST /v1/messages/count_tokens`` as a pipeline of its own: the same authentication,
limits, admission and budgets as inference, and a record, but no upstream: the answer is
the prompt's tokens as the first channel that would serve it renders it, after that
channel's hygiene steps.

A large body is decoded and counted in a worker thread, so that a 30 MB prompt does not
hold the event loop (and every open stream with it) while it is read.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from starlette.responses import JSONResponse, Response

from prefixgate import hygiene as hygiene_steps
from prefixgate.errors import NotFound
from prefixgate.identify import session_of_messages
from prefixgate.pipeline.exchange import Exchange
from prefixgate.protocol import anthropic as anthropic_proto
from prefixgate.protocol.common import decode_body

if TYPE_CHECKING:
    from prefixgate.config import ChannelConfig
    from prefixgate.engine.order import RenderOrders

OFF_LOOP_BYTES = 256 * 1024  # bodies from this size are decoded and counted in a thread


def _decode(raw: bytes, limits) -> dict:
    body = decode_body(raw, limits)
    anthropic_proto.check_count_tokens_request(body, limits)
    return body


async def decode_count_tokens(x: Exchange) -> None:
    """A count_tokens request: a Messages request without ``max_tokens``."""
    limits = x.gateway.config.limits
    if len(x.raw) >= OFF_LOOP_BYTES:
        body = await asyncio.to_thread(_decode, x.raw, limits)
    else:
        body = _decode(x.raw, limits)
    body["max_tokens"] = 1  # nothing is generated: the budgets hold one output token
    x.body = body
    rec = x.record
    rec.requested_model = body["model"]
    rec.session_id, rec.session_kind = session_of_messages(body, x.request.headers)


async def count_tokens(x: Exchange) -> Response:
    """The count, answered; the record says which channel's rendering it is."""
    gw, body = x.gateway, x.body
    targets = [
        t
        for t in gw.router.candidates(body["model"], None)
        if t.channel.kind in ("openai", "anthropic")
    ]
    if not targets:
        raise NotFound(f"model {body['model']!r} is not served here")
    channel = targets[0].channel

    def count() -> int:
        plain = {k: v for k, v in body.items() if k != "max_tokens"}
        return gw.token_counter(
            hygiene_steps.apply_plain(plain, channel, gw.render_orders), channel
        )

    n = await asyncio.to_thread(count) if len(x.raw) >= OFF_LOOP_BYTES else count()
    rec = x.record
    rec.channel, rec.status = channel.name, 200
    x.finish()
    return JSONResponse({"input_tokens": n}, headers=x.id_headers())


def estimate_tokens(body: dict, channel: ChannelConfig | None, *, orders: RenderOrders) -> int:
    """The prompt's tokens as the cache model renders it for the channel (the approximate
    tokenizer: about 4 characters a token): the gateway's token counter unless it is
    given another; ``orders``: the gateway's, the template's order for the channel."""
    from prefixgate.apis.messages.request import ConvertOptions, anthropic_to_openai
    from prefixgate.cache import ApproxTokenizer, ChatRenderer

    order = orders.render_order(channel) if channel is not None else "tools_first"
    upstream = anthropic_to_openai({"max_tokens": 1, **body}, ConvertOptions(upstream_model=""))
    text = ChatRenderer(order=order).render(upstream["messages"], upstream.get("tools"))
    return max(1, ApproxTokenizer().count(text))
