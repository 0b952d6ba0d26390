"""The engines' KV-cache events as configured (``kv_events:``), and where the gateway's
subscriber listens for them: the engine's endpoint setting, seen from the other side.

vLLM decides by the endpoint it is given (``--kv-events-config``): an address with ``*``
(or ``::``, or an ``ipc://``/``inproc://`` path) makes its PUB socket *bind*; a concrete
``tcp://host:port`` makes it *connect* there. The subscriber does the opposite:

- engine binds ``tcp://*:5557``: the subscriber connects to ``tcp://<replica host>:5557``,
  the host taken from the replica's URL;
- engine connects to ``tcp://10.0.0.9:5557``: the subscriber binds that address (the
  gateway's own);
- ``ipc://`` and ``inproc://``: the engine binds, the subscriber connects to the same path.

The replay socket (ROUTER) always binds on the engine's side, so the subscriber always
connects to it, ``*`` replaced by the replica's host.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from prefixgate.config.common import Model

__all__ = [
    "Endpoints",
    "KvEventsConfig",
    "KvEventsEndpoint",
    "check_endpoint",
    "engine_binds",
    "subscriber_endpoints",
]

_SCHEMES = ("tcp://", "ipc://", "inproc://")


@dataclass(frozen=True, slots=True)
class Endpoints:
    """The subscriber's side of one replica's event stream."""

    events: str  # the address the SUB socket binds or connects
    bind: bool
    replay: str | None  # the engine's ROUTER, always connected to
    topic: str = ""

    @property
    def mode(self) -> str:
        return "bind" if self.bind else "connect"


def engine_binds(endpoint: str) -> bool:
    """Whether an engine given ``endpoint`` binds it (else it connects to it)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def check_endpoint(endpoint: str) -> str:
    """``endpoint`` if it is a ZeroMQ address the engines use; ``ValueError`` otherwise."""
    if not endpoint.startswith(_SCHEMES):
        raise ValueError(f"{endpoint!r}: an event endpoint starts with tcp://, ipc:// or inproc://")
    if endpoint.startswith("tcp://") and ":" not in endpoint[len("tcp://") :].replace("::", ""):
        raise ValueError(f"{endpoint!r}: a tcp endpoint needs a port")
    return endpoint


def _host_of(replica_url: str) -> str:
    host = urlsplit(replica_url).hostname or "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _towards(endpoint: str, replica_url: str) -> str:
    """A bound-by-the-engine address as the subscriber connects to it."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    rest = endpoint[len("tcp://") :]
    host, _, port = rest.rpartition(":")
    if host in ("*", "[::]", "::", "0.0.0.0", "[*]"):
        host = _host_of(replica_url)
    return f"tcp://{host}:{port}"


def subscriber_endpoints(
    endpoint: str, replay_endpoint: str | None, topic: str, replica_url: str
) -> Endpoints:
    """The subscriber's addresses for an engine configured with ``endpoint`` and
    ``replay_endpoint``, serving at ``replica_url``."""
    check_endpoint(endpoint)
    if replay_endpoint is not None:
        check_endpoint(replay_endpoint)
    binds = engine_binds(endpoint)
    events = _towards(endpoint, replica_url) if binds else endpoint
    replay = None if replay_endpoint is None else _towards(replay_endpoint, replica_url)
    return Endpoints(events, not binds, replay, topic)


class KvEventsEndpoint(Model):
    """One replica's event addresses, as given to its engine's ``--kv-events-config``."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str | None = None  # None: the section's

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _zmq_address(cls, v: str | None) -> str | None:
        return v if v is None else check_endpoint(v)


class KvEventsConfig(Model):
    """The engines' KV-cache events (``events/``): where each replica publishes them.

    ``endpoint``/``replay_endpoint``/``topic`` are the engine's own settings; the gateway
    takes the other side (:func:`subscriber_endpoints`). A channel with several replicas gives
    ``replicas`` (one entry per URL, in the order base_url, replicas...), or an endpoint
    with ``*`` that each engine binds on its own host.
    """

    endpoint: str | None = None
    replay_endpoint: str | None = None
    topic: str = ""
    replicas: tuple[KvEventsEndpoint, ...] = ()
    block_size: int | None = Field(default=None, ge=1)  # None: the engines' own
    max_blocks: int = Field(default=200_000, ge=1)  # per replica and medium
    # removals remembered (with their times) per replica and medium, for the miss ledger
    history_blocks: int = Field(default=100_000, ge=1)
    stale_after: float = Field(default=30.0, gt=0)  # seconds
    replay_timeout: float = Field(default=2.0, gt=0)  # seconds

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _zmq_address(cls, v: str | None) -> str | None:
        return v if v is None else check_endpoint(v)

    def endpoints_for(self, urls: tuple[str, ...]) -> dict[str, Endpoints]:
        """The subscriber's side for each replica URL; ``ValueError`` if ambiguous."""
        if self.replicas:
            if len(self.replicas) != len(urls):
                raise ValueError(
                    f"kv_events.replicas has {len(self.replicas)} entries for {len(urls)} "
                    "replicas (base_url, then replicas, in order)"
                )
            items = [
                (url, r.endpoint, r.replay_endpoint, self.topic if r.topic is None else r.topic)
                for url, r in zip(urls, self.replicas, strict=True)
            ]
        elif self.endpoint is None:
            raise ValueError("kv_events needs an endpoint (or one per replica in replicas)")
        else:
            items = [(url, self.endpoint, self.replay_endpoint, self.topic) for url in urls]
        out = {url: subscriber_endpoints(ep, rep, topic, url) for url, ep, rep, topic in items}
        seen = [e.events for e in out.values()]
        if len(set(seen)) != len(seen):
            raise ValueError(
                "kv_events: two replicas would share one event address; give each replica "
                "its own endpoint (kv_events.replicas) or an endpoint with * on distinct hosts"
            )
        return out
