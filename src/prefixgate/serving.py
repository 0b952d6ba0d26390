"""Running ASGI apps on loopback: in a background thread (tests, demo, benchmarks) or in
the current event loop (the CLI)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

import uvicorn


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP (not 0) so that asyncio sets TCP_NODELAY on accepted connections:
    # without it a small write after the headers waits ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class Server(uvicorn.Server):
    """uvicorn's server, but a graceful stop on SIGTERM/SIGINT exits with status 0 instead
    of re-raising the signal once the drain is done."""

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            yield
            self._captured_signals.clear()


def uvicorn_server(app, *, log_level: str = "warning", **kw) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=kw.pop("graceful", 5),
        **kw,
    )
    return Server(config)


class ServerThread:
    """``with ServerThread(app) as s: s.url`` — the app served on a loopback port."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, **kw) -> None:
        self.sock = bind(host, port)
        self.host, self.port = self.sock.getsockname()[:2]
        self.server = uvicorn_server(app, **kw)
        self.server.config.setup_event_loop = lambda: None  # type: ignore[method-assign]
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"asgi:{self.port}")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def start(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
