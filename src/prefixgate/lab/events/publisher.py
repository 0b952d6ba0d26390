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
  from ``start`` on, then ``[identity, "", -1, ""]`` (with the ``map`` layout, vLLM 0.32's,
  the topic comes before ``seq``, and an empty frame before the final ``-1``, as 0.32 does);
- ``encoding`` picks the payload layout (``map``, ``array``, ``map-batch``: see
  :mod:`.wire`).

:meth:`EventPublisher.publish` is thread-safe and never blocks (what a slow subscriber
cannot take is dropped live; the replay buffer still has it).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import zmq

from prefixgate.config.kv_events import check_endpoint, engine_binds
from prefixgate.events.wire import ENCODINGS, END_SEQ, Encoding, Event, encode_batch, pack_seq

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

    @classmethod
    def from_engine_config(cls, raw: str | dict) -> PublisherSettings:
        """From vLLM's ``--kv-events-config`` JSON (its fields that shape the wire; the
        queue sizes and the publisher kind are the engine's business), plus
        ``encoding``. ``ValueError`` on what is not such a config."""
        try:
            data = json.loads(raw) if isinstance(raw, str) else dict(raw)
        except ValueError as exc:
            raise ValueError(f"kv events config is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("kv events config must be a JSON object")
        if data.get("publisher", "zmq") != "zmq":
            raise ValueError("only the zmq publisher is simulated")
        known = {"endpoint", "replay_endpoint", "topic", "encoding", "buffer_steps"}
        ignored = {"enable_kv_cache_events", "publisher", "hwm", "max_queue_size"}
        unknown = set(data) - known - ignored
        if unknown:
            raise ValueError(f"unknown kv events settings: {', '.join(sorted(unknown))}")
        return cls(**{k: v for k, v in data.items() if k in known})

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
    """Publishes event batches as an engine does (see the module docstring).

    Every socket belongs to one thread: :meth:`publish` (any thread) numbers and encodes
    the batch, keeps it for replay and hands it over an ``inproc`` pipe; the thread sends
    it, answers replay requests and counts subscriptions (an XPUB socket: a subscriber
    is known once its subscription arrived, so :meth:`wait_for_subscribers` tells when a
    batch sent now reaches it).
    """

    def __init__(self, settings: PublisherSettings) -> None:
        self.settings = settings
        self._ctx = zmq.Context()
        self._lock = threading.Lock()
        self._subscribed = threading.Condition()
        self._subscriptions = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=settings.buffer_steps)
        self._seq = 0
        self._topic = settings.topic.encode()
        self._closed = False
        pipe = f"inproc://kv-events-{id(self)}"
        self._pub = self._socket(zmq.XPUB)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self._pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self._pull = self._socket(zmq.PULL)
        self._push = self._socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, 100_000)
        self._replay: zmq.Socket | None = None
        try:
            self._pull.bind(pipe)
            self._push.connect(pipe)
            if engine_binds(settings.endpoint):
                self._pub.bind(settings.endpoint)
            else:
                self._pub.connect(settings.endpoint)
            if settings.replay_endpoint is not None:
                self._replay = self._socket(zmq.ROUTER)
                self._replay.bind(settings.replay_endpoint)
        except zmq.ZMQError:
            self._close_sockets()
            raise
        self._endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._replay_endpoint = (
            None if self._replay is None else self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        )
        self._thread = threading.Thread(target=self._serve, name="kv-events-pub", daemon=True)
        self._thread.start()

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        return sock

    @property
    def endpoint(self) -> str:
        """The PUB address (bound: with the real port of a ``*`` port)."""
        return self._endpoint if engine_binds(self.settings.endpoint) else self.settings.endpoint

    @property
    def replay_endpoint(self) -> str | None:
        return self._replay_endpoint

    @property
    def next_seq(self) -> int:
        return self._seq

    @property
    def subscriptions(self) -> int:
        """Subscriptions received and not withdrawn (one per subscriber and topic)."""
        return self._subscriptions

    def wait_for_subscribers(self, n: int = 1, timeout: float | None = None) -> bool:
        with self._subscribed:
            return self._subscribed.wait_for(lambda: self._subscriptions >= n, timeout)

    def publish(self, events: Sequence[Event], ts: float | None = None) -> int | None:
        """Send one batch; returns its sequence number (``None``: nothing to send)."""
        if not events:
            return None
        s = self.settings
        payload = encode_batch(
            time.time() if ts is None else ts,
            events,
            s.encoding,
            None if s.encoding == "array" else s.data_parallel_rank,
        )
        return self.publish_raw(payload)

    def publish_raw(self, payload: bytes, *, send: bool = True) -> int:
        """Send a payload as it is (tests send malformed ones). ``send=False`` keeps it
        for replay only, as if the network had lost it (tests make gaps with it)."""
        with self._lock:
            seq = self._seq
            self._seq += 1
            self._buffer.append((seq, payload))
            if send and not self._closed:
                # a full pipe drops the batch live; a replay still finds it
                with contextlib.suppress(zmq.Again):
                    self._push.send_multipart([pack_seq(seq), payload], zmq.NOBLOCK)
            return seq

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._thread.join(timeout=5)
        self._close_sockets()

    def _close_sockets(self) -> None:
        for sock in (self._push, self._pull, self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._ctx.term()

    # -- the thread ---------------------------------------------------------------------

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        poller.register(self._pub, zmq.POLLIN)
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        while not self._closed:
            ready = dict(poller.poll(100))
            if self._pull in ready:
                while True:
                    try:
                        seq, payload = self._pull.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    with contextlib.suppress(zmq.Again):
                        self._pub.send_multipart([self._topic, seq, payload], zmq.NOBLOCK)
            if self._pub in ready:
                self._count_subscriptions()
            if self._replay is not None and self._replay in ready:
                self._answer_replay(self._replay)

    def _count_subscriptions(self) -> None:
        while True:
            try:
                msg = self._pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if msg[:1] in (b"\x00", b"\x01"):
                with self._subscribed:
                    self._subscriptions += 1 if msg[:1] == b"\x01" else -1
                    self._subscribed.notify_all()

    def _answer_replay(self, sock: zmq.Socket) -> None:
        frames = sock.recv_multipart()
        if len(frames) == 3 and not frames[1]:
            ident, _, start_frame = frames
        elif len(frames) == 2:
            ident, start_frame = frames
        else:
            return  # not a replay request
        start = int.from_bytes(start_frame, "big") if len(start_frame) == 8 else 0
        with self._lock:
            kept = [(seq, p) for seq, p in self._buffer if seq >= start]
        # vLLM 0.32 (whose layout "map" is) puts the topic in front of each replayed batch
        head = [ident, b"", self._topic] if self.settings.encoding == "map" else [ident, b""]
        end_head = [ident, b"", b""] if self.settings.encoding == "map" else head
        for seq, payload in kept:
            sock.send_multipart([*head, pack_seq(seq), payload])
        sock.send_multipart([*end_head, pack_seq(END_SEQ), b""])
