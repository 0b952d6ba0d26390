"""The simulated upstream: an OpenAI-compatible server whose prefix cache IS prefixgate's
cache model (``prefixgate upstream-sim``, the embedded default, the tests' vLLM stand-in).
:mod:`.replicas` says how it behaves; its public names are re-exported here, loaded when
first asked for, so that registering the ``upstream-sim`` command (:mod:`.command`) imports
no server."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefixgate.lab.upstream_sim.replicas import (
        CALL_TRIGGER,
        SimError,
        SimSettings,
        SimUpstream,
        UpstreamSim,
        create_upstream_app,
        running_upstreams,
        serve_upstreams,
        settings_from_options,
        start_embedded,
        start_upstreams_in_thread,
    )

__all__ = [
    "CALL_TRIGGER",
    "SimError",
    "SimSettings",
    "SimUpstream",
    "UpstreamSim",
    "create_upstream_app",
    "running_upstreams",
    "serve_upstreams",
    "settings_from_options",
    "start_embedded",
    "start_upstreams_in_thread",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("prefixgate.lab.upstream_sim.replicas"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
