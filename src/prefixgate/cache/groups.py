"""KV cache groups of hybrid models, and how a prefix hit is agreed between them.

A model with several attention types has one KV cache group per type (vLLM's hybrid
allocator). A prefix-cache hit of ``e`` blocks is usable only if EVERY group can serve it:

- ``full`` (full attention, MLA): needs every block ``[0, e)``.
- ``window:W`` (sliding window of ``W`` tokens): the token after the hit attends to the
  ``W - 1`` tokens before it, so only the last ``ceil((W - 1) / B)`` blocks before ``e``
  matter. A block missing further back does not stop a window group from hitting.
- ``draft:N`` (EAGLE/MTP draft layers): attends like full attention, but its trailing
  ``N`` blocks of every request are *volatile*: the draft KV of the last positions is only
  final after decoding, so the host (offload) tier never stores them. On the GPU the draft
  group is as good as a full-attention group.

Availability is given per block as booleans (``present[i]``: block ``i`` is available to
this group, in whichever tier is being asked). :func:`group_hit` gives one group's longest
usable hit, :func:`agreed_hit` the hit all groups agree on (the AND).

External (host-tier) lookups start where the GPU hit ended (block ``start``) and follow a
lookup policy:

- ``veto``: the OffloadingConnector of vLLM as the DeepSeek deployment ran it. Each group counts the hit chunks
  it holds at the end of the full-attention prefix found in the host; one group with zero
  hit chunks there makes the whole external hit 0, even though the full-attention prefix
  is in host memory. That end is usually where an earlier request stopped, exactly where
  the draft group's volatile block was never stored: the host is written, never read.
- ``promote``: the proposed fix. If the full-attention groups hit, load that prefix anyway
  and recompute the part the other groups miss: a window's worth of tokens (the largest
  sliding window, or the draft group's volatile blocks), at most the loaded tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DEFAULT_GROUPS",
    "POLICIES",
    "ExternalHit",
    "KVGroup",
    "agreed_hit",
    "external_hit",
    "format_groups",
    "group_hit",
    "parse_groups",
    "tail_chunks",
]

GroupKind = Literal["full", "window", "draft"]
Policy = Literal["veto", "promote"]
POLICIES: tuple[str, ...] = ("veto", "promote")


@dataclass(frozen=True, slots=True)
class KVGroup:
    """One KV cache group. ``window_tokens`` only for ``window``; ``volatile_blocks`` (the
    trailing blocks of a request never offloaded) only for ``draft``."""

    kind: GroupKind
    window_tokens: int = 0
    volatile_blocks: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("full", "window", "draft"):
            raise ValueError(f"unknown KV group kind {self.kind!r}")
        if self.kind == "window" and self.window_tokens < 1:
            raise ValueError("a window group needs window_tokens >= 1")
        if self.volatile_blocks < 0:
            raise ValueError("volatile_blocks must be >= 0")

    def window_blocks(self, block_size: int) -> int | None:
        """Blocks before a hit's end this group needs (``None``: all of them)."""
        if self.kind != "window":
            return None
        return -(-(self.window_tokens - 1) // block_size)

    @property
    def spec(self) -> str:
        if self.kind == "window":
            return f"window:{self.window_tokens}"
        if self.kind == "draft":
            return f"draft:{self.volatile_blocks}"
        return "full"


DEFAULT_GROUPS: tuple[KVGroup, ...] = (KVGroup("full"),)


def parse_groups(spec: str) -> tuple[KVGroup, ...]:
    """``"full,window:4096,draft:1"`` → groups. ``window:W`` takes tokens (``4k`` allowed);
    ``draft`` alone means one volatile block."""
    groups: list[KVGroup] = []
    for raw in spec.split(","):
        part = raw.strip().lower()
        if not part:
            continue
        kind, _, arg = part.partition(":")
        try:
            if kind == "full" and not arg:
                groups.append(KVGroup("full"))
            elif kind in ("window", "swa", "sliding") and arg:
                groups.append(KVGroup("window", window_tokens=_int(arg)))
            elif kind in ("draft", "eagle", "mtp"):
                groups.append(KVGroup("draft", volatile_blocks=_int(arg) if arg else 1))
            else:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"bad KV group {raw.strip()!r} (want full, window:TOKENS or draft:BLOCKS)"
            ) from None
    if not groups:
        raise ValueError("no KV groups given")
    return tuple(groups)


def format_groups(groups: Sequence[KVGroup]) -> str:
    return ",".join(g.spec for g in groups)


def _int(text: str) -> int:
    text = text.strip().lower()
    mult = 1
    if text.endswith("k"):
        mult, text = 1024, text[:-1]
    return int(text) * mult


# -- hits ------------------------------------------------------------------------------


def group_hit(
    group: KVGroup, present: Sequence[bool], block_size: int, end: int, start: int = 0
) -> int:
    """The largest hit end ``e`` in ``[start, end]`` that ``group`` can serve; ``start`` if
    none beyond it. Blocks before ``start`` count as available (an earlier tier has them)."""
    w = group.window_blocks(block_size)
    if w is None:
        e = start
        while e < end and present[e]:
            e += 1
        return e
    return _window_end(present, w, end, start)


def _window_end(present: Sequence[bool], w: int, end: int, start: int) -> int:
    """Rightmost ``e <= end`` whose ``w`` preceding blocks (those ``>= start``) are all
    available, scanning right to left; ``start`` if there is none."""
    if w <= 0:
        return end
    e = end  # blocks [i + 1, e) are all available
    for i in range(end - 1, start - 1, -1):
        if not present[i]:
            e = i
        elif e - i >= w or i == start:
            return e
    return start


def agreed_hit(
    groups: Sequence[KVGroup],
    present: Sequence[Sequence[bool]],
    block_size: int,
    end: int,
    start: int = 0,
) -> int:
    """The largest hit end every group accepts (``present[k]`` belongs to ``groups[k]``)."""
    e = end
    for g, p in zip(groups, present, strict=True):
        if g.window_blocks(block_size) is None:
            e = min(e, group_hit(g, p, block_size, e, start))
    while True:
        moved = False
        for g, p in zip(groups, present, strict=True):
            w = g.window_blocks(block_size)
            if w is not None:
                ne = _window_end(p, w, e, start)
                if ne < e:
                    e, moved = ne, True
        if not moved:
            return e


@dataclass(frozen=True, slots=True)
class ExternalHit:
    """Blocks loaded from the external tier beyond the GPU hit, and prompt tokens that must
    be recomputed anyway (``promote`` only)."""

    blocks: int
    recompute_tokens: int = 0


def tail_chunks(present: Sequence[bool], end: int, start: int) -> int:
    """Consecutive available blocks ending at ``end`` (counting back to ``start``): the
    chunks a group can contribute to a hit that ends at ``end``."""
    n = 0
    i = end - 1
    while i >= start and present[i]:
        n += 1
        i -= 1
    return n


def external_hit(
    groups: Sequence[KVGroup],
    present: Sequence[Sequence[bool]],
    block_size: int,
    end: int,
    start: int,
    policy: Policy = "veto",
) -> ExternalHit:
    """The external-tier hit beyond ``start`` under ``policy``.

    The lookup is anchored where the full-attention groups' prefix ends (``anchor``; the
    agreed hit when there is no full-attention group). Each group counts the chunks it
    holds that end at the anchor (:func:`tail_chunks`).

    - ``veto``: a group with zero hit chunks there makes the whole external hit 0; else
      the hit is what all groups agree on (:func:`agreed_hit`).
    - ``promote``: load up to the anchor anyway; when some group does not agree, recompute
      a window's worth of tokens for it (the largest sliding window, or the draft group's
      volatile blocks), at most the loaded tokens.
    """
    if policy not in ("veto", "promote"):
        raise ValueError(f"policy must be 'veto' or 'promote', not {policy!r}")
    agreed = agreed_hit(groups, present, block_size, end, start)
    full = [p for g, p in zip(groups, present, strict=True) if g.kind == "full"]
    if not full:
        return ExternalHit(agreed - start)
    anchor = min(group_hit(KVGroup("full"), p, block_size, end, start) for p in full)
    if anchor <= start or agreed == anchor:
        return ExternalHit(agreed - start)
    if policy == "veto":
        if any(tail_chunks(p, anchor, start) == 0 for p in present):
            return ExternalHit(0)
        return ExternalHit(agreed - start)
    redo = 0
    for g in groups:
        if g.kind == "window":
            redo = max(redo, g.window_tokens)
        elif g.kind == "draft":
            redo = max(redo, g.volatile_blocks * block_size)
    loaded = (anchor - start) * block_size
    return ExternalHit(anchor - start, min(redo, loaded))
