"""The subscriber against real ZeroMQ sockets on loopback: order, gaps and replay,
restarts, silence, malformed messages, and the hub the app holds."""

from __future__ import annotations

import asyncio
import time

import msgspec
import zmq

from prefixgate.config import parse_config
from prefixgate.events import (
    BlockStored,
    EngineEvents,
    EventIndex,
    ReplicaIndex,
    content_keys,
    encode_batch,
    subscriber_endpoints,
)
from prefixgate.events.subscriber import Subscriber
from prefixgate.events.wire import pack_seq
from prefixgate.lab.events.publisher import EventPublisher, PublisherSettings

from .streams import (
    REPLICA,
    Engine,
    Running,
    bound_publisher,
    free_port,
    subscriber_for,
    wait_until,
)


def truth(batches) -> dict[bytes, int]:
    """What an index fed every batch directly holds: the publisher's truth."""
    idx = ReplicaIndex()
    for batch in batches:
        idx.apply(batch)
    return idx.resident()


async def subscribed(pub: EventPublisher, sub: Subscriber | None = None) -> None:
    """Until the publisher has the subscription (a batch sent now reaches it) and the
    subscriber has read the replay buffer (what it replays next comes from a gap)."""
    assert await asyncio.to_thread(pub.wait_for_subscribers, 1, 30), "no subscriber came"
    if sub is not None:
        await wait_until(sub.ready.is_set, "the subscriber read the replay buffer")


async def test_connect_mode_learns_the_history_then_follows() -> None:
    pub, idx, engine = bound_publisher(), EventIndex(), Engine(1)
    sent = [engine.batch() for _ in range(3)]
    for batch in sent:  # before anyone listens: learnt from the replay buffer
        pub.publish(batch)
    async with Running(pub) as run:
        sub = run.start(subscriber_for(pub, idx))
        await subscribed(pub, sub)
        for _ in range(5):
            sent.append(engine.batch())
            pub.publish(sent[-1])
        await wait_until(lambda: sub.status.last_seq == 7, "every batch applied")
        assert idx.replica(REPLICA).resident() == truth(sent)
        st = sub.status
        assert (st.complete, st.connected, st.batches, st.replayed_batches) == (True, True, 8, 3)
        assert (st.gaps, st.lost_batches, sub.endpoints.mode) == (0, 0, "connect")


async def test_bind_mode_when_the_engine_connects() -> None:
    port = free_port()
    pub = EventPublisher(
        PublisherSettings(f"tcp://127.0.0.1:{port}", "tcp://127.0.0.1:*", "", "array")
    )
    replay = "tcp://*:" + pub.replay_endpoint.rsplit(":", 1)[1]
    endpoints = subscriber_endpoints(f"tcp://127.0.0.1:{port}", replay, "", REPLICA)
    assert endpoints.bind
    idx, engine = EventIndex(), Engine(2)
    async with Running(pub) as run:
        sub = run.start(Subscriber(REPLICA, endpoints, idx))
        await subscribed(pub, sub)
        sent = [engine.batch() for _ in range(4)]
        for batch in sent:
            pub.publish(batch)
        await wait_until(lambda: sub.status.last_seq == 3, "every batch applied")
        assert idx.replica(REPLICA).resident() == truth(sent)
        assert sub.status.connected and sub.bound_endpoint == f"tcp://127.0.0.1:{port}"


async def test_a_gap_is_replayed_and_the_index_ends_equal_to_the_truth() -> None:
    pub, idx, engine = bound_publisher(), EventIndex(), Engine(3)
    async with Running(pub) as run:
        sub = run.start(subscriber_for(pub, idx))
        await subscribed(pub, sub)
        sent = []
        for upto in (6, 9):  # a gap at 3-4, caught up; then another at 7
            while len(sent) <= upto:
                sent.append(engine.batch())
                lost_on_the_way = len(sent) - 1 in (3, 4, 7)
                pub.publish_raw(encode_batch(time.time(), sent[-1]), send=not lost_on_the_way)
            await wait_until(lambda n=upto: sub.status.last_seq == n, "batches applied")
        st = sub.status
        assert idx.replica(REPLICA).resident() == truth(sent)
        assert (st.gaps, st.lost_batches, st.complete, st.batches) == (2, 0, True, 10)
        assert st.replays == 3  # at the start, then one per gap


async def test_a_gap_older_than_the_replay_buffer_is_counted_lost() -> None:
    pub, idx, engine = bound_publisher(buffer_steps=3), EventIndex(), Engine(4)
    async with Running(pub) as run:
        sub = run.start(subscriber_for(pub, idx))
        await subscribed(pub, sub)
        for i in range(7):
            pub.publish_raw(encode_batch(time.time(), engine.batch()), send=i in (0, 6))
        await wait_until(lambda: sub.status.last_seq == 6, "the stream caught up")
        st = sub.status
        assert (st.gaps, st.lost_batches, st.complete, st.batches) == (1, 3, False, 4)
        assert "lost" in (st.last_problem or "")


async def test_a_restarted_engine_starts_a_new_index() -> None:
    port, replay_port = free_port(), free_port()
    settings = PublisherSettings(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}", "kv")
    endpoints = subscriber_endpoints(settings.endpoint, settings.replay_endpoint, "kv", REPLICA)
    idx = EventIndex()
    async with Running() as run:
        first = EventPublisher(settings)
        sub = run.start(Subscriber(REPLICA, endpoints, idx))
        await subscribed(first, sub)
        before = Engine(5)
        for _ in range(3):
            first.publish(before.batch())
        await wait_until(lambda: sub.status.last_seq == 2, "the first engine's batches")
        assert len(idx.replica(REPLICA)) > 0
        first.close()
        second = EventPublisher(settings)  # the same addresses, a new process
        run.publishers.append(second)
        await subscribed(second)
        after = Engine(6)
        sent = [after.batch() for _ in range(2)]
        for batch in sent:
            second.publish(batch)
        await wait_until(
            lambda: sub.status.restarts == 1 and sub.status.last_seq == 1, "the restart seen"
        )
        assert idx.replica(REPLICA).resident() == truth(sent)  # nothing of the first
        assert sub.status.complete


B_CHANNEL = 16


async def test_silence_and_errors_make_the_events_stale() -> None:
    now = [1000.0]

    def clock() -> float:
        return now[0]

    pub, idx = bound_publisher(), EventIndex(block_size=B_CHANNEL)
    async with Running(pub) as run:
        nobody = run.start(
            Subscriber(
                REPLICA,
                subscriber_endpoints(f"tcp://*:{free_port()}", None, "", REPLICA),
                idx,
                stale_after=10,
                clock=clock,
            )
        )
        sub = run.start(subscriber_for(pub, idx, stale_after=10, clock=clock))
        await subscribed(pub, sub)
        await wait_until(lambda: sub.status.connected, "connected")
        st = sub.status
        now[0] += 11
        assert nobody.status.stale(now[0])  # nobody publishes there
        assert not st.stale(now[0])  # connected and idle: an idle engine says nothing
        st.note_request(now[0])
        now[0] += 5
        assert not st.stale(now[0])
        now[0] += 6
        assert st.stale(now[0])  # a request went there and nothing came back
        tokens = list(range(B_CHANNEL))
        pub.publish([BlockStored([1], None, tokens, B_CHANNEL, medium="GPU")])
        await wait_until(lambda: st.batches == 1, "a batch")
        assert not st.stale(now[0])
        pub.publish([BlockStored([2], None, tokens[:8], 8, medium="GPU")])  # another size
        await wait_until(lambda: st.batches == 2, "a batch of another block size")
        assert st.stale(now[0]) and "8" in st.error
        st.error = None
        pub.close()
        await wait_until(lambda: not st.connected, "the engine gone")
        assert not st.stale(now[0])
        now[0] += 11
        assert st.stale(now[0])


def _batch_with_an_unknown_event(tokens: list[int]) -> bytes:
    stored = {
        "type": "BlockStored",
        "block_hashes": [2],
        "parent_block_hash": 1,
        "token_ids": tokens,
        "block_size": 4,
        "medium": "GPU",
    }
    return msgspec.msgpack.encode([1.0, [{"type": "BlockPinned", "block_hashes": [5]}, stored], 0])


async def test_malformed_messages_are_counted_and_skipped() -> None:
    ctx = zmq.Context()
    xpub = ctx.socket(zmq.XPUB)  # a bare socket: any frames at all
    xpub.setsockopt(zmq.LINGER, 0)
    port = xpub.bind_to_random_port("tcp://127.0.0.1")
    idx = EventIndex()
    tokens = list(range(12))

    def batch(h: int, toks: list[int], parent: int | None = None) -> bytes:
        return encode_batch(1.0, [BlockStored([h], parent, toks, 4, medium="GPU")])

    try:
        async with Running() as run:
            endpoints = subscriber_endpoints(f"tcp://*:{port}", None, "kv", REPLICA)
            sub = run.start(Subscriber(REPLICA, endpoints, idx))
            assert await asyncio.to_thread(xpub.recv) == b"\x01kv"  # the subscription
            for frames in (
                [b"kv", pack_seq(0), batch(1, tokens[:4])],
                [b"kv", b"\x00" * 7, b"x"],
                [b"kv"],
                [b"kv", pack_seq(1), b"\xc1 not msgpack"],
                [b"kv2", pack_seq(99), batch(9, [9, 9, 9, 9])],  # another topic
                [b"kv", pack_seq(2), _batch_with_an_unknown_event(tokens[4:8])],
                [b"kv", pack_seq(3), batch(3, tokens[8:], parent=2)],
            ):
                xpub.send_multipart(frames)
            await wait_until(lambda: sub.status.last_seq == 3, "the stream read to its end")
            st = sub.status
            assert (st.malformed, st.unknown_events, st.unknown_types) == (3, 1, ["BlockPinned"])
            assert (st.batches, st.complete) == (3, False)  # batch 1 could not be read
            assert idx.longest_prefix(REPLICA, content_keys(tokens, 4)).blocks == 3
            assert len(idx.replica(REPLICA)) == 3  # and nothing of the other topic
    finally:
        xpub.close(linger=0)
        ctx.term()


async def test_the_hub_of_the_app() -> None:
    now = [0.0]
    pub = bound_publisher(topic="kv-events")
    port = pub.endpoint.rsplit(":", 1)[1]
    replay = pub.replay_endpoint.rsplit(":", 1)[1]
    local = {
        "name": "local",
        "base_url": REPLICA,
        "kv_events": {
            "endpoint": f"tcp://*:{port}",
            "replay_endpoint": f"tcp://*:{replay}",
            "topic": "kv-events",
            "stale_after": 5,
        },
    }
    config = parse_config(
        {"channels": [local, {"name": "plain", "base_url": "http://127.0.0.1:9/v1"}]}
    )
    hub = EngineEvents.from_config(config, clock=lambda: now[0])
    assert list(hub.channels) == ["local"] and hub
    await hub.start()
    try:
        await hub.wait_ready()
        await subscribed(pub)
        tokens = list(range(40))
        pub.publish([BlockStored([1, 2], None, tokens[:32], 16, medium="GPU")])
        st = hub.status("local", REPLICA)
        await wait_until(lambda: st.batches == 1, "the batch")
        assert hub.block_size("local") == 16
        keys = hub.content_keys("local", tokens)
        assert len(keys) == 2
        assert hub.longest_prefix("local", REPLICA, keys).gpu == 2
        assert hub.longest_prefix("plain", REPLICA, keys) is None  # no events there
        (row,) = hub.statuses()
        assert row["channel"] == "local" and row["blocks"] == {"GPU": 2}
        assert row["index"]["stored_blocks"] == 2 and row["connected"]
        hub.note_request("local", REPLICA)
        now[0] += 6
        assert not hub.usable("local", REPLICA)
        assert hub.longest_prefix("local", REPLICA, keys) is None  # stale: fall back
    finally:
        await hub.aclose()
        pub.close()
