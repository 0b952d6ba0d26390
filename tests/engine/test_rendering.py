"""What an upstream's template does with a conversation is learned from its /tokenize
(the simulated vLLM serving the project's own templates, over loopback) or read from a
configured template, and shown on /healthz."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx
import pytest

from prefixgate.cache.render import template_file
from prefixgate.config import parse_config
from prefixgate.engine.order import RenderOrders
from prefixgate.engine.rendering import Rendering, from_renderings
from prefixgate.lab.upstream_sim import SimSettings, create_upstream_app
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.upstream import Upstream

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


async def _learn(ch, orders: RenderOrders):
    t = Upstream()
    try:
        return await orders.learn(ch, t)
    finally:
        await t.aclose()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_learned_from_tokenize_and_read_from_the_configured_template_alike(name):
    sim = SimSettings(chat_template=name, max_model_len=1_048_576)
    with ServerThread(create_upstream_app(sim)) as up:
        ch = parse_config({"channels": [{"name": "e", "base_url": up.url + "/v1"}]}).channels[0]
        orders = RenderOrders()
        learned = asyncio.run(_learn(ch, orders))
    assert (learned.tools, learned.system, learned.reasoning) == EXPECTED[name]
    assert learned.source == "tokenize" and orders.rendering_of(ch) == learned
    # the project's templates keep consecutive messages and tool results apart
    assert (learned.same_role, learned.tool_results) == ("separate", "separate")
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
    got = orders.rendering_of(configured)
    assert (got.tools, got.system, got.reasoning) == EXPECTED[name]
    assert got.source == "configured template"
    assert (got.same_role, got.tool_results) == ("separate", "separate")


def test_the_gateway_shows_the_rendering_and_turns_the_protection_on_where_it_hoists():
    sim = SimSettings(chat_template="hoisting", max_model_len=1_048_576)
    with ServerThread(create_upstream_app(sim)) as up:
        cfg = parse_config({"channels": [{"name": "e", "base_url": up.url + "/v1"}]})
        with ServerThread(create_app(cfg)) as gw:
            details = httpx.get(gw.url + "/healthz?details=1", timeout=30).json()
    [ch] = details["details"]["rendering"]
    assert ch["channel"] == "e" and ch["system"] == "hoisted" and ch["source"] == "tokenize"
    assert ch["system_in_place"] is True and ch["reasoning"] == "dropped"


def test_an_upstream_that_does_not_tell_is_said_to_be_assumed():
    assert Rendering().source.startswith("assumed")
    ch = parse_config({"channels": [{"name": "n", "base_url": "http://127.0.0.1:9/v1"}]})
    got = RenderOrders().rendering_of(ch.channels[0])
    assert got.system == "unknown" and got.source.startswith("assumed")


def test_relearned_when_the_upstream_serves_another_model():
    """What was learned of an upstream that now lists other models (restarted with another
    model, maybe another template) is learned again at the next check."""
    order = RenderOrders()
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
        assert order.rendering_of(ch).system == "hoisted" and order._models[key] == (
            "deepseek-like",
        )
        # the same models: nothing asked until the refresh is due
        order._learned[key] = Rendering("tools_first", "in_place", "kept", "tokenize")
        asyncio.run(check(False))
        assert order.rendering_of(ch).system == "in_place"
        asyncio.run(check(True))
        assert order.rendering_of(ch).system == "hoisted"


# -- consecutive messages of one role, consecutive tool results (no generation prompt) ----

# A Qwen3/DeepSeek-like layout written for these tests: consecutive messages of one role
# share one turn (joined by a blank line), consecutive tool results one <tool_response> block.
MERGING = """\
{%- if tools -%}
  {{- '<|im_start|>tools' -}}{%- for t in tools -%}{{- '\\n' + (t | tojson) -}}{%- endfor -%}{{- '<|im_end|>\\n' -}}
{%- endif -%}
{%- for m in messages -%}
  {%- set prev = messages[loop.index0 - 1].role if loop.index0 > 0 else none -%}
  {%- set next = messages[loop.index0 + 1].role if not loop.last else none -%}
  {%- if m.role == 'tool' -%}
    {%- if prev != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\\n<tool_response>' + m.content + '</tool_response>' -}}
    {%- if next != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
  {%- else -%}
    {%- if prev != m.role -%}{{- '<|im_start|>' + m.role + '\\n' -}}{%- else -%}{{- '\\n\\n' -}}{%- endif -%}
    {{- m.content or '' -}}
    {%- for c in m.tool_calls or [] -%}{{- '\\n<tool_call>' + c.function.name + '</tool_call>' -}}{%- endfor -%}
    {%- if next != m.role -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""


def test_whether_an_appended_message_leaves_the_rendering_before_it_as_it_was():
    one = list(range(1, 21))
    got = {
        "same.one": one,
        "same.two": [*one, 50, 51],  # one's rendering is the head: separate turns
        "same.turn": [*one, 60],
        "results.one": one,
        "results.two": [*one[:-3], 70, 71, 72, 73],  # the block's end moved after the second
        "results.turn": [*one[:-1], 80, 81],  # a new turn re-splits only where they meet
    }
    r = from_renderings(got, "tokenize")
    assert (r.same_role, r.tool_results) == ("separate", "grouped")
    assert r.as_dict()["same_role"] == "separate" and r.as_dict()["tool_results"] == "grouped"
    # a template that rewrites its end whatever follows (the control) tells nothing
    r = from_renderings({**got, "same.turn": [*one[:10], 60], "results.two": None}, "tokenize")
    assert (r.same_role, r.tool_results) == ("unknown", "unknown")
    assert "same_role" not in r.as_dict() and "tool_results" not in r.as_dict()


def test_a_merging_template_is_told_from_tokenize_shown_and_read_alike(tmp_path):
    path = tmp_path / "merging.jinja"
    path.write_text(MERGING)
    sim = SimSettings(chat_template=str(path), max_model_len=1_048_576)
    with ServerThread(create_upstream_app(sim)) as up:
        cfg = parse_config({"channels": [{"name": "m", "base_url": up.url + "/v1"}]})
        with ServerThread(create_app(cfg)) as gw:
            details = httpx.get(gw.url + "/healthz?details=1", timeout=30).json()
    [ch] = details["details"]["rendering"]
    assert (ch["same_role"], ch["tool_results"], ch["source"]) == ("merged", "grouped", "tokenize")
    assert ch["system"] == "in_place" and ch["reasoning"] == "dropped"
    configured = parse_config(
        {
            "channels": [
                {"name": "c", "base_url": "http://127.0.0.1:9/v1", "chat_template": str(path)}
            ]
        }
    ).channels[0]
    orders = RenderOrders()
    got = orders.rendering_of(configured)
    assert (got.same_role, got.tool_results, got.source) == (
        "merged",
        "grouped",
        "configured template",
    )
    # a configured render_order overrides the tools' place only
    fixed = parse_config(
        {
            "channels": [
                {
                    "name": "f",
                    "base_url": "http://127.0.0.1:9/v1",
                    "chat_template": str(path),
                    "render_order": "system_first",
                }
            ]
        }
    ).channels[0]
    assert orders.rendering_of(fixed) == replace(got, tools="system_first")


def test_a_probe_the_upstream_drops_once_is_asked_again():
    """A loaded engine may fail one request of the round: each probe is asked once more
    before the round counts as not learned."""
    inner = create_upstream_app(SimSettings(chat_template="hoisting", max_model_len=1_048_576))
    failed: list[str] = []

    async def flaky(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/tokenize" and len(failed) < 3:
            failed.append(scope["path"])
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b"busy"})
            return
        await inner(scope, receive, send)

    with ServerThread(flaky) as up:
        ch = parse_config({"channels": [{"name": "e", "base_url": up.url + "/v1"}]}).channels[0]
        learned = asyncio.run(_learn(ch, RenderOrders()))
    assert len(failed) == 3
    assert learned is not None and (learned.system, learned.source) == ("hoisted", "tokenize")
