"""What the miss ledgers say (``ledgers``, :mod:`prefixgate.ledger`): three separate
findings, one per kind of loss, each with its figure and the fix that fits it,

- **capacity** (``kv_capacity``): tokens the engine had computed and evicted before they
  were asked for again, as the engine's KV events show (a shortfall of the hit alone is
  no evidence: a template the gateway does not know, a model's estimate): more KV memory,
  a host tier, or fewer concurrent sessions; the tokens lost because the engine cleared its
  whole cache (the ledger's ``cleared``: a ``/flush_cache``, a reset, a restart) are no
  such evidence and have their own finding (``cache_cleared``);
- **routing** (``routing_loss``): tokens cached on another replica of the channel when the
  request was sent: which routing policy would have kept them;
- **host tier** (``l2_write_only``): blocks the engine's own events show in its host
  tier (medium ``CPU``) when a request missed them, and none ever loaded back: the host
  tier's real contents, in place of the guesses from counters and log lines;

what the engine's chat template costs (:mod:`.template_cost`: ``template_hoisting``,
``template_reasoning``), and the **calibration** line (``calibration``): how often the index's and the cache
model's predictions of the hit equal the engine's reported ``cached_tokens``. Prompt
instability stays the slices' finding (``prefix_broken``); the ledger's
``prefix_changed`` figure is in the calibration table beside the other causes.

Every sum runs inside the database (portable SQL, :meth:`Store.query`).
"""

from __future__ import annotations

from collections.abc import Mapping

from prefixgate.doctor import template_cost
from prefixgate.doctor.findings import CRITICAL, INFO, WARNING, Finding, Table
from prefixgate.doctor.output import pct, tokens
from prefixgate.ledger import CAUSES
from prefixgate.store import Store
from prefixgate.store.schema import CLEARED_VERSION, LEDGER_VERSION

CAPACITY_SHARE = 0.05  # evicted tokens worth a finding, as a share of prompt tokens
CLEARED_SHARE = 0.05  # tokens lost to cache clears worth a finding
ROUTING_SHARE = 0.02
CRITICAL_SHARE = 0.20

_SUMS = ", ".join(f"SUM(l.tokens_{c})" for c in CAUSES)
_AGREE = (
    "SUM(CASE WHEN l.engine_cached IS NOT NULL AND l.{p}_predicted IS NOT NULL"
    " THEN 1 ELSE 0 END),"
    " SUM(CASE WHEN l.{p}_predicted = l.engine_cached THEN 1 ELSE 0 END)"
)


def _window(since: float | None, until: float | None) -> tuple[str, list]:
    sql, params = "", []
    if since is not None:
        sql, params = sql + " AND l.request_at >= ?", [*params, since]
    if until is not None:
        sql, params = sql + " AND l.request_at < ?", [*params, until]
    return sql, params


def findings(
    store: Store,
    since: float | None,
    until: float | None,
    policies: Mapping[str, str] | None = None,
) -> tuple[list[Finding], bool]:
    """The ledger's findings in the window, and whether it saw the host tier's contents
    (then the L2 guesses from counters and logs are left out)."""
    if store.schema_version() < LEDGER_VERSION:
        return [], False
    where, params = _window(since, until)
    cleared = "l.tokens_cleared" if store.schema_version() >= CLEARED_VERSION else "0"
    rows = store.query(
        "SELECT r.channel, COUNT(*), SUM(l.prompt_tokens), "
        f"{_SUMS}, SUM(l.host_hit), SUM(l.host_missed), "
        f"{_AGREE.format(p='index')}, {_AGREE.format(p='model')},"
        " SUM(CASE WHEN l.source = 'events' THEN 1 ELSE 0 END),"
        " SUM(CASE WHEN l.source = 'events' THEN l.tokens_evicted ELSE 0 END),"
        f" SUM({cleared})"
        " FROM ledgers l JOIN requests r ON r.request_id = l.request_id"
        f" WHERE 1 = 1{where} GROUP BY r.channel ORDER BY r.channel",
        params,
    )
    if not rows:
        return [], False
    out: list[Finding] = []
    channels = []
    for row in rows:
        ch = {
            "channel": row[0] or "(none)",
            "requests": int(row[1] or 0),
            "prompt_tokens": int(row[2] or 0),
            **{c: int(v or 0) for c, v in zip(CAUSES, row[3:10], strict=True)},
            "host_hit": int(row[10] or 0),
            "host_missed": int(row[11] or 0),
            "index_requests": int(row[12] or 0),
            "index_agree": int(row[13] or 0),
            "model_requests": int(row[14] or 0),
            "model_agree": int(row[15] or 0),
            "events_requests": int(row[16] or 0),
            # evictions the engine's own events show: the only evidence a capacity
            # finding stands on (a cache model's shortfall alone is no eviction, nor is
            # a cache clear: a flush, a restart)
            "evicted_seen": int(row[17] or 0) - int(row[18] or 0),
            "cleared": int(row[18] or 0),
        }
        channels.append(ch)
        policy = (policies or {}).get(ch["channel"])
        for f in (
            _capacity(ch),
            _cleared(ch),
            _routing(store, ch, policy, where, params),
            _host_tier(ch),
        ):
            if f is not None:
                out.append(f)
    out.extend(
        template_cost.findings(
            store, where, params, {c["channel"]: c["prompt_tokens"] for c in channels}
        )
    )
    out.append(_calibration(channels))
    host_seen = any(c["host_hit"] or c["host_missed"] for c in channels)
    return out, host_seen


def _share(ch: dict, cause: str) -> float:
    return ch[cause] / ch["prompt_tokens"] if ch["prompt_tokens"] else 0.0


def _causes_table(ch: dict) -> Table:
    rows = []
    for c in CAUSES:
        if ch[c]:
            rows.append([c, tokens(ch[c]), pct(_share(ch, c))])
        if c == "evicted" and ch.get("cleared"):  # its sub-count, beside it
            rows.append(
                ["evicted of which cleared", tokens(ch["cleared"]), pct(_share(ch, "cleared"))]
            )
    return Table(
        f"prompt tokens of channel {ch['channel']} by where they went",
        ["cause", "tokens", "share"],
        rows,
    )


def _recomputed(ch: dict, figure: str, fact: str, kind: str, severity: str, because: str, *,
                summary: str, fix: list[str]) -> Finding:  # fmt: skip
    """A finding on the prompt tokens of ``ch[figure]``, recomputed ``because``."""
    share, name = _share(ch, figure), ch["channel"]
    return Finding(
        kind=kind,
        severity=severity,
        title=(
            f"channel {name}: {tokens(ch[figure])} prompt tokens ({pct(share)}) recomputed "
            f"because the engine had {because}"
        ),
        summary=[
            f"{ch['requests']:,} requests, {tokens(ch['prompt_tokens'])} prompt tokens: the "
            f"serving replica had computed {tokens(ch[figure])} of them before and {summary}"
        ],
        fix=fix,
        evidence=[_causes_table(ch)],
        facts={"channel": name, fact: ch[figure], "share": round(share, 6)},
    )


def _capacity(ch: dict) -> Finding | None:
    share = _share(ch, "evicted_seen")
    if share < CAPACITY_SHARE:
        return None
    return _recomputed(
        ch,
        "evicted_seen",
        "evicted_tokens",
        "kv_capacity",
        CRITICAL if share >= CRITICAL_SHARE else WARNING,
        "evicted them",
        summary="removed them before the request came, as its KV events show (its KV cache "
        "is too small for the sessions it holds)",
        fix=[
            "add KV memory: a higher `--gpu-memory-utilization`, a shorter `--max-model-len`, "
            "a larger GPU or more replicas",
            "add a host tier (vLLM's `--kv-transfer-config` with the OffloadingConnector, or "
            "LMCache): evicted blocks are loaded back instead of recomputed",
            "or hold fewer concurrent sessions per replica (`max_concurrency` per key, more "
            "replicas)",
        ],
    )


def _cleared(ch: dict) -> Finding | None:
    share = _share(ch, "cleared")
    if share < CLEARED_SHARE:
        return None
    return _recomputed(
        ch,
        "cleared",
        "cleared_tokens",
        "cache_cleared",
        INFO if share < CRITICAL_SHARE else WARNING,
        "cleared its cache",
        summary="lost them when it cleared its whole prefix cache (its KV events' "
        "AllBlocksCleared: a `/flush_cache` or `/reset_prefix_cache` call, an engine "
        "restart), not by evicting them for room: no sign that its KV cache is too small",
        fix=[
            "find what clears the cache: a script or operator calling the engine's "
            "`/flush_cache` (SGLang) or `/reset_prefix_cache` (vLLM), a weight or LoRA "
            "update, restarts by a supervisor or an autoscaler; clear only when the model "
            "changes",
            "a restart loses the cache by design: restart replicas one at a time, out of "
            "busy hours",
        ],
    )


# What each policy loses to ``elsewhere``, and the policy that would have kept it.
_BETTER = {
    "round_robin": "session (a session stays on its replica) or precise",
    "least_busy": "session (a session stays on its replica) or precise",
    "session": "precise (prompts shared across sessions go where they are cached)",
    "prefix": "precise (the index's truth instead of the estimate)",
    "precise": "precise with a looser load guard (routing.balance_abs / routing.balance_rel)",
}


def _routing(
    store: Store, ch: dict, policy: str | None, where: str, params: list
) -> Finding | None:
    share = _share(ch, "elsewhere")
    if share < ROUTING_SHARE:
        return None
    name = ch["channel"]
    rows = store.query(
        "SELECT r.replica, l.elsewhere_replica, COUNT(*), SUM(l.tokens_elsewhere)"
        " FROM ledgers l JOIN requests r ON r.request_id = l.request_id"
        f" WHERE l.tokens_elsewhere > 0 AND r.channel = ?{where}"
        " GROUP BY r.replica, l.elsewhere_replica ORDER BY 4 DESC LIMIT 10",
        [None if name == "(none)" else name, *params],
    )
    better = _BETTER.get(policy or "", "precise (longest cached prefix from the index)")
    return Finding(
        kind="routing_loss",
        severity=CRITICAL if share >= CRITICAL_SHARE else WARNING,
        title=(
            f"channel {name}: {tokens(ch['elsewhere'])} prompt tokens ({pct(share)}) were cached "
            "on another replica than the one that served them"
        ),
        summary=[
            f"routing policy {policy or '(unknown)'} sent requests away from the replica that "
            f"held their prefix: {tokens(ch['elsewhere'])} tokens recomputed that another "
            "replica had in cache when the request was sent",
        ],
        fix=[f"`routing.policy: {better.split(' ', 1)[0]}` on channel {name}: {better}"],
        evidence=[
            Table(
                "where the lost prefixes were",
                ["served by", "cached on", "requests", "tokens"],
                [[a, b, int(n or 0), tokens(t)] for a, b, n, t in rows],
            )
        ],
        facts={
            "channel": name,
            "policy": policy,
            "elsewhere_tokens": ch["elsewhere"],
            "share": round(share, 6),
            "better_policy": better.split(" ", 1)[0],
        },
    )


def _host_tier(ch: dict) -> Finding | None:
    missed, hit = ch["host_missed"], ch["host_hit"]
    if not missed or hit:
        return None
    name = ch["channel"]
    return Finding(
        kind="l2_write_only",
        severity=WARNING,
        title=f"host-memory (L2) KV tier is write-only on channel {name} (engine events)",
        summary=[
            f"the engines' KV events show {tokens(missed)} prompt tokens in the host tier "
            "(medium CPU) of the serving replica when requests missed them, and no request "
            "was served from it",
            "known cause: hybrid KV cache groups (sliding-window or draft groups) make the "
            "connector's lookup veto the whole hit",
        ],
        fix=[
            "fix the connector's lookup (load the full-attention prefix, recompute the rest), "
            "or release the host tier's pinned memory until then",
        ],
        evidence=[
            Table(
                "host tier, from the engines' events",
                ["figure", "tokens"],
                [["held in host memory, missed", tokens(missed)], ["loaded back", tokens(hit)]],
            )
        ],
        facts={"channel": name, "host_missed_tokens": missed, "host_hit_tokens": hit},
    )


def _calibration(channels: list[dict]) -> Finding:
    rows = []
    for ch in channels:
        rows.append(
            [
                ch["channel"],
                ch["requests"],
                f"{ch['events_requests']:,}",
                _rate(ch["index_agree"], ch["index_requests"]),
                _rate(ch["model_agree"], ch["model_requests"]),
                *(tokens(ch[c]) for c in CAUSES),
            ]
        )
    idx = sum(c["index_agree"] for c in channels), sum(c["index_requests"] for c in channels)
    mod = sum(c["model_agree"] for c in channels), sum(c["model_requests"] for c in channels)
    title = (
        f"calibration: the index predicted the engine's cached_tokens exactly for "
        f"{_rate(*idx)}, the cache model for {_rate(*mod)}"
    )
    return Finding(
        kind="calibration",
        severity=INFO,
        title=title,
        evidence=[
            Table(
                "predictions of the hit against the engine, and the ledger",
                ["channel", "requests", "from events", "index = engine", "model = engine", *CAUSES],
                rows,
            )
        ],
        facts={
            "index_agree": idx[0],
            "index_requests": idx[1],
            "model_agree": mod[0],
            "model_requests": mod[1],
            "channels": channels,
        },
    )


def _rate(agree: int, n: int) -> str:
    return f"{agree / n:.1%} of {n:,} requests" if n else "no requests"
