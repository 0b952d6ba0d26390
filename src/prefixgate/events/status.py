"""The state of one replica's event stream, for ``/healthz``, ``/metrics`` and routing.

A replica's events are *usable* unless they are ``stale``:

- an error makes them stale until it is gone (the engine's block size differs from the
  channel's);
- no publisher connected for longer than ``stale_after`` (engine down, or events off);
  a publisher is connected once its ZeroMQ handshake succeeded (a TCP connection alone,
  a port scanner's, does not count), until its connection closes;
- requests were sent to the replica (:meth:`ReplicaStatus.note_request`) and no batch
  came for longer than ``stale_after`` after the first of them. An idle engine publishes
  nothing and is not stale: its index is still the truth.

``connects`` counts the publishers' handshakes since the start (an engine that restarts,
or reconnects after a network fault, adds one), ``handshake_failures`` the connections
that closed before theirs (a port probe, another protocol), and ``connection_since`` is
the wall-clock time ``connected`` took its current value.

``complete`` says whether every batch since the publisher's first was applied; a gap the
replay could not fill, a batch that did not decode, or joining a running engine without a
replay socket makes it false (predictions may then be short of the truth, or long).
Times are from one monotonic clock given by the caller, so tests can move it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from prefixgate.config.kv_events import Endpoints

__all__ = ["ReplicaStatus"]


@dataclass(slots=True)
class ReplicaStatus:
    replica: str
    endpoints: Endpoints
    stale_after: float
    started_at: float
    started_wall: float = field(default_factory=time.time)  # the start, on the wall clock
    publishers: int = 0  # connected now (their handshake done, not gone)
    connects: int = 0  # handshakes since the start
    handshake_failures: int = 0  # connections that never became a publisher (a port probe)
    changed_at: float | None = None  # when ``connected`` last changed (None: since start)
    changed_wall: float | None = None  # the same, on the wall clock
    last_seq: int | None = None
    last_message_at: float | None = None
    awaiting_since: float | None = None  # first request noted after the last batch
    complete: bool = False
    batches: int = 0
    events: int = 0
    duplicates: int = 0  # batches seen twice (the live stream after a replay)
    gaps: int = 0
    replays: int = 0
    replay_failures: int = 0
    replayed_batches: int = 0
    lost_batches: int = 0  # gaps no replay filled
    restarts: int = 0
    malformed: int = 0  # messages or payloads that did not decode (counted, skipped)
    unknown_events: int = 0
    malformed_events: int = 0
    unknown_types: list[str] = field(default_factory=list)
    error: str | None = None  # an ongoing problem: makes the events stale
    last_problem: str | None = None  # the latest thing logged, for the operator

    @property
    def connected(self) -> bool:
        return self.publishers > 0

    def publisher_up(self, now: float, wall: float) -> None:
        """A publisher's handshake succeeded."""
        self.connects += 1
        self.publishers += 1
        if self.publishers == 1:
            self.changed_at, self.changed_wall = now, wall

    def publisher_down(self, now: float, wall: float, *, all_gone: bool = False) -> None:
        """A connected publisher went away (``all_gone``: the socket closed, every one)."""
        was = self.publishers
        self.publishers = 0 if all_gone else max(0, self.publishers - 1)
        if was and not self.publishers:
            self.changed_at, self.changed_wall = now, wall

    def note_request(self, now: float) -> None:
        """A request went to this replica: its engine should publish soon."""
        if self.awaiting_since is None:
            self.awaiting_since = now

    def note_batch(self, now: float) -> None:
        self.last_message_at = now
        self.awaiting_since = None

    def stale(self, now: float) -> bool:
        if self.error is not None:
            return True
        if not self.connected:
            since = self.changed_at if self.changed_at is not None else self.started_at
            if now - since > self.stale_after:
                return True
        return self.awaiting_since is not None and now - self.awaiting_since > self.stale_after

    def as_dict(self, now: float) -> dict[str, Any]:
        """Plain data for ``/healthz`` details and the dashboard."""
        return {
            "replica": self.replica,
            "endpoint": self.endpoints.events,
            "mode": self.endpoints.mode,
            "replay_endpoint": self.endpoints.replay,
            "connected": self.connected,
            "publishers": self.publishers,
            "connects": self.connects,
            "handshake_failures": self.handshake_failures,
            "connection_since": (
                self.started_wall if self.changed_wall is None else self.changed_wall
            ),
            "stale": self.stale(now),
            "complete": self.complete,
            "last_seq": self.last_seq,
            "seconds_since_last_batch": (
                None if self.last_message_at is None else round(now - self.last_message_at, 3)
            ),
            "batches": self.batches,
            "events": self.events,
            "duplicates": self.duplicates,
            "gaps": self.gaps,
            "replays": self.replays,
            "replay_failures": self.replay_failures,
            "replayed_batches": self.replayed_batches,
            "lost_batches": self.lost_batches,
            "restarts": self.restarts,
            "malformed": self.malformed,
            "unknown_events": self.unknown_events,
            "malformed_events": self.malformed_events,
            "unknown_types": list(self.unknown_types),
            "error": self.error,
            "last_problem": self.last_problem,
        }
