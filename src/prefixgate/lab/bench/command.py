"""``prefixgate bench``: compare serving configurations the way the deployment report does.

Example::

    prefixgate bench \\
        --target fp8-tp2=http://127.0.0.1:8000/v1 \\
        --target gateway:anthropic=http://127.0.0.1:8787 \\
        --metrics-url gateway=http://127.0.0.1:8000/metrics \\
        --out bench-out

Each ``--target`` is ``NAME=URL`` or ``NAME:API=URL`` (API ``openai``, ``anthropic`` or
``responses``;
default ``--api``). Targets run one after the other; the tables go to stdout (or JSON
with ``--json``), live progress to stderr.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import click

from .scenarios import ALL_SCENARIOS, REPORT_SET, ScenarioParams
from .specs import RequestResult, Target
from .stats import parse_percentiles, parse_slo

__all__ = ["bench_command", "parse_targets"]


def parse_targets(specs: tuple[str, ...], api: str, metrics: tuple[str, ...] = ()) -> list[Target]:
    """``NAME[:API]=URL`` items (plus ``NAME=URL`` metrics overrides; ``none`` disables)."""
    metrics_urls: dict[str, str] = {}
    for item in metrics:
        name, sep, url = item.partition("=")
        if not sep or not name or not url:
            raise click.BadParameter(f"{item!r}: use NAME=URL", param_hint="--metrics-url")
        metrics_urls[name] = "" if url.lower() == "none" else url
    targets: list[Target] = []
    for item in specs:
        head, sep, url = item.partition("=")
        if not sep or not head or not url.startswith(("http://", "https://")):
            raise click.BadParameter(
                f"{item!r}: use NAME=URL or NAME:API=URL", param_hint="--target"
            )
        name, _, target_api = head.partition(":")
        target_api = target_api or api
        if target_api not in ("openai", "anthropic", "responses"):
            raise click.BadParameter(
                f"{item!r}: API must be openai, anthropic or responses", param_hint="--target"
            )
        if any(t.name == name for t in targets):
            raise click.BadParameter(f"target name {name!r} is used twice", param_hint="--target")
        targets.append(Target(name, url.rstrip("/"), target_api, metrics_urls.get(name)))  # type: ignore[arg-type]
    unknown = set(metrics_urls) - {t.name for t in targets}
    if unknown:
        raise click.BadParameter(f"no target named {sorted(unknown)}", param_hint="--metrics-url")
    return targets


def _scenario_names(text: str | None, load_requested: bool) -> list[str]:
    if not text:
        names = list(REPORT_SET)
        if load_requested:
            names.append("load")
        return names
    if text.strip() == "all":
        return list(ALL_SCENARIOS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_SCENARIOS]
    if unknown:
        raise click.BadParameter(
            f"unknown {unknown}; choose from {', '.join(ALL_SCENARIOS)} or 'all'",
            param_hint="--scenarios",
        )
    return names


class _RichProgress:
    """Live progress on stderr: one bar per target and scenario."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[failed]} failed"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self._task: Any = None

    def __enter__(self) -> _RichProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def scenario_started(self, target: str, scenario: str, planned: int) -> None:
        self._task = self.progress.add_task(f"{target} / {scenario}", total=planned, failed=0)

    def request_done(self, result: RequestResult) -> None:
        if self._task is None:
            return
        task = self.progress.tasks[-1]
        failed = task.fields["failed"] + (0 if result.success else 1)
        self.progress.update(self._task, advance=1, failed=failed)

    def scenario_finished(self, target: str, scenario: str) -> None:
        if self._task is not None:
            task = self.progress.tasks[-1]
            self.progress.update(self._task, total=task.completed)
        self._task = None


@click.command("bench")
@click.option(
    "--target",
    "targets",
    multiple=True,
    required=True,
    metavar="NAME[:API]=URL",
    help="A configuration to measure (repeatable). URL is the API base: "
    "http://host:8000/v1 (OpenAI) or http://host:8787 (Anthropic Messages).",
)
@click.option(
    "--api",
    type=click.Choice(["openai", "anthropic", "responses"]),
    default="openai",
    show_default=True,
    help="API of targets that do not name one: streaming /v1/chat/completions, /v1/messages "
    "or /v1/responses.",
)
@click.option("--model", default=None, help="Model name (default: the first of GET /v1/models).")
@click.option(
    "--api-key",
    envvar="PREFIXGATE_BENCH_API_KEY",
    default=None,
    help="API key sent to every target (env PREFIXGATE_BENCH_API_KEY).",
)
@click.option(
    "--scenarios",
    default=None,
    metavar="LIST",
    help=f"Comma-separated, or 'all' (default: {','.join(REPORT_SET)}; "
    f"all: {','.join(ALL_SCENARIOS)}).",
)
@click.option(
    "--metrics-url",
    "metrics_urls",
    multiple=True,
    metavar="NAME=URL",
    help="The server /metrics to read for a target (default <URL without /v1>/metrics; "
    "'none' disables). Point a gateway target at its upstream's /metrics.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the prompt text.")
@click.option(
    "--runs",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Sequential requests of the decode and thinking scenarios.",
)
@click.option(
    "--output-tokens",
    type=click.IntRange(min=2),
    default=256,
    show_default=True,
    help="Output tokens of the single-stream scenarios.",
)
@click.option(
    "--prefill-tokens",
    type=click.IntRange(min=16),
    default=1600,
    show_default=True,
    help="Approximate prompt tokens of the prefill scenario.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Concurrency limit of the load scenario (adds it to the default set).",
)
@click.option(
    "--rate",
    type=float,
    default=None,
    help="Requests/s of the load scenario (default: all at once; adds it).",
)
@click.option(
    "--arrival",
    type=click.Choice(["poisson", "gamma"]),
    default="poisson",
    show_default=True,
    help="Arrival process at --rate.",
)
@click.option(
    "--burstiness",
    type=float,
    default=1.0,
    show_default=True,
    help="Gamma shape for --arrival gamma (<1 burstier, >1 more even).",
)
@click.option(
    "--num-prompts",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Requests of the load scenario.",
)
@click.option(
    "--slo",
    default=None,
    metavar="ttft_ms=…,tpot_ms=…,e2el_ms=…",
    help="SLOs for goodput (request_goodput).",
)
@click.option(
    "--percentiles",
    default="99",
    show_default=True,
    metavar="LIST",
    help="Percentiles to report, e.g. 50,90,99.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write report.md, results.json, results.csv and PNG plots here.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON on stdout.")
@click.option("--no-progress", is_flag=True, help="No live progress on stderr.")
@click.option("--no-warmup", is_flag=True, help="Skip the unmeasured warm-up request per target.")
def bench_command(
    targets: tuple[str, ...],
    api: str,
    model: str | None,
    api_key: str | None,
    scenarios: str | None,
    metrics_urls: tuple[str, ...],
    seed: int,
    runs: int,
    output_tokens: int,
    prefill_tokens: int,
    concurrency: int | None,
    rate: float | None,
    arrival: str,
    burstiness: float,
    num_prompts: int,
    slo: str | None,
    percentiles: str,
    out_dir: str | None,
    as_json: bool,
    no_progress: bool,
    no_warmup: bool,
) -> None:
    """Benchmark serving configurations side by side: single-stream decode, thinking, long
    prefill cold and warm, concurrency 4 and 8 (and agent sessions, shared prefixes,
    arrival processes), with vLLM's metric definitions."""
    from .runner import run_bench
    from .tables import problems, to_json, to_markdown, to_rich_tables, write_outputs

    parsed = parse_targets(targets, api, metrics_urls)
    try:
        slo_ms = parse_slo(slo)
        pcts = parse_percentiles(percentiles)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if burstiness <= 0:
        raise click.BadParameter("must be positive", param_hint="--burstiness")
    if rate is not None and rate <= 0:
        raise click.BadParameter("must be positive", param_hint="--rate")
    names = _scenario_names(scenarios, concurrency is not None or rate is not None)
    params = ScenarioParams(
        seed=seed,
        runs=runs,
        output_tokens=output_tokens,
        long_prompt_tokens=prefill_tokens,
        concurrency=concurrency,
        rate=rate,
        burstiness=1.0 if arrival == "poisson" else burstiness,
        load_requests=num_prompts,
    )

    async def go(progress: Any) -> Any:
        return await run_bench(
            parsed,
            names,
            params,
            model=model,
            api_key=api_key,
            percentiles=pcts,
            slo_ms=slo_ms or None,
            warmup=not no_warmup,
            progress=progress,
        )

    if no_progress:
        run = asyncio.run(go(None))
    else:
        with _RichProgress() as progress:
            run = asyncio.run(go(progress))

    if out_dir:
        for path in write_outputs(run, out_dir):
            click.echo(f"wrote {path}", err=True)
    if as_json:
        click.echo(json.dumps(to_json(run), indent=2, default=str))
    elif sys.stdout.isatty():
        from rich.console import Console

        console = Console()
        for table in to_rich_tables(run):
            console.print(table)
        for line in [line for group in problems(run) for line in group]:
            console.print(line, markup=False, highlight=False)
    else:
        click.echo(to_markdown(run))
    failed = [
        tr
        for tr in run.targets
        if tr.error or not any(sr.summary["completed"] for sr in tr.scenarios.values())
    ]
    for tr in failed:
        click.echo(f"error: {tr.target.name}: {tr.error or 'no request completed'}", err=True)
    if failed:
        sys.exit(1)
