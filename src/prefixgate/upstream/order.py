"""Where an upstream's chat template puts the tools: learned from the upstream, not
assumed.

A channel's ``render_order`` is ``tools_first``, ``system_first`` or ``auto`` (the
default). For ``auto`` the gateway asks the upstream's ``POST /tokenize`` (vLLM, and the
simulated upstream) for three small chat prompts: a base one (a system message, a user
message, one tool), the same with the system text changed, and the same with the tool's
description changed. The change that makes the token lists differ first sits first in the
upstream's prompt. The learned order places the segments (so their token offsets), the
prefix router's blocks and the prompt estimates; until it is learned, or when the
upstream has no ``/tokenize``, ``tools_first`` is used and said so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import msgspec

log = logging.getLogger("prefixgate")

FALLBACK = "tools_first"
RETRY_S = 30.0  # after a failed attempt (doubling up to REFRESH_S)
REFRESH_S = 600.0  # after a learned one (the upstream may have been restarted with another model)


@dataclass(frozen=True, slots=True)
class Learned:
    order: str  # tools_first | system_first
    source: str  # how it is known: "configured", "tokenize", "assumed (...)"


_learned: dict[tuple[str, str], Learned] = {}  # (channel name, base_url) -> what was learned
_told: set[tuple[str, str]] = set()  # channels whose failure was logged (once, not every retry)


def render_order(channel) -> str:
    """The order the channel's upstream renders tools and system in."""
    return order_of(channel).order


def order_of(channel) -> Learned:
    """The channel's render order and how it is known."""
    if channel.render_order != "auto":
        return Learned(channel.render_order, "configured")
    got = _learned.get((channel.name, channel.base_url))
    if got is not None:
        return got
    return Learned(FALLBACK, "assumed (not learned from the upstream yet)")


def first_difference(a: list, b: list) -> int | None:
    """The first index where two token lists differ (None: identical)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def order_from_tokens(base: list, system_changed: list, tools_changed: list) -> str | None:
    """The order the three prompts' tokens show, or None when they do not tell (a template
    that renders no tools, or changes that start at the same token)."""
    s = first_difference(base, system_changed)
    t = first_difference(base, tools_changed)
    if s is None or t is None or s == t:
        return None
    return "system_first" if s < t else "tools_first"


def _tokenize_body(model: str | None, system: str, tool_doc: str) -> bytes:
    body = {
        "messages": [
            {"role": "system", "content": f"{system} You are a careful assistant."},
            {"role": "user", "content": "List the files."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "list_files",
                    "description": f"{tool_doc} the files of a directory.",
                    "parameters": {"type": "object", "properties": {}},
                },
            }
        ],
        "add_generation_prompt": True,
    }
    if model is not None:
        body["model"] = model
    return msgspec.json.encode(body)


def tokenize_url(base_url: str) -> str:
    """vLLM serves ``/tokenize`` at the server's root, beside ``/v1``."""
    return base_url.removesuffix("/v1") + "/tokenize"


async def learn(channel, transport) -> Learned | None:
    """Ask the channel's upstream (``openai`` channels with ``render_order: auto``) where
    it puts the tools; remember and return the answer (None: the upstream did not tell)."""
    from prefixgate.upstream.channel import post_for_json

    model = channel.upstream_model(channel.models[0]) if channel.models else None
    url = tokenize_url(channel.urls()[0])
    lists = []
    try:
        for system, tool_doc in (("Alpha.", "Lists"), ("Omega.", "Lists"), ("Alpha.", "Shows")):
            doc = await post_for_json(
                transport, channel, url, _tokenize_body(model, system, tool_doc)
            )
            lists.append(doc["tokens"])
    except Exception as exc:  # noqa: BLE001 - an upstream without /tokenize tells nothing
        _not_learned(channel, f"render order not learned ({exc}); assuming {FALLBACK}")
        return None
    order = order_from_tokens(*lists)
    if order is None:
        _not_learned(channel, f"/tokenize does not show where the tools go; assuming {FALLBACK}")
        return None
    got = _learned[(channel.name, channel.base_url)] = Learned(order, "tokenize")
    log.info("channel %s: the upstream renders %s (learned from /tokenize)", channel.name, order)
    return got


def _not_learned(channel, why: str) -> None:
    key = (channel.name, channel.base_url)
    log.log(logging.DEBUG if key in _told else logging.INFO, "channel %s: %s", channel.name, why)
    _told.add(key)


async def start(channels, transport, first_wait: float = 2.0) -> asyncio.Task | None:
    """Learn the order of every ``auto`` channel: the first round now (waiting at most
    ``first_wait`` seconds, so the first requests are placed in the learned order), then
    a task that asks again every few minutes, and sooner while a channel is not learned."""
    auto = [ch for ch in channels if ch.kind == "openai" and ch.render_order == "auto"]
    if not auto:
        return None
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(
            asyncio.gather(*(learn(ch, transport) for ch in auto)), timeout=first_wait
        )
    return asyncio.get_running_loop().create_task(_again(auto, transport))


async def learn_all(channels, transport) -> None:
    """Learn the order of the ``auto`` channels among ``channels`` once (a reload added
    or moved them); the periodic task of :func:`start` does not know them."""
    auto = [ch for ch in channels if ch.kind == "openai" and ch.render_order == "auto"]
    await asyncio.gather(*(learn(ch, transport) for ch in auto))


async def _again(auto, transport) -> None:
    retry = RETRY_S
    while True:
        learned = all(_learned.get((ch.name, ch.base_url)) is not None for ch in auto)
        await asyncio.sleep(REFRESH_S if learned else retry)
        retry = RETRY_S if learned else min(retry * 2, REFRESH_S)
        await asyncio.gather(*(learn(ch, transport) for ch in auto))
