"""Run every scenario against every target, one target at a time (two configurations
measured at once would slow each other), reading the server's ``/metrics`` before and
after each scenario.

Order per target: resolve the model (``--model``, else the first of ``GET /v1/models``,
else the model an earlier target used) ->
one warm-up request (connections opened, first-request costs paid; not measured) -> for
each scenario: scrape -> run -> scrape -> summarize (vLLM metrics + scenario figures +
counter deltas).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import server_metrics
from .client import BenchClient
from .scenarios import REPORT_SET, RunContext, ScenarioParams, build_scenarios, with_salt
from .specs import RequestResult, RequestSpec, Target
from .stats import DEFAULT_PERCENTILES, summarize

__all__ = ["BenchRun", "Progress", "ScenarioRun", "TargetRun", "run_bench"]


class Progress(Protocol):
    def scenario_started(self, target: str, scenario: str, planned: int) -> None: ...
    def request_done(self, result: RequestResult) -> None: ...
    def scenario_finished(self, target: str, scenario: str) -> None: ...


class _NoProgress:
    def scenario_started(self, target: str, scenario: str, planned: int) -> None:
        pass

    def request_done(self, result: RequestResult) -> None:
        pass

    def scenario_finished(self, target: str, scenario: str) -> None:
        pass


@dataclass
class ScenarioRun:
    name: str
    title: str
    headline: str
    summary: dict[str, Any]
    requests: list[RequestResult]


@dataclass
class TargetRun:
    target: Target
    model: str | None = None
    kv_capacity_tokens: int | None = None
    error: str | None = None
    scenarios: dict[str, ScenarioRun] = field(default_factory=dict)


@dataclass
class BenchRun:
    meta: dict[str, Any]
    targets: list[TargetRun]
    scenario_names: list[str]


async def _run_target(
    target: Target,
    names: Sequence[str],
    params: ScenarioParams,
    *,
    model: str | None,
    fallback_model: str | None,
    api_key: str | None,
    percentiles: Sequence[float],
    slo_ms: dict[str, float] | None,
    warmup: bool,
    progress: Progress,
    run_id: str,
) -> TargetRun:
    out = TargetRun(target)
    async with BenchClient(target, model or "", api_key=api_key) as client:
        if not model:
            try:
                client.model = await client.first_model()
            except Exception as exc:  # any failure: report it, go on with the next target
                if not fallback_model:
                    out.error = f"cannot list models at {target.models_url()}: {exc}"
                    return out
                client.model = fallback_model
        out.model = client.model
        params = with_salt(params, f"{run_id}/{target.name}")
        if warmup:
            spec = RequestSpec(({"role": "user", "content": f"[{run_id}] Say hello."},), 4)
            result = await client.send(spec)
            if not result.success:
                out.error = f"warm-up request failed: {result.error}"
                return out
        url = target.scrape_url()
        for scenario in build_scenarios(names, params):
            progress.scenario_started(target.name, scenario.name, scenario.planned)
            before = await server_metrics.scrape(client.http, url)
            ctx = RunContext(client, progress.request_done)
            t0 = time.perf_counter()
            results = await scenario.run(ctx)
            duration = time.perf_counter() - t0
            after = await server_metrics.scrape(client.http, url)
            if after is not None and after.kv_capacity_tokens:
                out.kv_capacity_tokens = after.kv_capacity_tokens
            summary = summarize(results, duration, percentiles=percentiles, slo_ms=slo_ms)
            summary |= scenario.extras(results)
            summary |= server_metrics.counter_deltas(before, after)
            out.scenarios[scenario.name] = ScenarioRun(
                scenario.name, scenario.title, scenario.headline, summary, results
            )
            progress.scenario_finished(target.name, scenario.name)
    return out


async def run_bench(
    targets: Sequence[Target],
    scenarios: Sequence[str] = REPORT_SET,
    params: ScenarioParams | None = None,
    *,
    model: str | None = None,
    api_key: str | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    slo_ms: dict[str, float] | None = None,
    warmup: bool = True,
    progress: Progress | None = None,
    run_id: str | None = None,
) -> BenchRun:
    """Benchmark ``targets`` one after the other; never raises for a failing target (its
    ``error`` says why) or request (counted as failed)."""
    names = list(scenarios)
    build_scenarios(names, ScenarioParams())  # unknown names fail before any traffic
    params = params or ScenarioParams()
    run_id = run_id or secrets.token_hex(4)
    sink = progress or _NoProgress()
    runs: list[TargetRun] = []
    for target in targets:
        runs.append(
            await _run_target(
                target,
                names,
                params,
                model=model,
                # a target that lists no models (a gateway) uses the one found before it
                fallback_model=next((r.model for r in runs if r.model), None),
                api_key=api_key,
                percentiles=percentiles,
                slo_ms=slo_ms,
                warmup=warmup,
                progress=sink,
                run_id=run_id,
            )
        )
    meta = {
        "run_id": run_id,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "scenarios": names,
        "percentiles": list(percentiles),
        "slo_ms": slo_ms or None,
        "params": {k: v for k, v in vars(params).items() if k != "salt"},
    }
    return BenchRun(meta, runs, names)
