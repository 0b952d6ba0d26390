"""The miss ledger: for every recorded request, where each of its prompt tokens went.

- :mod:`.causes`: :class:`Ledger`, the causes and what they mean;
- :mod:`.split`: the split itself, pure: from the index's blocks as of the request's time
  (``source: events``) or from the cache model's figures (``source: model``);
- :mod:`.cachemodel`: the cache model replayed on the recorded segments, per replica;
- :mod:`.worker`: :class:`LedgerWorker`, fed at a record's finish, computing ledgers off
  the request path and writing them to the store; the calibration figures for
  ``/metrics``.
"""

from __future__ import annotations

from .causes import CAUSES, EVENTS, MODEL, Ledger

__all__ = ["CAUSES", "EVENTS", "MODEL", "Ledger"]
