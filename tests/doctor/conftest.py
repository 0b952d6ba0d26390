from __future__ import annotations

import pytest

from prefixgate.record.record import Record
from tests.conftest import pg_database  # noqa: F401  (fixture re-export)
from tests.doctor import builders as b


def seed_records(*, texts: bool = True) -> list[Record]:
    """The billing-header incident's 8/17: 451 Claude Code requests on /v1/messages with a per-request cch=
    (383 pinned at 17920 = 280 × 64, 40 at 256, 28 at 0; prompts ~40k–180k averaging
    ~106k) and 444 Reasonix requests on /v1/chat/completions, same channel and model."""
    claude = b.claude_sessions(
        68,
        lambda s: 7 if s < 43 else 6,
        header=b.cch,
        first_tokens=23000,
        growth=23000,
        texts=texts,
    )
    firsts = 0
    for rec in claude:
        rec.prompt_tokens = sum(s.tokens for s in rec.segments_out if s.kind != "tool")
        if rec.request_id.endswith("-0"):
            rec.cached_tokens = 0 if firsts < 28 else 256
            firsts += 1
        else:
            rec.cached_tokens = 17920
        rec.reported_input_tokens = rec.prompt_tokens - rec.cached_tokens
        rec.reported_cache_read_tokens = rec.cached_tokens
    chat = b.simulate(b.chat_sessions(37, 12, first_tokens=24000, growth=9000))
    for rec in chat[7::36]:  # a long pause now and then: evicted, cold again
        rec.cached_tokens = 0
    return claude + chat


@pytest.fixture(scope="session")
def seed_dsn(tmp_path_factory) -> str:
    """A read-only SQLite store of :func:`seed_records` (shared: tests must not write)."""
    path = tmp_path_factory.mktemp("seed") / "seed.db"
    return b.write(f"sqlite:///{path}", seed_records())
