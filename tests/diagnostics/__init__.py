"""Shared by the diagnostics tests."""

from __future__ import annotations

import hashlib

# Alice holds two keys of one owner, Bob one of another's: (name, key, owner).
OWNERS = (
    ("alice", "key-alice", "team-a"),
    ("alice2", "key-alice-2", "team-a"),
    ("bob", "key-bob", "team-b"),
)


def keys(entries=OWNERS) -> list[dict]:
    """The gateway's ``keys`` settings for ``(name, key, owner)`` entries."""
    return [
        {"name": n, "key_sha256": hashlib.sha256(k.encode()).hexdigest(), "owner": o}
        for n, k, o in entries
    ]
