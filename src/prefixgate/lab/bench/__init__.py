"""``prefixgate bench``: measure serving configurations side by side, with the metric
definitions of ``vllm bench serve`` and the scenarios of the deployment report.

Modules: :mod:`.specs` (plain data), :mod:`.prompts` (seeded text), :mod:`.client`
(bodies, SSE parsers, the streaming client), :mod:`.stats` (TTFT/TPOT/ITL/E2EL,
percentiles, goodput), :mod:`.server_metrics` (``/metrics`` deltas), :mod:`.arrivals`,
:mod:`.scenarios`, :mod:`.runner` (targets x scenarios), :mod:`.tables` and :mod:`.plots`
(markdown, rich, JSON, CSV, PNG), :mod:`.command` (``bench_command``).

Library use::

    run = asyncio.run(run_bench([Target("vllm", "http://127.0.0.1:8000/v1")]))
    print(to_markdown(run))
"""

from .runner import BenchRun, run_bench
from .scenarios import ALL_SCENARIOS, REPORT_SET, ScenarioParams
from .specs import RequestResult, RequestSpec, Target
from .tables import to_csv, to_json, to_markdown, write_outputs

__all__ = [
    "ALL_SCENARIOS",
    "REPORT_SET",
    "BenchRun",
    "RequestResult",
    "RequestSpec",
    "ScenarioParams",
    "Target",
    "run_bench",
    "to_csv",
    "to_json",
    "to_markdown",
    "write_outputs",
]
