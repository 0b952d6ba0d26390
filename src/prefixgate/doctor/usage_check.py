"""Usage semantics: did Messages clients see ``input_tokens`` that include the cache?

Anthropic's ``input_tokens`` excludes cache reads; OpenAI-style ``prompt_tokens`` includes
them. A gateway that copies one into the other makes Claude Code believe its window is
fuller than it is and compact early — and every compaction restarts the prefix. Records
keep both the raw upstream figures and what the client was shown, so this is a query.
"""

from __future__ import annotations

from prefixgate.doctor import query
from prefixgate.doctor.findings import WARNING, Finding, Table
from prefixgate.store import Store

MIN_SHARE = 0.5  # of the checkable responses of a channel


def check(store: Store, since: float | None, until: float | None) -> Finding | None:
    where, params = query.window(since, until)
    sql = (
        "SELECT channel, COUNT(*),"
        " SUM(CASE WHEN reported_input_tokens = prompt_tokens THEN 1 ELSE 0 END),"
        " SUM(CASE WHEN reported_input_tokens = prompt_tokens THEN cached_tokens ELSE 0 END),"
        " SUM(cached_tokens)"
        f" FROM requests WHERE {query.OK} AND endpoint = ? AND cached_tokens > 0"
        f" AND reported_input_tokens IS NOT NULL{where} GROUP BY channel"
    )
    rows = query.run(store, sql, ["messages", *params])
    bad = []
    for channel, n, inflated, inflated_cached, _cached in rows:
        n, inflated = int(n), int(inflated or 0)
        if n and inflated >= MIN_SHARE * n:
            bad.append([channel or "(none)", n, inflated, int(inflated_cached or 0)])
    if not bad:
        return None
    channels = ", ".join(str(r[0]) for r in bad)
    return Finding(
        kind="usage_includes_cache",
        severity=WARNING,
        title=f"Messages clients are shown input_tokens that include cached tokens ({channels})",
        summary=[
            "on /v1/messages, responses with cache hits reported input_tokens == prompt_tokens: "
            "the cached part was counted again as new input",
            "Claude Code sizes its context from input_tokens + cache reads + output, so it sees a "
            "fuller window than it has and compacts early; each compaction restarts the prefix",
        ],
        fix=[
            f"enable `anthropic_messages_exclude_cache: true` on channel(s) {channels} "
            "(input_tokens = prompt − cache reads − cache writes; cache reads in "
            "cache_read_input_tokens; no inflated estimate in message_start)",
        ],
        evidence=[
            Table(
                "Messages responses with cache hits",
                [
                    "channel",
                    "responses",
                    "input_tokens included the cache",
                    "cached tokens counted twice",
                ],
                bad,
            )
        ],
        facts={"channels": [r[0] for r in bad], "rows": bad},
    )
