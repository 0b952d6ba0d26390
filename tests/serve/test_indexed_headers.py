"""The request headers a handler reads: looked up by name in any case, the first of a
repeated name, as Starlette's own ``Headers`` gives them."""

from __future__ import annotations

from starlette.datastructures import Headers

from prefixgate.serve.app import IndexedHeaders

RAW = [
    (b"host", b"127.0.0.1:8080"),
    (b"x-api-key", b"k1"),
    (b"anthropic-beta", b"one"),
    (b"anthropic-beta", b"two"),
    (b"user-agent", b"claude-cli/2.1 (caf\xe9)"),
]


def test_lookups_agree_with_starlettes_headers() -> None:
    ours, theirs = IndexedHeaders(RAW), Headers(raw=RAW)
    for name in ("host", "X-API-Key", "anthropic-beta", "User-Agent", "absent"):
        assert ours.get(name) == theirs.get(name)
        assert (name in ours) == (name in theirs)
    assert ours["ANTHROPIC-BETA"] == "one"  # the first of a repeated name
    assert ours.getlist("anthropic-beta") == ["one", "two"]  # the list itself, kept whole
    assert ours["user-agent"] == "claude-cli/2.1 (café)"  # latin-1, as ASGI's bytes are read
    assert 3 not in ours


def test_no_headers() -> None:
    empty = IndexedHeaders([])
    assert empty.get("host") is None
    assert "host" not in empty
