"""Engine truth: the inference engines' KV-cache events, read into an index of what each
replica holds.

Modules, one concept each:

- :mod:`.wire`: the ZeroMQ frames and the msgpack batches of every vLLM release (and
  SGLang's), decoded with msgspec; unknown and malformed events counted and skipped;
- :mod:`.index`: per replica and medium, the cached blocks keyed by content (the cache
  model's chained hash of their token ids), bounded; ``longest_prefix``;
- :mod:`.status`: one replica's stream for ``/healthz`` and ``/metrics``; stale or not;
- :mod:`.subscriber`: one replica's SUB socket: order, gaps and replay, restarts;
- :mod:`.hub`: :class:`EngineEvents`, every channel's subscribers and index, for the app;

The engines' side of the wire (a publisher, and a cache model's stores and evictions as
the events an engine sends) is the simulated upstream's: :mod:`prefixgate.lab.events`.

Every name is imported on first use (pyzmq, numpy and the cache model load with the
subscriber and the index, not with the package). Bind or connect, from the engine's own
endpoint setting, is the config's (:mod:`prefixgate.config.kv_events`), re-exported here.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefixgate.config.kv_events import Endpoints, engine_binds, subscriber_endpoints

    from .hub import ChannelEvents, EngineEvents
    from .index import GPU, EventIndex, IndexCounters, PrefixHit, ReplicaIndex, content_keys
    from .status import ReplicaStatus
    from .subscriber import Subscriber
    from .wire import (
        ENCODINGS,
        AllBlocksCleared,
        Batch,
        BlockRemoved,
        BlockStored,
        Encoding,
        WireDecoder,
        WireError,
        encode_batch,
    )

# Each name's module, relative to this package (".config.kv_events": prefixgate.config's).
_WHERE = {
    "Endpoints": ".config.kv_events",
    "engine_binds": ".config.kv_events",
    "subscriber_endpoints": ".config.kv_events",
    "ChannelEvents": "hub",
    "EngineEvents": "hub",
    "GPU": "index",
    "EventIndex": "index",
    "IndexCounters": "index",
    "PrefixHit": "index",
    "ReplicaIndex": "index",
    "content_keys": "index",
    "ReplicaStatus": "status",
    "Subscriber": "subscriber",
    "ENCODINGS": "wire",
    "AllBlocksCleared": "wire",
    "Batch": "wire",
    "BlockRemoved": "wire",
    "BlockStored": "wire",
    "Encoding": "wire",
    "WireDecoder": "wire",
    "WireError": "wire",
    "encode_batch": "wire",
}
__all__ = [
    "AllBlocksCleared",
    "Batch",
    "BlockRemoved",
    "BlockStored",
    "ChannelEvents",
    "ENCODINGS",
    "Encoding",
    "Endpoints",
    "EngineEvents",
    "EventIndex",
    "GPU",
    "IndexCounters",
    "PrefixHit",
    "ReplicaIndex",
    "ReplicaStatus",
    "Subscriber",
    "WireDecoder",
    "WireError",
    "content_keys",
    "encode_batch",
    "engine_binds",
    "subscriber_endpoints",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)
