"""Replay inputs, each turned into a list of :class:`TraceRequest`.

- **Mooncake JSONL** (FAST'25 traces): ``timestamp`` (ms), ``input_length``,
  ``output_length``, ``hash_ids`` (one id per 512-token block, the last one covering a
  partial block when ``input_length`` is not a multiple of 512). The ids are used directly
  as block keys (no per-token work); a block size that divides 512 splits each id into
  ``(id, j)`` sub-blocks.
- **Records from a store** (``open_store(dsn).iter_records()``): each request's
  ``segments_out`` become pseudo-token sequences of their estimated length, with ids drawn
  deterministically from the segment hash, scaled so the total is the record's
  ``prompt_tokens`` (see :func:`record_tokens`), then hashed into chained blocks.
- **Synthetic agent traffic** (:mod:`prefixgate.lab.traffic`), rendered with
  :class:`~prefixgate.cache.render.ChatRenderer` and tokenized with
  :class:`~prefixgate.cache.tokenizer.ApproxTokenizer`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from prefixgate.cache.blocks import hash_blocks
from prefixgate.cache.render import ChatRenderer
from prefixgate.cache.tokenizer import ApproxTokenizer
from prefixgate.record.record import Record, Segment

__all__ = [
    "MOONCAKE_BLOCK_SIZE",
    "Trace",
    "TraceRequest",
    "load_mooncake",
    "load_store",
    "load_synthetic",
    "record_tokens",
]

MOONCAKE_BLOCK_SIZE = 512
Progress = Callable[[int, int | None], None]


@dataclass(slots=True)
class TraceRequest:
    """One request to replay. ``keys``: the keys of its full blocks at the replay's block
    size, in chain order; ``ids``: the trace's own block ids as given (Mooncake only);
    ``arrival`` in seconds."""

    keys: Sequence[Hashable]
    num_tokens: int
    output_tokens: int = 0
    arrival: float | None = None
    ids: Sequence[Hashable] | None = None


@dataclass(slots=True)
class Trace:
    """Requests in arrival order plus where they came from."""

    kind: str  # "mooncake" | "store" | "synthetic" | "requests"
    name: str
    block_size: int
    requests: list[TraceRequest] = field(default_factory=list)
    skipped: int = 0  # records without segments or a prompt size, or not served
    # a store's records: what the upstream reported for the very requests replayed
    # (prompt_tokens, cached_tokens, hit_rate), and where the block size came from
    measured: dict[str, Any] | None = None
    block_source: str | None = None

    @property
    def id_block_size(self) -> int | None:
        return MOONCAKE_BLOCK_SIZE if self.kind == "mooncake" else None


# -- Mooncake --------------------------------------------------------------------------


class _MooncakeLine(msgspec.Struct):
    timestamp: float
    input_length: int
    hash_ids: list[int]
    output_length: int = 0


def load_mooncake(
    path: str | Path,
    block_size: int = MOONCAKE_BLOCK_SIZE,
    *,
    limit: int | None = None,
    progress: Progress | None = None,
) -> Trace:
    """Parse a Mooncake trace. ``block_size`` must divide 512."""
    if block_size <= 0 or MOONCAKE_BLOCK_SIZE % block_size:
        raise ValueError(f"block size for a Mooncake trace must divide 512, not {block_size}")
    split = MOONCAKE_BLOCK_SIZE // block_size
    decoder = msgspec.json.Decoder(_MooncakeLine)
    path = Path(path)
    trace = Trace("mooncake", path.name, block_size)
    out = trace.requests
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            try:
                r = decoder.decode(line)
            except msgspec.DecodeError as exc:
                raise ValueError(f"{path}:{n}: not a Mooncake trace line: {exc}") from exc
            ids = r.hash_ids
            if split == 1:
                keys: Sequence[Hashable] = ids
            else:
                full = r.input_length // block_size
                keys = [(h, j) for h in ids for j in range(split)][:full]
            out.append(
                TraceRequest(keys, r.input_length, r.output_length, r.timestamp / 1000.0, ids)
            )
            if progress is not None and n % 2000 == 0:
                progress(n, None)
    return trace


# -- store records ---------------------------------------------------------------------

_SCALE_STEP = 32  # scale factors are rounded to 1/32 so equal segments stay equal


def _segment_ids(seg_hash: str, n: int) -> np.ndarray:
    """``n`` pseudo-token ids drawn from a segment's hash: equal segments give equal ids,
    and a shorter run of a segment is a prefix of a longer one."""
    seed = int.from_bytes(hashlib.blake2b(seg_hash.encode(), digest_size=8).digest(), "little")
    rng = np.random.Generator(np.random.PCG64(seed))
    return rng.integers(0, 2**31 - 1, size=n, dtype=np.int64)


def record_tokens(segments: Sequence[Segment], prompt_tokens: int | None) -> np.ndarray:
    """Pseudo-tokens of a request from its upstream segments.

    The whole tool list (``tools``) stands for the per-tool segments it contains. Each
    segment gets ``tokens * s`` ids, where ``s = prompt_tokens / Σ tokens`` rounded to a
    multiple of 1/32 (so the same segment has the same length in requests whose factors
    differ slightly, and the prefix cache sees equal prefixes as equal); the rounding
    remainder is given to (or taken from) the last segments, so the total is exactly
    ``prompt_tokens``.
    """
    has_tools = any(s.kind == "tools" for s in segments)
    segs = [s for s in segments if not (has_tools and s.kind == "tool")]
    est = [max(0, s.tokens) for s in segs]
    total_est = sum(est)
    target = total_est if prompt_tokens is None else max(0, prompt_tokens)
    if not segs or total_est == 0:
        return np.zeros(0, dtype=np.int64)
    scale = round(target / total_est * _SCALE_STEP) / _SCALE_STEP or 1 / _SCALE_STEP
    lengths = [int(round(t * scale)) for t in est]
    diff = target - sum(lengths)
    i = len(lengths) - 1
    if diff > 0:
        lengths[i] += diff
    while diff < 0 and i >= 0:
        cut = min(lengths[i], -diff)
        lengths[i] -= cut
        diff += cut
        i -= 1
    parts = [_segment_ids(s.hash, n) for s, n in zip(segs, lengths, strict=True) if n]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def records_to_trace(records: Iterable[Record], block_size: int, name: str = "records") -> Trace:
    """The served records (a 2xx status) with upstream segments, as a trace; beside it
    the hit rate the upstream reported for those same requests."""
    trace = Trace("store", name, block_size)
    t0: float | None = None
    prompt = cached = reported = 0
    for rec in records:
        if not rec.segments_out or not 200 <= rec.status < 300:
            trace.skipped += 1
            continue
        tokens = record_tokens(rec.segments_out, rec.prompt_tokens)
        if len(tokens) == 0:
            trace.skipped += 1
            continue
        t0 = rec.received_at if t0 is None else t0
        keys = hash_blocks(tokens, block_size)
        trace.requests.append(
            TraceRequest(keys, len(tokens), rec.completion_tokens or 0, rec.received_at - t0)
        )
        if rec.prompt_tokens:
            prompt += rec.prompt_tokens
            cached += rec.cached_tokens or 0
            reported += rec.cached_tokens is not None
    if prompt:
        trace.measured = {
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "hit_rate": cached / prompt,
            "requests_with_cached_figure": reported,
        }
    return trace


def load_store(
    dsn: str, block_size: int | None, *, progress: Progress | None = None, default: int = 64
) -> Trace:
    """Records of a store (``sqlite:///…``, a ``.db`` path, ``postgresql://…``). Without a
    ``block_size``, the one the records show: every cached figure is a whole number of
    the upstream's blocks (``default`` when none is non-zero)."""
    from prefixgate.doctor.distribution import cached_values, infer_block
    from prefixgate.store import open_store

    with open_store(dsn) as store:
        source = "given"
        if block_size is None:
            found = infer_block(cached_values(store, []))
            block_size = found.block if found else default
            source = (
                f"from the records' cached figures ({found.distinct_values} values)"
                if found
                else "default (no cached figure to infer it from)"
            )
        records = store.iter_records()
        if progress is not None:
            records = _counting(records, progress)
        trace = records_to_trace(records, block_size, name=_safe_name(dsn))
    trace.block_source = source
    return trace


def _counting(items: Iterable[Any], progress: Progress) -> Iterable[Any]:
    for n, item in enumerate(items, 1):
        if n % 500 == 0:
            progress(n, None)
        yield item


def _safe_name(dsn: str) -> str:
    """A DSN without credentials (never print a password)."""
    if "://" in dsn and "@" in dsn:
        scheme, rest = dsn.split("://", 1)
        return f"{scheme}://…@{rest.rsplit('@', 1)[1]}"
    return dsn


# -- synthetic agent traffic -------------------------------------------------------------


def _openai_messages(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any] | None]:
    """Chat messages and tools of a simulated request as the upstream receives them: an
    Anthropic body goes through the gateway's own converter (which drops cache markers)."""
    if "system" in body or _is_anthropic(body):
        from prefixgate.apis.messages.request import ConvertOptions, anthropic_to_openai

        body = anthropic_to_openai(body, ConvertOptions(upstream_model="sim"))
    return body.get("messages", []), body.get("tools")


def _is_anthropic(body: dict[str, Any]) -> bool:
    for m in body.get("messages", ()):
        content = m.get("content")
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result") for b in content
        ):
            return True
    return False


def load_synthetic(
    spec: Any = None,
    block_size: int = 64,
    *,
    output_tokens: int = 256,
    interarrival: float = 1.0,
    progress: Progress | None = None,
) -> Trace:
    """Synthetic sessions of ``spec`` (a :class:`~prefixgate.lab.traffic.TrafficSpec`,
    default: the generator's defaults), interleaved as the generator does, rendered with
    ``ChatRenderer`` and ``ApproxTokenizer``. Arrivals are ``interarrival`` seconds apart;
    every request is given ``output_tokens`` of output."""
    from prefixgate.lab.traffic import TrafficSpec, traffic

    spec = TrafficSpec() if spec is None else spec
    renderer = ChatRenderer()
    tokenizer = ApproxTokenizer()
    requests = traffic(spec)
    trace = Trace("synthetic", f"synthetic:{spec.sessions}x{spec.turns}", block_size)
    for i, req in enumerate(requests):
        messages, tools = _openai_messages(req.body)
        text = renderer.render(messages, tools)
        tokens = tokenizer.encode_array(text)
        keys = hash_blocks(tokens, block_size)
        trace.requests.append(TraceRequest(keys, len(tokens), output_tokens, i * interarrival))
        if progress is not None and (i + 1) % 50 == 0:
            progress(i + 1, len(requests))
    return trace
