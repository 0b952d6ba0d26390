"""Where a subscriber listens: the engine's endpoint setting, seen from the other side.

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

__all__ = ["Endpoints", "check_endpoint", "engine_binds", "subscriber_endpoints"]

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
