/* Upstream health: each channel's replicas, their KV events, traffic and errors, the host (L2) tier. */
"use strict";

(() => {
  const { h, fmt } = PG;
  const STATE = { up: ["up", "healthy"], ejected: ["ejected", "ejected (recent failure)"], down: ["down", "down (health probe)"] };

  function l2Panel(l2) {
    if (!l2) {
      return h("div", { class: "l2", dataset: { l2: "unknown" } }, PG.pill("neutral", "no metrics"),
        h("div", { class: "l2-body" }, h("h3", { text: "Host-memory (L2) KV tier" }),
          h("p", {}, "Set ", h("code", { text: "metrics_url" }), " on this channel to check the upstream's offloading tier.")));
    }
    const c = l2.counters || {};
    const verdict = {
      write_only: ["bad", "write-only", "Blocks are stored to host memory but never loaded back."],
      ok: ["ok", "loading", "Blocks stored to host memory are loaded back."],
      none: ["neutral", "no tier", "The upstream reports no KV offloading."],
      unreachable: ["warn", "unreachable", `The metrics endpoint did not answer (${l2.error || "error"}).`],
    }[l2.status] || ["neutral", l2.status, ""];
    const rows = l2.status === "unreachable" ? [] : [
      ["GPU → CPU stored", fmt.bytes(c.store_bytes)],
      ["CPU → GPU loaded", fmt.bytes(c.load_bytes)],
      ["external cache hits", `${fmt.num(c.external_hits)} of ${fmt.num(c.external_queries)} tokens`],
      ["GPU prefix-cache hit rate", fmt.pct(c.gpu_hit_rate)],
    ];
    const f = l2.finding;
    return h("div", { class: "l2", dataset: { l2: l2.status } }, PG.pill(verdict[0], verdict[1]),
      h("div", { class: "l2-body" }, h("h3", { text: "Host-memory (L2) KV tier" }), h("p", { text: verdict[2] }),
        f ? h("p", { class: "notes", text: f.summary[1] || "" }) : null,
        rows.length ? h("div", { class: "stats" }, rows.map(([k, v]) => h("span", {}, `${k} `, h("b", { text: v })))) : null,
        f && f.fix.length ? h("div", { class: "fix" }, h("h3", { text: "Suggested fix" }), h("ul", {}, f.fix.map((s) => h("li", {}, s.split("`").map((part, i) => (i % 2 ? h("code", { text: part }) : part)))))) : null));
  }

  function admissionStats(a) {
    return h("div", { class: "stats" },
      h("span", {}, "in flight ", h("b", { text: `${fmt.int(a.in_flight)} of ${fmt.int(a.limit)}` })),
      h("span", {}, "queued ", h("b", { text: `${fmt.int(a.queued)} of ${fmt.int(a.max_queued)}` })),
      h("span", {}, "refused (overloaded) ", h("b", { text: fmt.int(a.refused) })),
      h("span", {}, "admitted after a wait ", h("b", { text: fmt.int(a.waited) })),
      a.shed === undefined ? null : h("span", {}, "refused (loop late) ", h("b", { text: fmt.int(a.shed) })),
      a.shed === undefined ? null : h("span", {}, "loop late ", h("b", { text: `${a.loop_late_ms} ms${a.shedding ? ", shedding" : ""}` })));
  }

  function admissionCard(a) {
    return h("section", { class: "card", id: "admission" },
      h("div", { class: "card-head" }, h("h2", { text: "Admission" }), h("span", { class: "sub", text: "this worker, since it started" })),
      admissionStats(a));
  }

  function eventsCell(ch, r) {
    if (!ch.kv_events) return "–";
    const e = r.events;
    if (!e) return PG.pill("neutral", "none");
    const verdict = e.stale ? ["bad", "stale"] : !e.connected ? ["warn", "connecting"] : !e.complete ? ["warn", "incomplete"] : ["ok", "live"];
    const blocks = Object.entries(e.blocks || {}).map(([m, n]) => `${m} ${fmt.int(n)}`).join(" · ") || "no blocks";
    const age = e.seconds_since_last_batch == null ? "no batch yet" : `last batch ${e.seconds_since_last_batch.toFixed(1)} s ago`;
    const trouble = e.error || e.last_problem;
    const times = e.connects === 0 ? "never connected" : e.connects === 1 ? "connected once" : `connected ${fmt.int(e.connects)} times`;
    const publisher = `${e.connected ? "publisher connected" : "no publisher"} since ${fmt.time(e.connection_since)} (${times})`;
    return h("span", { class: "kv-events", dataset: { events: verdict[1], publisher: e.connected ? "connected" : "none" }, title: `${e.endpoint} (${e.mode}); gaps ${e.gaps}, lost ${e.lost_batches}, restarts ${e.restarts}` },
      PG.pill(verdict[0], verdict[1]), " ", h("span", { class: "sub", text: `${publisher}; ${blocks}; ${age}${trouble ? `; ${trouble}` : ""}` }));
  }

  function channelCard(ch) {
    const meta = h("div", { class: "channel-meta" },
      h("span", {}, "kind ", h("b", { text: ch.kind })),
      h("span", {}, "routing ", h("b", { text: ch.routing })),
      h("span", {}, "priority ", h("b", { text: String(ch.priority) }), " · weight ", h("b", { text: String(ch.weight) })),
      h("span", {}, "models ", h("b", { text: ch.models.map((m) => (ch.model_map[m] ? `${m} → ${ch.model_map[m]}` : m)).join(", ") || "any" })),
      h("span", {}, "billing header ", h("b", { text: ch.strip_billing_header ? "stripped" : "kept" })),
      h("span", { title: ch.render_order_source }, "template order ", h("b", { text: ch.render_order.replace("_", " ") }), ` (${ch.render_order_source})`),
      h("span", { class: "rendering", title: ch.rendering.source }, "later system messages ", h("b", { text: ch.rendering.system.replace("_", " ") }),
        ch.system_in_place ? " (delivered in place)" : "", " · past reasoning ", h("b", { text: ch.rendering.reasoning.replace(/_/g, " ") })),
      h("span", {}, "health probe ", h("b", { text: ch.health_check_interval ? `every ${ch.health_check_interval} s` : "passive only" })));
    const table = PG.table([
      { label: "replica", cell: (r) => h("span", { class: "mono", text: r.url }) },
      { label: "state", cell: (r) => (r.state ? PG.pill(STATE[r.state][0], STATE[r.state][1]) : PG.pill("neutral", "not configured")) },
      { label: "in flight", num: true, cell: (r) => fmt.int(r.inflight) },
      { label: "KV events", cell: (r) => eventsCell(ch, r) },
      { label: "requests", num: true, cell: (r) => (r.stats ? h("a", { href: PG.link("/requests", { replica: r.url, channel: ch.name }), text: fmt.int(r.stats.requests) }) : "0") },
      { label: "errors", num: true, cell: (r) => (r.stats ? `${fmt.int(r.stats.errors)} (${fmt.pct(r.stats.requests ? r.stats.errors / r.stats.requests : null)})` : "–") },
      { label: "hit rate", num: true, cell: (r) => (r.stats ? PG.rateBar(r.stats.hit_rate) : "–") },
      { label: "TTFT p50 / p90", num: true, cell: (r) => (r.stats && r.stats.ttft ? `${fmt.ms(r.stats.ttft.p50)} / ${fmt.ms(r.stats.ttft.p90)}` : "–") },
      { label: "last request", num: true, cell: (r) => (r.stats ? fmt.time(r.stats.last_seen) : "–") },
    ], ch.replicas, { rowClass: (r) => `replica-${r.state || "unconfigured"}` });
    return h("section", { class: "card channel", dataset: { channel: ch.name } },
      h("div", { class: "card-head" }, h("h2", { text: ch.name }), h("span", { class: "sub", text: `${ch.replicas.length} replica${ch.replicas.length === 1 ? "" : "s"}` })),
      meta, ch.admission ? admissionStats(ch.admission) : null, table, l2Panel(ch.l2));
  }

  async function load() {
    const content = document.getElementById("content");
    let d;
    try { d = await PG.api("upstream"); } catch (e) { PG.showError(e); return; }
    const errors = h("section", { class: "card", id: "errors" },
      h("div", { class: "card-head" }, h("h2", { text: "Errors" }), h("span", { class: "sub", text: "from the store, in the window" })),
      d.errors.length ? PG.table([
        { label: "channel", cell: (e) => e.channel || "–" },
        { label: "replica", cell: (e) => h("span", { class: "mono", text: e.replica || "–" }) },
        { label: "status", num: true, cell: (e) => PG.pill("bad", String(e.status)) },
        { label: "error", cell: (e) => e.error_type || "–" },
        { label: "requests", num: true, cell: (e) => fmt.int(e.requests) },
        { label: "last", num: true, cell: (e) => fmt.time(e.last) },
      ], d.errors) : h("p", { class: "empty", text: "No failed requests in this window." }));
    content.replaceChildren(admissionCard(d.admission), ...d.channels.map(channelCard), errors);
  }

  PG.ready(() => {
    PG.filterBar({ fields: ["channel", "model"], onChange: load });
    load();
  });
})();
