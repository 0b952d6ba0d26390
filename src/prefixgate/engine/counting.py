"""How many tokens a prompt an engine refused had, when its message gave only a bound:
counted by the engine's own tokenizer (vLLM's ``/tokenize``), else estimated the way the
cache model counts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from prefixgate.errors import PromptTooLong
from prefixgate.upstream.client import read_all

if TYPE_CHECKING:
    from prefixgate.engine.client import EngineClient


def tokenize_url(base_url: str) -> str:
    """vLLM serves ``/tokenize`` at the server's root, beside ``/v1``."""
    return base_url.removesuffix("/v1") + "/tokenize"


def estimate_prompt_tokens(request: bytes) -> int | None:
    """The prompt tokens of an OpenAI chat request, estimated the way the cache model
    counts without the upstream's tokenizer (its chat rendering, about four characters a
    token); None for a body of another shape."""
    from prefixgate.cache import ApproxTokenizer, ChatRenderer

    try:
        body = msgspec.json.decode(request)
        messages, tools = body["messages"], body.get("tools")
        return ApproxTokenizer().count(ChatRenderer().render(messages, tools))
    except (msgspec.DecodeError, KeyError, TypeError, AttributeError, ValueError):
        return None


async def counted(
    transport: EngineClient,
    err: PromptTooLong,
    url: str,
    request: bytes,
    options: dict[str, Any],
) -> PromptTooLong:
    """The refused prompt counted by the upstream's own tokenizer (vLLM's ``/tokenize``
    with the request's messages and tools, asked through ``transport`` with the refused
    request's ``options``: its timeouts, headers and TLS) when the upstream's message gave
    only a bound; ``err`` (the gateway's estimate) when that cannot be had."""
    if not url.endswith("/chat/completions") or err.estimated_from is None:
        return err
    timeouts = options["timeouts"]
    try:
        sent = msgspec.json.decode(request)
        ask = {k: sent[k] for k in ("model", "messages", "tools") if sent.get(k)}
        resp = await transport.open(
            tokenize_url(url.removesuffix("/chat/completions")),
            msgspec.json.encode(ask),
            timeouts=timeouts,
            extra_headers=options.get("extra_headers"),
            tls=options.get("tls"),
        )
        count = msgspec.json.decode(await read_all(resp, timeouts.idle))["count"]
    except Exception:  # noqa: BLE001 - no /tokenize, or another shape: the estimate
        return err
    if not isinstance(count, int) or count <= err.estimated_from:
        return err
    return PromptTooLong(
        count,
        err.max_tokens,
        raw=err.raw,
        estimated_from=err.estimated_from,
        counted_by="counted by the upstream tokenizer (/tokenize)",
    )
