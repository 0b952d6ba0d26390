"""``config/`` sits at the bottom of the package: every module of it imports only the
standard library, third-party packages and ``prefixgate.config`` itself, so any part of
the gateway may read its settings without an import cycle."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import prefixgate.config

CONFIG = Path(prefixgate.config.__file__).parent


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, absolute (relative imports resolved against the
    package), in any scope: under ``TYPE_CHECKING`` and inside functions too."""
    tree = ast.parse(path.read_text(), str(path))
    package = "prefixgate.config"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                out.add(f"{base}.{node.module}" if node.module else base)
            else:
                out.add(node.module or "")
    return out


def test_config_imports_nothing_of_the_gateway_but_itself() -> None:
    modules = sorted(CONFIG.glob("*.py"))
    assert len(modules) > 5
    upward = {
        (path.name, name)
        for path in modules
        for name in imported(path)
        if name.split(".")[0] == "prefixgate" and not name.startswith("prefixgate.config")
    }
    assert upward == set()


def test_the_walk_sees_imports_and_the_rest_is_stdlib_or_installed() -> None:
    names = set().union(*(imported(p) for p in CONFIG.glob("*.py")))
    assert {"prefixgate.config.common", "pydantic", "yaml", "hashlib"} <= names
    outside = {n.split(".")[0] for n in names} - {"prefixgate", "__future__"}
    third_party = {n for n in outside if n not in sys.stdlib_module_names}
    assert third_party == {"pydantic", "yaml"}
