"""The miss ledger of one request: where each of its prompt tokens went.

Causes, in the order the ledger shows them (each a count of prompt tokens; they sum to
``prompt_tokens`` exactly):

- ``hit``: served from the engine's prefix cache (its reported ``cached_tokens``);
- ``prefix_changed``: the previous request of the session had a prompt this long, but
  this one differs from it earlier (``changed_segment`` names the first segment that
  changed): those blocks were never computed in this form;
- ``evicted``: the serving replica had computed those blocks and removed them before this
  request was served (or, never held there, another replica had and removed them): a
  capacity loss, except its sub-count ``cleared``;
- ``elsewhere``: cached on another replica when the request was sent: a routing loss;
- ``partial_block``: vLLM's rule that the last, partial block never hits (at least one
  token is always computed: at most ``floor((L - 1) / B) * B`` tokens can hit);
- ``cold``: never computed anywhere before (the new tail of a conversation, a first
  prompt);
- ``unknown``: no engine events cover that time (the replica's stream was down, stale or
  not yet read), or the index and the engine disagree about a block.

Beside the causes, sub-counts of them: ``host_hit`` and ``host_missed`` (a host tier's part
of ``hit`` and of what did not hit) and ``cleared``: the ``evicted`` tokens whose removal was
the engine clearing its whole cache (its ``AllBlocksCleared`` event: a ``/flush_cache``, a
reset, a restart), not an eviction for room: no evidence that the cache is too small.

``source`` says how the ledger was made: ``events`` (the engines' KV events, read as of the
request's time) or ``model`` (the cache model replayed on the recorded segments, for a
channel without events). Beside the causes, the three predictions of the hit for
calibration: the engine's own (``engine_cached``), the index's (``index_predicted``: what a
lookup in the index found when the request was sent) and the cache model's
(``model_predicted``).
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["CAUSES", "Ledger"]

CAUSES = ("hit", "prefix_changed", "evicted", "elsewhere", "partial_block", "cold", "unknown")
EVENTS, MODEL = "events", "model"


class Ledger(msgspec.Struct, kw_only=True):
    request_id: str
    received_at: float
    source: str  # "events" | "model"
    prompt_tokens: int
    block_size: int
    hit: int = 0
    prefix_changed: int = 0
    evicted: int = 0
    elsewhere: int = 0
    partial_block: int = 0
    cold: int = 0
    unknown: int = 0
    changed_segment: str | None = None  # the first segment that differs from the previous
    changed_index: int | None = None  # its position in the upstream prompt's segments
    elsewhere_replica: str | None = None  # the replica that held most ``elsewhere`` tokens
    engine_cached: int | None = None
    index_predicted: int | None = None
    model_predicted: int | None = None
    host_hit: int = 0  # hit tokens held only in a host tier (loaded back)
    host_missed: int = 0  # tokens not hit that a host tier held (never loaded back)
    cleared: int = 0  # evicted tokens whose removal was a cache clear (flush, restart)

    def parts(self) -> dict[str, int]:
        return {c: getattr(self, c) for c in CAUSES}

    def total(self) -> int:
        return sum(getattr(self, c) for c in CAUSES)

    def as_dict(self) -> dict[str, Any]:
        out = msgspec.structs.asdict(self)
        out["parts"] = self.parts()
        return out
