"""The ASGI app of one simulated upstream: its state, its routes, the request pipeline.

The behaviour (output, tool-call trigger, errors) is described in :mod:`.upstream`.
The pipeline of one ``POST /v1/chat/completions`` is :meth:`UpstreamSim.chat`:

1. parse and validate the body (``replies.parse_chat``), check the model;
2. render ``messages`` + ``tools`` and tokenize;
3. vLLM's context-window checks (``replies.check_context``);
4. plan the whole reply from the prompt tokens (``replies.plan_reply``: deterministic);
5. run it: ``cache.begin`` -> prefill sleep (UNCACHED tokens / ``prefill_tokens_per_s``)
   -> first token -> one ``1/decode_tokens_per_s`` per further token -> ``cache.end``
   (also when the client goes away: the request then counts as ``abort``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import time
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from prefixgate.cache import (
    ApproxTokenizer,
    ChatRenderer,
    JinjaChatTemplate,
    Lease,
    PrefixCache,
    Renderer,
    RenderError,
    TokenizerError,
    get_tokenizer,
)
from prefixgate.cache.render import vllm_messages

from .replies import (
    ChatJob,
    Reply,
    SimError,
    check_context,
    chunk_body,
    completion_body,
    error_body,
    parse_chat,
    plan_reply,
    stream_deltas,
    usage_body,
)
from .settings import SimSettings
from .vllm_metrics import CONTENT_TYPE, SimMetrics

__all__ = ["UpstreamSim", "create_upstream_app"]

log = logging.getLogger("prefixgate.lab.upstream_sim")


def _sse(body: dict[str, Any]) -> bytes:
    return (
        b"data: " + json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
    )


class UpstreamSim:
    """The state and routes of one simulated upstream."""

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.model_name = settings.models[0]
        self.renderer: Renderer = (
            JinjaChatTemplate.from_file(settings.chat_template)
            if settings.chat_template
            else ChatRenderer(settings.render_order)  # type: ignore[arg-type]
        )
        self.tokenizer = get_tokenizer(settings.tokenizer)
        self.events, self._emitter = _event_publisher(settings)
        emitter = self._emitter
        self.cache = PrefixCache(
            settings.block_size,
            settings.capacity_tokens,
            on_evict=None if emitter is None else emitter.evicted,
            on_store=None if emitter is None else emitter.stored,
        )
        self.metrics = SimMetrics(self.model_name, self.cache)
        self.created = int(time.time())

    # -- the steps -------------------------------------------------------------------------

    def check_model(self, model: str | None) -> None:
        s = self.settings
        if model is None or s.accept_any_model or model in s.models:
            return
        raise SimError(f"The model `{model}` does not exist.", 404, "NotFoundError")

    def render_tokens(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
        *,
        chat: bool = True,
    ) -> list[int]:
        """``chat``: for a chat completion (vLLM's chat request takes an assistant's
        ``reasoning_content`` as its ``reasoning``; its ``/tokenize`` request does not)."""
        try:
            if isinstance(self.renderer, JinjaChatTemplate):
                if not chat:
                    messages = [_without_old_reasoning(m) for m in messages]
                text = self.renderer.render(  # the messages as vLLM gives a template
                    vllm_messages(messages), tools, add_generation_prompt, **(template_kwargs or {})
                )
            else:
                text = self.renderer.render(messages, tools, add_generation_prompt)
            return self.tokenizer.encode(text)
        except (RenderError, TokenizerError) as exc:
            raise SimError(str(exc)) from exc

    def plan(self, job: ChatJob, tokens: list[int]) -> Reply:
        s = self.settings
        return plan_reply(
            job,
            tokens,
            self.tokenizer,
            default_output_tokens=s.default_output_tokens,
            max_model_len=s.max_model_len,
            seed=s.seed,
        )

    def prefill_seconds(self, prompt_tokens: int, cached_tokens: int) -> float:
        rate = self.settings.prefill_tokens_per_s
        return (prompt_tokens - cached_tokens) / rate if rate > 0 else 0.0

    @property
    def token_seconds(self) -> float:
        rate = self.settings.decode_tokens_per_s
        return 1.0 / rate if rate > 0 else 0.0

    def begin(self, tokens: list[int], salt: str | None) -> Lease:
        lease = self.cache.begin(tokens, salt=salt)
        self.publish_events()
        m = self.metrics
        m.running += 1
        m.prompt_tokens += lease.prompt_tokens
        m.cached_tokens += lease.cached_tokens
        return lease

    def end(self, lease: Lease, output_ids: list[int], reason: str, started: float) -> None:
        self.cache.end(lease, output_tokens=output_ids)
        self.publish_events()
        m = self.metrics
        m.running -= 1
        reason = "stop" if reason == "tool_calls" else reason
        m.finish(reason, len(output_ids), time.monotonic() - started)

    def publish_events(self) -> None:
        """One batch of KV events for what the last step stored and evicted, as vLLM
        publishes one per scheduler step."""
        if self.events is not None and self._emitter is not None:
            self.events.publish(self._emitter.take())

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, as vLLM's ``reset_prefix_cache`` (or a restart) does,
        and publish ``AllBlocksCleared``; ``False`` while a request holds blocks."""
        try:
            self.cache.reset()
        except RuntimeError:
            return False
        if self._emitter is not None:
            self._emitter.cleared()
            self.publish_events()
        return True

    def usage(self, lease: Lease, completion_tokens: int) -> dict[str, Any]:
        return usage_body(
            lease.prompt_tokens,
            completion_tokens,
            lease.cached_tokens,
            report_cached=self.settings.report_cached_tokens,
            report_zero=self.settings.reports_zero_cached,
        )

    # -- routes ----------------------------------------------------------------------------

    async def _json(self, request: Request) -> Any:
        raw = await request.body()
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise SimError(f"JSON decode error: {exc}") from exc

    async def chat(self, request: Request) -> Response:
        job = parse_chat(await self._json(request), self.model_name)
        self.check_model(job.model)
        tokens = self.render_tokens(
            job.messages, job.tools, job.add_generation_prompt, job.template_kwargs
        )
        check_context(len(tokens), job.max_tokens, self.settings.max_model_len)
        reply = self.plan(job, tokens)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if job.stream:
            return StreamingResponse(
                self._stream(job, tokens, reply, rid, created),
                media_type="text/event-stream",
            )
        started = time.monotonic()
        lease = self.begin(tokens, job.salt)
        done, reason = 0, "abort"
        try:
            await asyncio.sleep(self.prefill_seconds(len(tokens), lease.cached_tokens))
            self.metrics.ttft.observe(time.monotonic() - started)
            if reply.completion_tokens > 1 and self.token_seconds:
                await asyncio.sleep((reply.completion_tokens - 1) * self.token_seconds)
            done, reason = reply.completion_tokens, reply.finish_reason
        finally:
            self.end(lease, reply.output_ids[:done], reason, started)
        usage = self.usage(lease, reply.completion_tokens)
        return JSONResponse(completion_body(rid, created, job.model, reply, usage))

    async def _stream(self, job: ChatJob, tokens: list[int], reply: Reply, rid: str, created: int):
        started = time.monotonic()
        lease = self.begin(tokens, job.salt)
        done, reason = 0, "abort"
        try:
            await asyncio.sleep(self.prefill_seconds(len(tokens), lease.cached_tokens))
            first = time.monotonic()
            self.metrics.ttft.observe(first - started)
            role = {"role": "assistant", "content": ""}
            usage = self.usage(lease, 0) if job.include_usage and job.continuous_usage else None
            yield _sse(chunk_body(rid, created, job.model, role, usage=usage))
            deltas = stream_deltas(reply, self.settings.stream_chunk_tokens)
            dt = self.token_seconds
            for i, (delta, n) in enumerate(deltas):
                done += n
                if dt and done > 1:
                    await asyncio.sleep(max(0.0, first + (done - 1) * dt - time.monotonic()))
                last = i == len(deltas) - 1
                if job.include_usage and job.continuous_usage:
                    usage = self.usage(lease, done)
                yield _sse(
                    chunk_body(
                        rid,
                        created,
                        job.model,
                        delta,
                        finish_reason=reply.finish_reason if last else None,
                        stop_reason=reply.stop_reason,
                        usage=usage,
                    )
                )
            done, reason = reply.completion_tokens, reply.finish_reason
            if job.include_usage:
                usage = self.usage(lease, done)
                yield _sse(chunk_body(rid, created, job.model, None, usage=usage))
            yield b"data: [DONE]\n\n"
        finally:
            self.end(lease, reply.output_ids[:done], reason, started)

    async def models(self, request: Request) -> Response:
        data = [
            {
                "id": name,
                "object": "model",
                "created": self.created,
                "owned_by": "vllm",
                "root": name,
                "parent": None,
                "max_model_len": self.settings.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid5(uuid.NAMESPACE_URL, name).hex}",
                        "object": "model_permission",
                        "created": self.created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in self.settings.models
        ]
        return JSONResponse({"object": "list", "data": data})

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": "prefixgate-sim"})

    async def tokenize(self, request: Request) -> Response:
        body = await self._json(request)
        if not isinstance(body, dict):
            raise SimError("The request body must be a JSON object.")
        self.check_model(body.get("model"))
        if isinstance(body.get("prompt"), str):
            tokens = self.tokenizer.encode(body["prompt"])
        elif isinstance(body.get("messages"), list):
            kwargs = body.get("chat_template_kwargs")
            tokens = self.render_tokens(
                body["messages"],
                body.get("tools") or None,
                body.get("add_generation_prompt", True) is not False,
                kwargs if isinstance(kwargs, dict) else None,
                chat=False,
            )
        else:
            raise SimError("Either 'prompt' (a string) or 'messages' (a list) is required.")
        return JSONResponse(
            {
                "count": len(tokens),
                "max_model_len": self.settings.max_model_len,
                "tokens": tokens,
                "token_strs": None,
            }
        )

    async def detokenize(self, request: Request) -> Response:
        body = await self._json(request)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise SimError("'tokens' must be a list of integers.")
        if not isinstance(self.tokenizer, ApproxTokenizer):
            raise SimError("detokenize is only supported with the approx tokenizer.")
        if any(t < 0 or t >= 1 << 32 for t in tokens):
            raise SimError("token ids must be in [0, 2**32).")
        data = b"".join(t.to_bytes(4, "little") for t in tokens).rstrip(b"\0")
        return JSONResponse({"prompt": data.decode("utf-8", "replace")})

    async def prometheus(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def on_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, SimError)
        return JSONResponse(
            error_body(exc, nested=self.settings.nested_errors), status_code=exc.status
        )

    async def log_stats(self) -> None:
        """vLLM-like periodic log lines (``Prefix cache hit rate: ...``)."""
        last_q = last_h = last_p = last_g = 0
        interval = self.settings.log_interval_s
        while True:
            await asyncio.sleep(interval)
            c, m = self.cache, self.metrics
            dq, dh = c.queries - last_q, c.hits - last_h
            dp, dg = m.prompt_tokens - last_p, m.generation_tokens - last_g
            last_q, last_h, last_p, last_g = c.queries, c.hits, m.prompt_tokens, m.generation_tokens
            if dq or dg:
                log.info(
                    "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f "
                    "tokens/s, Running: %d reqs, Waiting: 0 reqs, GPU KV cache usage: %.1f%%, "
                    "Prefix cache hit rate: %.1f%%",
                    dp / interval,
                    dg / interval,
                    m.running,
                    100 * c.usage,
                    100 * dh / dq if dq else 0.0,
                )


def _event_publisher(settings: SimSettings):
    """The KV-event publisher and the cache's emitter, when events are asked for (pyzmq is
    loaded only then)."""
    if settings.kv_events is None:
        return None, None
    from prefixgate.lab.events.emitter import CacheEventEmitter
    from prefixgate.lab.events.publisher import EventPublisher

    return EventPublisher(settings.kv_events), CacheEventEmitter(settings.block_size)


def create_upstream_app(settings: SimSettings | None = None) -> Starlette:
    """The ASGI app of one simulated upstream; ``app.state.cache`` is its PrefixCache and
    ``app.state.sim`` its :class:`UpstreamSim` (``.events``: its KV-event publisher)."""
    sim = UpstreamSim(settings or SimSettings())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        task = None
        if sim.settings.log_interval_s > 0:
            task = asyncio.create_task(sim.log_stats())
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            close = getattr(sim.tokenizer, "close", None)
            if callable(close):
                close()
            if sim.events is not None:
                sim.events.close()

    routes = [
        Route("/v1/chat/completions", sim.chat, methods=["POST"]),
        Route("/v1/models", sim.models, methods=["GET"]),
        Route("/health", sim.health, methods=["GET"]),
        Route("/version", sim.version, methods=["GET"]),
        Route("/tokenize", sim.tokenize, methods=["POST"]),
        Route("/detokenize", sim.detokenize, methods=["POST"]),
        Route("/metrics", sim.prometheus, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={SimError: sim.on_error}, lifespan=lifespan)
    app.state.sim = sim
    app.state.cache = sim.cache
    app.state.settings = sim.settings
    if sim.settings.api_key:
        return KeyRequired(app, sim.settings.api_key)
    return app


def _without_old_reasoning(m: Any) -> Any:
    """A message as vLLM's ``/tokenize`` reads it: ``reasoning_content`` unknown there."""
    if isinstance(m, dict) and "reasoning_content" in m:
        return {k: v for k, v in m.items() if k != "reasoning_content"}
    return m


class KeyRequired:
    """vLLM's ``--api-key``: every route but ``/health`` answers 401 without
    ``Authorization: Bearer <key>`` (compared by digest, in constant time)."""

    def __init__(self, app, key: str) -> None:
        self.app = app
        self.digest = hashlib.sha256(key.encode()).digest()

    def __getattr__(self, name: str):
        return getattr(self.app, name)  # state, router … of the wrapped app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            given = b""
            for name, value in scope["headers"]:
                if name == b"authorization" and value[:7].lower() == b"bearer ":
                    given = value[7:].strip()
            if not hmac.compare_digest(hashlib.sha256(given).digest(), self.digest):
                body = b'{"error": "Unauthorized"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
