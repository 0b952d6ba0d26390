"""Helpers for the event-stream tests: real sockets on loopback, waits without timing."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Callable

import zmq.asyncio

from prefixgate.events import BlockRemoved, BlockStored, EventIndex, subscriber_endpoints
from prefixgate.events.subscriber import Subscriber
from prefixgate.lab.events.publisher import EventPublisher, PublisherSettings

REPLICA = "http://127.0.0.1:8000/v1"
B = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_until(cond: Callable[[], bool], what: str, limit: float = 30.0) -> None:
    """Until ``cond()``; a hang guard only (generous), never a speed assertion."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.005)


def bound_publisher(topic: str = "kv", **kw) -> EventPublisher:
    """A publisher that binds free ports (the subscriber connects)."""
    return EventPublisher(PublisherSettings("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", topic, **kw))


def subscriber_for(pub: EventPublisher, index: EventIndex, topic: str = "kv", **kw) -> Subscriber:
    """A subscriber configured as an operator would: the engine's endpoints with ``*``."""
    port = pub.endpoint.rsplit(":", 1)[1]
    replay = None
    if pub.replay_endpoint is not None:
        replay = "tcp://*:" + pub.replay_endpoint.rsplit(":", 1)[1]
    endpoints = subscriber_endpoints(f"tcp://*:{port}", replay, topic, REPLICA)
    return Subscriber(REPLICA, endpoints, index, **kw)


class Engine:
    """Random prompts stored and evicted, as batches an engine would send."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.held: list[int] = []
        self.next_hash = seed << 32

    def batch(self) -> list:
        events: list = []
        if self.held and self.rng.random() < 0.5:
            gone = self.rng.sample(self.held, min(len(self.held), self.rng.randint(1, 3)))
            for h in gone:
                self.held.remove(h)
            events.append(BlockRemoved(gone, "GPU"))
        n = self.rng.randint(1, 4)
        hashes = list(range(self.next_hash, self.next_hash + n))
        self.next_hash += n
        tokens = [self.rng.randrange(50_000) for _ in range(n * B)]
        events.append(BlockStored(hashes, None, tokens, B, medium="GPU"))
        self.held += hashes
        return events


class Running:
    """``async with Running(pub, ...) as run``: subscribers started in one zmq.asyncio
    context; at the end they, then the publishers given, are closed."""

    def __init__(self, *publishers: EventPublisher) -> None:
        self.ctx = zmq.asyncio.Context()
        self.subs: list[Subscriber] = []
        self.publishers = list(publishers)

    def start(self, sub: Subscriber) -> Subscriber:
        sub.start(self.ctx)
        self.subs.append(sub)
        return sub

    async def __aenter__(self) -> Running:
        return self

    async def __aexit__(self, *exc) -> None:
        for sub in self.subs:
            await sub.aclose()
        self.ctx.term()
        for pub in self.publishers:
            pub.close()
