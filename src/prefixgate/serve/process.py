"""Running ASGI apps: in a background thread (tests, demo, benchmarks) or in the current
event loop (the CLI), on the project's own HTTP server (``httpserver``) or on uvicorn (the
simulated upstreams, and ``serve --http uvicorn``), both with the bounded edge
(``edge.py``); the open-file limit a server starts with."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import os
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable, Coroutine

import uvicorn

from prefixgate.serve import httpserver
from prefixgate.serve.edge import Edge, EdgeLimits
from prefixgate.serve.uvicorn_edge import EdgeHttpToolsProtocol

# File descriptors kept for what is not a client connection: the listening sockets, the
# store, logs, the embedded upstream. Each client connection may hold one upstream
# connection too, and the refused ones over the cap (a tenth more) one each.
_FD_RESERVE = 128
_FDS_PER_CONNECTION = 2.1

# The collector's first-generation threshold for a serving process (Python's default is
# 700). A decoded 50 KB agent request is thousands of dicts and lists: with the default the
# collector runs several times a request and its older generations grow with every batch
# of requests in flight (docs/performance.md).
GC_THRESHOLD = (50_000, 20, 100)


def run(main: Coroutine):
    """Run ``main`` to completion on uvloop; on the standard asyncio loop when uvloop is
    missing (docs/performance.md).

    Also tunes the garbage collector for serving: a higher first threshold here, and
    ``gc.freeze()`` once the server has started (``http_server``), so that the objects
    of the imports and the app's construction are never scanned again."""
    gc.set_threshold(*GC_THRESHOLD)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        return asyncio.run(main)
    return uvloop.run(main)


def bind(
    host: str = "127.0.0.1", port: int = 0, *, reuse_port: bool = False, listen: bool = True
) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP (not 0) so that asyncio sets TCP_NODELAY on accepted connections:
    # without it a small write after the headers waits ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(httpserver.BACKLOG)
    sock.setblocking(False)
    return sock


def run_workers(
    workers: int, host: str, port: int, serve: Callable[[socket.socket, int], None]
) -> int:
    """Serve with ``workers`` processes, each its own event loop and its own listening
    socket on the same port (SO_REUSEPORT: the kernel spreads connections over them).
    ``serve(sock, index)`` runs in each forked child. The parent forwards SIGTERM/SIGINT/SIGHUP
    to the children and returns the first non-zero exit status (0 when all stop cleanly).

    Each worker is a whole gateway: in-memory state (the prefix router's LRU, in-flight
    counts, local rate limits, an embedded simulated upstream) is per process."""
    # Bound but not listening: reserves the port (also an ephemeral one) for the group
    # without taking connections itself.
    anchor = bind(host, port, reuse_port=True, listen=False)
    port = anchor.getsockname()[1]
    children: list[int] = []
    # A SIGHUP (a reload) before a worker's loop handles it must not kill it: ignored
    # until then (the worker's own handler replaces this), forwarded by the parent.
    hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    for i in range(workers):
        pid = os.fork()
        if pid == 0:  # the child: a gateway of its own
            code = 0
            try:
                anchor.close()
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                serve(bind(host, port, reuse_port=True), i)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        children.append(pid)

    def forward(signum, _frame) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    previous = {
        s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    }
    previous[signal.SIGHUP] = hup
    status = 0
    try:
        for child in children:
            while True:
                try:
                    _, st = os.waitpid(child, 0)
                    break
                except InterruptedError:  # pragma: no cover - PEP 475 retries
                    continue
            code = os.waitstatus_to_exitcode(st)
            if code and not status:
                status = code if code > 0 else 128 - code
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        anchor.close()
    return status


class Server(uvicorn.Server):
    """uvicorn's server with the bounded edge (``uvicorn_edge``); a graceful stop on
    SIGTERM/SIGINT exits with status 0 instead of re-raising the signal once the drain is
    done."""

    edge: Edge | None = None
    on_started: Callable[[], None] | None = None

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if self.edge is not None:
            self.edge.start(asyncio.get_running_loop())
        _freeze_gc()
        if self.started and self.on_started is not None:
            self.on_started()

    async def shutdown(self, sockets=None) -> None:
        try:
            await super().shutdown(sockets=sockets)
        finally:
            if self.edge is not None:
                await self.edge.stop()

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            yield
            self._captured_signals.clear()


def uvicorn_server(
    app,
    *,
    log_level: str = "warning",
    edge: EdgeLimits | None = None,
    refusal=None,
    max_header_bytes: int = 1024 * 1024,
    on_started: Callable[[], None] | None = None,
    **kw,
) -> Server:
    limits = edge or EdgeLimits()
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=kw.pop("graceful", 5),
        timeout_keep_alive=limits.keepalive,
        backlog=httpserver.BACKLOG,
        **kw,
    )
    server = Server(config)
    server.edge = Edge(limits, refusal, server.server_state.connections)
    server.on_started = on_started
    # The request target counts in the head's bound, as in the own server (64 KiB of it).
    config.http = functools.partial(
        EdgeHttpToolsProtocol, edge=server.edge, max_head_bytes=max_header_bytes + 64 * 1024
    )
    return server


def raise_open_files() -> tuple[int, int]:
    """The soft open-file limit raised to the hard one (a gateway holds two descriptors a
    connection: the client's and the upstream's); returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def connection_cap(configured: int, open_files: int) -> int:
    """The connection cap in force: the configured one, lowered to what ``open_files``
    descriptors can serve without running out (EMFILE) on the upstream side."""
    return min(configured, max(16, int((open_files - _FD_RESERVE) / _FDS_PER_CONNECTION)))


def _freeze_gc() -> None:
    """Once started: everything that exists now (imports, the app) leaves the collector's
    sight, in a serving process (``run``), not in a test."""
    if gc.get_threshold() == GC_THRESHOLD:
        gc.collect()
        gc.freeze()


def http_server(app, *, on_started: Callable[[], None] | None = None, **kw) -> httpserver.Server:
    """The gateway's own HTTP server (``httpserver``) for ``app``; ``kw`` are its
    settings (graceful, max_body, max_header_bytes, busy polling, edge, refusal)."""

    def started() -> None:
        _freeze_gc()
        if on_started is not None:
            on_started()

    return httpserver.Server(app, on_started=started, **kw)


class ServerThread:
    """``with ServerThread(app) as s: s.url`` — the app served on a loopback port."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, **kw) -> None:
        self.sock = bind(host, port)
        self.host, self.port = self.sock.getsockname()[:2]
        self.server = http_server(app, **kw)
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
