"""What an upstream's template does with a conversation is learned from its /tokenize
(the simulated vLLM serving the project's own templates, over loopback) or read from a
configured template, and shown on /healthz."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from prefixgate.cache.render import template_file
from prefixgate.config import parse_config
from prefixgate.serve.app import build_app
from prefixgate.serve.process import ServerThread
from prefixgate.upstream import Upstream
from prefixgate.upstream.order import learn, rendering_of
from prefixgate.upstream.rendering import Rendering, from_renderings
from prefixgate.upstream_sim import SimSettings, create_upstream_app

EXPECTED = {
    "hoisting": ("system_first", "hoisted", "dropped"),
    "in_place": ("tools_first", "in_place", "kept"),
    "reasoning_last_query": ("tools_first", "in_place", "until_next_user"),
}


def test_where_the_first_difference_lands_says_where_a_piece_is_rendered():
    base = [1, 2, 3, 4, 5, 6, 7, 8]
    got = {
        "tools.base": base,
        "tools.system": [1, 9, 3, 4, 5, 6, 7, 8],
        "tools.tool": [1, 2, 3, 9, 5, 6, 7, 8],
        "system.base": base,
        "system.later": [1, 2, 9, 4, 5, 6, 7, 8],  # the later system message shows first
        "system.user": [1, 2, 3, 4, 9, 6, 7, 8],
        "loop.a": base,
        "loop.b": [1, 2, 3, 4, 5, 9, 7, 8],
        "after.a": base,
        "after.b": base,  # gone once a user turn follows
    }
    r = from_renderings(got, "tokenize")
    assert (r.tools, r.system, r.reasoning) == ("system_first", "hoisted", "until_next_user")
    # refused or missing probes tell nothing
    r = from_renderings({**got, "system.later": None, "after.b": None}, "tokenize")
    assert (r.system, r.reasoning) == ("unknown", "unknown")
    # a later system message that changes nothing is not rendered at all
    assert from_renderings({**got, "system.later": base}, "x").system == "dropped"


async def _learn(ch):
    t = Upstream()
    try:
        return await learn(ch, t)
    finally:
        await t.aclose()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_learned_from_tokenize_and_read_from_the_configured_template_alike(name):
    sim = SimSettings(chat_template=name, max_model_len=1_048_576)
    with ServerThread(create_upstream_app(sim)) as up:
        ch = parse_config({"channels": [{"name": "e", "base_url": up.url + "/v1"}]}).channels[0]
        learned = asyncio.run(_learn(ch))
    assert (learned.tools, learned.system, learned.reasoning) == EXPECTED[name]
    assert learned.source == "tokenize" and rendering_of(ch) == learned
    configured = parse_config(
        {
            "channels": [
                {
                    "name": "c",
                    "base_url": "http://127.0.0.1:9/v1",
                    "chat_template": str(template_file(name)),
                }
            ]
        }
    ).channels[0]
    got = rendering_of(configured)
    assert (got.tools, got.system, got.reasoning) == EXPECTED[name]
    assert got.source == "configured template"


def test_the_gateway_shows_the_rendering_and_turns_the_protection_on_where_it_hoists():
    sim = SimSettings(chat_template="hoisting", max_model_len=1_048_576)
    with ServerThread(create_upstream_app(sim)) as up:
        cfg = parse_config({"channels": [{"name": "e", "base_url": up.url + "/v1"}]})
        with ServerThread(build_app(cfg)) as gw:
            details = httpx.get(gw.url + "/healthz?details=1", timeout=30).json()
    [ch] = details["details"]["rendering"]
    assert ch["channel"] == "e" and ch["system"] == "hoisted" and ch["source"] == "tokenize"
    assert ch["system_in_place"] is True and ch["reasoning"] == "dropped"


def test_an_upstream_that_does_not_tell_is_said_to_be_assumed():
    assert Rendering().source.startswith("assumed")
    ch = parse_config({"channels": [{"name": "n", "base_url": "http://127.0.0.1:9/v1"}]})
    got = rendering_of(ch.channels[0])
    assert got.system == "unknown" and got.source.startswith("assumed")


def test_relearned_when_the_upstream_serves_another_model():
    """What was learned of an upstream that now lists other models (restarted with another
    model, maybe another template) is learned again at the next check."""
    from prefixgate.upstream import order

    sim = SimSettings(models=("deepseek-like",), chat_template="hoisting")
    with ServerThread(create_upstream_app(sim)) as up:
        ch = parse_config({"channels": [{"name": "e", "base_url": up.url + "/v1"}]}).channels[0]
        key = (ch.name, ch.base_url)
        order._learned[key] = Rendering("tools_first", "in_place", "kept", "tokenize")
        order._models[key] = ("qwen-like",)  # what it served when that was learned

        async def check(due: bool):
            t = Upstream()
            try:
                await order._check(ch, t, due)
            finally:
                await t.aclose()

        asyncio.run(check(False))
        assert rendering_of(ch).system == "hoisted" and order._models[key] == ("deepseek-like",)
        # the same models: nothing asked until the refresh is due
        order._learned[key] = Rendering("tools_first", "in_place", "kept", "tokenize")
        asyncio.run(check(False))
        assert rendering_of(ch).system == "in_place"
        asyncio.run(check(True))
        assert rendering_of(ch).system == "hoisted"
