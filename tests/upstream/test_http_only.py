"""``upstream/`` is the HTTP hop only (client, pool, transport, TLS): what an engine's
answer means is ``engine/``'s, and nothing of the pipeline, the record or the gateway is
known down here. Read from the modules' source (every import, those inside functions and
under ``TYPE_CHECKING`` too), so a shortcut that would make a cycle fails here first."""

from __future__ import annotations

import ast
from pathlib import Path

import prefixgate.upstream

PACKAGE = Path(prefixgate.upstream.__file__).parent

# What the HTTP hop may use of the project: itself, the error tree, the typed config
# (timeouts, TLS), the event loop's busy polling and the chunked framing it shares with
# the server.
ALLOWED = (
    "prefixgate.upstream",
    "prefixgate.errors",
    "prefixgate.config",
    "prefixgate.busypoll",
    "prefixgate.chunked",
)


def imports_of(path: Path) -> set[str]:
    """The project modules ``path`` imports, by their absolute names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: within the package, or above it
                base = ["prefixgate", "upstream"][: 2 - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.add(module)
            # ``from prefixgate import busypoll`` names a module, not an attribute
            found.update(f"{module}.{alias.name}" for alias in node.names if module == "prefixgate")
    return {name for name in found if name == "prefixgate" or name.startswith("prefixgate.")}


def allowed(name: str) -> bool:
    return any(name == a or name.startswith(a + ".") for a in ALLOWED)


def test_the_upstream_package_imports_only_http_and_the_error_tree():
    modules = sorted(PACKAGE.glob("*.py"))
    assert {p.name for p in modules} >= {"__init__.py", "client.py", "http1.py", "transport.py"}
    wrong = {
        f"{path.name}: {name}"
        for path in modules
        for name in imports_of(path)
        if name != "prefixgate" and not allowed(name)
    }
    assert not wrong, sorted(wrong)


def test_the_check_sees_an_import_it_must_refuse(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from prefixgate.record import Record\n"
        "def f():\n    from prefixgate.engine.client import map_status\n"
        "from prefixgate import pipeline\n"
        "from .. import gateway\n"
    )
    names = imports_of(bad)
    assert {"prefixgate.record", "prefixgate.engine.client", "prefixgate.pipeline"} <= names
    assert "prefixgate.gateway" in names
    assert not any(allowed(n) for n in names - {"prefixgate"})
