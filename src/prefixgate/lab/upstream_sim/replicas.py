"""``prefixgate upstream-sim``: an OpenAI-compatible server whose prefix cache IS the model.

Each app holds one :class:`~prefixgate.cache.PrefixCache` (``app.state.cache``). A chat
request is rendered (``ChatRenderer`` or a real Jinja chat template), tokenized, and run
through the cache as vLLM runs it: ``begin`` when scheduled (the hit becomes
``usage.prompt_tokens_details.cached_tokens``), the lease held while the request
"runs", ``end`` with the generated token ids when it finishes or is cancelled.

Modules: :mod:`.settings` (``SimSettings``), :mod:`.app` (routes and the request
pipeline), :mod:`.replies` (parsing, planning, vLLM wire shapes), :mod:`.textgen`
(deterministic text and schema-built arguments), :mod:`.vllm_metrics` (Prometheus text); this
module is the public face and runs replicas (in a thread for tests, or in the current
event loop for the CLI).

Output behaviour:

- Text is deterministic: seeded by ``SimSettings.seed`` and the prompt tokens' hash.
  ``completion_tokens = min(max_tokens, default_output_tokens)``; with ``ignore_eos``
  exactly ``max_tokens`` (``default_output_tokens`` when no ``max_tokens``).
  ``finish_reason`` is ``length`` when the limit cut the output, else ``stop``.
- ``stop`` strings cut the text; ``finish_reason="stop"`` and ``stop_reason`` = the string.
- Thinking: ``chat_template_kwargs.enable_thinking`` (or ``thinking``) true, or any
  ``reasoning_effort``: about half of the output tokens come first as
  ``reasoning_content``.
- Tool calls: ``tool_choice`` naming a function, or ``"required"``, makes the reply a
  tool call whose arguments are built from the tool's JSON schema (every required
  property, type-correct, enums respected). **Trigger:** the text ``[[call:ToolName]]``
  in the LAST user message makes the reply call that tool (if it is among ``tools``; one
  call per trigger, in order) unless ``tool_choice`` is ``"none"``. Tool calls ignore
  ``max_tokens``.
- Errors use vLLM's wording and its flat shape
  ``{"object":"error","message":...,"type":"BadRequestError","param":null,"code":400}``
  (``SimSettings.nested_errors=True`` gives newer vLLM's ``{"error":{...}}``).

Other routes: ``GET /v1/models``, ``GET /health``, ``GET /version``, ``POST /tokenize``,
``POST /detokenize`` (approx tokenizer only), ``GET /metrics`` (see :mod:`.vllm_metrics`).

Simplifications: no scheduler (requests never wait, run concurrently without slowing each
other), one choice (``n`` is ignored), no logprobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn

from prefixgate.cache import PrefixCache
from prefixgate.serve.process import ServerThread, bind, uvicorn_server

from .app import UpstreamSim, create_upstream_app
from .replies import CALL_TRIGGER, SimError
from .settings import SimSettings, settings_from_options

__all__ = [
    "CALL_TRIGGER",
    "SimError",
    "SimSettings",
    "SimUpstream",
    "UpstreamSim",
    "create_upstream_app",
    "running_upstreams",
    "serve_upstreams",
    "settings_from_options",
    "start_embedded",
    "start_upstreams_in_thread",
]


class SimUpstream(ServerThread):
    """One simulated upstream served from a background thread."""

    def __init__(self, settings: SimSettings, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = create_upstream_app(settings)
        super().__init__(self.app, host, port)

    @property
    def cache(self) -> PrefixCache:
        return self.app.state.cache

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        return self.url + "/v1"


def start_upstreams_in_thread(
    settings: SimSettings | None = None,
    replicas: int = 1,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
) -> list[SimUpstream]:
    """Start ``replicas`` independent upstreams (each its own cache), on ``port+i`` or on
    free ports when ``port`` is 0. The caller stops them (``s.stop()``)."""
    settings = settings or SimSettings()
    started: list[SimUpstream] = []
    try:
        for i in range(replicas):
            srv = SimUpstream(settings.for_replica(i), host, port + i if port else 0)
            try:
                srv.start()
            except BaseException:
                srv.sock.close()
                raise
            started.append(srv)
    except BaseException:
        for s in started:
            s.stop()
        raise
    return started


@contextlib.contextmanager
def running_upstreams(
    settings: SimSettings | None = None, replicas: int = 1
) -> Iterator[list[SimUpstream]]:
    """``with running_upstreams(settings, 2) as ups: ups[0].base_url``."""
    servers = start_upstreams_in_thread(settings, replicas)
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


async def _serve_one(server: uvicorn.Server, sock: socket.socket) -> None:
    # Server._serve: serve without capturing signals; the caller's event loop owns them.
    serve = getattr(server, "_serve", None) or server.serve
    await serve(sockets=[sock])


async def _wait_started(servers: list[uvicorn.Server], tasks: list[asyncio.Task]) -> None:
    while not all(s.started for s in servers):
        for t in tasks:
            if t.done():
                t.result()  # raises the startup failure
                raise RuntimeError("simulated upstream exited during startup")
        await asyncio.sleep(0.01)


def _build(settings: SimSettings, host: str, port: int, replicas: int, log_level: str):
    socks: list[socket.socket] = []
    try:
        for i in range(replicas):
            socks.append(bind(host, port + i if port else 0))
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    servers = [
        uvicorn_server(create_upstream_app(settings.for_replica(i)), log_level=log_level)
        for i in range(len(socks))
    ]
    urls = [f"http://{host}:{sock.getsockname()[1]}" for sock in socks]
    return socks, servers, urls


async def serve_upstreams(
    settings: SimSettings,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    replicas: int = 1,
    ready: Callable[[list[str]], Any] | None = None,
    log_level: str = "warning",
) -> None:
    """Serve ``replicas`` independent upstreams on ``port .. port+replicas-1`` in the
    current event loop until cancelled (then shut down gracefully). ``ready(urls)`` is
    called (and awaited if it returns an awaitable) once all are listening."""
    socks, servers, urls = _build(settings, host, port, replicas, log_level)
    tasks = [
        asyncio.create_task(_serve_one(srv, sock)) for srv, sock in zip(servers, socks, strict=True)
    ]
    try:
        await _wait_started(servers, tasks)
        if ready is not None:
            result = ready(urls)
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                await result
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            if t.done():
                t.result()
    finally:
        for srv in servers:
            srv.should_exit = True
        await asyncio.wait(tasks)
        for sock in socks:
            sock.close()


async def start_embedded(
    settings: SimSettings | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    replicas: int = 1,
) -> tuple[str, list[uvicorn.Server]]:
    """Start upstreams as background tasks of the current event loop; returns the first
    one's OpenAI base URL (``.../v1``) and the servers (set ``should_exit`` to stop them;
    each server's task is ``server.config.app.state.serve_task``)."""
    socks, servers, urls = _build(settings or SimSettings(), host, port, replicas, "warning")
    tasks = []
    for srv, sock in zip(servers, socks, strict=True):
        task = asyncio.create_task(_serve_one(srv, sock))
        srv.config.app.state.serve_task = task
        tasks.append(task)
    try:
        await _wait_started(servers, tasks)
    except BaseException:
        for srv in servers:
            srv.should_exit = True
        await asyncio.wait(tasks)
        for sock in socks:
            sock.close()
        raise
    return urls[0] + "/v1", servers
