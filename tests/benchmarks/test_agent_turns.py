"""benchmarks/agent_turns.py measures what the issue asks: Claude Code sessions from the
traffic generator that grow past 300 KB, and per-turn figures that say above-floor cost
by turn index."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import agent_turns as at  # noqa: E402


def test_the_sessions_are_claude_code_turns_growing_past_300_kb():
    (turns,) = at.sessions(1, 64)
    assert len(turns) == 64
    sizes = [len(body) for body, _ in turns]
    assert sizes == sorted(sizes) and sizes[-1] > 300_000  # no compaction: it only grows
    body, headers = turns[-1]
    req = json.loads(body)
    assert headers["User-Agent"].startswith("claude-cli/")
    assert req["tools"] and req["stream"] is True
    assert any(m["role"] == "system" for m in req["messages"])  # the mid-conversation one
    kinds = {
        b["type"] for m in req["messages"] if isinstance(m["content"], list) for b in m["content"]
    }
    assert {"tool_use", "tool_result", "thinking", "text"} <= kinds


def test_the_summary_reads_turns_around_an_index_and_the_floor_under_them():
    cpu = [1.0 + k / 10 for k in range(64)]
    floor = [0.5] * 64
    m = {
        "cpu_ms": cpu,
        "ttlb_ms": [[2.0, 4.0]] * 64,
        "idle_ms_per_s": 0.1,
        "user_s": 1.0,
        "system_s": 0.2,
    }
    s = at.summarize("x", m, floor)
    assert s["by_turn"]["10"]["cpu_ms"] == sum(cpu[8:13]) / 5
    assert s["by_turn"]["60"]["above_floor_ms"] == sum(cpu[58:63]) / 5 - 0.5
    assert s["above_floor_60_over_10"] == (sum(cpu[58:63]) / 5 - 0.5) / (sum(cpu[8:13]) / 5 - 0.5)
    assert s["ttlb_ms_p50"] == 3.0
