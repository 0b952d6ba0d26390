"""A KV-event publisher with the engines' wire: PUB socket, ROUTER replay, bounded buffer.

The simulated upstream publishes its prefix cache's stores and evictions with it, so the
subscriber, the index and everything built on them run against the same bytes a vLLM
sends, with no vLLM. It follows the engines' conventions:

- ``endpoint`` with ``*`` (``tcp://*:5557``, ``tcp://127.0.0.1:*`` for a free port), ``::``,
  ``ipc://`` or ``inproc://``: the PUB socket binds; a concrete ``tcp://host:port``: it
  connects (the subscriber binds);
- each batch goes out as ``[topic, seq (8 bytes big-endian), payload]``, ``seq`` from 0;
- the last ``buffer_steps`` batches are kept; a ``replay_endpoint`` ROUTER answers a
  request ``[identity, "", start]`` with ``[identity, "", seq, payload]`` for each kept batch
  from ``start`` on, then ``[identity, "", -1, ""]``;
- ``encoding`` picks the payload layout (``map``, ``array``, ``map-batch``: see
  :mod:`.wire`).

:meth:`EventPublisher.publish` is thread-safe and never blocks (a PUB socket drops what a
slow subscriber cannot take; the replay buffer still has it). The replay socket is served
by a daemon thread of its own.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import zmq

from .endpoints import check_endpoint, engine_binds
from .wire import ENCODINGS, END_SEQ, Encoding, Event, encode_batch, pack_seq

__all__ = ["EventPublisher", "PublisherSettings"]


@dataclass(frozen=True)
class PublisherSettings:
    """What ``--kv-events-config`` says to an engine (the fields vLLM's config has, plus
    the payload layout to imitate)."""

    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    topic: str = ""
    encoding: Encoding = "map"
    buffer_steps: int = 10_000
    data_parallel_rank: int = 0

    def __post_init__(self) -> None:
        check_endpoint(self.endpoint)
        if self.replay_endpoint is not None:
            check_endpoint(self.replay_endpoint)
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}")
        if self.buffer_steps < 1:
            raise ValueError("buffer_steps must be >= 1")

    def offset(self, replica: int) -> PublisherSettings:
        """The settings of the ``replica``-th of several engines: tcp ports + ``replica``
        (as vLLM offsets them by data-parallel rank), so each gets its own."""
        if replica == 0:
            return self
        return PublisherSettings(
            _port_plus(self.endpoint, replica),
            None if self.replay_endpoint is None else _port_plus(self.replay_endpoint, replica),
            self.topic,
            self.encoding,
            self.buffer_steps,
            self.data_parallel_rank,
        )


def _port_plus(endpoint: str, n: int) -> str:
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint.rpartition(":")
        return f"{host}:{int(port) + n}" if port.isdigit() else endpoint
    return f"{endpoint}_{n}"


class EventPublisher:
    """Publishes event batches as an engine does (see the module docstring)."""

    def __init__(self, settings: PublisherSettings) -> None:
        self.settings = settings
        self._ctx = zmq.Context()
        self._lock = threading.Lock()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=settings.buffer_steps)
        self._seq = 0
        self._topic = settings.topic.encode()
        self._closed = threading.Event()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self._replay: zmq.Socket | None = None
        self._thread: threading.Thread | None = None
        try:
            if engine_binds(settings.endpoint):
                self._pub.bind(settings.endpoint)
            else:
                self._pub.connect(settings.endpoint)
            if settings.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(settings.replay_endpoint)
        except zmq.ZMQError:
            self.close()
            raise
        if self._replay is not None:
            self._thread = threading.Thread(
                target=self._serve_replay, name="kv-events-replay", daemon=True
            )
            self._thread.start()

    @property
    def endpoint(self) -> str:
        """The PUB address (bound: the real port of a ``*`` port)."""
        if engine_binds(self.settings.endpoint):
            return self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        return self.settings.endpoint

    @property
    def replay_endpoint(self) -> str | None:
        return None if self._replay is None else self._replay.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def next_seq(self) -> int:
        return self._seq

    def publish(self, events: Sequence[Event], ts: float | None = None) -> int | None:
        """Send one batch; returns its sequence number (``None``: nothing to send)."""
        if not events or self._closed.is_set():
            return None
        s = self.settings
        payload = encode_batch(
            time.time() if ts is None else ts,
            events,
            s.encoding,
            None if s.encoding == "array" else s.data_parallel_rank,
        )
        return self.publish_raw(payload)

    def publish_raw(self, payload: bytes) -> int:
        """Send a payload as it is (tests send malformed ones with it)."""
        with self._lock:
            seq = self._seq
            self._seq += 1
            self._buffer.append((seq, payload))
            if self._pub.closed:
                return seq
            # no subscriber, or a full queue: dropped; a replay still finds it
            with contextlib.suppress(zmq.Again):
                self._pub.send_multipart([self._topic, pack_seq(seq), payload], zmq.NOBLOCK)
            return seq

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            self._pub.close(linger=0)
            if self._replay is not None:
                self._replay.close(linger=0)
        self._ctx.term()

    def _serve_replay(self) -> None:
        sock = self._replay
        assert sock is not None
        while not self._closed.is_set():
            if not sock.poll(100, zmq.POLLIN):
                continue
            frames = sock.recv_multipart()
            if len(frames) == 3 and not frames[1]:
                ident, _, start_frame = frames
            elif len(frames) == 2:
                ident, start_frame = frames
            else:
                continue  # not a replay request
            start = int.from_bytes(start_frame, "big") if len(start_frame) == 8 else 0
            with self._lock:
                kept = [(seq, p) for seq, p in self._buffer if seq >= start]
            for seq, payload in kept:
                sock.send_multipart([ident, b"", pack_seq(seq), payload])
            sock.send_multipart([ident, b"", pack_seq(END_SEQ), b""])
