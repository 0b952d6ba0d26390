"""The upstream's template order is learned from its /tokenize, not assumed."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from prefixgate.config import parse_config
from prefixgate.engine.order import RenderOrders, order_from_tokens
from prefixgate.lab.upstream_sim import SimSettings, create_upstream_app
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from prefixgate.upstream import Upstream

MODEL = "claude-opus-4-8"
TOOLS = [{"name": "Read", "description": "Reads a file.", "input_schema": {"type": "object"}}]


def test_the_change_that_shows_first_sits_first():
    base = [1, 2, 3, 4, 5, 6]
    assert order_from_tokens(base, [1, 9, 3, 4, 5, 6], [1, 2, 3, 4, 9, 6]) == "system_first"
    assert order_from_tokens(base, [1, 2, 3, 4, 9, 6], [1, 9, 3, 4, 5, 6]) == "tools_first"
    # a template that renders no tools does not tell
    assert order_from_tokens(base, [1, 9, 3, 4, 5, 6], base) is None


def _serve_one(upstream_url: str, dsn: str, **channel) -> tuple[dict, list]:
    ch = {
        "name": "vllm",
        "base_url": upstream_url + "/v1",
        "models": [MODEL],
        "model_map": {MODEL: "sim-model"},
        **channel,
    }
    cfg = parse_config({"channels": [ch], "store": {"dsn": dsn}})
    body = {
        "model": MODEL,
        "max_tokens": 8,
        "system": "You are a coding agent.",
        "tools": TOOLS,
        "messages": [{"role": "user", "content": "hello"}],
    }
    app = create_app(cfg)
    with ServerThread(app) as gw:
        assert httpx.post(gw.url + "/v1/messages", json=body, timeout=30).status_code == 200
        learned = app.state.gateway.render_orders.order_of(cfg.channels[0])
    with open_store(dsn) as store:
        [rec] = list(store.iter_records())
    kinds = [s.kind for s in rec.segments_out or rec.segments_in]
    return {"order": learned.order, "source": learned.source}, kinds


@pytest.mark.parametrize("order", ["tools_first", "system_first"])
def test_the_gateway_learns_the_order_and_places_the_segments_by_it(tmp_path, order):
    sim = SimSettings(render_order=order, max_model_len=1_048_576)
    with ServerThread(create_upstream_app(sim)) as upstream:
        got, kinds = _serve_one(upstream.url, f"sqlite:///{tmp_path / 'o.db'}")
    assert got == {"order": order, "source": "tokenize"}
    first_tool, first_system = kinds.index("tool"), kinds.index("system")
    assert (first_system < first_tool) == (order == "system_first")


def test_a_configured_order_is_kept_and_an_upstream_without_tokenize_is_said(tmp_path):
    sim = SimSettings(render_order="system_first", max_model_len=1_048_576)
    with ServerThread(create_upstream_app(sim)) as upstream:
        got, _ = _serve_one(
            upstream.url, f"sqlite:///{tmp_path / 'c.db'}", render_order="tools_first"
        )
    assert got == {"order": "tools_first", "source": "configured"}
    # /tokenize missing (here: a base URL whose root has none): the assumption is said
    with ServerThread(create_upstream_app(sim)) as upstream:
        ch = parse_config(
            {"channels": [{"name": "x", "base_url": upstream.url + "/nothing/v1"}]}
        ).channels[0]
        orders = RenderOrders()

        async def attempt():
            t = Upstream()
            try:
                return await orders.learn(ch, t)
            finally:
                await t.aclose()

        assert asyncio.run(attempt()) is None
    got = orders.order_of(ch)
    assert got.order == "tools_first" and got.source.startswith("assumed")


def test_a_real_template_that_puts_the_tools_inside_the_system_turn(tmp_path):
    """A Qwen-style template (the tools listed after the system text, in the system turn):
    learned from the template's rendering, whatever the simulator's own setting says."""
    template = tmp_path / "chat.jinja"
    template.write_text(
        "{%- if messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}"
        "{%- if tools %}\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
        "{%- endif %}<|im_end|>\n{%- endif %}"
        "{%- for m in messages[1:] %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
    )
    sim = SimSettings(
        render_order="tools_first", chat_template=str(template), max_model_len=1_048_576
    )
    with ServerThread(create_upstream_app(sim)) as upstream:
        got, kinds = _serve_one(upstream.url, f"sqlite:///{tmp_path / 'q.db'}")
    assert got == {"order": "system_first", "source": "tokenize"}
    assert kinds.index("system") < kinds.index("tool")
