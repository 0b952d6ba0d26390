"""benchmarks/typing_debt.py counts what the type checker tolerates as mypy reads it: a
package's wildcard covers the package and every module under it, once per error code."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "typing_debt", Path(__file__).parents[2] / "benchmarks" / "typing_debt.py"
)
assert _spec is not None and _spec.loader is not None
typing_debt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(typing_debt)

PYPROJECT = """
[tool.mypy]
[[tool.mypy.overrides]]
module = ["p.a"]
disallow_untyped_defs = true
[[tool.mypy.overrides]]
module = ["p.b.*", "p.c"]
disable_error_code = ["index", "misc"]
[[tool.mypy.overrides]]
module = "p.c"
disable_error_code = ["misc", "arg-type"]
"""

FILES = ["src/p/__init__.py", "src/p/a.py", "src/p/b/__init__.py", "src/p/b/x.py", "src/p/c.py"]


def test_wildcards_cover_the_package_and_its_modules_and_pairs_count_once():
    assert typing_debt.count(PYPROJECT, FILES) == {
        "modules": 5,
        "strict": 1,
        # p.b and p.b.x: index, misc; p.c: index, misc, arg-type (misc once)
        "tolerated pairs": 7,
        "modules with any tolerated": 3,
    }
