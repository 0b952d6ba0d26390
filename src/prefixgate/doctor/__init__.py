"""``prefixgate doctor``: why the prefix cache misses, found from the records as a week of
reading logs found it by hand in the billing-header incident.

    d = diagnose("sqlite:///prefixgate-demo.db", since=parse_time("24h"))
    print(render_text(d))          # findings first, by severity, evidence under each
    to_json(d)                     # the same tree as JSON
    sys.exit(exit_code(d))         # 2 when a critical finding exists

See :mod:`.diagnose` for the pipeline and one module per step.
"""

from prefixgate.doctor.diagnose import diagnose, exit_code
from prefixgate.doctor.findings import Diagnosis, Finding, Table
from prefixgate.doctor.output import render_text, to_json
from prefixgate.doctor.timespec import parse_time

__all__ = [
    "Diagnosis",
    "Finding",
    "Table",
    "diagnose",
    "exit_code",
    "parse_time",
    "render_text",
    "to_json",
]
