"""Engine truth: the inference engines' KV-cache events, read into an index of what each
replica holds.

Modules, one concept each:

- :mod:`.wire`: the ZeroMQ frames and the msgpack batches of every vLLM release (and
  SGLang's), decoded with msgspec; unknown and malformed events counted and skipped;
- :mod:`.index`: per replica and medium, the cached blocks keyed by content (the cache
  model's chained hash of their token ids), bounded; ``longest_prefix``;
- :mod:`.endpoints`: bind or connect, from the engine's own endpoint setting;
- :mod:`.status`: one replica's stream for ``/healthz`` and ``/metrics``; stale or not;
- :mod:`.subscriber`: one replica's SUB socket: order, gaps and replay, restarts;
- :mod:`.hub`: :class:`EngineEvents`, every channel's subscribers and index, for the app;
- :mod:`.publisher`: the engines' side of the wire, for the simulated upstream.

The ZeroMQ-bound names (``EngineEvents``, ``Subscriber``, ``EventPublisher``) are imported
on first use, so that reading the config does not load pyzmq.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .endpoints import Endpoints, engine_binds, subscriber_endpoints
from .index import GPU, EventIndex, IndexCounters, PrefixHit, ReplicaIndex, content_keys
from .status import ReplicaStatus
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

if TYPE_CHECKING:
    from .hub import ChannelEvents, EngineEvents
    from .publisher import EventPublisher, PublisherSettings
    from .subscriber import Subscriber

__all__ = [
    "ENCODINGS",
    "GPU",
    "AllBlocksCleared",
    "Batch",
    "BlockRemoved",
    "BlockStored",
    "ChannelEvents",
    "Encoding",
    "Endpoints",
    "EngineEvents",
    "EventIndex",
    "EventPublisher",
    "IndexCounters",
    "PrefixHit",
    "PublisherSettings",
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

_LAZY = {
    "ChannelEvents": "hub",
    "EngineEvents": "hub",
    "EventPublisher": "publisher",
    "PublisherSettings": "publisher",
    "Subscriber": "subscriber",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{module}", __name__), name)
