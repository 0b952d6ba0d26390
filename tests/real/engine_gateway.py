"""The gateway over a real engine's KV-events channel, with a store: the set-up the vLLM
and SGLang tests share (the ledger, precise routing, diagnostics, the render order).

- :func:`gateway`: ``create_app`` over one channel and a SQLite store, on a loopback port;
- :func:`drive`: three agent sessions sharing a team prompt, one request at a time, each
  followed by a wait until the index holds the prompt's full blocks (the events of a step
  arrive after its response: a wait on the index's state, not on time);
- :func:`stored`: the records and the ledgers of the requests sent, read back from the
  store; :func:`say_ledgers` prints them;
- :func:`precise_channel`: one channel over two replicas with ``routing: precise``;
- :func:`check_render_order`: what the gateway learned from an engine's ``/tokenize``
  against the model's template rendered here.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from prefixgate.cache import JinjaChatTemplate
from prefixgate.config import parse_config
from prefixgate.engine.order import RenderOrders
from prefixgate.events import content_keys
from prefixgate.ledger import CAUSES
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from prefixgate.upstream import Upstream
from tests.conftest import settled
from tests.real import harness
from tests.real.test_kv_events import session_prompt, turn

BLOCK = harness.BLOCK_SIZE  # vLLM's block and SGLang's page alike


@dataclass
class Gateway:
    app: object  # the ASGI app (its state: the gateway, the events hub, the ledger)
    url: str
    dsn: str  # its store


@contextlib.contextmanager
def gateway(tmp_path: Path, channel: dict, name: str = "real") -> Iterator[Gateway]:
    """The gateway over ``channel`` with a SQLite store ``<name>.db`` in ``tmp_path``."""
    dsn = f"sqlite:///{tmp_path}/{name}.db"
    # No shedding on the loop's lag: the real engines beside it take the machine's cores
    # (a request of these tests was once refused as overloaded, the loop 314 ms late)
    config = parse_config(
        {
            "channels": [channel],
            "store": {"dsn": dsn, "journal_path": str(tmp_path / "j")},
            "server": {"shed_loop_lag": None},
        }
    )
    app = create_app(config)
    with ServerThread(app) as srv:
        yield Gateway(app, srv.url, dsn)


def stored(dsn: str, sent: list[str]) -> tuple[dict, list]:
    """The store's records by request id, and the ledgers of ``sent`` (each one there)."""
    with open_store(dsn) as store:
        records = {r.request_id: r for r in store.iter_records()}
        ledgers = [store.get_ledger(rid) for rid in sent]
    missing = [rid for rid, x in zip(sent, ledgers, strict=True) if x is None]
    assert not missing, f"no ledger stored for {missing}"
    return records, ledgers


def say_ledgers(say, records: dict, ledgers: list) -> None:
    """A line a ledger: session, replica, route, prompt, the three hits and the causes."""
    for x in ledgers:
        rec = records[x.request_id]
        say(
            f"{rec.session_id[-1]} {rec.replica[-5:-3]} {rec.route_source} "
            f"prompt {x.prompt_tokens:5d} engine {x.engine_cached:5d} "
            f"index {x.index_predicted:5d} model {x.model_predicted} "
            + " ".join(f"{c} {v}" for c, v in x.parts().items() if v)
        )


def precise_channel(pair: tuple, model_dir: Path) -> dict:
    """One channel over the two servers of ``pair`` (each ``(server, its events)``) with
    ``routing: precise`` and the model's own template and tokenizer."""
    (a, ev_a), (b, ev_b) = pair
    return {
        "name": "real",
        "base_url": a.base_url,
        "replicas": [b.base_url],
        "routing": {"policy": "precise"},
        "chat_template": str(model_dir / "tokenizer_config.json"),
        "tokenizer": f"hf:{model_dir}",
        "kv_events": {
            "topic": ev_a["topic"],
            "block_size": BLOCK,
            "replicas": [
                {k: ev[k] for k in ("endpoint", "replay_endpoint")} for ev in (ev_a, ev_b)
            ],
        },
    }


def check_ledgers_on_one_replica(say, records: dict, ledgers: list, mismatches: int) -> None:
    """Three sessions driven by :func:`drive` over one replica whose small KV cache they
    share: every ledger sums to its prompt, its hit is the engine's, the index predicted
    the engine's figure, and they evicted each other; ``mismatches``: token id counts that
    differed from the engine's prompt_tokens (its ``/tokenize`` is exact)."""
    assert mismatches == 0
    for x in ledgers:
        assert x.source == "events" and x.total() == records[x.request_id].prompt_tokens
        assert x.hit == x.engine_cached
    agree = sum(x.index_predicted == x.engine_cached for x in ledgers)
    say(f"the index predicted the engine's cached_tokens for {agree} of {len(ledgers)} requests")
    assert agree >= 0.99 * len(ledgers)
    totals = {c: sum(getattr(x, c) for x in ledgers) for c in CAUSES}
    say(f"tokens by cause: {totals}")
    assert totals["evicted"] > 0 and totals["hit"] > 0 and totals["cold"] > 0
    assert totals["unknown"] == 0 and totals["elsewhere"] == 0  # one replica


def check_precise_routing(say, sent: list[str], records: dict, ledgers: list) -> None:
    """Three sessions driven by :func:`drive` over two replicas with ``routing: precise``:
    every decision came from the events, each session stayed on one replica and hit its
    history, every ledger sums to its prompt and the index predicted the engine's figure."""
    served: dict[str, set] = {}
    for rid in sent:
        served.setdefault(records[rid].session_id, set()).add(records[rid].replica)
    say(f"replicas per session: {served}")
    assert all(records[rid].route_source == "events" for rid in sent)
    for x in ledgers:
        assert x.source == "events" and x.total() == records[x.request_id].prompt_tokens
    # Each later turn went where its session's prefix was cached: nothing recomputed that
    # the other replica held, and it hit its history. A first request matches only the
    # team's block elsewhere (1 of 11 blocks, under routing.match_threshold): at most
    # that is booked as a routing loss.
    later = ledgers[3:]
    assert sum(x.elsewhere for x in later) == 0
    assert all(x.elsewhere <= BLOCK for x in ledgers[:3])
    assert all(x.hit > 0 for x in later), [x.hit for x in later]
    assert all(len(urls) == 1 for urls in served.values())
    agree = sum(x.index_predicted == x.engine_cached for x in ledgers)
    say(f"the index predicted the engine's cached_tokens for {agree} of {len(ledgers)}")
    assert agree >= 0.99 * len(ledgers)


def drive(app, url: str, server, replicas: tuple, *, turns: int) -> list[str]:
    """Three sessions sharing a team prompt, ``turns`` turns each, one request at a time
    through the gateway at ``url``, each followed by a wait until a replica's index holds
    every full block of the prompt; then until every record and ledger is written. The
    request ids, in order (turn by turn)."""
    nonce = secrets.token_hex(4)
    histories = {s: [{"role": "system", "content": session_prompt(nonce, s)}] for s in range(3)}
    sent: list[str] = []
    index = until_listening(app, replicas)
    with httpx.Client(timeout=120) as http:
        for n in range(turns):
            for s in range(3):
                messages = [*histories[s], turn(s, n)[0]]
                sent.append(send(http, url, server, f"{nonce}-{s}", messages))
                until_held(index, replicas, content_keys(tokenize(http, server, messages), BLOCK))
                histories[s] += turn(s, n)
    until_written(app, len(sent))
    return sent


def send_turns(app, url: str, server, session: str, prompts: list[list[dict]]) -> list[str]:
    """Each prompt through the gateway at ``url`` as one session, one at a time, each
    followed by a wait until the index holds its full blocks; then until every record and
    ledger is written. The request ids."""
    index = until_listening(app, (server.base_url,))
    sent = []
    with httpx.Client(timeout=120) as http:
        for messages in prompts:
            sent.append(send(http, url, server, session, messages))
            keys = content_keys(tokenize(http, server, messages), BLOCK)
            until_held(index, (server.base_url,), keys)
    until_written(app, len(sent))
    return sent


def send(http: httpx.Client, url: str, server, session: str, messages: list[dict]) -> str:
    """One chat request of ``session`` through the gateway at ``url``; its request id."""
    r = http.post(
        url + "/v1/chat/completions",
        json={"model": server.served_model, "messages": messages, "max_tokens": 1},
        headers={"x-session-id": session},
    )
    assert r.status_code == 200, r.text
    return r.headers["x-request-id"]


def tokenize(http: httpx.Client, server, messages: list[dict]) -> list[int]:
    """The engine's token ids of ``messages`` rendered by its template (its ``/tokenize``)."""
    r = http.post(
        server.url + "/tokenize", json={"model": server.served_model, "messages": messages}
    )
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def until_listening(app, replicas: tuple):
    """Until every replica's subscriber is listening: the replay read, and each engine's
    publisher connected (its handshake); what an engine publishes before that is lost
    (ZeroMQ's late join). The channel's index."""
    hub = app.state.events
    deadline = time.monotonic() + 120
    while not all(hub.subscriber("real", r).listening for r in replicas):
        assert time.monotonic() < deadline, hub.statuses()
        time.sleep(0.01)
    return hub.channels["real"].index


def until_written(app, n: int) -> None:
    """Until the gateway has recorded ``n`` requests and written their ledgers."""
    settled(app.state.gateway)
    ledger, writer = app.state.ledger, app.state.gateway.recorder
    deadline = time.monotonic() + 120
    while ledger.written < n or writer.stats().written < n:
        assert time.monotonic() < deadline, (ledger.computed, ledger.failed, writer.stats())
        time.sleep(0.05)


def until_held(index, replicas: tuple, keys: list[bytes], limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while all(index.longest_prefix(r, keys, touch=False).gpu < len(keys) for r in replicas):
        assert time.monotonic() < deadline, "the engines' events never showed the prompt"
        time.sleep(0.005)


def check_render_order(base_url: str, model_dir: Path, probe=None) -> None:
    """The gateway asks the engine at ``base_url`` (its ``/tokenize``, messages and tools)
    where the model's template puts the tools; the answer agrees with the template rendered
    here. ``probe(channel, transport)``, when given, runs on the same transport after it."""
    config = parse_config({"channels": [{"name": "real", "base_url": base_url}]})
    channel = config.channels[0]

    async def learn_once():
        transport = Upstream()
        try:
            got = await RenderOrders().learn(channel, transport)
            if probe is not None:
                await probe(config, transport)
            return got
        finally:
            await transport.aclose()

    got = asyncio.run(learn_once())
    assert got is not None and got.source == "tokenize", got
    template = JinjaChatTemplate.from_file(model_dir / "tokenizer_config.json")
    messages = [{"role": "system", "content": "SYSTEM-MARK"}, {"role": "user", "content": "u"}]
    tools = [{"type": "function", "function": {"name": "TOOL_MARK", "parameters": {}}}]
    text = template.render(messages, tools, True)
    expected = (
        "system_first" if text.index("SYSTEM-MARK") < text.index("TOOL_MARK") else "tools_first"
    )
    assert got.order == expected
