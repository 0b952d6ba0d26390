"""What a gateway learns of its channels' chat templates is its own (two gateways in one
process learn theirs apart), kept across a reload, and engine/ keeps no module-level state
it could share between them."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

from prefixgate.config import parse_config
from prefixgate.gateway import Gateway
from prefixgate.lab.upstream_sim import SimSettings, create_upstream_app
from prefixgate.reload import reload_gateway
from prefixgate.serve.process import ServerThread

ENGINE = Path(__file__).parents[2] / "src" / "prefixgate" / "engine"


def _config(url: str, weight: int = 1) -> dict:
    return {"channels": [{"name": "e", "base_url": url + "/v1", "weight": weight}]}


def test_two_gateways_learn_apart_and_a_reload_keeps_what_was_learned():
    hoisting = SimSettings(chat_template="hoisting", max_model_len=1_048_576)
    in_place = SimSettings(chat_template="in_place", max_model_len=1_048_576)
    with ServerThread(create_upstream_app(hoisting)) as up_a:
        url_a = up_a.url
        with ServerThread(create_upstream_app(in_place)) as up_b:

            async def both():
                a = Gateway.from_config(parse_config(_config(url_a)))
                b = Gateway.from_config(parse_config(_config(up_b.url)))
                async with a, b:  # each learns its channel's template as it starts
                    return a, b

            a, b = asyncio.run(both())
    [ch_a], [ch_b] = a.config.channels, b.config.channels
    assert a.render_orders is not b.render_orders
    assert a.render_orders.rendering_of(ch_a).system == "hoisted"
    assert b.render_orders.rendering_of(ch_b).system == "in_place"
    # one channel name, another upstream: neither knows the other's
    assert a.render_orders.rendering_of(ch_b).source.startswith("assumed")
    assert b.render_orders.rendering_of(ch_a).source.startswith("assumed")
    # the upstream is gone, the channel stays: the new generation knows what was learned
    old = a.live

    async def reload():
        return await reload_gateway(a, parse_config(_config(url_a, weight=2)))

    assert asyncio.run(reload()).applied
    assert a.live is not old and a.config.channels[0].weight == 2
    assert a.render_orders.rendering_of(a.config.channels[0]).system == "hoisted"
    assert a.live.router.orders is a.render_orders
    assert a.live.engine_tokens.orders is a.render_orders


def _mutable(value: ast.expr | None) -> bool:
    if isinstance(value, ast.Dict | ast.Set | ast.List | ast.DictComp | ast.SetComp | ast.ListComp):
        return True
    if isinstance(value, ast.Call):
        f = value.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        return name in {"dict", "set", "list", "defaultdict", "OrderedDict", "deque", "Counter"}
    return False


def test_engine_keeps_no_module_level_mutable_state():
    found = []
    for path in sorted(ENGINE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign):
                targets = [ast.unparse(t) for t in node.targets]
            elif isinstance(node, ast.AnnAssign):
                targets = [ast.unparse(node.target)]
            else:
                continue
            if targets != ["__all__"] and _mutable(node.value):
                found.append(f"{path.name}:{node.lineno} {', '.join(targets)}")
        tree = ast.parse(path.read_text())
        found += [
            f"{path.name}:{n.lineno} global" for n in ast.walk(tree) if isinstance(n, ast.Global)
        ]
    assert not found, found
