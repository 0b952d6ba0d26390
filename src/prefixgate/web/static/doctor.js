/* Doctor: the diagnosis, findings first, with their evidence and the suggested fix. */
"use strict";

(() => {
  const { h, fmt, finding } = PG;
  async function load(refresh) {
    const content = document.getElementById("content");
    content.replaceChildren(h("p", { class: "loading", text: "Diagnosing…" }));
    let d;
    try { d = await PG.api("doctor", refresh ? { refresh: "1" } : {}); } catch (e) { PG.showError(e); return; }
    const o = d.overall || {};
    const counts = {};
    for (const f of d.findings) counts[f.severity] = (counts[f.severity] || 0) + 1;
    const summary = h("div", { class: "kpis" },
      PG.kpi("Hit rate", fmt.pct(o.hit_rate), `${fmt.num(o.cached_tokens)} of ${fmt.num(o.prompt_tokens)} prompt tokens`, "hero"),
      PG.kpi("Requests", fmt.num(o.requests), `diagnosed ${fmt.time(d.generated_at)} UTC`),
      PG.kpi("Critical", fmt.int(counts.critical || 0), "findings"),
      PG.kpi("Warnings", fmt.int(counts.warning || 0), "findings"));
    const again = h("button", { type: "button", class: "link", text: "Run again", onclick: () => load(true) });
    const notes = d.notes.length ? h("section", { class: "card" }, h("div", { class: "card-head" }, h("h2", { text: "Notes" })),
      h("ul", { class: "notes" }, d.notes.map((n) => h("li", { text: n })))) : null;
    const slices = d.slices.length ? h("section", { class: "card" },
      h("div", { class: "card-head" }, h("h2", { text: "Slices ranked by tokens lost" }), h("span", { class: "sub", text: "each against its best peer on the same upstream" })),
      PG.table([
        { label: "slice", cell: (s) => h("span", { class: "mono", text: s.slice }) },
        { label: "upstream", cell: (s) => s.scope, class: "muted" },
        { label: "requests", num: true, cell: (s) => fmt.int(s.requests) },
        { label: "hit rate", num: true, cell: (s) => PG.rateBar(s.hit_rate) },
        { label: "best peer", cell: (s) => (s.peer ? `${s.peer} (${fmt.pct(s.peer_hit_rate)})` : "–"), class: "muted" },
        { label: "tokens lost", num: true, cell: (s) => fmt.num(s.tokens_lost) },
      ], d.slices.slice(0, 10))) : null;
    content.replaceChildren(summary,
      h("div", { class: "nav-row" }, h("span", { class: "notes", text: `${d.findings.length} finding${d.findings.length === 1 ? "" : "s"} on ${d.store}` }), again),
      ...d.findings.map(finding), ...[slices, notes].filter(Boolean));
  }

  PG.ready(() => {
    PG.filterBar({ fields: [], onChange: () => load(false) });
    load(false);
  });
})();
