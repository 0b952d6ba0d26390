"""OpenTelemetry export against a real OTLP/HTTP receiver (an HTTP server in the test),
whose requests are decoded with the official ``opentelemetry-proto`` package: one span per
request with the GenAI conventions' attributes, the client's trace continued, nothing
lost or slowed when the endpoint is down, nothing loaded when telemetry is off."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.fakes import Reply

PRICES = {"models": {"m": {"input": 3.0, "cached_input": 0.3, "output": 15.0, "cache_write": 3.75}}}


class Receiver:
    """An OTLP/HTTP trace receiver: POST /v1/traces with a protobuf body."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.headers: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (the stdlib's name)
                body = self.rfile.read(int(self.headers["content-length"]))
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                receiver.requests.append(req)
                receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> list:
        out = []
        for req in self.requests:
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    out.extend(ss.spans)
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def attrs(span) -> dict:
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


def wait_spans(gws, receiver, n: int) -> list:
    deadline = time.monotonic() + 20
    while True:
        for gw in gws:
            gw.gateway.telemetry.force_flush()
        spans = receiver.spans()
        if len(spans) >= n:
            return spans
        assert time.monotonic() < deadline, f"{len(spans)} spans of {n}"
        time.sleep(0.05)


def test_one_span_per_request_with_the_genai_attributes(gateway, upstream, receiver, monkeypatch):
    monkeypatch.setenv(
        "TEST_OTLP_HEADERS", "authorization=Basic cGs6c2s=,x-langfuse-ingestion-version=4"
    )
    telemetry = {"otlp_endpoint": receiver.url, "headers_env": "TEST_OTLP_HEADERS"}
    chat = gateway(telemetry=telemetry, prices=PRICES)
    vendor = gateway(
        {"kind": "anthropic", "base_url": upstream.url}, telemetry=telemetry, prices=PRICES
    )
    upstream.script = lambda body: Reply(
        text="hi there", prompt_tokens=1000, cached_tokens=768, completion_tokens=5
    )
    upstream.anthropic_usage = {
        "input_tokens": 10,
        "cache_read_input_tokens": 90,
        "cache_creation_input_tokens": 20,
        "output_tokens": 3,
    }
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    o = openai.OpenAI(base_url=chat.url + "/v1", api_key="k", max_retries=0)
    stream = o.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hello"}],
        stream=True,
        extra_headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "hi there"
    a = anthropic.Anthropic(base_url=vendor.url, api_key="k", max_retries=0)
    a.messages.create(
        model="m",
        max_tokens=16,
        messages=[{"role": "user", "content": "hello"}],
        extra_headers={"x-claude-code-session-id": "sess-42"},
    )
    upstream.script = lambda body: Reply(status=503)
    with pytest.raises(openai.APIStatusError):
        o.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
    wait_spans([chat, vendor], receiver, 3)
    by_id = {attrs(s)["prefixgate.request_id"]: s for s in receiver.spans()}
    assert len(by_id) == 3
    recs = chat.records + vendor.records
    first, failed, passthrough = (
        by_id[recs[0].request_id],
        by_id[recs[1].request_id],
        by_id[recs[2].request_id],
    )

    a0 = attrs(first)
    assert first.name == "chat m" and first.kind == first.SPAN_KIND_CLIENT
    assert first.trace_id.hex() == trace_id  # the client's trace, continued
    assert first.parent_span_id.hex() == "00f067aa0ba902b7"
    assert a0["gen_ai.operation.name"] == "chat"
    assert a0["gen_ai.provider.name"] == "openai"
    assert a0["gen_ai.request.model"] == "m" and a0["gen_ai.response.model"] == "m"
    assert a0["gen_ai.usage.input_tokens"] == 1000  # cached tokens included
    assert a0["gen_ai.usage.cache_read.input_tokens"] == 768
    assert a0["gen_ai.usage.output_tokens"] == 5
    assert "gen_ai.usage.cache_creation.input_tokens" not in a0  # not reported by this API
    assert a0["gen_ai.request.stream"] is True
    assert 0 < a0["gen_ai.response.time_to_first_chunk"] < 10
    assert a0["gen_ai.usage.cost"] == pytest.approx(recs[0].cost_nano / 1e9)
    assert a0["prefixgate.cost_saved"] == pytest.approx(768 * 2.7 / 1e6)
    assert first.end_time_unix_nano - first.start_time_unix_nano == pytest.approx(
        recs[0].latency_ms * 1e6, rel=1e-3
    )

    a1 = attrs(failed)
    assert failed.status.code == failed.status.STATUS_CODE_ERROR
    assert a1["error.type"] == recs[1].error_type and a1["prefixgate.status"] == recs[1].status

    a2 = attrs(passthrough)
    assert a2["gen_ai.provider.name"] == "anthropic"
    assert a2["gen_ai.usage.input_tokens"] == 120  # 10 fresh + 90 read + 20 written
    assert a2["gen_ai.usage.cache_read.input_tokens"] == 90
    assert a2["gen_ai.usage.cache_creation.input_tokens"] == 20
    assert a2["gen_ai.usage.cache_write.input_tokens"] == 20
    assert a2["gen_ai.conversation.id"] == a2["session.id"] == recs[2].session_id
    assert (
        recs[2].cost_nano
        == (10 * 3_000_000 + 90 * 300_000 + 20 * 3_750_000 + 3 * 15_000_000) // 1000
    )
    # the resource and the headers from the environment
    resource = {
        kv.key: kv.value.string_value
        for kv in receiver.requests[0].resource_spans[0].resource.attributes
    }
    assert resource["service.name"] == "prefixgate"
    assert receiver.headers[0]["authorization"] == "Basic cGs6c2s="
    assert receiver.headers[0]["x-langfuse-ingestion-version"] == "4"
    assert receiver.headers[0]["content-type"] == "application/x-protobuf"
    o.close()
    a.close()


def test_a_span_says_where_the_prompt_broke_against_the_session(receiver):
    from prefixgate.config import TelemetryConfig
    from prefixgate.record.record import Record, Segment
    from prefixgate.telemetry import Telemetry

    def rec(i: int, system: str, messages: int) -> Record:
        segs = [Segment("system", "system[0]", system, 400, 100)]
        segs += [
            Segment("message", f"messages[{m}]:user", f"m{m}", 40, 10) for m in range(messages)
        ]
        return Record(
            request_id=f"r{i}",
            received_at=time.time(),
            session_id="sess-7",
            status=200,
            segments_in=segs,
            segments_out=segs,
        )

    tel = Telemetry(TelemetryConfig(otlp_endpoint=receiver.url))
    try:
        for r in (rec(0, "cch=1", 1), rec(1, "cch=1", 3), rec(2, "cch=2", 5)):
            tel._span(r, None)
        tel.force_flush()
    finally:
        tel.shutdown()
    first, grown, broken = (
        attrs(s) for s in sorted(receiver.spans(), key=lambda s: attrs(s)["prefixgate.request_id"])
    )
    assert not any(k.startswith("prefixgate.prefix.") for k in first)  # nothing to compare
    assert grown["prefixgate.prefix.extends_previous"] is True
    assert broken["prefixgate.prefix.extends_previous"] is False
    assert broken["prefixgate.prefix.changed_segment"] == "system[0]"
    assert broken["prefixgate.prefix.changed_kind"] == "system"
    assert broken["prefixgate.prefix.tokens_before_change"] == 0


def test_sampling_keeps_a_share_of_the_traces(gateway, upstream, receiver):
    gw = gateway(telemetry={"otlp_endpoint": receiver.url, "sample_ratio": 0.0})
    o = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
    for _ in range(5):
        o.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    # a client's sampled trace is kept whatever the ratio (the parent decides)
    o.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "x"}],
        extra_headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    )
    spans = wait_spans([gw], receiver, 1)
    time.sleep(0.2)
    gw.gateway.telemetry.force_flush()
    assert (
        len(receiver.spans()) == 1 and spans[0].trace_id.hex() == "0af7651916cd43dd8448eb211c80319c"
    )
    o.close()


def test_an_unreachable_endpoint_costs_requests_nothing_and_logs_once(gateway, upstream, caplog):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    gw = gateway(telemetry={"otlp_endpoint": f"http://127.0.0.1:{port}/v1/traces", "timeout": 0.5})
    o = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
    caplog.set_level(logging.INFO)
    for _round in range(3):
        for _ in range(10):
            r = o.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            assert r.choices[0].message.content == "Hello from upstream"
        time.sleep(0.1)  # the spans are made on the loop's next turn
        gw.gateway.telemetry.force_flush()
    exporter = gw.gateway.telemetry.exporter
    assert exporter.failed == 30 and exporter.exported == 0
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage().split(":")[0] for r in lines] == ["telemetry"]
    assert "spans not exported" in lines[0].getMessage()  # the first batch; the rest held back
    assert len(gw.records) == 30 and all(r.status == 200 for r in gw.records)
    o.close()


def test_off_by_default_loads_nothing():
    code = (
        "import sys\n"
        "from prefixgate.config import parse_config\n"
        "from prefixgate.serve.app import create_app\n"
        "app = create_app(parse_config({'channels': [{'name': 'c', 'base_url': 'http://127.0.0.1:9/v1'}], 'store': None}))\n"
        "assert app.state.gateway.telemetry is None\n"
        "loaded = [m for m in sys.modules if m.startswith('opentelemetry') or m == 'prefixgate.telemetry']\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_span_carries_the_requests_miss_ledger(gateway, upstream, receiver, tmp_path):
    """With a store, each request gets a miss ledger after its answer; its span waits for it
    and says where every prompt token went, the parts summing to the prompt."""
    gw = gateway(
        telemetry={"otlp_endpoint": receiver.url},
        store={"dsn": f"sqlite:///{tmp_path}/r.db", "journal_path": str(tmp_path / "j")},
    )
    upstream.script = lambda body: Reply(text="ok", prompt_tokens=900, completion_tokens=2)
    o = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
    history = [{"role": "system", "content": "You are terse. " * 200}]
    for turn in range(3):
        history.append({"role": "user", "content": f"question {turn} " * 50})
        o.chat.completions.create(
            model="m", messages=history, extra_headers={"x-session-id": "sess-ledger"}
        )
        history.append({"role": "assistant", "content": "ok"})
    o.close()
    spans = wait_spans([gw], receiver, 3)
    causes = ("hit", "prefix_changed", "evicted", "elsewhere", "partial_block", "cold", "unknown")
    for span in spans:
        a = attrs(span)
        assert a["prefixgate.ledger.source"] == "model"  # no engine events here
        parts = [a[f"prefixgate.ledger.{c}_tokens"] for c in causes]
        assert sum(parts) == a["gen_ai.usage.input_tokens"] == 900
