"""docs/architecture.md cannot drift: its pipeline lines are the code's tuples (the way in
and the way out), its package map names every package and root module, its recipes name
files that exist, and its module table names every module of the package."""

from __future__ import annotations

import re
from pathlib import Path

from prefixgate import pipeline
from prefixgate.serve.app import INFERENCE

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def test_the_documented_pipeline_is_the_codes():
    block = DOC.split("<!-- pipeline:begin -->", 1)[1].split("<!-- pipeline:end -->", 1)[0]
    lines = dict(
        re.match(r"(\S+)\s+(.*)", line).groups()
        for line in block.strip().strip("`").strip().splitlines()
    )
    routed = dict(INFERENCE)  # the endpoints the server routes to, by path
    documented = {path: line for path, line in lines.items() if path != "finish"}
    assert documented == {
        path: pipeline.describe(routed[path].steps) for path in routed if path.startswith("/v1/")
    }
    assert lines["finish"] == pipeline.describe(pipeline.FINISH_STEPS)


def _block(name: str) -> str:
    return DOC.split(f"<!-- {name}:begin -->", 1)[1].split(f"<!-- {name}:end -->", 1)[0]


PACKAGE = ROOT / "src" / "prefixgate"


def test_the_package_map_has_one_line_per_package_and_every_root_module():
    lines = _block("packages").strip().splitlines()
    listed = [m.group(1) for line in lines if (m := re.match(r"- `(\w+)/` — \S", line))]
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert sorted(listed) == packages
    assert len(listed) == len(set(listed))
    (root,) = [line for line in lines if line.startswith("- the root — ")]
    assert set(re.findall(r"`(\w+\.py)`", root)) == {p.name for p in PACKAGE.glob("*.py")}


def test_every_file_a_recipe_names_exists():
    recipes = _block("recipes")
    for kind in ("A hygiene step", "An API", "An engine", "A routing policy", "A doctor finding"):
        assert f"- **{kind}" in recipes
    named = set(re.findall(r"`((?:tests/|docs/)?[\w/]+\.(?:py|md))`", recipes))
    assert len(named) > 20
    for name in named:
        base = ROOT if name.startswith(("tests/", "docs/")) else PACKAGE
        assert (base / name).is_file(), name
    for folder in re.findall(r"`((?:tests/)?[\w/]+/)`", recipes):
        base = ROOT if folder.startswith("tests/") else PACKAGE
        assert (base / folder).is_dir(), folder


def test_every_module_is_in_the_table():
    package = ROOT / "src" / "prefixgate"
    modules = {p.relative_to(package).as_posix() for p in package.rglob("*.py")}
    listed = set(re.findall(r"^\| `([\w/]+\.py)` \|", DOC, flags=re.M))
    assert modules - listed == set(), "modules missing from docs/architecture.md"
    assert listed - modules == set(), "docs/architecture.md lists modules that do not exist"
