"""Upstream health as the dashboard shows it: each channel's replicas from the config, their
state in the router (ejected, down, in flight), their KV-event stream (``events/``: live,
stale, what the index holds), their traffic and errors from the store, the
host-memory (L2) tier verdict of the doctor's upstream-health check for channels
with a ``metrics_url``, and admission (requests in flight, queued and refused) of the
worker that answers and of each capped channel."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prefixgate.doctor import upstream_health
from prefixgate.doctor.upstream_health import LOAD_KEYS, STORE_KEYS
from prefixgate.hygiene import keeps_system_in_place


def replica_state(router: Any, url: str) -> dict[str, Any]:
    """What this gateway process knows about one replica right now."""
    ejected = bool(router.is_ejected(url))
    down = bool(router.is_down(url))
    return {
        "state": "down" if down else "ejected" if ejected else "up",
        "inflight": int(router.inflight(url)),
    }


def l2_status(url: str) -> dict[str, Any]:
    """Fetch one ``/metrics`` snapshot (blocking: run it in a thread) and judge the host
    tier: ``write_only`` (the doctor's finding), ``ok`` (blocks are loaded back), ``none``
    (no offloading counters) or ``unreachable``."""
    try:
        counters = upstream_health.parse_metrics(upstream_health.fetch_metrics(url))
    except Exception as exc:  # a dead endpoint is a status, not a crash
        return {"status": "unreachable", "error": type(exc).__name__, "finding": None}
    finding = upstream_health.metrics_finding(url, [counters])
    stored, loaded = counters.get(*STORE_KEYS), counters.get(*LOAD_KEYS)
    q, h = counters.get("prefix_cache_queries"), counters.get("prefix_cache_hits")
    ext_q = counters.get("external_prefix_cache_queries")
    ext_h = counters.get("external_prefix_cache_hits")
    if finding is not None:
        status = "write_only"
    elif stored > 0 or loaded > 0 or ext_q > 0:
        status = "ok"
    else:
        status = "none"
    return {
        "status": status,
        "finding": asdict(finding) if finding else None,
        "counters": {
            "store_bytes": stored,
            "load_bytes": loaded,
            "external_queries": ext_q,
            "external_hits": ext_h,
            "gpu_hit_rate": h / q if q else None,
            "block_size": counters.block_size,
        },
    }


def view(gateway: Any, stats: dict[str, Any], l2: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Channels with their replicas (configured ones first, then replicas seen only in the
    store), joined with the store's per-replica figures."""
    by_key = {(r["channel"], r["replica"]): r for r in stats["replicas"]}
    admission = gateway.admission.snapshot()
    hub = getattr(gateway, "events", None)
    events = {(e["channel"], e["replica"]): e for e in (hub.statuses() if hub else ())}
    orders = gateway.render_orders  # what each channel's template was learned to do
    seen: set[tuple[str, str]] = set()
    channels = []
    for ch in gateway.config.channels:
        replicas = []
        for url in ch.urls():
            seen.add((ch.name, url))
            replicas.append(
                {
                    "url": url,
                    "configured": True,
                    **replica_state(gateway.router, url),
                    "stats": by_key.get((ch.name, url)),
                    "events": events.get((ch.name, url)),
                }
            )
        for (name, url), r in by_key.items():
            if name == ch.name and (name, url) not in seen:
                seen.add((name, url))
                replicas.append(
                    {"url": url, "configured": False, "state": None, "inflight": 0, "stats": r}
                )
        channels.append(
            {
                "name": ch.name,
                "kind": ch.kind,
                "models": list(ch.models) + [m for m in ch.model_map if m not in ch.models],
                "model_map": dict(ch.model_map),
                "priority": ch.priority,
                "weight": ch.weight,
                "routing": ch.routing.policy,
                "render_order": orders.order_of(ch).order,
                "render_order_source": orders.order_of(ch).source,
                "rendering": orders.rendering_of(ch).as_dict(),
                "system_in_place": keeps_system_in_place(ch, orders),
                "strip_billing_header": ch.strip_billing_header,
                "health_check_interval": ch.health.interval,
                "metrics_url": ch.metrics_url is not None,
                "kv_events": ch.kv_events is not None,
                "l2": l2.get(ch.name),
                "admission": admission["channels"].get(ch.name),
                "replicas": replicas,
            }
        )
    gone = [r for key, r in by_key.items() if key not in seen]
    return {
        "channels": channels,
        "unconfigured": gone,
        "errors": stats["errors"],
        "admission": admission["worker"],
    }
