"""Segment capture cost and capture storage size.

1. Hashes + sizes of the real 77 KB Claude Code request (the fixture's ``body``): p50/p99
   of ``segments_anthropic`` (target: well under 1 ms at p50), the first time (every
   digest computed) and again (digests of repeated segments looked up), and of ``texts_of``
   (redacted texts, only paid when capture is opted in).
2. A synthetic growing Claude Code session of ``--turns`` turns built on that request
   (each turn adds an assistant tool call and its tool result, and moves the
   cache_control marker), captured into a SQLite store: stored bytes versus the raw JSON
   of all the turns (target: at most 10%, thanks to content addressing).

    python benchmarks/record_capture.py [--turns 1000] [--json]
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from prefixgate.record import segments as seg_mod
from prefixgate.record.record import Record
from prefixgate.record.segments import segments_anthropic, texts_of
from prefixgate.store.sqlite import SqliteStore

FIXTURE = (
    Path(__file__).resolve().parents[1] / "tests/fixtures/claude-code/01_v2.1.332_print_turn1.json"
)
WORDS = [
    "def",
    "return",
    "self",
    "import",
    "class",
    "value",
    "error",
    "file",
    "path",
    "line",
    "test",
    "request",
    "token",
    "cache",
    "prefix",
    "segment",
    "session",
    "store",
    "record",
    "batch",
    "query",
    "index",
    "table",
    "column",
    "server",
    "client",
]


def load_body(path: Path = FIXTURE) -> dict:
    return json.loads(path.read_text())["body"]


def _move_cache_marker(messages: list[dict]) -> None:
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict):
                    block.pop("cache_control", None)
    last = messages[-1]["content"]
    if isinstance(last, list) and last and isinstance(last[-1], dict):
        last[-1]["cache_control"] = {"type": "ephemeral"}


def growing_session(body: dict, turns: int, seed: int = 1):
    """Yield ``turns`` request bodies of one session; turn k has 2k more messages."""
    rng = random.Random(seed)
    body = copy.deepcopy(body)
    for k in range(turns):
        if k:
            call_id = f"toolu_{k:06d}"
            command = " ".join(rng.choices(WORDS, k=rng.randint(3, 12)))
            body["messages"].append(
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "text",
                            "text": " ".join(rng.choices(WORDS, k=rng.randint(5, 60))),
                        },
                        {
                            "type": "tool_use",
                            "id": call_id,
                            "name": "Bash",
                            "input": {"command": command},
                        },
                    ],
                }
            )
            output = "\n".join(
                " ".join(rng.choices(WORDS, k=rng.randint(4, 16)))
                for _ in range(rng.randint(5, 60))
            )
            body["messages"].append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": call_id, "content": output}],
                }
            )
        _move_cache_marker(body["messages"])
        yield body


def bench_capture(body: dict, rounds: int) -> dict:
    def timed(fn) -> list[float]:
        fn()  # warm up
        out = []
        for _ in range(rounds):
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
        out.sort()
        return out

    def cold() -> None:  # nothing seen before: every digest computed
        seg_mod._DIGESTS = seg_mod._Digests()
        segments_anthropic(body)

    saved = seg_mod._DIGESTS
    try:
        first = timed(cold)
    finally:
        seg_mod._DIGESTS = saved
    seg = timed(lambda: segments_anthropic(body))  # the same request again: digests looked up
    as_sent = json.dumps(body).encode()
    from_bytes = timed(
        lambda: seg_mod.segments_from_bytes(as_sent, "anthropic")
    )  # the gateway's way
    txt = timed(lambda: texts_of(body))
    raw = len(json.dumps(body, ensure_ascii=False).encode())
    return {
        "request_bytes": raw,
        "segments": len(segments_anthropic(body)),
        "hash_cold_p50_ms": statistics.median(first),
        "hash_p50_ms": statistics.median(seg),
        "from_bytes_p50_ms": statistics.median(from_bytes),
        "hash_p99_ms": seg[int(len(seg) * 0.99) - 1],
        "texts_p50_ms": statistics.median(txt),
    }


def bench_session(body: dict, turns: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "capture.db"
        store = SqliteStore(path)
        store.migrate()
        raw_bytes = 0
        stored_texts: set[str] = set()
        batch: list[Record] = []
        t0 = time.perf_counter()
        for k, turn in enumerate(growing_session(body, turns)):
            raw_bytes += len(json.dumps(turn, ensure_ascii=False, separators=(",", ":")).encode())
            texts: dict[str, str] = {}
            segs = segments_anthropic(turn, texts=texts, known=stored_texts)
            new = texts
            stored_texts.update(new)
            batch.append(
                Record(
                    request_id=f"req-{k}",
                    received_at=1_700_000_000.0 + k,
                    endpoint="messages",
                    session_id="session-1",
                    segments_in=segs,
                    segments_out=segs,
                    texts=new,
                )
            )
            if len(batch) >= 100:
                store.write_batch(batch)
                batch = []
        store.write_batch(batch)
        elapsed = time.perf_counter() - t0
        store.close()
        stored = sum(p.stat().st_size for p in Path(tmp).iterdir())
    return {
        "turns": turns,
        "raw_json_bytes": raw_bytes,
        "stored_bytes": stored,
        "ratio": stored / raw_bytes,
        "capture_seconds": elapsed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    body = load_body()
    result = {
        "capture": bench_capture(body, args.rounds),
        "session": bench_session(body, args.turns),
    }
    if args.json:
        print(json.dumps(result))
    else:
        c, s = result["capture"], result["session"]
        print(f"request: {c['request_bytes']} bytes, {c['segments']} segments")
        print(f"hashes+sizes, first time: p50 {c['hash_cold_p50_ms']:.3f} ms")
        print(
            f"hashes+sizes, seen before: p50 {c['hash_p50_ms']:.3f} ms, "
            f"p99 {c['hash_p99_ms']:.3f} ms"
        )
        print(f"from the request bytes, seen before: p50 {c['from_bytes_p50_ms']:.3f} ms")
        print(f"texts (redacted): p50 {c['texts_p50_ms']:.3f} ms")
        print(
            f"session of {s['turns']} turns: raw {s['raw_json_bytes'] / 1e6:.1f} MB, "
            f"stored {s['stored_bytes'] / 1e6:.2f} MB ({s['ratio']:.1%}), "
            f"captured in {s['capture_seconds']:.1f} s"
        )
    ok = result["capture"]["hash_p50_ms"] < 1.0 and result["session"]["ratio"] <= 0.10
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
