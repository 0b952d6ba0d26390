"""One replica's event stream: a ZeroMQ SUB socket feeding the index, in order, complete.

The subscriber binds or connects as :mod:`.endpoints` says, watches its socket's
connections (a monitor socket) and applies each batch to the channel's
:class:`~.index.EventIndex` in sequence order.

A **publisher is connected** once the socket's monitor reports its ZeroMQ handshake
(``EVENT_HANDSHAKE_SUCCEEDED``), until that connection closes (``EVENT_DISCONNECTED``); a
TCP connection that never completes a handshake (a port probe) never counts. The monitor
names a connection (its file descriptor) only when it opens (``EVENT_ACCEPTED`` on a bound
socket, ``EVENT_CONNECTED`` on a connecting one) and closes: a handshake's success or
failure names the bound address, not the peer. What tells them apart is that libzmq
reports a failed handshake (``EVENT_HANDSHAKE_FAILED_*``) just before that connection's
close, from the one I/O thread of the context, so a close right after a failure is that
connection's and any other close is a publisher's. The SUB socket sends its subscription
as the handshake completes (the socket's pending commands are run at once), so from then
on what the engine publishes reaches the index; the engine applies it a moment later, and
a batch sent in that moment is missed live and replayed when the next one shows the gap.

The stream:

- **start**: with a replay socket, ask for everything from sequence 0 first, so joining
  a running engine learns what it already holds (as far as its replay buffer reaches);
- **gap** (a sequence number skipped: the SUB socket's high-water mark, a slow joiner, a
  reconnect): replay from the first missing batch on the engine's ROUTER socket (a DEALER
  sends the 8-byte start; ``(seq, payload)`` frames come back until ``seq = -1``, with the
  topic in front in vLLM 0.32: ``(topic, seq, payload)``); what
  the buffer no longer has is counted as lost and the stream marked incomplete;
- **duplicate** (the live stream repeating what the replay brought): recognised by its
  payload and skipped;
- **restart** (the sequence goes back with another payload): the engine restarted with
  an empty cache; the replica's index is cleared and its new stream read from 0.

Malformed frames and payloads, unknown event types: counted and skipped, with a log line
at most once a minute per kind; nothing here raises into the gateway. A socket that cannot
be opened (address in use) is retried every ``retry_interval`` seconds, with the error on
the status meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from prefixgate.config.kv_events import Endpoints

from .index import EventIndex
from .status import ReplicaStatus
from .wire import END_SEQ, WireDecoder, WireError, split_frames

__all__ = ["Subscriber"]

log = logging.getLogger("prefixgate.events")

_RECENT = 4096  # batches remembered to tell a duplicate from a restart
_LOG_EVERY = 60.0
_MAX_UNKNOWN_TYPES = 16
_OPENED = (zmq.EVENT_ACCEPTED, zmq.EVENT_CONNECTED)  # a TCP connection, by fd
_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
    zmq.EVENT_HANDSHAKE_FAILED_AUTH,
)


class Subscriber:
    """Reads one replica's events into ``index`` (under the replica's name)."""

    def __init__(
        self,
        replica: str,
        endpoints: Endpoints,
        index: EventIndex,
        *,
        stale_after: float = 30.0,
        replay_timeout: float = 2.0,
        retry_interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.replica = replica
        self.endpoints = endpoints
        self.index = index
        self.replay_timeout = replay_timeout
        self.retry_interval = retry_interval
        self.clock = clock
        self.status = ReplicaStatus(replica, endpoints, stale_after, started_at=clock())
        self._decoder = WireDecoder()
        self._topic = endpoints.topic.encode()
        self._recent: OrderedDict[int, int] = OrderedDict()  # seq -> hash of its payload
        self._logged: dict[str, float] = {}
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        # set once the socket is open and the replay buffer read: batches published from
        # then on reach the index (tests and wait_ready use it; nothing waits for it)
        self.ready = asyncio.Event()
        # set while a publisher is connected (its handshake done): see wait_publisher
        self.publisher = asyncio.Event()

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, ctx: zmq.asyncio.Context) -> None:
        self._ctx = ctx
        self.status.started_at = self.clock()
        self.status.started_wall = time.time()
        self._task = asyncio.create_task(self._run(), name=f"kv-events {self.replica}")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._close()

    async def wait_publisher(self) -> None:
        """Until the socket is open, the replay buffer read and a publisher connected."""
        await self.ready.wait()
        await self.publisher.wait()

    @property
    def listening(self) -> bool:
        """Whether :meth:`wait_publisher` would return now."""
        return self.ready.is_set() and self.publisher.is_set()

    @property
    def bound_endpoint(self) -> str | None:
        """The address actually bound (``tcp://127.0.0.1:*`` resolves to a port)."""
        if self._sock is None or not self.endpoints.bind:
            return None
        return self._sock.getsockopt_string(zmq.LAST_ENDPOINT)

    async def _run(self) -> None:
        first = True
        while True:
            try:
                self._open()
            except zmq.ZMQError as exc:
                self._close()
                e = self.endpoints
                self.status.error = f"cannot {e.mode} {e.events}: {exc}"
                self._problem("open", self.status.error)
                await asyncio.sleep(self.retry_interval)
                continue
            if not first:  # what happened while the socket was down is unknown
                self._forget()
            first = False
            self.status.error = None
            monitor = asyncio.create_task(self._watch())
            try:
                await self._serve()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never into the gateway: reopen and carry on
                log.exception("kv events %s: reading stopped", self.replica)
                self.status.last_problem = f"reading stopped: {exc!r}"
            finally:
                monitor.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await monitor
                self._close()
                self.ready.clear()
            await asyncio.sleep(self.retry_interval)

    def _open(self) -> None:
        assert self._ctx is not None
        sock = self._sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.SUBSCRIBE, self._topic)
        self._monitor = sock.get_monitor_socket()
        if self.endpoints.bind:
            sock.bind(self.endpoints.events)
        else:
            sock.connect(self.endpoints.events)

    def _close(self) -> None:
        sock, self._sock = self._sock, None
        monitor, self._monitor = self._monitor, None
        if sock is not None:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            sock.close(linger=0)
        if monitor is not None:
            monitor.close(linger=0)
        self.status.publisher_down(self.clock(), time.time(), all_gone=True)
        self.publisher.clear()

    def _forget(self) -> None:
        self.index.clear(self.replica)
        self.status.last_seq = None
        self.status.complete = False
        self._recent.clear()

    async def _watch(self) -> None:
        """Track the publishers connected, from the socket's monitor (see the module's
        docstring)."""
        assert self._monitor is not None
        st = self.status
        opened: set[int] = set()  # connections up (fds), handshaken or not
        failed = 0  # handshakes failed whose connection's close is still to come
        while True:
            msg = await recv_monitor_message(self._monitor)
            event, fd = msg["event"], msg["value"]
            if event in _OPENED:
                opened.add(fd)
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                if self._sock is not None:
                    # runs the socket's pending commands: the subscription goes out now.
                    # (get, not getsockopt: the asyncio socket's get keeps its wake-ups)
                    self._sock.get(zmq.EVENTS)
                st.publisher_up(self.clock(), time.time())
                self.publisher.set()
            elif event in _FAILED:
                failed += 1
                st.handshake_failures += 1
            elif event == zmq.EVENT_DISCONNECTED and fd in opened:
                opened.discard(fd)
                if failed:
                    failed -= 1  # the connection whose handshake just failed
                else:
                    st.publisher_down(self.clock(), time.time())
                    if not st.connected:
                        self.publisher.clear()
            elif event == zmq.EVENT_MONITOR_STOPPED:
                return

    async def _serve(self) -> None:
        if self.endpoints.replay is not None:
            await self._replay(0)  # what the engine cached before we listened
        # From now on every batch reaches the index: its history answers for this time on
        # (an idle engine publishes nothing, and has nothing cached since).
        self.index.replica(self.replica).history.begin(time.time())
        self.ready.set()
        assert self._sock is not None
        while True:
            frames = await self._sock.recv_multipart()
            try:
                await self.on_message(frames)
            except Exception as exc:  # a bug must cost one batch, not the stream
                log.exception("kv events %s: a batch failed", self.replica)
                self.status.malformed += 1
                self.status.last_problem = f"a batch failed: {exc!r}"
            await asyncio.sleep(0)  # a flood of batches must not hold the gateway's loop

    # -- the stream -----------------------------------------------------------------------

    async def on_message(self, frames: Sequence[bytes]) -> None:
        """One message from the SUB socket: in order, replayed, or a restart."""
        st = self.status
        try:
            topic, seq, payload = split_frames(frames)
        except WireError as exc:
            st.malformed += 1
            self._problem("frames", f"malformed message skipped: {exc}")
            return
        if self._topic and topic != self._topic:
            return  # another topic that merely starts with ours
        st.note_batch(self.clock())
        last = st.last_seq
        if last is not None and seq <= last:
            if self._recent.get(seq) == hash(payload):
                st.duplicates += 1
                return
            st.restarts += 1
            self._problem("restart", f"sequence went back from {last} to {seq}: engine restarted")
            self._forget()
            last = None
        expected = 0 if last is None else last + 1
        if seq > expected:
            if last is not None:
                st.gaps += 1
            if self.endpoints.replay is not None:
                await self._replay(expected)
            if st.last_seq is not None and seq <= st.last_seq:
                return  # the replay brought this batch too
        self._accept(seq, payload)

    def _accept(self, seq: int, payload: bytes) -> None:
        """Apply the batch after ``last_seq`` (noting what was skipped to reach it)."""
        st = self.status
        last = st.last_seq
        expected = 0 if last is None else last + 1
        if seq != expected:
            st.complete = False
            if last is not None:
                st.lost_batches += seq - expected
                self._problem("lost", f"batches {expected}..{seq - 1} lost (not replayed)")
        elif last is None:
            st.complete = True  # from the publisher's first batch on
        st.last_seq = seq
        recent = self._recent
        recent[seq] = hash(payload)
        if len(recent) > _RECENT:
            recent.popitem(last=False)
        try:
            batch = self._decoder.decode(payload)
        except WireError as exc:
            st.malformed += 1
            st.complete = False
            self._problem("payload", f"batch {seq} skipped: {exc}")
            return
        self.index.apply(self.replica, batch.events)
        st.batches += 1
        st.events += len(batch.events)
        if batch.unknown or batch.malformed:
            st.unknown_events += batch.unknown
            st.malformed_events += batch.malformed
            for name in batch.unknown_types:
                if name not in st.unknown_types and len(st.unknown_types) < _MAX_UNKNOWN_TYPES:
                    st.unknown_types.append(name)
            self._problem(
                "events",
                f"batch {seq}: {batch.unknown} unknown ({', '.join(batch.unknown_types)}) "
                f"and {batch.malformed} malformed events skipped",
            )
        error = self.index.replica(self.replica).block_size_error
        if error is not None and st.error != error:
            st.error = error
            self._problem("block_size", error)

    async def _replay(self, start: int) -> None:
        """Fetch and apply the batches from ``start`` on from the engine's replay socket."""
        assert self._ctx is not None and self.endpoints.replay is not None
        st = self.status
        st.replays += 1
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        timeout_ms = int(self.replay_timeout * 1000)
        try:
            dealer.connect(self.endpoints.replay)
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                if not await dealer.poll(timeout_ms, zmq.POLLIN):
                    st.replay_failures += 1
                    self._problem("replay", f"no answer from {self.endpoints.replay}")
                    return
                frames = await dealer.recv_multipart()
                if frames and not frames[0]:
                    frames = frames[1:]  # the empty delimiter
                if len(frames) == 3:  # vLLM 0.32 sends the topic too
                    frames = frames[1:]
                if len(frames) != 2 or len(frames[0]) != 8:
                    st.malformed += 1
                    continue
                seq = int.from_bytes(frames[0], "big", signed=True)
                if seq == END_SEQ:
                    return
                if st.last_seq is not None and seq <= st.last_seq:
                    continue
                st.replayed_batches += 1
                self._accept(seq, frames[1])
        except zmq.ZMQError as exc:
            st.replay_failures += 1
            self._problem("replay", f"replay from {self.endpoints.replay} failed: {exc}")
        finally:
            dealer.close(linger=0)

    def _problem(self, kind: str, message: str) -> None:
        self.status.last_problem = message
        now = self.clock()
        if now - self._logged.get(kind, -_LOG_EVERY - 1) > _LOG_EVERY:
            self._logged[kind] = now
            log.warning("kv events %s: %s", self.replica, message)
