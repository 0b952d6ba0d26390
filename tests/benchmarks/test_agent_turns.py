"""benchmarks/agent_turns.py measures what the issue asks: Claude Code sessions from the
traffic generator that grow past 300 KB, and per-turn figures that say above-floor cost
by turn index."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

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


def test_cjk_sessions_are_the_same_turns_with_texts_not_all_ascii():
    """``--cjk``: every body is still a JSON request whose turns grow at their tail (what
    the lent decode relies on), its texts not all ASCII and its keys untouched."""
    (plain,) = at.sessions(1, 8)
    (cjk,) = at.sessions(1, 8, cjk=True)
    for (a, ha), (b, hb) in zip(plain, cjk, strict=True):
        assert ha == hb and not b.isascii() and a != b
        ra, rb = json.loads(a), json.loads(b)
        assert ra.keys() == rb.keys() and len(ra["messages"]) == len(rb["messages"])
        assert json.dumps(rb, ensure_ascii=False).replace("这个", "the") == json.dumps(ra)
    for before, after in zip(cjk, cjk[1:], strict=False):  # each starts with the last
        old, new = json.loads(before[0])["messages"], json.loads(after[0])["messages"]
        assert new[: len(old) - 2] == old[: len(old) - 2]


def test_reminder_sessions_have_a_system_message_after_each_user_message():
    """``--reminders``: Claude Code's ``<total_tokens>`` reminder after each user message,
    the earlier ones the same in every turn (what a turn re-sends is unchanged)."""
    (plain,) = at.sessions(1, 6)
    (turns,) = at.sessions(1, 6, reminders=True)
    said: dict[int, str] = {}
    for (a, _), (b, _) in zip(plain, turns, strict=True):
        sent = json.loads(b)["messages"]
        assert [m for m in sent if m["role"] != "system" or "total_tokens" not in str(m)] == (
            json.loads(a)["messages"]
        )
        for i, m in enumerate(sent):
            if m["role"] == "user":
                assert sent[i + 1]["role"] == "system"
                assert "<total_tokens>" in sent[i + 1]["content"]
                assert said.setdefault(i + 1, sent[i + 1]["content"]) == sent[i + 1]["content"]


def test_codex_sessions_are_the_same_conversations_as_responses_requests():
    """``--codex``: each turn is a Responses request the gateway takes, as Codex CLI sends
    it (its headers, ``store: false``, the session's id as ``prompt_cache_key``), holding
    the same conversation as the Claude Code turn it was made of, and each turn's input
    is the previous turn's and new items."""
    from prefixgate.config import Limits
    from prefixgate.protocol.responses import decode_responses_body

    (plain,) = at.sessions(1, 12)
    (turns,) = at.sessions(1, 12, codex=True)
    before: list = []
    instructions: dict[str, str] = {}  # the same every turn
    for (a, ha), (b, hb) in zip(plain, turns, strict=True):
        decode_responses_body(b, Limits())  # taken as it is, nothing refused
        req, claude = json.loads(b), json.loads(a)
        sid = ha["X-Claude-Code-Session-Id"]
        assert hb == {"originator": "codex_exec", "session-id": sid, "version": "0.171.0"}
        assert req["store"] is False and req["stream"] is True
        assert req["prompt_cache_key"] == sid and "cache_control" not in b.decode()
        assert [t["name"] for t in req["tools"]] == [t["name"] for t in claude["tools"]]
        system = [x["text"] for x in claude["system"]]
        assert system[0].startswith("x-anthropic-billing-header")  # Claude Code's own
        assert req["instructions"] == "\n".join(system[1:])
        assert instructions.setdefault("", req["instructions"]) == req["instructions"]
        items = req["input"]
        assert items[: len(before)] == before and len(items) > len(before)
        before = items
        calls = {i["call_id"]: i["name"] for i in items if i["type"] == "function_call"}
        outputs = [i["call_id"] for i in items if i["type"] == "function_call_output"]
        assert set(outputs) <= set(calls)  # each output answers a call
        uses = [
            b["name"]
            for m in claude["messages"]
            if isinstance(m["content"], list)
            for b in m["content"]
            if b["type"] == "tool_use"
        ]
        assert list(calls.values()) == uses  # every tool call, in its order
        developer = [i for i in items if i.get("role") == "developer"]
        assert len(developer) == sum(m["role"] == "system" for m in claude["messages"])
    assert {i["type"] for i in before} == {"message", "reasoning", "function_call",
                                           "function_call_output"}  # fmt: skip


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


def _short_run(only: list[str], **more) -> dict:
    """A three-turn run of ``only`` (``run()`` pins this process to the load's core: the
    affinity is given back after it)."""
    given = {
        "sessions": 1,
        "turns": 3,
        "warm_turns": 1,
        "settle": 0.05,
        "only": only,
        "no_litellm": True,
        "litellm_version": at.ov.LITELLM_VERSION,
        "ref": None,
        "count": False,
        "cjk": False,
        "reminders": False,
        "codex": False,
    }
    args = SimpleNamespace(**{**given, **more})
    cpus = os.sched_getaffinity(0)
    try:
        return asyncio.run(at.run(args))
    finally:
        os.sched_setaffinity(0, cpus)


def test_the_bare_relay_carries_the_turns_and_its_floor_stands_beside_the_gateway():
    r = _short_run([at.RELAY])
    (relay,) = r["subjects"]
    assert relay["subject"] == "bare-relay"
    assert len(relay["cpu_ms"]) == 3 and all(c > 0 for c in relay["cpu_ms"])
    assert relay["ttlb_ms_p50"] > 0
    both = at.relay_floor(r, "cpu_ms")
    assert both == [a + b for a, b in zip(relay["cpu_ms"], r["floor"]["per_turn_ms"], strict=True)]
    assert "floor: bare relay + decode" in at.table(r)


def test_the_counted_floor_is_the_bare_relay_plus_the_decode_and_each_subject_a_ratio_of_it():
    r = {
        "sessions": 1,
        "turns": 8,
        "body_kb": {"by_turn": {"1": 80.0}},
        "floor": {"instructions": [1e6] * 8},
        "subjects": [
            {"subject": "bare-relay", "instructions": [3e6] * 8},
            {"subject": "defaults", "instructions": [8e6] * 8},
        ],
    }
    assert at.relay_floor(r, "instructions") == [4e6] * 8
    rows = {line.split()[0]: line.split() for line in at.count_table(r).splitlines()[2:]}
    assert rows["defaults"][1:] == ["8.00", "8.00", "2.00"]
    assert rows["floor:"][-1] == "1.00"


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_the_in_process_floor_is_counted_body_by_body():
    small, large = b'{"a": "x"}', json.dumps({"a": ["y" * 100] * 1000}).encode()
    counted = at.floor_instructions([small, large, small])
    assert len(counted) == 3 and all(c > 0 for c in counted)
    assert counted[1] > 10 * counted[0]  # each dump is its own body's, in order
    assert abs(counted[2] - counted[0]) < counted[0]


def test_paired_subjects_take_the_same_turns_side_by_side():
    r = _short_run([at.RELAY, "no-store"], paired=True)
    assert r["paired"] is True
    relay, gateway = r["subjects"]
    assert (relay["subject"], gateway["subject"]) == (at.RELAY, "no-store")
    for s in (relay, gateway):
        assert len(s["cpu_ms"]) == 3 and all(c > 0 for c in s["cpu_ms"])
        assert s["ttlb_ms_p50"] > 0
        # by thread, in the same windows: the two parts are the CPU a turn
        parts = s["loop_thread_ms"] + s["other_threads_ms"]
        assert abs(parts - s["cpu_ms_mean"]) < 1e-6 * max(1.0, abs(parts))
    assert "side by side" in at.table(r)


def test_a_subject_with_a_store_reports_the_segment_lists_it_stored():
    r = _short_run(["defaults", "no-store"], paired=True)
    stored, plain = r["subjects"]
    assert (stored["subject"], plain["subject"]) == ("defaults", "no-store")
    assert "lists_kb" not in plain  # no store, nothing to read
    assert stored["lists_kb"] > 0.1  # a Claude Code turn's lists: ~100 segments of JSON
    assert f"{stored['lists_kb']:.2f}" in at.table(r)


def test_codex_turns_go_to_the_responses_endpoint_and_are_recorded():
    """``--codex``: the turns are answered by ``/v1/responses`` (any other status fails
    the run) and recorded with their segments, beside the bare relay carrying them."""
    r = _short_run([at.RELAY, "defaults"], paired=True, codex=True)
    relay, stored = r["subjects"]
    assert (relay["subject"], stored["subject"]) == (at.RELAY, "defaults")
    assert all(c > 0 for c in stored["cpu_ms"]) and stored["lists_kb"] > 0.1
    assert r["codex"] is True and "Codex" in at.table(r)
