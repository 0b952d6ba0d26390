"""The scenarios: what each sends, in what order, and its own figures.

The report's set (:data:`REPORT_SET`), after the deployment report of Qwen on SGLang: one streaming
script, temperature 0, ``ignore_eos`` where the API has it, the same seeded prompts for
every configuration.

- ``decode``: a short prompt, ``runs`` (3) sequential requests of 256 output tokens;
  headline: single-stream decode tok/s (1000 / mean TPOT, so TTFT is excluded).
- ``thinking``: the same with thinking on; decode tok/s over reasoning and answer.
- ``prefill``: a ~1.6k-token prompt sent twice, cold then warm (the same bytes, so the
  prefix cache hits): both TTFTs, the cached tokens, and the prefill rate two ways:
  ``prefill_tok_s_cold`` = uncached tokens / cold TTFT (includes the fixed per-request
  cost) and ``prefill_tok_s_from_hit`` = tokens the hit saved / TTFT it saved (the fixed
  cost cancels). ``prefill_runs`` > 1 repeats the pair with new prompts; medians.
- ``concurrency4`` / ``concurrency8``: 4 / 8 simultaneous requests of 128 tokens, thinking
  off; headline: aggregate output tok/s.

Beyond the report: ``agent`` (sessions of growing history, each turn appending the real
reply and a new user message: cached tokens and TTFT per turn), ``shared-prefix`` (groups
of requests sharing a long prefix: the first of a group alone, the rest together) and
``load`` (many requests under a concurrency limit and/or an arrival process at a rate).

Every prompt starts with a salt line (run id and target), so "cold" is cold even when two
targets share one backend or the benchmark ran before.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .arrivals import arrival_offsets
from .client import BenchClient
from .prompts import seeded_text
from .specs import RequestResult, RequestSpec

__all__ = [
    "ALL_SCENARIOS",
    "REPORT_SET",
    "RunContext",
    "Scenario",
    "ScenarioParams",
    "build_scenarios",
]

REPORT_SET = ("decode", "thinking", "prefill", "concurrency4", "concurrency8")
ALL_SCENARIOS = (*REPORT_SET, "agent", "shared-prefix", "load")

_CONTINUE = "Continue the following text for as long as you can, without stopping:\n\n"


@dataclass(frozen=True)
class ScenarioParams:
    """Sizes and counts of every scenario (tokens are approximate prompt tokens)."""

    seed: int = 0
    salt: str = ""
    runs: int = 3
    output_tokens: int = 256
    short_prompt_tokens: int = 32
    long_prompt_tokens: int = 1600
    prefill_runs: int = 1  # cold/warm pairs, each with its own prompt (medians reported)
    prefill_output_tokens: int | None = None  # None: output_tokens
    concurrent_output_tokens: int = 128
    agent_sessions: int = 2
    agent_turns: int = 6
    agent_system_tokens: int = 1000
    agent_user_tokens: int = 150
    agent_output_tokens: int = 64
    shared_groups: int = 2
    shared_group_size: int = 4
    shared_prefix_tokens: int = 1200
    shared_suffix_tokens: int = 40
    shared_output_tokens: int = 32
    load_requests: int = 32
    load_prompt_tokens: int = 256
    load_output_tokens: int = 128
    concurrency: int | None = None
    rate: float | None = None
    burstiness: float = 1.0

    def text(self, key: object, n_tokens: int, *, salted: bool = True) -> str:
        return seeded_text(f"{self.seed}/{key}", n_tokens, salt=self.salt if salted else "")


class RunContext:
    """What a scenario runs with: ``send`` one request, ``batch`` many under a
    concurrency gate, ``schedule`` them at arrival times. A request's start is stamped
    after its gate (inside :meth:`BenchClient.send`)."""

    def __init__(
        self, client: BenchClient, on_result: Callable[[RequestResult], None] | None = None
    ) -> None:
        self.client = client
        self._on_result = on_result

    async def send(self, spec: RequestSpec) -> RequestResult:
        result = await self.client.send(spec)
        if self._on_result is not None:
            self._on_result(result)
        return result

    async def batch(
        self, specs: Sequence[RequestSpec], concurrency: int | None = None
    ) -> list[RequestResult]:
        return await self.schedule(specs, [0.0] * len(specs), concurrency)

    async def schedule(
        self, specs: Sequence[RequestSpec], offsets: Sequence[float], concurrency: int | None
    ) -> list[RequestResult]:
        gate = asyncio.Semaphore(concurrency or max(1, len(specs)))
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def one(spec: RequestSpec, at: float) -> RequestResult:
            delay = t0 + at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            async with gate:
                return await self.send(spec)

        return list(await asyncio.gather(*(one(s, a) for s, a in zip(specs, offsets, strict=True))))


Runner = Callable[[RunContext], Awaitable[list[RequestResult]]]


@dataclass(frozen=True)
class Scenario:
    """``run`` sends the requests; ``extras`` adds the scenario's own figures to the
    summary; ``headline`` is the summary key of its cell in the side-by-side table."""

    name: str
    title: str
    headline: str
    planned: int
    run: Runner
    extras: Callable[[list[RequestResult]], dict[str, Any]] = field(default=lambda _: {})


def _user(text: str) -> tuple[dict[str, str], ...]:
    return ({"role": "user", "content": text},)


def _sequential(specs: list[RequestSpec]) -> Runner:
    async def run(ctx: RunContext) -> list[RequestResult]:
        return [await ctx.send(s) for s in specs]

    return run


def _median_ms(values: list[float]) -> float | None:
    return statistics.median(values) * 1000 if values else None


def _ok(results: list[RequestResult], label: str | None = None) -> list[RequestResult]:
    return [r for r in results if r.success and (label is None or r.label == label)]


def _decode(p: ScenarioParams, *, thinking: bool) -> Scenario:
    name = "thinking" if thinking else "decode"
    specs = [
        RequestSpec(
            _user(_CONTINUE + p.text(f"{name}/{i}", p.short_prompt_tokens)),
            p.output_tokens,
            thinking=thinking,
            label=f"run{i + 1}",
        )
        for i in range(p.runs)
    ]
    title = "Think-on" if thinking else "Decode (short prompt)"
    return Scenario(name, title, "decode_tok_s", len(specs), _sequential(specs))


def _prefill(p: ScenarioParams) -> Scenario:
    out_tokens = p.prefill_output_tokens or p.output_tokens
    specs: list[RequestSpec] = []
    for i in range(p.prefill_runs):
        text = p.text(f"prefill/{i}" if i else "prefill", p.long_prompt_tokens)
        messages = _user(text + "\n\n" + _CONTINUE.strip())
        specs += [
            RequestSpec(messages, out_tokens, label="cold", session=i),
            RequestSpec(messages, out_tokens, label="warm", session=i),
        ]

    def extras(results: list[RequestResult]) -> dict[str, Any]:
        cold, warm = _ok(results, "cold"), _ok(results, "warm")
        out: dict[str, Any] = {}
        if cold:
            out |= {
                "ttft_cold_ms": _median_ms([r.ttft for r in cold]),
                "cached_tokens_cold": statistics.median(r.cached_tokens for r in cold),
                "prefill_input_tokens": statistics.median(r.input_tokens for r in cold),
                # includes the fixed per-request overhead, so a lower bound
                "prefill_tok_s_cold": statistics.median(
                    (r.input_tokens - r.cached_tokens) / r.ttft for r in cold
                ),
            }
        if warm:
            out |= {
                "ttft_warm_ms": _median_ms([r.ttft for r in warm]),
                "cached_tokens_warm": statistics.median(r.cached_tokens for r in warm),
            }
        # per pair: what the hit saved, per token it saved (the fixed overhead cancels)
        by_hit = []
        for c in cold:
            for w in warm:
                saved, gain = w.cached_tokens - c.cached_tokens, c.ttft - w.ttft
                if w.session == c.session and saved > 0 and gain > 0:
                    by_hit.append(saved / gain)
        out["prefill_tok_s_from_hit"] = statistics.median(by_hit) if by_hit else None
        return out

    return Scenario(
        "prefill", "Long-prefill", "decode_tok_s", len(specs), _sequential(specs), extras
    )


def _concurrent(p: ScenarioParams, n: int) -> Scenario:
    specs = [
        RequestSpec(
            _user(_CONTINUE + p.text(f"conc{n}/{i}", p.short_prompt_tokens)),
            p.concurrent_output_tokens,
            label=f"c{i + 1}",
        )
        for i in range(n)
    ]

    async def run(ctx: RunContext) -> list[RequestResult]:
        return await ctx.batch(specs, n)

    return Scenario(f"concurrency{n}", f"Conc{n} aggregate", "output_throughput", n, run)


def _agent(p: ScenarioParams) -> Scenario:
    async def session(ctx: RunContext, s: int) -> list[RequestResult]:
        history: list[dict[str, str]] = [
            {"role": "system", "content": p.text(f"agent/system/{s}", p.agent_system_tokens)}
        ]
        out: list[RequestResult] = []
        for t in range(p.agent_turns):
            user = p.text(f"agent/{s}/user/{t}", p.agent_user_tokens, salted=False)
            history.append({"role": "user", "content": user})
            spec = RequestSpec(
                tuple(history), p.agent_output_tokens, label=f"turn{t + 1}", session=s, turn=t + 1
            )
            result = await ctx.send(spec)
            out.append(result)
            reply = result.text or p.text(f"agent/{s}/reply/{t}", 16, salted=False)
            history.append({"role": "assistant", "content": reply})
        return out

    async def run(ctx: RunContext) -> list[RequestResult]:
        per = await asyncio.gather(*(session(ctx, s) for s in range(p.agent_sessions)))
        return [r for rs in per for r in rs]

    def extras(results: list[RequestResult]) -> dict[str, Any]:
        turns = []
        for t in range(1, p.agent_turns + 1):
            rs = [r for r in _ok(results) if r.turn == t]
            if not rs:
                continue
            turns.append(
                {
                    "turn": t,
                    "requests": len(rs),
                    "mean_input_tokens": statistics.fmean(r.input_tokens for r in rs),
                    "mean_cached_tokens": statistics.fmean(r.cached_tokens for r in rs),
                    "mean_ttft_ms": statistics.fmean(r.ttft for r in rs) * 1000,
                }
            )
        return {"agent_turns": turns}

    n = p.agent_sessions * p.agent_turns
    return Scenario("agent", "Agent cache hit %", "usage_cache_hit_rate", n, run, extras)


def _shared_prefix(p: ScenarioParams) -> Scenario:
    groups: list[list[RequestSpec]] = []
    for g in range(p.shared_groups):
        prefix = p.text(f"shared/{g}", p.shared_prefix_tokens)
        groups.append(
            [
                RequestSpec(
                    (
                        {"role": "system", "content": prefix},
                        {
                            "role": "user",
                            "content": p.text(
                                f"shared/{g}/{i}", p.shared_suffix_tokens, salted=False
                            ),
                        },
                    ),
                    p.shared_output_tokens,
                    label="first" if i == 0 else "shared",
                    session=g,
                )
                for i in range(p.shared_group_size)
            ]
        )

    async def run(ctx: RunContext) -> list[RequestResult]:
        out: list[RequestResult] = []
        for specs in groups:
            out.append(await ctx.send(specs[0]))
            out.extend(await ctx.batch(specs[1:]))
        return out

    def extras(results: list[RequestResult]) -> dict[str, Any]:
        first, rest = _ok(results, "first"), _ok(results, "shared")
        return {
            "median_ttft_first_ms": _median_ms([r.ttft for r in first]),
            "median_ttft_shared_ms": _median_ms([r.ttft for r in rest]),
            "mean_cached_tokens_shared": statistics.fmean(r.cached_tokens for r in rest)
            if rest
            else None,
        }

    n = p.shared_groups * p.shared_group_size
    return Scenario("shared-prefix", "Shared-prefix hit %", "usage_cache_hit_rate", n, run, extras)


def _load(p: ScenarioParams) -> Scenario:
    specs = [
        RequestSpec(
            _user(_CONTINUE + p.text(f"load/{i}", p.load_prompt_tokens)),
            p.load_output_tokens,
            label="load",
        )
        for i in range(p.load_requests)
    ]
    concurrency = p.concurrency if p.concurrency or p.rate else 4
    offsets = arrival_offsets(len(specs), p.rate, burstiness=p.burstiness, seed=p.seed)

    async def run(ctx: RunContext) -> list[RequestResult]:
        return await ctx.schedule(specs, offsets, concurrency)

    def extras(_: list[RequestResult]) -> dict[str, Any]:
        return {
            "max_concurrency": concurrency,
            "request_rate": p.rate if p.rate is not None else "inf",
            "burstiness": p.burstiness,
        }

    return Scenario("load", "Load aggregate", "output_throughput", len(specs), run, extras)


_FACTORIES: dict[str, Callable[[ScenarioParams], Scenario]] = {
    "decode": lambda p: _decode(p, thinking=False),
    "thinking": lambda p: _decode(p, thinking=True),
    "prefill": _prefill,
    "concurrency4": lambda p: _concurrent(p, 4),
    "concurrency8": lambda p: _concurrent(p, 8),
    "agent": _agent,
    "shared-prefix": _shared_prefix,
    "load": _load,
}


def build_scenarios(names: Sequence[str], params: ScenarioParams) -> list[Scenario]:
    """The named scenarios (in the given order) for one target."""
    unknown = [n for n in names if n not in _FACTORIES]
    if unknown:
        raise ValueError(f"unknown scenarios {unknown}; known: {', '.join(ALL_SCENARIOS)}")
    return [_FACTORIES[n](params) for n in names]


def with_salt(params: ScenarioParams, salt: str) -> ScenarioParams:
    return replace(params, salt=salt)
