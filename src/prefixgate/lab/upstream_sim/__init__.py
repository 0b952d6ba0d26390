"""The simulated upstream: an OpenAI-compatible server whose prefix cache IS prefixgate's
cache model (``prefixgate upstream-sim``, the embedded default, the tests' vLLM stand-in).
:mod:`.replicas` says how it behaves; its public names are re-exported here."""

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
