"""A simulated vLLM with known rates, and the gateway in front of it, on loopback.

Sockets get TCP_NODELAY here: ``prefixgate.serve.process.bind`` creates its listening socket
with ``proto=0``, so asyncio does not set TCP_NODELAY on accepted connections and the
first small write after the response headers waits for the client's delayed ACK (~40 ms
on Linux). Once ``bind`` sets it, ``_nodelay`` is a no-op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from prefixgate.config import parse_config
from prefixgate.lab.upstream_sim import SimSettings, create_upstream_app
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread

PREFILL_RATE = 20_000.0  # tokens/s
DECODE_RATE = 200.0  # tokens/s


@dataclass
class Stack:
    upstream: ServerThread
    gateway: ServerThread | None = None

    @property
    def openai_url(self) -> str:
        return self.upstream.url + "/v1"

    @property
    def metrics_url(self) -> str:
        return self.upstream.url + "/metrics"

    @property
    def gateway_url(self) -> str:
        assert self.gateway is not None
        return self.gateway.url


def sim_settings(**kw) -> SimSettings:
    base = dict(
        prefill_tokens_per_s=PREFILL_RATE,
        decode_tokens_per_s=DECODE_RATE,
        # without ignore_eos (Anthropic) the sim stops here, not at max_tokens
        default_output_tokens=100_000,
    )
    return SimSettings(**(base | kw))


@contextlib.contextmanager
def sim_stack(**rates) -> Iterator[Stack]:
    """The simulated upstream (known rates) and the gateway in front of it."""
    with ServerThread(create_upstream_app(sim_settings(**rates))) as up:
        config = parse_config(
            {"channels": [{"name": "sim", "base_url": up.url + "/v1"}], "store": None}
        )
        with ServerThread(create_app(config)) as gw:
            yield Stack(up, gw)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with sim_stack() as s:
        yield s
