"""Config reload on a real ``prefixgate serve`` process (SIGHUP and ``prefixgate reload``),
under 200 streams held open across it: a price changed, a replica added and one removed;
every stream ends complete and byte-exact on the settings it started with, the requests
that arrived after the swap use the new ones; a config that fails its checks is refused
and the old one keeps serving; what cannot change live is kept and named."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest
import yaml

from prefixgate.config import parse_config
from prefixgate.reload import keep_fixed
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.spend.prices import PriceTable
from prefixgate.store import open_store
from tests.conftest import scripted_upstream
from tests.fakes import Reply
from tests.serve.served import Served, held_streams, wait_for

ADMIN = "admin-secret-for-reload"
STREAMS = 200
WORDS = [f"w{i:02d} " for i in range(12)]


def _config(dsn: str, journal: str, replicas: list[str], price_in: float) -> dict:
    return {
        "embedded_upstream": False,
        "admin_key_sha256": hashlib.sha256(ADMIN.encode()).hexdigest(),
        "channels": [
            {
                "name": "main",
                "base_url": replicas[0],
                "replicas": replicas[1:],
                "models": ["m"],
                "routing": {"policy": "round_robin"},
                "render_order": "tools_first",
            }
        ],
        "prices": {"models": {"m": {"input": price_in, "cached_input": 0.1, "output": 2.0}}},
        "store": {"dsn": dsn, "journal_path": journal},
        "server": {"max_connections": 2000, "max_in_flight": 1000},
    }


def _state(url: str) -> dict:
    r = httpx.get(url + "/healthz?details", headers={"x-api-key": ADMIN})
    return r.json()["details"]["config"]


def _news(upstream) -> int:
    return sum(r["messages"][0]["content"].startswith("new") for r in upstream.requests)


def _cost(table: PriceTable, rec) -> int:
    c = table.cost(
        "m",
        "main",
        rec.prompt_tokens,
        rec.cached_tokens,
        rec.cache_creation_tokens,
        rec.completion_tokens,
    )
    return c.nanos


def _body(i: int) -> dict:
    return {"model": "m", "stream": True, "messages": [{"role": "user", "content": f"task {i}"}]}


def _reference(upstream_url: str, n: int) -> dict[int, bytes]:
    """The bytes a gateway that is never reloaded streams for each request (its own
    process, on the same upstream)."""
    cfg = {"channels": [{"name": "main", "base_url": upstream_url}], "store": None}
    with ServerThread(create_app(parse_config(cfg))) as ref:
        out = {}
        for i in range(n):
            with httpx.stream("POST", ref.url + "/v1/chat/completions", json=_body(i)) as r:
                out[i] = r.read()
        return out


def test_a_reload_under_200_streams_changes_prices_and_replicas(tmp_path):
    hold = threading.Event()

    def script(body: dict) -> Reply:
        task = body["messages"][0]["content"]
        deltas = [{"role": "assistant", "content": ""}] + [
            {"content": f"{task} {w}"} for w in WORDS
        ]
        return Reply(deltas=deltas, hold=hold)

    dsn = f"sqlite:///{tmp_path / 'records.db'}"
    journal = str(tmp_path / "journal")
    with scripted_upstream() as a, scripted_upstream() as b, scripted_upstream() as c:
        for up in (a, b, c):
            up.script = script
        hold.set()
        expected = _reference(a.url, STREAMS)
        for up in (a, b, c):
            up.requests.clear()
        hold.clear()
        first = _config(dsn, journal, [a.url, b.url], price_in=1.0)
        gw = Served(tmp_path, first)
        config_path = tmp_path / f"gw-{gw.port}.yaml"
        with gw:
            started = threading.Event()
            results: list = []
            runner = threading.Thread(
                target=lambda: results.extend(
                    asyncio.run(held_streams(gw.url, [_body(i) for i in range(STREAMS)], started))
                )
            )
            runner.start()
            wait_for(started.is_set, "every stream has its first bytes")
            assert len(a.requests) + len(b.requests) == STREAMS
            assert len(a.requests) and len(b.requests)  # round robin over both replicas

            # The reload: A leaves, C joins, input costs ten times more.
            second = _config(dsn, journal, [b.url, c.url], price_in=10.0)
            second["server"] = {**second["server"], "port": gw.port, "host": "127.0.0.1"}
            config_path.write_text(yaml.safe_dump(second))
            gw.proc.send_signal(signal.SIGHUP)
            state = wait_for(lambda: (s := _state(gw.url))["generation"] == 2 and s, "reloaded")
            last = state["last_reload"]
            assert last["applied"] and last["needs_restart"] == []
            assert last["in_flight_on_previous"] == STREAMS
            assert not results  # every stream is still open

            # New requests take the new replicas and the new price.
            after = []
            for i in range(6):
                r = httpx.post(
                    gw.url + "/v1/chat/completions",
                    headers={"x-api-key": "k"},
                    json={"model": "m", "messages": [{"role": "user", "content": f"new {i}"}]},
                )
                assert r.status_code == 200, r.text
                after.append(r.headers["x-request-id"])
            news = [_news(up) for up in (a, b, c)]
            assert news == [0, 3, 3]  # round robin over B and C; none to A

            hold.set()
            runner.join(300)
            assert len(results) == STREAMS
            wait_for(lambda: "replica " + a.url + " left" in gw.output, "A's pool closed")
        assert gw.returncode == 0, gw.output

    for i, (got, _rid) in enumerate(results):
        assert got == expected[i], f"stream {i} differs"
    prices_of = {
        1.0: PriceTable.from_config(parse_config(first).prices),
        10.0: PriceTable.from_config(parse_config(second).prices),
    }
    with open_store(dsn) as store:
        recs = {r.request_id: r for r in store.iter_records()}
    assert len(recs) == STREAMS + len(after)
    for rid in [rid for _, rid in results]:
        rec = recs[rid]
        assert rec.replica in (a.url, b.url) and rec.status == 200
        assert rec.cost_nano == _cost(prices_of[1.0], rec)
    for rid in after:
        rec = recs[rid]
        assert rec.replica in (b.url, c.url)
        assert rec.cost_nano == _cost(prices_of[10.0], rec) > _cost(prices_of[1.0], rec)


def test_a_bad_config_is_refused_and_the_old_one_keeps_serving(tmp_path, upstream):
    upstream.script = lambda body: Reply(text="still here")
    dsn = f"sqlite:///{tmp_path / 'records.db'}"
    cfg = _config(dsn, str(tmp_path / "journal"), [upstream.url], price_in=1.0)
    gw = Served(tmp_path, cfg, "--pid-file", str(tmp_path / "gw.pid"))
    path = tmp_path / f"gw-{gw.port}.yaml"
    good = path.read_text()
    with gw:
        pid = (tmp_path / "gw.pid").read_text().strip()
        assert pid == str(gw.proc.pid)
        # A budget that does not parse: prefixgate reload refuses to send it at all.
        bad = yaml.safe_load(good)
        bad["budgets"] = {"owners": {"team": ["lots of tokens"]}}
        path.write_text(yaml.safe_dump(bad))
        cli = [sys.executable, "-m", "prefixgate.cli", "reload", "--config", str(path)]
        out = subprocess.run([*cli, "--pid", pid], capture_output=True, text=True)
        assert out.returncode == 1 and "not reloaded" in out.stderr and "budgets" in out.stderr
        assert _state(gw.url)["reloads"] == {"applied": 0, "refused": 0}
        # Sent anyway (a plain SIGHUP): the gateway refuses it with the reason.
        gw.proc.send_signal(signal.SIGHUP)
        state = wait_for(lambda: (s := _state(gw.url))["reloads"]["refused"] == 1 and s, "refused")
        assert state["generation"] == 1 and not state["last_reload"]["applied"]
        assert "budgets.owners.team" in state["last_reload"]["reason"]
        r = httpx.post(
            gw.url + "/v1/chat/completions",
            headers={"x-api-key": "k"},
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.json()["choices"][0]["message"]["content"] == "still here"
        # A good one with a change that needs a restart: applied, the rest kept and named.
        fixed = yaml.safe_load(good)
        fixed["server"]["max_in_flight"] = 7
        fixed["prices"]["models"]["m"]["output"] = 3.0
        path.write_text(yaml.safe_dump(fixed))
        env = {"PREFIXGATE_ADMIN_KEY": ADMIN}
        out = subprocess.run(
            [*cli, "--pid-file", str(tmp_path / "gw.pid"), "--url", gw.url],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
        )
        assert out.returncode == 0, out.stderr
        assert "generation 2 serves" in out.stdout
        assert "server.max_in_flight: needs a restart" in out.stdout
        assert gw.proc.poll() is None
    assert gw.returncode == 0
    assert not (tmp_path / "gw.pid").exists()


def test_what_cannot_change_live_is_kept_and_named():
    base = {"channels": [{"name": "a", "base_url": "http://127.0.0.1:9/v1"}], "store": None}
    old = parse_config(base)
    new = parse_config(
        {
            **base,
            "server": {"port": 9999},
            "channels": [
                {
                    "name": "a",
                    "base_url": "http://127.0.0.1:9/v1",
                    "kv_events": {"endpoint": "tcp://127.0.0.1:5557"},
                    "models": ["x"],
                }
            ],
        }
    )
    effective, kept = keep_fixed(old, new)
    assert effective.server.port == old.server.port
    assert effective.channels[0].kv_events is None and effective.channels[0].models == ("x",)
    assert kept[0].startswith("server.port: needs a restart")
    assert kept[1].startswith("channels[a].kv_events: needs a restart")


@pytest.mark.parametrize("host", ["0.0.0.0"])
def test_a_reload_that_would_open_a_public_gateway_is_refused(host):
    from prefixgate.config import ConfigError
    from prefixgate.reload import check

    with pytest.raises(ConfigError, match="open it to anyone"):
        check(
            parse_config(
                {
                    "server": {"host": host},
                    "channels": [{"name": "a", "base_url": "http://127.0.0.1:9/v1"}],
                }
            )
        )
