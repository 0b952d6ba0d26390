"""The rows of the reliability benchmark about whom an error blames (run them with
``reliability.py``), against real ``prefixgate serve`` and ``prefixgate upstream-sim``
processes:

- ``unknown_model``: requests naming a model the upstream does not serve, on a channel of
  two replicas that accepts any model: each answered 404 ``not_found_error`` (as Anthropic
  does), sent upstream once (no retry), and both replicas still serve the next requests.
- ``garbage_first_event``: a replica whose stream starts with an event that is not JSON,
  ahead of a healthy one: every stream fails over before its first byte and completes.
- ``upstream_down_log``: an upstream that refuses connections under a burst of requests:
  the log's lines about it, against one line per failed request before.
- ``request_id``: every answer, success or error, names its record.
- ``start_report``: ``serve`` against an upstream URL without ``/v1`` and against a dead
  one: what it says at start.
- ``dashboard_login``: the admin key only in a POST form; the cookie a random token.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as ov  # noqa: E402

MSG = {"model": "llm", "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}


def row(case: str, result: str, goal: str, met: bool) -> dict:
    return {"case": case, "result": result, "goal": goal, "met": bool(met)}


@contextlib.contextmanager
def upstream_sim(replicas: int = 1):
    port = ov.free_port() if replicas == 1 else _free_ports(replicas)
    cmd = [sys.executable, "-m", "prefixgate.cli", "upstream-sim", "--port", str(port)]
    cmd += ["--replicas", str(replicas), "--model", "llm", "--strict-models"]
    cmd += ["--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    urls = [f"http://127.0.0.1:{port + i}" for i in range(replicas)]
    try:
        for url in urls:
            ov.wait_http(url + "/v1/models", proc)
        yield urls
    finally:
        ov.stop(proc)


def _free_ports(n: int) -> int:
    """A first port with ``n - 1`` free ones after it."""
    for _ in range(50):
        first = ov.free_port()
        with contextlib.ExitStack() as stack:
            try:
                for i in range(1, n):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", first + i))
            except OSError:
                continue
            return first
    raise RuntimeError("no run of free ports")


@contextlib.contextmanager
def gateway(work: Path, channels: list[dict], **top):
    """``prefixgate serve`` with these channels (and no store unless given); its log in
    ``work``."""
    port = ov.free_port()
    cfg = {"server": {"host": "127.0.0.1", "port": port}, "channels": channels, "store": None}
    cfg.update(top)
    path = work / f"gw-{port}.json"
    path.write_text(json.dumps(cfg))
    log = work / f"gw-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefixgate.cli", "serve", "--config", str(path)],
            cwd=work,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        ov.wait_http(url + "/healthz", proc)
        yield url, log
    finally:
        ov.stop(proc)


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def unknown_model(args) -> dict:
    n = args.typos
    with tempfile.TemporaryDirectory() as tmp, upstream_sim(replicas=2) as urls:
        channel = {
            "name": "vllm",
            "base_url": urls[0] + "/v1",
            "replicas": [urls[1] + "/v1"],
            "routing": {"policy": "session"},
        }
        with gateway(Path(tmp), [channel]) as (url, _), httpx.Client(timeout=30) as client:
            statuses = []
            for i in range(n):
                r = client.post(
                    url + "/v1/messages",
                    json={**MSG, "model": "llm-typo"},
                    headers={"x-session-id": f"typo-{i}"},
                )
                statuses.append((r.status_code, r.json()["error"]["type"]))
            before = [
                _metric(client.get(u + "/metrics").text, "vllm:request_success_total") for u in urls
            ]
            ok = [
                client.post(
                    url + "/v1/messages", json=MSG, headers={"x-session-id": f"next-{i}"}
                ).status_code
                for i in range(n)
            ]
            after = [
                _metric(client.get(u + "/metrics").text, "vllm:request_success_total") for u in urls
            ]
            failovers = _metric(client.get(url + "/metrics").text, "prefixgate_failovers_total")
    served = [a - b for a, b in zip(after, before, strict=True)]
    right = sum(s == (404, "not_found_error") for s in statuses)
    met = right == n and failovers == 0 and all(s > 0 for s in served) and ok == [200] * n
    return row(
        "unknown_model",
        f"{right} of {n} typos answered 404 not_found_error; {failovers:g} failovers; "
        f"the next {n} requests: {ok.count(200)} × 200, served by the replicas as {served}",
        "every typo 404 not_found_error, never retried, no replica ejected",
        met,
    )


class GarbageUpstream:
    """A replica whose streams begin with an event that is not JSON."""

    def __init__(self) -> None:
        self.port = ov.free_port()
        self.requests = 0

    async def _serve(self, reader, writer) -> None:
        with contextlib.suppress(ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
                await reader.readexactly(length)
                self.requests += 1
                body = b"data: <html>502 Bad Gateway</html>\n\n"
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    + b"content-length: %d\r\n\r\n" % len(body)
                    + body
                )
                await writer.drain()
        writer.close()

    def run(self, stop: asyncio.Event):
        async def main():
            server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
            async with server:
                await stop.wait()

        return main()


def garbage_first_event(args) -> dict:
    import threading

    n = args.streams_small
    bad = GarbageUpstream()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=lambda: loop.run_until_complete(bad.run(stop)), daemon=True)
    thread.start()
    time.sleep(0.3)
    try:
        with tempfile.TemporaryDirectory() as tmp, upstream_sim() as urls:
            channels = [
                {"name": "bad", "base_url": f"http://127.0.0.1:{bad.port}/v1", "priority": 2},
                {"name": "good", "base_url": urls[0] + "/v1", "priority": 1},
            ]
            with gateway(Path(tmp), channels) as (url, _), httpx.Client(timeout=30) as client:
                complete = 0
                for _ in range(n):
                    r = client.post(url + "/v1/messages", json={**MSG, "stream": True})
                    complete += r.status_code == 200 and "event: message_stop" in r.text
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(5)
    return row(
        "garbage_first_event",
        f"{complete} of {n} streams complete (the garbage replica was tried {bad.requests} "
        "times, then ejected for its cool-down)",
        "every stream fails over before its first byte and completes",
        complete == n and bad.requests >= 1,
    )


def upstream_down_log(args) -> dict:
    n = args.burst
    dead = f"http://127.0.0.1:{ov.free_port()}/v1"  # nothing listens there
    with tempfile.TemporaryDirectory() as tmp:
        with gateway(Path(tmp), [{"name": "dead", "base_url": dead}]) as (url, log):

            async def burst():
                async with httpx.AsyncClient(timeout=30) as client:
                    sem = asyncio.Semaphore(16)

                    async def one():
                        async with sem:
                            return (await client.post(url + "/v1/messages", json=MSG)).status_code

                    return await asyncio.gather(*(one() for _ in range(n)))

            t0 = time.monotonic()
            statuses = asyncio.run(burst())
            seconds = time.monotonic() - t0
            time.sleep(0.5)
            lines = [
                line
                for line in Path(log).read_text(errors="replace").splitlines()
                if "failed: cannot reach upstream" in line
            ]
    per_interval = len(lines) / max(1.0, seconds / 10.0)
    return row(
        "upstream_down_log",
        f"{statuses.count(502)} of {n} requests answered 502 in {seconds:.1f} s; "
        f"{len(lines)} log lines about the dead upstream",
        "one line per 10 s interval with a count, not one per request",
        statuses.count(502) == n and per_interval <= 2,
    )


def request_id(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp, upstream_sim() as urls:
        channel = {"name": "sim", "base_url": urls[0] + "/v1"}
        with gateway(Path(tmp), [channel]) as (url, _), httpx.Client(timeout=30) as client:
            answers = [
                ("request-id", client.post(url + "/v1/messages", json=MSG)),
                ("request-id", client.post(url + "/v1/messages", json={**MSG, "stream": True})),
                ("request-id", client.post(url + "/v1/messages", json={"model": "llm"})),
                (
                    "x-request-id",
                    client.post(
                        url + "/v1/chat/completions",
                        json={"model": "llm", "messages": MSG["messages"]},
                    ),
                ),
                ("x-request-id", client.post(url + "/v1/chat/completions", json={})),
            ]
    named = sum(bool(re.fullmatch(r"[0-9a-f]{32}", r.headers.get(h, ""))) for h, r in answers)
    return row(
        "request_id",
        f"{named} of {len(answers)} answers (successes, a stream, errors) carry their record's id",
        "every answer",
        named == len(answers),
    )


def start_report(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp, upstream_sim() as urls:
        dead = f"http://127.0.0.1:{ov.free_port()}/v1"
        channels = [{"name": "novone", "base_url": urls[0]}, {"name": "dead", "base_url": dead}]
        with gateway(Path(tmp), channels) as (url, log):
            time.sleep(0.5)
            out = Path(log).read_text(errors="replace")
    said = {
        "listening URL": url in out,
        "a hint for the URL without /v1": f"use {urls[0]}/v1" in out,
        "a warning for the dead upstream": f"{dead}: WARNING" in out,
        "the open-file limit": "open files" in out,
    }
    return row(
        "start_report",
        "; ".join(f"{what}: {'said' if ok else 'MISSING'}" for what, ok in said.items()),
        "each said at start, one line each, no traceback",
        all(said.values()) and "Traceback" not in out,
    )


def dashboard_login(args) -> dict:
    key = "pg-admin-" + "x" * 24
    digest = hashlib.sha256(key.encode()).hexdigest()
    with tempfile.TemporaryDirectory() as tmp, upstream_sim() as urls:
        store = {"dsn": f"sqlite:///{tmp}/records.db"}
        channels = [{"name": "sim", "base_url": urls[0] + "/v1"}]
        with (
            gateway(Path(tmp), channels, store=store, admin_key_sha256=digest) as (url, log),
            httpx.Client(timeout=30) as client,
        ):
            in_url = client.get(url + "/dashboard", params={"key": key}).status_code
            login = client.post(
                url + "/dashboard/login",
                data={"key": key},
                headers={"origin": url},
                follow_redirects=False,
            )
            cookie = login.cookies.get("prefixgate_session", "")
            page = client.get(url + "/dashboard", cookies={"prefixgate_session": cookie})
            logged = Path(log).read_text(errors="replace")
    ok = (
        in_url == 400
        and login.status_code == 303
        and len(cookie) >= 32
        and key not in cookie
        and page.status_code == 200
        and key not in logged
    )
    return row(
        "dashboard_login",
        f"?key= in the URL: {in_url}; POST form: {login.status_code} with a "
        f"{len(cookie)}-character session token (not the key); the page with it: "
        f"{page.status_code}; the key in the log: {'yes' if key in logged else 'no'}",
        "the key only in a POST body, never in a URL or the cookie",
        ok,
    )


CASES: dict[str, Callable[[argparse.Namespace], dict]] = {
    "unknown_model": unknown_model,
    "garbage_first_event": garbage_first_event,
    "upstream_down_log": upstream_down_log,
    "request_id": request_id,
    "start_report": start_report,
    "dashboard_login": dashboard_login,
}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--typos", type=int, default=20, help="requests with a mistyped model")
    ap.add_argument("--streams-small", type=int, default=20, help="streams of garbage_first_event")
    ap.add_argument("--burst", type=int, default=2000, help="requests to a dead upstream")
