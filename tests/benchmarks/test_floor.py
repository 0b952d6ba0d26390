"""The benchmark's floor proxy (benchmarks/overhead_floor.py) relays answers byte for
byte, one-shot and streamed, or the floor it reports would be a floor of something else."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str) -> None:
    for _ in range(300):
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            subprocess.run(["sleep", "0.05"], check=False)
    raise AssertionError(f"{url} did not come up")


@pytest.fixture(scope="module")
def ports():
    up, floor = _port(), _port()
    procs = [
        subprocess.Popen([sys.executable, str(BENCH / "overhead_upstream.py"), "--port", str(up)])
    ]
    try:
        _wait(f"http://127.0.0.1:{up}/health")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(BENCH / "overhead_floor.py"),
                    "--port",
                    str(floor),
                    "--upstream-port",
                    str(up),
                    "--busy-poll-us",
                    "200",
                ]
            )
        )
        _wait(f"http://127.0.0.1:{floor}/health")
        yield up, floor
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


@pytest.mark.parametrize("model", ["fake", "fake-long"])
@pytest.mark.parametrize("stream", [False, True])
def test_floor_relays_the_upstream_answer_verbatim(ports, stream, model):
    up, floor = ports
    body = {
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": "x" * 60_000}],
    }
    with httpx.Client(timeout=10) as c:
        direct = c.post(f"http://127.0.0.1:{up}/v1/chat/completions", json=body)
        # Several on one kept-alive connection, a Messages path among them.
        for path in ("/v1/chat/completions", "/v1/messages", "/v1/chat/completions"):
            via = c.post(f"http://127.0.0.1:{floor}{path}", json=body)
            assert via.status_code == direct.status_code == 200
            assert via.content == direct.content
            assert len(via.content) > (2000 if stream and model == "fake-long" else 100)
