"""Every request recorded: in-process with the real writer and store, and the real
``prefixgate serve`` process under concurrent load, stopped with SIGTERM (SQLite and
Postgres, and with the store cut off mid-run)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from prefixgate.config import parse_config
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from tests.conftest import load_fixture, pg_schema_dsn
from tests.fakes import Reply

MSG = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


def test_records_reach_the_store_with_segments(upstream, tmp_path):
    dsn = f"sqlite:///{tmp_path / 'r.db'}"
    config = parse_config(
        {
            "channels": [{"name": "main", "base_url": upstream.url, "capture_text": True}],
            "store": {"dsn": dsn, "journal_path": str(tmp_path / "journal")},
        }
    )
    upstream.script = lambda b: Reply(
        text="ok", prompt_tokens=20000, cached_tokens=17920, completion_tokens=4
    )
    fx = load_fixture("01_v2.1.332_print_turn1.json")
    headers = {
        "user-agent": fx["headers"]["User-Agent"],
        "x-api-key": "sk-ant-api03-SECRETSECRETSECRET",
    }
    with ServerThread(create_app(config)) as gw:
        for stream in (False, True):
            r = httpx.post(
                gw.url + "/v1/messages?beta=true",
                json={**fx["body"], "stream": stream},
                headers=headers,
            )
            assert r.status_code == 200
        r = httpx.post(
            gw.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}], "user": "u1"},
        )
        assert r.status_code == 200
        assert httpx.post(gw.url + "/v1/messages", content=b"{bad").status_code == 400
        metrics = httpx.get(gw.url + "/metrics").text
    with open_store(dsn) as store:
        recs = sorted(store.iter_records(with_texts=True), key=lambda r: r.received_at)
    assert len(recs) == 4
    first = recs[0]
    assert first.client == "claude-cli" and first.client_version == "2.1.332"
    assert (first.prompt_tokens, first.cached_tokens) == (20000, 17920)
    assert first.reported_input_tokens == 2080 and first.reported_cache_read_tokens == 17920
    assert first.session_id == fx["headers"]["X-Claude-Code-Session-Id"]
    names_in = [s.name for s in first.segments_in]
    names_out = [s.name for s in first.segments_out]
    assert names_in[0] == "system[0]"  # as received: the billing header leads
    assert names_out[0] == "tools"  # as sent: tools first, no billing header
    header_hash = first.segments_in[0].hash
    assert header_hash not in {s.hash for s in first.segments_out}
    assert recs[1].stream and recs[1].ttft_ms is not None and recs[1].status == 200
    assert recs[2].endpoint == "chat" and recs[2].session_id == "u1"
    assert recs[3].status == 400 and recs[3].error_type == "invalid_request_error"
    # Captured texts are redacted, and the key never reaches the store file.
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("r.db*"))
    assert b"SECRETSECRETSECRET" not in raw
    assert 'prefixgate_cached_tokens_total{channel="main",client="claude-cli"' in metrics


# -- the real process, SIGTERM under load ---------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_STARTED: list[subprocess.Popen] = []  # this test's gateways, stopped by _no_gateway_left


@pytest.fixture(autouse=True)
def _no_gateway_left():
    """A test that fails before it stops its gateway leaves none running: the gateway's
    whole process group (its workers too) is killed once the test ends."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        if proc.stdout is not None and not proc.stdout.closed:
            proc.stdout.close()


def _start_gateway(
    tmp_path: Path, upstream_url: str, dsn: str, *extra: str
) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cfg = {
        "server": {"host": "127.0.0.1", "port": port},
        "channels": [{"name": "main", "base_url": upstream_url}],
        "store": {"dsn": dsn, "journal_path": str(tmp_path / "journal")},
    }
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefixgate.cli",
            "serve",
            "--config",
            str(path),
            "--log-level",
            "warning",
            *extra,
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, its workers in it
    )
    _STARTED.append(proc)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    out = proc.stdout.read().decode()
    proc.stdout.close()
    raise AssertionError("gateway did not start: " + out)


async def _load(url: str, n: int) -> list[int]:
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> int:
            if i % 2:
                r = await client.post(url + "/v1/messages", json={**MSG, "stream": True})
                assert "event: message_stop" in r.text
            else:
                r = await client.post(
                    url + "/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": str(i)}]},
                )
            return r.status_code

        return await asyncio.gather(*(one(i) for i in range(n)))


def _sigterm(proc: subprocess.Popen) -> str:
    """Stop the gateway as an operator does; its output (warnings and up), for the
    assertions' messages."""
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(60)
        out = proc.stdout.read().decode()
    finally:
        proc.stdout.close()
    assert rc == 0, out
    return out


def _run_load_then_sigterm(
    proc: subprocess.Popen, url: str, upstream, n: int, mid_run=None
) -> list[int]:
    statuses: list[int] = []
    t = threading.Thread(target=lambda: statuses.extend(asyncio.run(_load(url, n))))
    t.start()
    deadline = time.monotonic() + 30
    while len(upstream.requests) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    if mid_run:
        mid_run()
    proc.send_signal(signal.SIGTERM)  # every request is in flight now
    t.join(60)
    _sigterm(proc)
    return statuses


def test_sigterm_under_load_loses_no_record(upstream, tmp_path, store_dsn):
    dsn = store_dsn
    upstream.script = lambda b: Reply(text="a b c d e f g h", chunk_delay=0.05)
    proc, url = _start_gateway(tmp_path, upstream.url, dsn)
    n = 40
    statuses = _run_load_then_sigterm(proc, url, upstream, n)
    assert statuses == [200] * n
    with open_store(dsn) as store:
        recs = list(store.iter_records())
    assert len(recs) == n and all(r.status == 200 for r in recs)
    assert len({r.request_id for r in recs}) == n


class _Proxy:
    """A TCP proxy to Postgres that the test can cut and restore."""

    def __init__(self, target: tuple[str, int], port: int | None = None) -> None:
        self.target = target
        self.port = port or _free_port()
        self.up = True
        self._conns: list[socket.socket] = []
        self._lsock = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self._lsock.accept()
            except OSError:
                return
            if not self.up:
                c.close()
                continue
            u = socket.create_connection(self.target)
            self._conns += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def cut(self) -> None:
        self.up = False
        for s in self._conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self._conns.clear()

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self._lsock.close()
        self.cut()


@pytest.mark.postgres
def test_store_cut_mid_run_then_back_loses_no_record(upstream, tmp_path, pg_database):
    from urllib.parse import urlsplit, urlunsplit

    dsn = pg_schema_dsn(pg_database)
    parts = urlsplit(dsn)
    proxy = _Proxy((parts.hostname, parts.port or 5432))
    proxied = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
    try:
        upstream.script = lambda b: Reply(text="a b c d e f g h", chunk_delay=0.05)
        proc, url = _start_gateway(tmp_path, upstream.url, proxied)
        # A first wave while the store is up, so the writer has a live connection to lose.
        assert asyncio.run(_load(url, 4)) == [200] * 4
        time.sleep(0.5)
        proxy.cut()
        n = 30
        statuses: list[int] = []
        t = threading.Thread(target=lambda: statuses.extend(asyncio.run(_load(url, n))))
        t.start()
        t.join(60)
        time.sleep(0.5)  # the writer fails: the records wait in the journal
        assert journal_lines(tmp_path / "journal") >= n
        proxy.restore()
        time.sleep(4)  # the writer retries (every 2 s) and stores them
        _sigterm(proc)
    finally:
        proxy.close()
    assert statuses == [200] * n
    with open_store(dsn) as store:
        recs = list(store.iter_records())
    assert len(recs) == n + 4
    assert len({r.request_id for r in recs}) == n + 4
    assert not (tmp_path / "journal").exists()  # everything stored: nothing left behind


def journal_lines(journal: Path) -> int:
    """Records in a journal directory (every slot, every segment)."""
    return sum(p.read_bytes().count(b"\n") for p in journal.glob("*/*.jsonl"))


def test_journal_left_at_exit_is_stored_on_next_start(upstream, tmp_path):
    """Store unreachable for a whole run: the records stay in the journal; the next
    start stores them."""
    dead = "postgresql://postgres@127.0.0.1:9/nowhere?connect_timeout=1"
    proc, url = _start_gateway(tmp_path, upstream.url, dead)
    assert asyncio.run(_load(url, 6)) == [200] * 6
    _sigterm(proc)
    assert journal_lines(tmp_path / "journal") == 6
    dsn = f"sqlite:///{tmp_path / 'r.db'}"
    proc, url = _start_gateway(tmp_path, upstream.url, dsn)
    time.sleep(1)
    _sigterm(proc)
    with open_store(dsn) as store:
        assert store.count() == 6


os.environ.setdefault("PYTHONUNBUFFERED", "1")


def test_several_workers_serve_and_stop_cleanly(upstream, tmp_path):
    """`serve --workers 2`: both processes serve, SIGTERM drains them, no record is lost."""
    dsn = f"sqlite:///{tmp_path / 'r.db'}"
    upstream.script = lambda b: Reply(text="a b c", chunk_delay=0.02)
    proc, url = _start_gateway(tmp_path, upstream.url, dsn, "--workers", "2")
    n = 24
    assert asyncio.run(_load(url, n)) == [200] * n
    out = _sigterm(proc)
    with open_store(dsn) as store:
        assert store.count() == n, out


def test_a_lock_held_past_its_timeout_before_sigterm_loses_no_record(upstream, tmp_path):
    """Another writer holds the SQLite file past lock_timeout, so both workers' batches
    fail, and the lock is let go just before SIGTERM: the drain tries the store once more
    and stores every record, instead of leaving them in the journal for the next start."""
    dsn = f"sqlite:///{tmp_path / 'r.db'}"
    upstream.script = lambda b: Reply(text="a b c")
    with open_store(dsn) as store:
        store.migrate()
    proc, url = _start_gateway(tmp_path, upstream.url, dsn, "--workers", "2")
    assert asyncio.run(_load(url, 4)) == [200] * 4
    con = sqlite3.connect(tmp_path / "r.db", isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        assert asyncio.run(_load(url, 20)) == [200] * 20
        time.sleep(2.5)  # past the store's lock_timeout (2 s): the batches fail
    finally:
        con.execute("COMMIT")
        con.close()
    out = _sigterm(proc)
    assert "database is locked" in out  # the batches did fail
    with open_store(dsn) as store:
        assert store.count() == 24, out
