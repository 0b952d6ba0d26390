from __future__ import annotations

from pathlib import Path

import pytest

MOONCAKE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "mooncake"


@pytest.fixture
def mooncake_dir() -> Path:
    if not (MOONCAKE / "conversation_trace.jsonl").is_file():
        pytest.skip("the shipped Mooncake traces are not present")
    return MOONCAKE
