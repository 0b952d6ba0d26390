"""``GET /v1/models``: the models the caller's key may use, in the caller's protocol (an
Anthropic client sends ``anthropic-version``). Not recorded: nothing is sent for it but,
for a channel that accepts any model, its upstream's own list (kept a minute)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from prefixgate.engine.channel import anthropic_headers, anthropic_url, bearer
from prefixgate.errors import GatewayError
from prefixgate.pipeline.exchange import error_response
from prefixgate.protocol import anthropic as anthropic_proto
from prefixgate.protocol import openai as openai_proto

if TYPE_CHECKING:
    from prefixgate.config import ChannelConfig
    from prefixgate.gateway import Gateway
    from prefixgate.routing.channels import ChannelRouter
    from prefixgate.upstream import Upstream

log = logging.getLogger("prefixgate")


async def models(gw: Gateway, request: Request) -> Response:
    """The model names of the channels, and what the channels that serve any model list
    upstream, less those the key may not use."""
    anthropic = "anthropic-version" in request.headers
    try:
        principal = gw.auth.authenticate(request.headers)
    except GatewayError as err:
        proto = anthropic_proto if anthropic else openai_proto
        return error_response(err, proto.error_bytes)
    router = gw.router
    names = dict.fromkeys(router.models())
    for ch in gw.config.channels:
        if not ch.models:  # serves any model: what its upstream says it has
            listed = await gw.model_lists.of(ch, router, request.headers)
            names.update(dict.fromkeys(listed))
    allowed = [m for m in names if principal.allows(m)]
    if anthropic:
        return JSONResponse(anthropic_proto.model_list(allowed))
    return JSONResponse(openai_proto.model_list(allowed))


class ModelLists:
    """The model ids each channel that accepts any model lists upstream (``GET
    …/models``), kept for a minute (ten seconds after a failure, which lists none)."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self._kept: dict[str, tuple[float, list[str]]] = {}  # channel -> (until, ids)

    async def of(self, ch: ChannelConfig, router: ChannelRouter, incoming) -> list[str]:
        now = time.monotonic()
        cached = self._kept.get(ch.name)
        if cached is not None and cached[0] > now:
            return cached[1]
        ids: list[str] = []
        ttl = 10.0
        urls = [u for u in ch.urls() if router.healthy(u)] or list(ch.urls())
        if ch.kind == "openai":
            url, headers = urls[0] + "/models", bearer(ch)
        else:
            url = anthropic_url(urls[0]).removesuffix("/messages") + "/models"
            headers = anthropic_headers(ch, incoming)
        try:
            doc = await self.upstream.get_json(
                url, timeouts=ch.timeouts, extra_headers=headers, tls=ch.tls
            )
            data = doc.get("data") if isinstance(doc, dict) else None
            if isinstance(data, list):
                ids = [
                    m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)
                ]
                ttl = 60.0
        except GatewayError as err:
            log.info("channel %s: no model list from upstream (%s)", ch.name, err.message)
        self._kept[ch.name] = (now + ttl, ids)
        return ids


__all__ = ["ModelLists", "models"]
