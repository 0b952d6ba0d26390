"""A real ``prefixgate serve`` process for the tests of the edge and of the command: its
config written to a file, its output kept, started and stopped as an operator would."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import yaml

SIM_CHANNEL = {"name": "sim", "base_url": "http://127.0.0.1:1/v1"}  # replaced by the embedded


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """``prefixgate serve`` with ``config`` (a dict; the embedded simulated upstream unless
    it names channels) and ``args``; ``output`` once stopped."""

    def __init__(self, tmp_path: Path, config: dict | None = None, *args: str) -> None:
        self.port = free_port()
        cfg = {"embedded_upstream": True, "channels": [SIM_CHANNEL], "store": None}
        cfg.update(config or {})
        cfg["server"] = {"host": "127.0.0.1", "port": self.port, **cfg.get("server", {})}
        path = tmp_path / f"gw-{self.port}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        self.log = tmp_path / f"gw-{self.port}.log"
        self._out = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prefixgate.cli", "serve", "--config", str(path), *args],
            cwd=tmp_path,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self.returncode: int | None = None

    def wait_ready(self, timeout: float = 60) -> Served:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}: {self.output}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop(signal.SIGKILL)
        raise AssertionError("serve did not start: " + self.output)

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()
        self.returncode = self.proc.returncode
        return self.returncode

    def __enter__(self) -> Served:
        return self.wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_for(cond, what: str, limit: float = 120.0):
    """``cond()``'s first true value, polled; a guard against a hang, not a measurement."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"never: {what}")


async def held_streams(url: str, bodies: list[dict], opened: threading.Event) -> list:
    """One chat stream per body, concurrently, each on its own connection; ``opened`` is
    set once every stream has its first bytes. Each stream's (bytes, request id)."""
    n, count = len(bodies), 0
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=300) as client:

        async def one(body: dict) -> tuple[bytes, str]:
            nonlocal count
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200, await r.aread()
                got = b""
                async for part in r.aiter_raw():
                    if not got:
                        count += 1
                        if count == n:
                            opened.set()
                    got += part
                return got, r.headers["x-request-id"]

        return await asyncio.gather(*(one(b) for b in bodies))
