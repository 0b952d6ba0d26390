/* Usage and cost: requests, tokens, hit rate, cost, what the cache saved and what misses
   with a known cause lost, by key, owner, model, client, channel or day. */
"use strict";

(() => {
  const { h, fmt } = PG;
  const GROUPS = [["key", "Key"], ["owner", "Owner"], ["model", "Model"], ["client", "Client"], ["channel", "Channel"], ["day", "Day"]];

  function money(x, cur) {
    if (x === null || x === undefined) return "–";
    const digits = Math.abs(x) >= 100 ? 2 : 4;
    return `${x.toFixed(digits)}${cur ? " " + cur : ""}`;
  }

  async function load() {
    const content = document.getElementById("content");
    const by = PG.params().get("by") || "key";
    let d;
    try { d = await PG.api("usage", { by }); } catch (e) { PG.showError(e); return; }
    const cur = d.currency;
    const t = d.total;
    const kpis = h("div", { class: "kpis" },
      PG.kpi("Requests", fmt.int(t.requests), `${fmt.int(t.errors)} failed`),
      PG.kpi("Input tokens", fmt.num(t.input_tokens), `${fmt.pct(t.hit_rate)} cached`),
      PG.kpi("Cost", money(t.cost, cur), t.unpriced ? `${fmt.int(t.unpriced)} requests without a price` : "the records' own"),
      PG.kpi("Saved by the cache", t.cost === null ? "–" : money(t.saved, cur), "cached input against fresh"),
      PG.kpi("Lost to misses", d.causes_known ? money(t.lost, cur) : "–", d.causes_known ? "with a known cause" : "no cause in the store"));
    const split = PG.segmented("by", GROUPS, by, (v) => { PG.setParams({ by: v === "key" ? null : v }); load(); });
    const rows = [...d.rows, t];
    const table = PG.table([
      { label: GROUPS.find((g) => g[0] === by)[1].toLowerCase(), cell: (r) => (r === t ? h("b", { text: "total" }) : r.group) },
      { label: "requests", num: true, cell: (r) => fmt.int(r.requests) },
      { label: "errors", num: true, cell: (r) => fmt.int(r.errors) },
      { label: "fresh", num: true, cell: (r) => fmt.num(r.fresh_tokens) },
      { label: "cached", num: true, cell: (r) => fmt.num(r.cached_tokens) },
      { label: "written", num: true, cell: (r) => fmt.num(r.cache_write_tokens) },
      { label: "output", num: true, cell: (r) => fmt.num(r.output_tokens) },
      { label: "hit rate", num: true, cell: (r) => PG.rateBar(r.hit_rate) },
      { label: "cost", num: true, cell: (r) => money(r.cost, "") },
      { label: "saved", num: true, cell: (r) => (r.cost === null ? "–" : money(r.saved, "")) },
      { label: "lost", num: true, cell: (r) => money(r.lost, "") },
    ], rows, { class: "usage", rowClass: (r) => (r === t ? "total" : "") });
    const usage = h("section", { class: "card", id: "usage" },
      h("div", { class: "card-head" }, h("h2", { text: `By ${by}` }),
        h("span", { class: "sub", text: cur ? `money in ${cur}` : "no price table" }), h("span", { class: "right" }, split)),
      d.rows.length ? table : h("p", { class: "empty", text: "No requests in this window." }));
    content.replaceChildren(kpis, usage);
  }

  PG.ready(() => {
    PG.filterBar({ fields: ["key", "client", "model", "channel"], onChange: load });
    load();
  });
})();
