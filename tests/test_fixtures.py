"""The test data kept in the repository is what PROVENANCE.md says: every file listed, each
with its recorded digest (a changed or lost fixture fails here instead of emptying the
parametrised tests that read it), nothing unlisted, and no credential in a capture."""

from __future__ import annotations

import hashlib
import json
import lzma
import re

import pytest

from tests.conftest import FIXTURE_ROOT

ROW = re.compile(r"^\| `([^`]+)` \| `([0-9a-f]{64})` \| ([\d,]+) \|$", re.MULTILINE)
LISTED = {
    name: (digest, int(size.replace(",", "")))
    for name, digest, size in ROW.findall((FIXTURE_ROOT / "PROVENANCE.md").read_text())
}
NOT_DATA = {"PROVENANCE.md", "mooncake/LICENSE-APACHE"}


def test_every_fixture_is_listed_with_its_provenance():
    present = {
        p.relative_to(FIXTURE_ROOT).as_posix() for p in FIXTURE_ROOT.rglob("*") if p.is_file()
    }
    assert len(LISTED) >= 4
    assert present - NOT_DATA == set(LISTED)


@pytest.mark.parametrize("name", sorted(LISTED))
def test_fixture_bytes_are_the_recorded_ones(name: str):
    raw = (FIXTURE_ROOT / name).read_bytes()
    data = lzma.decompress(raw) if name.endswith(".xz") else raw
    assert (hashlib.sha256(data).hexdigest(), len(data)) == LISTED[name]


@pytest.mark.parametrize(
    "path",
    sorted(FIXTURE_ROOT.glob("*/*.json")),
    ids=lambda p: p.relative_to(FIXTURE_ROOT).as_posix(),
)
def test_captures_carry_no_credential(path):
    headers = json.loads(path.read_text())["headers"]
    secret = {k: v for k, v in headers.items() if k.lower() in ("x-api-key", "authorization")}
    assert secret and all(v.startswith("<redacted") for v in secret.values())
