"""An upgrade without a dropped request: two real ``prefixgate serve`` processes on one
port (SO_REUSEPORT). The old one carries 200 streams; the new one starts on the same port;
the old one gets SIGTERM while new requests keep arriving, hands the port over
(``serve/handover.py``), drains its streams to their end and exits 0. No client sees a
refused connection, a reset or a cut stream, and every request has exactly one record."""

from __future__ import annotations

import asyncio
import json
import signal
import threading

import httpx

from prefixgate.serve import handover
from prefixgate.store import open_store
from tests.conftest import scripted_upstream
from tests.fakes import Reply
from tests.serve.served import Served, free_port, held_streams, wait_for

STREAMS = 200
WORDS = [f"w{i:02d} " for i in range(8)]


def _body(i: int, stream: bool = True) -> dict:
    return {"model": "m", "stream": stream, "messages": [{"role": "user", "content": f"t{i}"}]}


def _text(body: bytes) -> str:
    """The content a chat stream carried."""
    out = []
    for line in body.decode().split("\n"):
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                out.append(choice["delta"].get("content") or "")
    return "".join(out)


class NewRequests:
    """Requests arriving all through the switch, from a thread of its own: ``FRESH`` loops
    on a new connection each time (many connections a second, so that some always wait in
    an accept queue) and ``KEPT`` on kept-alive ones. Every outcome is kept: the request ids
    answered, and every error (a refused connection, a reset, a cut answer, a non-200)."""

    FRESH, KEPT = 32, 4

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.ids: list[str] = []
        self.errors: list[str] = []
        self.thread = threading.Thread(target=lambda: asyncio.run(self._all()))

    async def _all(self) -> None:
        fresh = httpx.AsyncClient(
            timeout=60, limits=httpx.Limits(max_connections=None, max_keepalive_connections=0)
        )
        kept = httpx.AsyncClient(timeout=60)
        async with fresh, kept:
            loops = [self._loop(fresh) for _ in range(self.FRESH)]
            loops += [self._loop(kept) for _ in range(self.KEPT)]
            await asyncio.gather(*loops)

    async def _loop(self, client: httpx.AsyncClient) -> None:
        i = 0
        while not self.stop.is_set():
            i += 1
            try:
                r = await client.post(self.url + "/v1/chat/completions", json=_body(i, False))
                if r.status_code != 200:
                    self.errors.append(f"{r.status_code} {r.text[:100]}")
                else:
                    self.ids.append(r.headers["x-request-id"])
            except httpx.HTTPError as exc:
                self.errors.append(repr(exc))

    def __enter__(self) -> NewRequests:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(60)


def test_an_upgrade_under_200_streams_drops_nothing(tmp_path):
    hold = threading.Event()

    def script(body: dict) -> Reply:
        task = body["messages"][0]["content"]
        if not body.get("stream"):
            return Reply(text=f"short {task}")
        deltas = [{"role": "assistant", "content": ""}] + [
            {"content": f"{task} {w}"} for w in WORDS
        ]
        return Reply(deltas=deltas, hold=hold)

    port = free_port()
    dsn = f"sqlite:///{tmp_path / 'records.db'}"
    with scripted_upstream() as up:
        up.script = script
        cfg = {
            "embedded_upstream": False,
            "channels": [{"name": "main", "base_url": up.url, "render_order": "tools_first"}],
            "store": {"dsn": dsn, "journal_path": str(tmp_path / "journal")},
            # No load shedding: on this shared machine a late loop would answer some new
            # requests 503 (overloaded, retry-after), which is admission, not the switch.
            "server": {
                "port": port,
                "max_connections": 2000,
                "drain_timeout": 120,
                "shed_loop_lag": None,
            },
        }
        for d in ("old", "new"):
            (tmp_path / d).mkdir()
        old = Served(tmp_path / "old", cfg, "--pid-file", str(tmp_path / "old.pid"))
        url = old.url = f"http://127.0.0.1:{port}"
        new = None
        with old:
            opened = threading.Event()
            streams: list = []
            runner = threading.Thread(
                target=lambda: streams.extend(
                    asyncio.run(held_streams(url, [_body(i) for i in range(STREAMS)], opened))
                )
            )
            runner.start()
            wait_for(opened.is_set, "200 streams open on the old process")
            with NewRequests(url) as arriving:
                new = Served(tmp_path / "new", cfg, "--pid-file", str(tmp_path / "new.pid"))
                wait_for((tmp_path / "new.pid").exists, "the new process serves the port")
                before = len(arriving.ids)
                old.proc.send_signal(signal.SIGTERM)
                wait_for(lambda: "no longer accepting" in old.output, "the old one let go")
                wait_for(lambda: len(arriving.ids) > before + 50, "new requests after it")
            hold.set()  # the old process's streams may end now
            runner.join(300)
            assert old.proc.wait(300) == 0, old.output
        try:
            r = httpx.post(url + "/v1/chat/completions", json=_body(0, False))
            assert r.status_code == 200
            arriving.ids.append(r.headers["x-request-id"])
        finally:
            new.stop()
    assert old.returncode == 0 and new.returncode == 0, new.output
    assert arriving.errors == []  # no refused connection, no reset, no error answer
    assert len(streams) == STREAMS
    for i, (body, _) in enumerate(streams):
        assert body.endswith(b"data: [DONE]\n\n"), f"stream {i} was cut"
        assert _text(body) == "".join(f"t{i} {w}" for w in WORDS)
    ids = [rid for _, rid in streams] + arriving.ids
    with open_store(dsn) as store:
        recorded = [r.request_id for r in store.iter_records()]
    assert sorted(recorded) == sorted(ids)  # each request recorded once, by one of the two


def test_the_steering_program_picks_a_successor_socket():
    assert handover.program(2, 1) == [(0x06, 0, 0, 2)]  # return 2: the first after ours
    ld, mod, add, ret = handover.program(1, 3)
    assert ld[0] == 0x20 and ld[3] == 0xFFFFF000 + 56  # A = a random u32
    assert mod == (0x94, 0, 0, 3) and add == (0x04, 0, 0, 1) and ret == (0x16, 0, 0, 0)
