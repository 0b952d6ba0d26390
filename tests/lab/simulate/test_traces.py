"""Replay inputs: Mooncake JSONL, store records, synthetic agent traffic."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from prefixgate.lab.simulate import run_simulation
from prefixgate.lab.simulate.traces import load_mooncake, load_synthetic, record_tokens
from prefixgate.lab.traffic import AGENT_STABLE_OPENAI, TrafficSpec
from prefixgate.record.record import Record, Segment
from prefixgate.store import open_store

TINY = [
    {"timestamp": 0, "input_length": 1124, "output_length": 10, "hash_ids": [1, 2, 3]},
    {"timestamp": 1000, "input_length": 1124, "output_length": 20, "hash_ids": [1, 2, 3]},
    {"timestamp": 2000, "input_length": 1024, "output_length": 30, "hash_ids": [1, 2]},
    {"timestamp": 3000, "input_length": 1600, "output_length": 40, "hash_ids": [1, 2, 4, 5]},
]


@pytest.fixture
def tiny_trace(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in TINY))
    return path


def test_mooncake_parsing(tiny_trace: Path):
    trace = load_mooncake(tiny_trace)
    assert trace.kind == "mooncake" and trace.block_size == 512 and trace.id_block_size == 512
    first = trace.requests[0]
    assert (first.num_tokens, first.output_tokens, first.arrival) == (1124, 10, 0.0)
    assert list(first.keys) == [1, 2, 3] and list(first.ids or []) == [1, 2, 3]
    assert [r.arrival for r in trace.requests] == [0.0, 1.0, 2.0, 3.0]
    # a smaller block size splits each id; only full blocks get a key
    split = load_mooncake(tiny_trace, block_size=256)
    assert list(split.requests[0].keys) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    with pytest.raises(ValueError):
        load_mooncake(tiny_trace, block_size=300)


def test_bad_mooncake_line(tmp_path: Path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_mooncake(path)


def test_both_conventions_on_a_tiny_trace(tiny_trace: Path):
    result = run_simulation(str(tiny_trace))
    st = result.main.stats
    rows = result.main.rows
    # (1) ids as given: 0/3, 3/3 (the partial id 3 counts), 2/2, 2/4
    assert [(r.ids_hit, r.ids) for r in rows] == [(0, 3), (3, 3), (2, 2), (2, 4)]
    assert (st.ids_hit, st.ids_total) == (7, 12)
    assert st.id_hit_ratio == pytest.approx(7 / 12)
    # (2) vLLM: the partial block (id 3) is never a hit; request 3 (1024 tokens) is capped
    # by the last-token rule at floor(1023 / 512) * 512 = 512 tokens
    assert [r.gpu_hit_tokens for r in rows] == [0, 1024, 512, 1024]
    assert st.prompt_tokens == 4872
    assert st.token_hit_rate == pytest.approx(2560 / 4872)
    assert st.query_blocks == 12
    assert st.block_hit_rates(512)[2] == pytest.approx(5 / 12)


def _independent(lines: list[dict]) -> tuple[int, int, int, int]:
    """Straightforward recomputation: a set of ids, and a set of full blocks with vLLM's
    caps."""
    ids_seen: set[int] = set()
    blocks_seen: set[int] = set()
    ids_hit = ids_total = tok_hit = tok_total = 0
    for r in lines:
        ids, n = r["hash_ids"], r["input_length"]
        k = 0
        while k < len(ids) and ids[k] in ids_seen:
            k += 1
        ids_hit += k
        ids_total += len(ids)
        ids_seen.update(ids)
        full = n // 512
        cap = (n - 1) // 512
        k = 0
        while k < min(full, cap) and ids[k] in blocks_seen:
            k += 1
        tok_hit += k * 512
        tok_total += n
        blocks_seen.update(ids[:full])
    return ids_hit, ids_total, tok_hit, tok_total


def test_replay_of_the_shipped_trace_matches_a_recomputation(mooncake_dir: Path, tmp_path: Path):
    src = mooncake_dir / "conversation_trace.jsonl"
    with src.open() as f:
        head = [next(f) for _ in range(500)]
    path = tmp_path / "head.jsonl"
    path.write_text("".join(head))
    st = run_simulation(str(path)).main.stats
    ids_hit, ids_total, tok_hit, tok_total = _independent([json.loads(x) for x in head])
    assert st.requests == 500
    assert (st.ids_hit, st.ids_total) == (ids_hit, ids_total)
    assert (st.gpu_hit_tokens, st.prompt_tokens) == (tok_hit, tok_total)
    assert tok_hit > 0


def test_record_tokens_scaling_keeps_equal_segments_equal():
    seg = [
        Segment("tools", "tools", "t" * 32, 4000, 1000),
        Segment("tool", "Bash", "u" * 32, 400, 100),
    ]
    seg += [Segment("system", "messages[0]:system", "s" * 32, 800, 200)]
    a = record_tokens(seg, 1210)  # factor rounds to 1.0; the remainder goes last
    b = record_tokens(seg, 1195)
    assert len(a) == 1210 and len(b) == 1195  # per-tool segments are covered by "tools"
    assert np.array_equal(a[:1000], b[:1000])
    doubled = record_tokens(seg, 2400)  # factor 2: every segment twice as long
    assert len(doubled) == 2400
    assert np.array_equal(doubled[:1000], a[:1000])  # a longer run extends the same ids
    assert len(record_tokens(seg, None)) == 1200
    assert len(record_tokens([], 50)) == 0


def _record(i: int, segments: list[Segment], prompt: int) -> Record:
    return Record(
        request_id=f"r{i}",
        received_at=1000.0 + i,
        status=200,
        prompt_tokens=prompt,
        completion_tokens=50,
        segments_out=segments,
    )


def test_store_records_replay(tmp_path: Path):
    tools = Segment("tools", "tools", "a" * 32, 4000, 1000)
    system = Segment("system", "messages[0]:system", "b" * 32, 800, 200)
    m1 = Segment("message", "messages[1]:user", "c" * 32, 400, 100)
    m2 = Segment("message", "messages[2]:assistant", "d" * 32, 1200, 300)
    dsn = f"sqlite:///{tmp_path / 'rec.db'}"
    with open_store(dsn) as store:
        store.migrate()
        store.write_batch(
            [
                _record(0, [tools, system, m1], 1300),
                _record(1, [tools, system, m1, m2], 1600),
                Record(request_id="r2", received_at=1002.0),  # no segments: skipped
            ]
        )
    result = run_simulation(dsn, block_size=64)
    assert result.source["kind"] == "store" and result.source["skipped"] == 1
    rows = result.main.rows
    assert [r.prompt_tokens for r in rows] == [1300, 1600]
    # the first 1300 tokens are equal: 20 full blocks of 64 hit
    assert [r.gpu_hit_tokens for r in rows] == [0, 1280]
    assert [r.arrival for r in rows] == [0.0, 1.0]


def test_synthetic_agent_traffic_is_rendered_and_hits():
    spec = TrafficSpec(sessions=2, turns=3, seed=3, mix={AGENT_STABLE_OPENAI: 1.0}, titles=False)
    trace = load_synthetic(spec, 64)
    assert len(trace.requests) == 6
    assert all(r.num_tokens > 1000 for r in trace.requests)
    st = run_simulation(trace).main.stats
    assert 0.5 < st.token_hit_rate < 1.0


def test_claude_code_bodies_go_through_the_converter():
    spec = TrafficSpec(sessions=1, turns=2, seed=5, mix={"claude-code": 1.0}, titles=False)
    trace = load_synthetic(spec, 64)
    st = run_simulation(trace).main.stats
    assert st.requests == 2 and st.gpu_hit_tokens > 0


@pytest.mark.parametrize("name", ["conversation", "synthetic"])
def test_whole_shipped_traces_unlimited(mooncake_dir: Path, name: str):
    path = mooncake_dir / f"{name}_trace.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    st = run_simulation(str(path), keep_rows=False).main.stats
    ids_hit, ids_total, tok_hit, tok_total = _independent(lines)
    assert (st.ids_hit, st.ids_total, st.gpu_hit_tokens, st.prompt_tokens) == (
        ids_hit,
        ids_total,
        tok_hit,
        tok_total,
    )


def test_a_store_replays_only_what_was_served_at_the_block_size_it_shows(tmp_path: Path):
    """Through the real gateway into a simulated vLLM (block 32), some requests refused
    for their length: the replay takes the served ones, the block size the records show,
    and puts the upstream's measured hit rate beside its own."""
    from prefixgate.lab.traffic import breakers as bk
    from tests.doctor import live

    dsn, statuses = live.record(
        bk.CLOCK,
        f"sqlite:///{tmp_path / 'gw.db'}",
        block=32,
        sim={"max_model_len": 24_000},
        sessions=2,
        turns=8,
        ok_only=False,
    )
    refused = statuses.count(400)
    assert refused and 200 in statuses
    result = run_simulation(dsn)
    src = result.source
    assert src["block_size"] == 32 and src["block_size_source"].startswith("from the records")
    assert src["skipped"] == refused and src["requests"] == statuses.count(200)
    measured = src["measured"]["hit_rate"]
    assert abs(result.main.stats.token_hit_rate - measured) < 0.05
    assert any("Measured on the upstream" in n for n in result.notes)
