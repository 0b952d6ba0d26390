from __future__ import annotations

import lzma
import shutil
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_ROOT

MOONCAKE = FIXTURE_ROOT / "mooncake"


@pytest.fixture(scope="session")
def mooncake_dir(tmp_path_factory) -> Path:
    """The Mooncake traces, whole, as the simulator reads them: the repository keeps them
    xz-compressed (4.2 MB of JSON in 0.26 MB), so they are unpacked once per run."""
    out = tmp_path_factory.mktemp("mooncake")
    for packed in sorted(MOONCAKE.glob("*.jsonl.xz")):
        with lzma.open(packed) as src, (out / packed.name.removesuffix(".xz")).open("wb") as dst:
            shutil.copyfileobj(src, dst)
    return out
