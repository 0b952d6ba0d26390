"""The ``prefixgate simulate`` command (registered by the main CLI)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

__all__ = ["simulate_command"]


def _capacity(ctx: click.Context, param: click.Parameter, value: str | None) -> object:
    from prefixgate.lab.simulate import parse_capacity

    if value is None:
        return None
    try:
        return parse_capacity(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _sweep(ctx: click.Context, param: click.Parameter, value: str | None) -> object:
    if value is None:
        return None
    return [_capacity(ctx, param, v) for v in value.split(",") if v.strip()]


@contextmanager
def _progress() -> Iterator[Callable[[str, int, int | None], None] | None]:
    """A rich progress bar on stderr when it is a terminal; nothing otherwise."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    tasks: dict[str, int] = {}

    def update(phase: str, done: int, total: int | None) -> None:
        if phase not in tasks:
            tasks[phase] = bar.add_task(phase, total=total)
        bar.update(tasks[phase], completed=done, total=total)

    with bar:
        yield update


@click.command("simulate")
@click.argument("trace_or_dsn", required=False)
@click.option(
    "--block-size", type=click.IntRange(min=1), help="Tokens per KV block (Mooncake: 512; else 64)."
)
@click.option(
    "--gpu-capacity",
    callback=_capacity,
    help="GPU KV capacity in tokens (2M, 65536, unlimited). Default: unlimited.",
)
@click.option(
    "--host-capacity",
    callback=_capacity,
    help="Host-memory (L2) tier in tokens, or unlimited. Default: no host tier.",
)
@click.option(
    "--groups",
    default="full",
    show_default=True,
    help='KV cache groups, e.g. "full,window:4096,draft:1".',
)
@click.option(
    "--policy",
    type=click.Choice(["veto", "promote"]),
    default="veto",
    show_default=True,
    help="Host-tier lookup across groups.",
)
@click.option(
    "--offload",
    type=click.Choice(["through", "evict"]),
    default="through",
    show_default=True,
    help="Write to the host when computed, or when evicted from the GPU.",
)
@click.option(
    "--timed",
    is_flag=True,
    help="Requests hold their blocks while they run (arrival times, output lengths).",
)
@click.option(
    "--prefill-rate",
    type=click.FloatRange(min=0, min_open=True),
    help="Prefill tokens/s: report prefill seconds saved.",
)
@click.option(
    "--decode-rate",
    type=click.FloatRange(min=0, min_open=True),
    default=50.0,
    show_default=True,
    help="Decode tokens/s per request (timed).",
)
@click.option(
    "--bytes-per-block",
    type=click.IntRange(min=1),
    help="KV bytes per block: report host bytes written/read.",
)
@click.option(
    "--sweep", callback=_sweep, help='GPU capacities to sweep, e.g. "1M,2M,4M,unlimited".'
)
@click.option(
    "--plot",
    "plot",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write a PNG of the sweep.",
)
@click.option(
    "--scenario",
    type=click.Choice(["seed-l2"]),
    help="Run a ready scenario instead of TRACE_OR_DSN.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--per-request", is_flag=True, help="With --json: include every request's row.")
def simulate_command(
    trace_or_dsn: str | None,
    block_size: int | None,
    gpu_capacity: object,
    host_capacity: object,
    groups: str,
    policy: str,
    offload: str,
    timed: bool,
    prefill_rate: float | None,
    decode_rate: float,
    bytes_per_block: int | None,
    sweep: list[object] | None,
    plot: Path | None,
    scenario: str | None,
    as_json: bool,
    per_request: bool,
) -> None:
    """What-if replay of TRACE_OR_DSN through a GPU and a host-memory KV tier.

    TRACE_OR_DSN is a Mooncake .jsonl trace, a store DSN (sqlite:///…, postgresql://…)
    or "synthetic" (agent traffic; "synthetic:SESSIONSxTURNS").
    """
    from prefixgate.lab.simulate import (
        plot_sweep,
        render_text,
        run_scenario,
        run_simulation,
        to_json,
    )
    from prefixgate.store.base import StoreError

    if scenario is None and not trace_or_dsn:
        raise click.UsageError("give TRACE_OR_DSN or --scenario")
    if plot is not None and sweep is None and scenario is None:
        raise click.UsageError("--plot needs --sweep")
    try:
        with _progress() as progress:
            if scenario is not None:
                result = run_scenario(scenario, progress=progress)
            else:
                result = run_simulation(
                    trace_or_dsn,
                    block_size=block_size,
                    gpu_capacity_tokens=gpu_capacity,
                    host_capacity_tokens=host_capacity,
                    groups=groups,
                    policy=policy,
                    offload=offload,
                    timed=timed,
                    prefill_rate=prefill_rate,
                    decode_rate=decode_rate,
                    bytes_per_block=bytes_per_block,
                    sweep=sweep,
                    progress=progress,
                    keep_rows=per_request,
                )
    except (ValueError, OSError, StoreError) as exc:
        raise click.ClickException(str(exc)) from None
    if plot is not None:
        plot_sweep(result, plot)
        click.echo(f"plot written to {plot}", err=True)
    if as_json:
        click.echo(to_json(result, per_request=per_request))
    else:
        click.echo(render_text(result), nl=False)
    sys.stdout.flush()
