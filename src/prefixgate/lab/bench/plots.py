"""PNG plots of a run (matplotlib's Agg canvas; no pyplot, no global state):

- ``ttft.png``: median TTFT per scenario, one bar per configuration;
- ``decode.png``: decode tok/s (1000 / mean TPOT) per scenario;
- ``throughput.png``: aggregate output tok/s per scenario;
- ``agent.png`` (when the agent scenario ran): cached tokens and TTFT per turn.
"""

from __future__ import annotations

from pathlib import Path

from .runner import BenchRun

__all__ = ["write_plots"]


def _bars(run: BenchRun, key: str, ylabel: str, title: str, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = run.scenario_names
    n = max(1, len(run.targets))
    width = 0.8 / n
    fig = Figure(figsize=(max(6.0, 1.3 * len(names) + 2), 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, tr in enumerate(run.targets):
        values = []
        for name in names:
            sr = tr.scenarios.get(name)
            v = sr.summary.get(key) if sr and sr.summary.get("completed") else None
            values.append(float(v) if v is not None else 0.0)
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(names))]
        ax.bar(xs, values, width, label=tr.target.name)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    if run.targets:
        ax.legend()
    fig.savefig(path, dpi=110)
    return path


def _agent(run: BenchRun, path: Path) -> Path | None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    series = []
    for tr in run.targets:
        sr = tr.scenarios.get("agent")
        turns = sr.summary.get("agent_turns") if sr else None
        if turns:
            series.append((tr.target.name, turns))
    if not series:
        return None
    fig = Figure(figsize=(9.0, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    cached, ttft = fig.subplots(1, 2)
    for name, turns in series:
        xs = [t["turn"] for t in turns]
        (line,) = cached.plot(
            xs, [t["mean_cached_tokens"] for t in turns], marker="o", label=f"{name} cached"
        )
        color = line.get_color()
        cached.plot(
            xs,
            [t["mean_input_tokens"] for t in turns],
            linestyle=":",
            color=color,
            label=f"{name} prompt",
        )
        ttft.plot(xs, [t["mean_ttft_ms"] for t in turns], marker="o", color=color, label=name)
    cached.set_title("agent: prompt and cached tokens per turn")
    cached.set_xlabel("turn")
    cached.set_ylabel("tokens")
    ttft.set_title("agent: TTFT per turn")
    ttft.set_xlabel("turn")
    ttft.set_ylabel("ms")
    for ax in (cached, ttft):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=110)
    return path


def write_plots(run: BenchRun, out_dir: Path) -> list[Path]:
    written = [
        _bars(run, "median_ttft_ms", "ms", "Median TTFT per scenario", out_dir / "ttft.png"),
        _bars(run, "decode_tok_s", "tok/s", "Decode tok/s (excl. TTFT)", out_dir / "decode.png"),
        _bars(
            run,
            "output_throughput",
            "tok/s",
            "Aggregate output throughput",
            out_dir / "throughput.png",
        ),
    ]
    agent = _agent(run, out_dir / "agent.png")
    if agent is not None:
        written.append(agent)
    return written
