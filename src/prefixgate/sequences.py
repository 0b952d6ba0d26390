"""Two sequences compared in C: how long a prefix they share.

A request re-sends the previous one's text, tokens or segments and appends; comparing
them item by item in Python would cost a bytecode loop over the whole conversation, where
slice comparisons run at memcmp speed (strings, bytes) or compare references first
(lists: identical items are equal at once)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, count
from operator import is_not
from typing import Any

__all__ = ["common_prefix", "same_prefix"]


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading items (characters, bytes, list items) ``a`` and ``b`` share:
    the whole compared at once, then by halves."""
    lo, hi = 0, min(len(a), len(b))
    # (not sliced where the whole is compared: a list's copy writes to each item)
    if (a if len(a) == hi else a[:hi]) == (b if len(b) == hi else b[:hi]):
        return hi
    while hi - lo > 1:  # a[:lo] == b[:lo], a[lo:hi] != b[lo:hi]
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def same_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading items of ``a`` and ``b`` are the very same objects (``is``), found
    in C: equal objects that are not the same one end it. For what was lent turn over
    turn, whose bytes are known only for the object itself."""
    return next(compress(count(), map(is_not, a, b)), min(len(a), len(b)))
