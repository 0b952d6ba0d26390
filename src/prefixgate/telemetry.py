"""OpenTelemetry export: one span per request, OTLP over HTTP/protobuf, with the GenAI
semantic conventions (``gen_ai.*``) and prefixgate's own attributes (``prefixgate.*``).

Off by default (``telemetry:`` in the config); this module and the OpenTelemetry SDK are
only imported when it is on, so a gateway without it pays nothing. When on, the span is
built from the finished record on the event loop's next turn — after the answer's last
bytes went out — and handed to the SDK's batch processor, whose own thread encodes and
sends batches. An endpoint that is down costs the requests nothing: the batch is dropped
after the exporter's timeout, and the log says so once per interval (the SDK's own
per-batch lines are held back).

Attributes (the conventions' names, checked against the GenAI registry):
``gen_ai.operation.name`` (``chat``), ``gen_ai.provider.name`` (the channel's API:
``openai`` or ``anthropic``), ``gen_ai.request.model``, ``gen_ai.response.model``,
``gen_ai.usage.input_tokens`` (every input token, cached ones included),
``gen_ai.usage.output_tokens``, ``gen_ai.usage.cache_read.input_tokens``,
``gen_ai.usage.cache_creation.input_tokens`` and its newer name
``gen_ai.usage.cache_write.input_tokens`` (when the upstream reports cache writes),
``gen_ai.conversation.id`` (the session), ``gen_ai.response.time_to_first_chunk``
(seconds), ``gen_ai.request.stream``, ``error.type``; ``gen_ai.usage.cost`` (Langfuse
reads it as the generation's cost) with ``session.id`` and ``user.id`` (the key); and
where the prompt broke against the session's previous one (``prefixgate.prefix.*``, from
the segment capture); and the request's miss ledger when the gateway computes one
(``prefixgate.ledger.<cause>_tokens`` for hit, prefix_changed, evicted, elsewhere,
partial_block, cold and unknown, ``cleared_tokens`` when some evicted ones were lost to a
cache clear, with ``prefixgate.ledger.source``, ``changed_segment`` and
``elsewhere_replica``): the span then waits for the ledger, which is computed after the
answer, off the request path.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from prefixgate.config import TelemetryConfig
from prefixgate.logthrottle import LogThrottle
from prefixgate.record import Record
from prefixgate.record.segments import first_changed

log = logging.getLogger("prefixgate")
SESSIONS_KEPT = 10_000  # sessions whose last prompt is kept to say where the next one broke
# The SDK's loggers that would write a line per failed batch (or per dropped span).
_SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.sdk._shared_internal",
)


def parse_headers(text: str | None) -> dict[str, str]:
    """``name=value,name=value`` (the form of ``OTEL_EXPORTER_OTLP_HEADERS``)."""
    out = {}
    for part in (text or "").split(","):
        name, sep, value = part.partition("=")
        if sep and name.strip():
            out[name.strip()] = value.strip()
    return out


class _Quiet(logging.Filter):
    """Holds back the SDK's own warnings: the exporter's failures are logged, throttled,
    by :class:`_Exporter`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.CRITICAL


class _Exporter(OTLPSpanExporter):
    """The official OTLP/HTTP exporter; a failed batch is one throttled log line."""

    def __init__(self, endpoint: str, **kw) -> None:
        super().__init__(endpoint=endpoint, **kw)
        self.where = endpoint.split("?", 1)[0]
        self.failures = LogThrottle(log, interval=60.0)
        self.exported = 0
        self.failed = 0

    def export(self, spans):
        try:
            result = super().export(spans)
        except Exception as exc:  # never into the SDK's thread
            result, reason = SpanExportResult.FAILURE, str(exc)
        else:
            reason = "the endpoint did not take them"
        if result is SpanExportResult.SUCCESS:
            self.exported += len(spans)
        else:
            self.failed += len(spans)
            self.failures.warning(
                "otlp", "telemetry: %d spans not exported to %s: %s", len(spans), self.where, reason
            )
        return result


class Telemetry:
    """The tracer of one gateway app; :meth:`export` is called by ``Exchange.finish``."""

    def __init__(self, cfg: TelemetryConfig, channels=()) -> None:
        self.kinds = {c.name: c.kind for c in channels}
        headers = parse_headers(os.environ.get(cfg.headers_env)) if cfg.headers_env else {}
        self.exporter = _Exporter(cfg.otlp_endpoint, headers=headers, timeout=cfg.timeout)
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": cfg.service_name}),
            sampler=ParentBased(TraceIdRatioBased(cfg.sample_ratio)),
        )
        self.processor = BatchSpanProcessor(self.exporter)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("prefixgate")
        self.propagator = TraceContextTextMapPropagator()
        self._last: OrderedDict[str, list] = OrderedDict()  # session -> its last prompt
        self._quiet = _Quiet()
        for name in _SDK_LOGGERS:
            logging.getLogger(name).addFilter(self._quiet)

    def export(self, rec: Record, traceparent: str | None = None, ledger=None) -> None:
        """The record's span, built on the loop's next turn (off the answer's clock), with
        the request's miss ledger when it has one."""
        asyncio.get_running_loop().call_soon(self._span, rec, traceparent, ledger)

    def exporter_of(self, rec: Record, traceparent: str | None):
        """What exports the record's span once its ledger is known (``LedgerWorker.feed``'s
        ``then``)."""
        return lambda ledger: self.export(rec, traceparent, ledger)

    def _span(self, rec: Record, traceparent: str | None, ledger=None) -> None:
        try:
            parent = (
                self.propagator.extract({"traceparent": traceparent}) if traceparent else Context()
            )
            span = self.tracer.start_span(
                f"chat {rec.requested_model or ''}".rstrip(),
                context=parent,
                kind=SpanKind.CLIENT,
                start_time=int(rec.received_at * 1e9),
            )
            change = self.prefix_change(rec)  # every request, so each compares with its last
            if span.is_recording():
                span.set_attributes(attributes(rec, self.kinds.get(rec.channel, "openai")))
                span.set_attributes(change)
                if ledger is not None:
                    span.set_attributes(ledger_attributes(ledger))
                if rec.status >= 400 or rec.status == 0:
                    span.set_status(Status(StatusCode.ERROR, rec.error_type or str(rec.status)))
            span.end(end_time=int((rec.done_at or rec.received_at) * 1e9))
        except Exception:  # a span must never break the gateway
            log.exception("telemetry: no span for request %s", rec.request_id)

    def prefix_change(self, rec: Record) -> dict:
        """Where this request's prompt, as sent upstream, first differs from its session's
        previous one (the segment capture's lists; the last prompt of the latest
        ``SESSIONS_KEPT`` sessions is kept): that segment's name and kind and the tokens
        before it, or that it extends the previous prompt."""
        cur = rec.segments_out or rec.segments_in
        sid = rec.session_id
        if not cur or sid is None or rec.status != 200:
            return {}
        prev = self._last.pop(sid, None)
        self._last[sid] = cur
        if len(self._last) > SESSIONS_KEPT:
            self._last.popitem(last=False)
        if prev is None:
            return {}
        change = first_changed(prev, cur)
        if change is None:
            return {"prefixgate.prefix.extends_previous": True}
        seg = cur[change.index]
        return {
            "prefixgate.prefix.extends_previous": False,
            "prefixgate.prefix.changed_segment": seg.name,
            "prefixgate.prefix.changed_kind": seg.kind,
            "prefixgate.prefix.tokens_before_change": change.offset,
        }

    def force_flush(self, timeout_millis: int = 10_000) -> bool:
        return self.provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.provider.shutdown()
        for name in _SDK_LOGGERS:
            logging.getLogger(name).removeFilter(self._quiet)


def ledger_attributes(ledger) -> dict:
    """The miss ledger (ledger/): where each prompt token went, by cause, as
    ``prefixgate.ledger.<cause>_tokens``, with its source and what it names."""
    out = {f"prefixgate.ledger.{cause}_tokens": n for cause, n in ledger.parts().items()}
    out["prefixgate.ledger.source"] = ledger.source
    if ledger.cleared:  # the evicted tokens lost to a cache clear (a sub-count)
        out["prefixgate.ledger.cleared_tokens"] = ledger.cleared
    if ledger.changed_segment is not None:
        out["prefixgate.ledger.changed_segment"] = ledger.changed_segment
    if ledger.elsewhere_replica is not None:
        out["prefixgate.ledger.elsewhere_replica"] = ledger.elsewhere_replica
    return out


def attributes(rec: Record, provider: str = "openai") -> dict:
    """The span's attributes from a finished record (None values left out); ``provider``
    is the API of the channel that served it."""
    a = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": rec.requested_model,
        "gen_ai.response.model": rec.upstream_model,
        "gen_ai.request.stream": rec.stream,
        "gen_ai.usage.input_tokens": rec.prompt_tokens,
        "gen_ai.usage.output_tokens": rec.completion_tokens,
        "gen_ai.usage.cache_read.input_tokens": rec.cached_tokens,
        "gen_ai.usage.cache_creation.input_tokens": rec.cache_creation_tokens,
        "gen_ai.usage.cache_write.input_tokens": rec.cache_creation_tokens,
        "gen_ai.conversation.id": rec.session_id,
        "session.id": rec.session_id,
        "user.id": rec.key_name,
        "gen_ai.response.time_to_first_chunk": (
            rec.ttft_ms / 1000.0 if rec.ttft_ms is not None else None
        ),
        "error.type": rec.error_type,
        "gen_ai.usage.cost": rec.cost_nano / 1e9 if rec.cost_nano is not None else None,
        "prefixgate.request_id": rec.request_id,
        "prefixgate.endpoint": rec.endpoint,
        "prefixgate.client": rec.client,
        "prefixgate.key": rec.key_name,
        "prefixgate.owner": rec.key_owner,
        "prefixgate.channel": rec.channel,
        "prefixgate.replica": rec.replica,
        "prefixgate.status": rec.status,
        "prefixgate.retries": rec.retries,
        "prefixgate.cost_saved": (
            rec.cost_saved_nano / 1e9 if rec.cost_saved_nano is not None else None
        ),
    }
    return {k: v for k, v in a.items() if v is not None}


__all__ = ["Telemetry", "attributes", "parse_headers"]
