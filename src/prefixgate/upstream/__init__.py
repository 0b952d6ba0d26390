"""The upstream hop: one small interface (:class:`Upstream`) over the project's own
HTTP/1.1 client (:mod:`.http1`), every foreign error mapped once into the error tree
(:mod:`.client`)."""

from prefixgate.upstream.client import (
    Upstream,
    UpstreamRejected,
    UpstreamResponse,
    map_status,
)

__all__ = [
    "Upstream",
    "UpstreamRejected",
    "UpstreamResponse",
    "map_status",
]
