"""`prefixgate demo`: run the incident and the fix, print the table and the diagnosis."""

from __future__ import annotations

import contextlib
import shutil
import time

import click


@click.command()
@click.option(
    "--sessions",
    type=int,
    default=10,
    show_default=True,
    help="Agent sessions (half Claude-Code-like).",
)
@click.option("--turns", type=int, default=40, show_default=True, help="Turns per session.")
@click.option(
    "--concurrency", type=int, default=6, show_default=True, help="Sessions in flight at once."
)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option(
    "--store",
    "store_path",
    default="prefixgate-demo.db",
    show_default=True,
    help="SQLite file written.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def demo(sessions, turns, concurrency, seed, store_path, as_json) -> None:
    """Reproduce the billing-header incident and its fix: the same Claude-Code-like and stable-prefix
    traffic through the gateway with the billing-header protection off, then on."""
    import json

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from prefixgate.lab import incident

    console = Console(stderr=as_json, width=max(100, shutil.get_terminal_size().columns))

    @contextlib.contextmanager
    def progress_factory(name: str, total: int):
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=as_json,
        ) as progress:
            task = progress.add_task(name, total=total)
            yield lambda: progress.advance(task)

    t0 = time.monotonic()
    results = incident.run_demo(
        sessions=sessions,
        turns=turns,
        seed=seed,
        concurrency=concurrency,
        store_path=store_path,
        progress_factory=progress_factory,
    )
    from prefixgate.doctor import diagnose, render_text

    diagnosis = diagnose(results[0].dsn)
    if as_json:
        click.echo(json.dumps(incident.as_json(results, diagnosis), indent=2))
        return
    _print_demo(console, results, incident.BLOCK)
    console.rule("prefixgate doctor on the incident's store")
    click.echo(render_text(diagnosis))
    predicted = incident.predicted_rate(diagnosis)
    if predicted is not None:
        measured = results[1].entries["messages"].hit_rate
        console.print(
            f"\nThe doctor predicted {predicted:.1%} for /v1/messages after the fix; "
            f"the replay with the fix measured {measured:.1%}."
        )
    console.print(
        f"\nRecords: [bold]{store_path}[/] (the incident), "
        f"[bold]{incident.fixed_store_path(store_path)}[/] (the fix); {time.monotonic() - t0:.1f} s. "
        f"Again: prefixgate doctor --store sqlite:///{store_path}"
    )


def _print_demo(console, results, block: int) -> None:
    from rich import box
    from rich.table import Table

    table = Table(
        title="prefixgate demo: the billing header at token 0", box=box.SIMPLE_HEAD, pad_edge=False
    )
    for col in (
        "header",
        "entry",
        "requests",
        "prompt",
        "cached",
        "hit rate",
        "in-session",
        "pinned",
    ):
        left = col in ("header", "entry", "pinned")
        table.add_column(col, justify="left" if left else "right", no_wrap=True)
    for r in results:
        for entry in ("messages", "chat"):
            st = r.entries.get(entry)
            if st is None:
                continue
            pinned = "-"
            if st.pinned_value is not None:
                shape = (
                    f"={st.pinned_value // block}x{block}" if st.pinned_value % block == 0 else ""
                )
                pinned = f"{st.pinned_count} @ {st.pinned_value}{shape}"
            table.add_row(
                "stripped" if r.strip else "kept",
                entry,
                str(st.requests),
                _human(st.prompt_tokens),
                _human(st.cached_tokens),
                f"{st.hit_rate:.1%}",
                f"{st.in_session_hit_rate:.1%}",
                pinned,
            )
        table.add_section()
    console.print(table)
    console.print(
        "header: Claude Code's billing header kept at token 0 (the incident) or stripped (the fix).\n"
        "entry: messages = /v1/messages (Claude-Code-like sessions), chat = /v1/chat/completions "
        "(a stable-prefix agent, the control group).\n"
        "hit rate = sum(cached) / sum(prompt) tokens; in-session = the same over every request after "
        "a session's first; pinned = requests whose cached length is one exact constant."
    )


def _human(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1_000_000 else f"{n / 1e3:.1f}k" if n >= 1000 else str(n)
