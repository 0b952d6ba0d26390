"""Conversion micro-benchmark: the real Claude Code request to the upstream request, and a
streamed response through the stream state machine. No I/O.

    python benchmarks/convert.py [--json]

Request figures use the body of ``tests/fixtures/claude-code/01_v2.1.332_print_turn1.json``
(a real Claude Code request, 50 KB of JSON). ``request path`` is what the gateway does to
it before sending: the typed decode with its checks (``decode_messages_body``), the
billing-header hygiene, the conversion (texts stay raw JSON) and the encoding; ``decode``
and ``convert`` are its first and third steps. ``plain path`` is the way a request goes
that the typed decode refuses (``messages_body._plain_path``: the dict decode with the depth
check, the dict checks, then the lenient typed decode), followed by the same hygiene,
conversion and encoding. ``dict API`` is ``anthropic_to_openai`` on a decoded dict (what the
token counter and the cache model call): it encodes the dict and takes the typed way.
The stream figures feed a 256-chunk OpenAI stream (decoded chunks, as the relay gives
them) through ``AnthropicStream``. Goal: ≤ 0.5 ms for the request path.

``codex path`` is the same for ``POST /v1/responses``, on the body of
``tests/fixtures/codex/01_v0.171.0_exec_turn1.json`` (a real Codex CLI request, 40 KB of
JSON): the typed decode with its checks (``decode_responses_body``), the conversion to Chat
Completions and the encoding; ``codex_stream`` feeds the same 256-chunk stream through
``ResponsesStream``. Goal: ≤ 0.3 ms for the codex path.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import msgspec

from prefixgate.apis.messages.request import ConvertOptions, anthropic_to_openai, convert
from prefixgate.apis.messages.stream import AnthropicStream
from prefixgate.apis.responses import request as responses_request
from prefixgate.apis.responses.response import response_base
from prefixgate.apis.responses.stream import ResponsesStream
from prefixgate.config import Limits
from prefixgate.hygiene import strip_billing_header
from prefixgate.hygiene.billing import strip_billing_header_typed
from prefixgate.protocol.messages_body import _plain_path, decode_messages_body
from prefixgate.protocol.responses import decode_responses_body
from prefixgate.sse import SSEDecoder

HERE = Path(__file__).resolve().parent
FIXTURE = "claude-code/01_v2.1.332_print_turn1.json"
CODEX_FIXTURE = "codex/01_v0.171.0_exec_turn1.json"


def fixture_body(name: str = FIXTURE) -> bytes:
    path = HERE.parent / "tests" / "fixtures" / name
    body = json.loads(path.read_text())["body"]
    return (body if isinstance(body, str) else json.dumps(body)).encode()


def timed(fn, n: int) -> dict:
    for _ in range(min(50, n)):
        fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    samples.sort()
    return {
        "p50_ms": 1000 * samples[len(samples) // 2],
        "p99_ms": 1000 * samples[int(len(samples) * 0.99)],
        "mean_ms": 1000 * statistics.fmean(samples),
    }


def stream_chunks(n: int) -> list[bytes]:
    """An OpenAI SSE stream as an upstream sends it: role, n content chunks, finish, usage."""

    def chunk(choices, usage=None) -> bytes:
        obj = {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": choices}
        if usage:
            obj["usage"] = usage
        return b"data: " + msgspec.json.encode(obj) + b"\n\n"

    out = [chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}}])]
    out += [chunk([{"index": 0, "delta": {"content": f" w{i}"}}]) for i in range(n)]
    out.append(chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    usage = {"prompt_tokens": 12000, "completion_tokens": n}
    usage["prompt_tokens_details"] = {"cached_tokens": 11000}
    out.append(chunk([], usage))
    out.append(b"data: [DONE]\n\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=2000, help="iterations per figure")
    ap.add_argument("--chunks", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    raw = fixture_body()
    limits = Limits()
    typed = decode_messages_body(raw, limits).typed
    opts = ConvertOptions(upstream_model="served-model")
    decode = msgspec.json.decode
    encode = msgspec.json.encode

    def request_path() -> bytes:
        clean, _ = strip_billing_header_typed(decode_messages_body(raw, limits).typed)
        return encode(convert(clean, opts))

    def plain_path() -> bytes:
        clean, _ = strip_billing_header_typed(_plain_path(raw, limits).typed)
        return encode(convert(clean, opts))

    plain = decode(raw)

    def dict_api() -> bytes:
        clean, _ = strip_billing_header(plain)
        return encode(anthropic_to_openai(clean, opts))

    assert decode(request_path()) == decode(plain_path()) == decode(dict_api())

    chunks = stream_chunks(args.chunks)

    def feed(conv) -> None:
        conv.start()
        dec = SSEDecoder()
        for c in chunks:
            for _, data in dec.feed(c):
                if data != b"[DONE]":
                    conv.feed(decode(data))
        conv.finish()

    def stream() -> None:
        feed(AnthropicStream(model="claude", stop_sequences=None, exclude_cache=True))

    codex_raw = fixture_body(CODEX_FIXTURE)
    codex = decode_responses_body(codex_raw, limits)

    def codex_path() -> bytes:
        return encode(
            responses_request.convert(decode_responses_body(codex_raw, limits).typed, opts)
        )

    def codex_stream() -> None:
        feed(ResponsesStream(response_base(codex), responses_request.tool_map(codex.typed)))

    results = {
        "body_bytes": len(raw),
        "decode": timed(lambda: decode_messages_body(raw, limits), args.n),
        "convert": timed(lambda: convert(typed, opts), args.n),
        "request_path": timed(request_path, args.n),
        "plain_path": timed(plain_path, args.n),
        "dict_api": timed(dict_api, args.n),
        f"stream_{args.chunks}_chunks": timed(stream, max(50, args.n // 10)),
    }
    results["codex_body_bytes"] = len(codex_raw)
    results["codex_path"] = timed(codex_path, args.n)
    results[f"codex_stream_{args.chunks}_chunks"] = timed(codex_stream, max(50, args.n // 10))
    s = results[f"stream_{args.chunks}_chunks"]
    results["stream_per_chunk_us"] = 1000 * s["p50_ms"] / args.chunks
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"Claude Code request: {len(raw) / 1024:.0f} KiB of JSON")
    print(f"Codex request: {len(codex_raw) / 1024:.0f} KiB of JSON")
    print(f"{'figure':<28}{'p50 ms':>10}{'p99 ms':>10}")
    for k, v in results.items():
        if isinstance(v, dict):
            print(f"{k:<28}{v['p50_ms']:>10.3f}{v['p99_ms']:>10.3f}")
    print(f"stream, per chunk: {results['stream_per_chunk_us']:.1f} µs")
    goal = results["request_path"]["p50_ms"]
    print(f"request path goal ≤ 0.5 ms: {'met' if goal <= 0.5 else 'NOT met'} ({goal:.3f} ms)")
    goal = results["codex_path"]["p50_ms"]
    print(f"codex path goal ≤ 0.3 ms: {'met' if goal <= 0.3 else 'NOT met'} ({goal:.3f} ms)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
