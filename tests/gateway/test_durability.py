"""A record is durable once its answer is complete: the real ``prefixgate serve`` process
killed with SIGKILL under concurrent load (SQLite and Postgres), stopped with SIGTERM while
another session holds the Postgres table locked, and running while the store is down and
then back. Every request that got a complete answer has exactly one record."""

from __future__ import annotations

import asyncio
import collections
import signal
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest

from prefixgate.store import open_store
from tests.conftest import pg_schema_dsn
from tests.fakes import Reply
from tests.gateway.test_recording import (
    MSG,
    _free_port,
    _Proxy,
    _sigterm,
    _start_gateway,
    journal_lines,
)


async def _load(url: str, n: int, concurrency: int, done: list[str], tag: str = "s") -> None:
    """``n`` requests, half Messages streams and half chat answers, each with its own
    session id; the ids of the answers that arrived complete go into ``done``. Requests
    the gateway's death cuts off are not complete."""
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> None:
            sid = f"{tag}-{i:05d}"
            async with gate:
                try:
                    if i % 2:
                        r = await client.post(
                            url + "/v1/messages",
                            json={**MSG, "stream": True},
                            headers={"x-claude-code-session-id": sid},
                        )
                        complete = r.status_code == 200 and "event: message_stop" in r.text
                    else:
                        r = await client.post(
                            url + "/v1/chat/completions",
                            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                            headers={"x-session-id": sid},
                        )
                        complete = r.status_code == 200 and bool(r.json()["choices"])
                except (httpx.HTTPError, ValueError):
                    return
            if complete:
                done.append(sid)

        await asyncio.gather(*(one(i) for i in range(n)))


def _in_background(url: str, n: int, concurrency: int) -> tuple[threading.Thread, list[str]]:
    done: list[str] = []
    t = threading.Thread(target=lambda: asyncio.run(_load(url, n, concurrency, done)))
    t.start()
    return t, done


def _sessions(dsn: str) -> collections.Counter[str]:
    with open_store(dsn) as store:
        return collections.Counter(r.session_id for r in store.iter_records())


def _until_stored(dsn: str, sessions: list[str], limit: float = 120.0) -> None:
    """Poll the store until it holds every session (a generous limit, not a timing goal)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            if set(sessions) <= set(_sessions(dsn)):
                return
        except Exception:  # the schema may not be there yet
            pass
        assert time.monotonic() < deadline, "the records never reached the store"
        time.sleep(0.2)


def _store_dsn(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'r.db'}"
    return pg_schema_dsn(request.getfixturevalue("pg_database"))


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_sigkill_under_load_loses_no_completed_record(upstream, tmp_path, backend, request):
    dsn = _store_dsn(backend, tmp_path, request)
    upstream.script = lambda b: Reply(text="a b c d e f g h", chunk_delay=0.005)
    proc, url = _start_gateway(tmp_path, upstream.url, dsn)
    n = 600
    t, done = _in_background(url, n, 32)
    deadline = time.monotonic() + 60
    while len(done) < n // 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)  # mid-load: 32 requests in flight
    proc.wait(60)
    proc.stdout.close()
    t.join(120)
    assert n // 3 <= len(done) < n
    # The next start stores what the killed process had journaled.
    proc, url = _start_gateway(tmp_path, upstream.url, dsn)
    _until_stored(dsn, done)
    _sigterm(proc)
    stored = _sessions(dsn)
    assert all(stored[sid] == 1 for sid in done)  # exactly one record per complete answer
    assert max(stored.values()) == 1
    assert not (tmp_path / "journal").exists()


@pytest.mark.postgres
def test_locked_table_then_sigterm_exits_and_nothing_is_lost(upstream, tmp_path, pg_database):
    """Another session holds the requests table (ACCESS EXCLUSIVE) while requests flow:
    the writer's statements fail after the lock timeout and the records wait in the
    journal; SIGTERM ends the process while the lock is still held; once it is released
    the next start stores every record."""
    dsn = pg_schema_dsn(pg_database)
    upstream.script = lambda b: Reply(text="a b c d", chunk_delay=0.005)
    proc, url = _start_gateway(tmp_path, upstream.url, dsn)
    first: list[str] = []
    asyncio.run(_load(url, 10, 4, first))
    _until_stored(dsn, first)
    holder = psycopg.connect(dsn)
    try:
        holder.execute("LOCK TABLE requests IN ACCESS EXCLUSIVE MODE")
        done: list[str] = []
        asyncio.run(_load(url, 200, 16, done, tag="locked"))
        assert len(done) == 200  # the answers never wait for the store
        assert journal_lines(tmp_path / "journal") >= 200
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(120)  # a shutdown waiting on the lock would never end
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        finally:
            out = proc.stdout.read().decode()
            proc.stdout.close()
        assert rc == 0, out
        assert holder.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert "records wait in the journal" in out
    finally:
        holder.rollback()
        holder.close()
    proc, url = _start_gateway(tmp_path, upstream.url, dsn)
    _until_stored(dsn, first + done)
    _sigterm(proc)
    stored = _sessions(dsn)
    assert sorted(stored) == sorted(first + done) and max(stored.values()) == 1


@pytest.mark.postgres
def test_store_down_then_back_stores_everything_without_a_restart(upstream, tmp_path, pg_database):
    """The store's address refuses connections (nothing listens there) while requests
    flow; then the store comes back at that address and the running gateway stores the
    records it journaled meanwhile."""
    dsn = pg_schema_dsn(pg_database)
    parts = urlsplit(dsn)
    port = _free_port()  # nothing listens here yet
    down = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}"))
    upstream.script = lambda b: Reply(text="a b c d", chunk_delay=0.005)
    proc, url = _start_gateway(tmp_path, upstream.url, down)
    done: list[str] = []
    asyncio.run(_load(url, 100, 16, done))
    assert len(done) == 100
    time.sleep(1)  # the writer tries the store and fails
    assert journal_lines(tmp_path / "journal") == 100
    proxy = _Proxy((parts.hostname, parts.port or 5432), port=port)  # the store is back
    try:
        _until_stored(dsn, done)
        _sigterm(proc)
    finally:
        proxy.close()
    stored = _sessions(dsn)
    assert sorted(stored) == sorted(done) and max(stored.values()) == 1
    assert not (tmp_path / "journal").exists()
