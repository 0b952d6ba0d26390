"""The billing-header incident, reproduced and fixed, in under a minute (what `prefixgate demo` runs;
the command itself, its progress and its table are in `demo.py`, beside it).

A simulated vLLM upstream (block size 64, tools rendered before the system prompt, a cache
large enough for every session) sits behind the gateway. The same synthetic traffic —
Claude-Code-like sessions on ``/v1/messages`` whose billing header carries a per-request
``cch=``, and a stable-prefix agent on ``/v1/chat/completions`` (the control group) — is
replayed twice: with ``strip_anthropic_billing_header`` off, then on, each phase against a
fresh upstream. Every request is recorded in the store, which is left for the doctor.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from prefixgate.config import parse_config
from prefixgate.lab.traffic import TrafficSpec, generate
from prefixgate.lab.upstream_sim import SimSettings, create_upstream_app
from prefixgate.record import Record
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store

BLOCK = 64
MODEL = "llm-prime"
UPSTREAM_MODEL = "deepseek-v4-flash-0731"


@dataclass
class EntryStats:
    entry: str
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    later_prompt: int = 0  # turns after each session's first request
    later_cached: int = 0
    pinned_value: int | None = None
    pinned_count: int = 0
    hit_rate: float = 0.0
    in_session_hit_rate: float = 0.0

    def finish(self, cached_values: list[int]) -> None:
        self.hit_rate = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        self.in_session_hit_rate = (
            self.later_cached / self.later_prompt if self.later_prompt else 0.0
        )
        nonzero = [v for v in cached_values if v > 0]
        if nonzero:
            value, count = Counter(nonzero).most_common(1)[0]
            # Pinned: one exact value held by at least half of the entry's requests.
            if count >= max(3, (len(cached_values) + 1) // 2):
                self.pinned_value, self.pinned_count = value, count


@dataclass
class PhaseResult:
    name: str
    strip: bool
    seconds: float
    dsn: str = ""
    entries: dict[str, EntryStats] = field(default_factory=dict)


def summarize(records: list[Record], name: str, strip: bool, seconds: float) -> PhaseResult:
    result = PhaseResult(name, strip, seconds)
    values: dict[str, list[int]] = defaultdict(list)
    seen_sessions: set[tuple[str, str | None]] = set()
    for rec in sorted(records, key=lambda r: r.received_at):
        st = result.entries.setdefault(rec.endpoint, EntryStats(rec.endpoint))
        st.requests += 1
        if rec.status != 200 or rec.prompt_tokens is None:
            st.errors += 1
            continue
        cached = rec.cached_tokens or 0
        st.prompt_tokens += rec.prompt_tokens
        st.cached_tokens += cached
        values[rec.endpoint].append(cached)
        key = (rec.endpoint, rec.session_id)
        if key in seen_sessions:
            st.later_prompt += rec.prompt_tokens
            st.later_cached += cached
        seen_sessions.add(key)
    for entry, st in result.entries.items():
        st.finish(values[entry])
    return result


def _spec(sessions: int, turns: int, seed: int) -> TrafficSpec:
    return TrafficSpec(
        sessions=sessions,
        turns=turns,
        seed=seed,
        cch=True,
        titles=False,
        compact_chars=0,
        tool_result_chars=(1000, 20000),  # agent turns that read files and logs
        models=(MODEL,),
        stable_models=(MODEL,),
        mix={"claude-code": 0.5, "stable-openai": 0.5},
    )


async def replay(base_url: str, sessions, concurrency: int, progress) -> None:
    """Each session's requests in order, ``concurrency`` sessions at a time; ``progress()``
    after each answer is read in full."""
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency * 2)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as client:

        async def run(session) -> None:
            async with sem:
                for req in session:
                    async with client.stream(
                        "POST", req.endpoint, headers=req.headers, content=req.content()
                    ) as r:
                        async for _ in r.aiter_raw():
                            pass
                    progress()

        await asyncio.gather(*(run(s) for s in sessions))


def run_phase(
    name: str, strip: bool, dsn: str, sessions, concurrency: int, progress, extra=None
) -> PhaseResult:
    """One phase's traffic through a gateway (``extra``: more of its config, e.g. prices)."""
    settings = SimSettings(
        block_size=BLOCK,
        render_order="tools_first",
        models=(UPSTREAM_MODEL,),
        max_model_len=1_048_576,
    )
    with ServerThread(create_upstream_app(settings)) as upstream:
        config = parse_config(
            {
                "channels": [
                    {
                        "name": "h200-vllm",
                        "kind": "openai",
                        "base_url": upstream.url + "/v1",
                        "models": [MODEL],
                        "model_map": {MODEL: UPSTREAM_MODEL},
                        "strip_anthropic_billing_header": strip,
                        "render_order": "tools_first",
                        "capture_text": True,  # so the doctor can show what varies
                    }
                ],
                "store": {"dsn": dsn},
                **(extra or {}),
            }
        )
        t0 = time.time()
        with ServerThread(create_app(config)) as gw:
            asyncio.run(replay(gw.url, sessions, concurrency, progress))
        seconds = time.time() - t0
    with open_store(dsn) as store:
        records = list(store.iter_records(since=t0))
    result = summarize(records, name, strip, seconds)
    result.dsn = dsn
    return result


def fixed_store_path(store_path: str) -> str:
    """Where the demo keeps the phase with the fix: beside the incident's store."""
    p = Path(store_path)
    return str(p.with_name(p.stem + "-fixed" + p.suffix))


def run_demo(
    *,
    sessions: int = 10,
    turns: int = 40,
    seed: int = 7,
    concurrency: int = 6,
    store_path: str = "prefixgate-demo.db",
    progress_factory=None,
) -> list[PhaseResult]:
    """Replay the traffic with the header kept (into ``store_path``: the incident, for the
    doctor) and then stripped (into its ``-fixed`` sibling: what the fix measures)."""
    per_session = generate(_spec(sessions, turns, seed))
    total = sum(len(s) for s in per_session)
    results = []
    for name, strip, path in (
        ("header kept (the incident)", False, store_path),
        ("header stripped (the fix)", True, fixed_store_path(store_path)),
    ):
        for suffix in ("", "-wal", "-shm"):
            Path(path + suffix).unlink(missing_ok=True)
        with progress_factory(name, total) as tick:
            results.append(
                run_phase(name, strip, f"sqlite:///{path}", per_session, concurrency, tick)
            )
    return results


def predicted_rate(diagnosis) -> float | None:
    """The doctor's predicted hit rate after the fix, for the broken slice."""
    for f in diagnosis.findings:
        prediction = f.facts.get("prediction") if f.kind == "prefix_broken" else None
        if prediction:
            return prediction.get("predicted_rate")
    return None


def as_json(results: list[PhaseResult], diagnosis=None) -> dict:
    out: dict = {"block_size": BLOCK, "phases": [asdict(r) for r in results]}
    if diagnosis is not None:
        out["doctor"] = diagnosis.to_dict()
        out["doctor_predicted_rate"] = predicted_rate(diagnosis)
    return out
