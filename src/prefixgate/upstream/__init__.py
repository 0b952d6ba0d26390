"""The upstream hop, HTTP only: one small interface (:class:`.transport.Transport`) over
the project's own HTTP/1.1 client and pool (:mod:`.http1`, TLS included), every foreign
error mapped once into the error tree (:mod:`.client`), a status other than 2xx as
:class:`UpstreamStatus`. What an engine's answer means is :mod:`prefixgate.engine`'s."""

from prefixgate.upstream.client import Upstream, UpstreamResponse, UpstreamStatus

__all__ = [
    "Upstream",
    "UpstreamResponse",
    "UpstreamStatus",
]
