"""docs/architecture.md cannot drift: its pipeline lines are the code's tuples, and its
module table names every module of the package."""

from __future__ import annotations

import re
from pathlib import Path

from prefixgate import pipeline

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def test_the_documented_pipeline_is_the_codes():
    block = DOC.split("<!-- pipeline:begin -->", 1)[1].split("<!-- pipeline:end -->", 1)[0]
    lines = dict(
        re.match(r"(\S+)\s+(.*)", line).groups()
        for line in block.strip().strip("`").strip().splitlines()
    )
    assert lines == {
        "/v1/messages": pipeline.describe(pipeline.MESSAGES.steps),
        "/v1/chat/completions": pipeline.describe(pipeline.CHAT.steps),
        "/v1/responses": pipeline.describe(pipeline.RESPONSES.steps),
        "/v1/responses/compact": pipeline.describe(pipeline.COMPACT.steps),
        "/v1/messages/count_tokens": pipeline.describe(pipeline.COUNT_TOKENS.steps),
    }


def test_every_module_is_in_the_table():
    package = ROOT / "src" / "prefixgate"
    modules = {p.relative_to(package).as_posix() for p in package.rglob("*.py")}
    listed = set(re.findall(r"^\| `([\w/]+\.py)` \|", DOC, flags=re.M))
    assert modules - listed == set(), "modules missing from docs/architecture.md"
    assert listed - modules == set(), "docs/architecture.md lists modules that do not exist"
