"""The diagnosis as plain data: a tree of dataclasses that ``dataclasses.asdict`` turns
into JSON-able dicts (``prefixgate doctor --json``) and :mod:`.output` turns into text."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

CRITICAL = "critical"
WARNING = "warning"
INFO = "info"
SEVERITY_ORDER = {CRITICAL: 0, WARNING: 1, INFO: 2}


@dataclass
class Table:
    """A small evidence table: a title, column names and rows of plain values."""

    title: str
    columns: list[str]
    rows: list[list[Any]]


@dataclass
class Finding:
    """One diagnosed problem, evidence first-class.

    ``kind`` is a stable machine name (``prefix_broken``, ``per_session_prefix``,
    ``l2_write_only``, ``cache_report_off``, ``usage_includes_cache``,
    ``context_overflow``, ``unknown_model``, ``upstream_unreachable``, ``rate_limited``,
    ``errors``, ``kv_capacity``, ``cache_cleared``, ``routing_loss``, ``template_hoisting``,
    ``template_reasoning``, ``calibration``, ``no_problem``);
    ``facts`` holds the figures behind the text (also machine-readable)."""

    kind: str
    severity: str
    title: str
    summary: list[str] = field(default_factory=list)
    fix: list[str] = field(default_factory=list)
    evidence: list[Table] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class Rate:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def add(self, requests: int, prompt: int, cached: int) -> None:
        self.requests += requests
        self.prompt_tokens += prompt
        self.cached_tokens += cached

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hit_rate": round(self.hit_rate, 6)}


@dataclass
class Diagnosis:
    store: str
    since: float | None
    until: float | None
    generated_at: float
    overall: dict[str, Any]
    days: list[dict[str, Any]]
    slices: list[dict[str, Any]]
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)
    # every breaker found, material or not (doctor/breakers.py), most tokens lost first
    breakers: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def critical(self) -> bool:
        return any(f.severity == CRITICAL for f in self.findings)
