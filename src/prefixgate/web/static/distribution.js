/* Distribution: cached-length histograms per slice, pinned constants marked. */
"use strict";

(() => {
  const { h, fmt } = PG;
  const SPLITS = [["endpoint", "Entry"], ["client", "Client"], ["kind", "Session kind"], ["channel", "Channel"], ["model", "Model"], ["key", "Key"]];

  function sliceCard(sl, data, by) {
    const p = sl.pinned;
    const chart = h("div", { class: "hist", dataset: { slice: sl.value } });
    const markers = p ? [{ value: p.value, label: `pinned ${fmt.int(p.value)}${p.block > 1 ? ` = ${p.k} × ${p.block}` : ""} · ${fmt.pct(p.share)} of requests` }] : [];
    const callout = p
      ? h("div", { class: "callout bad" },
        h("b", { text: `cached_tokens is pinned at ${fmt.int(p.value)}` }),
        ` in ${fmt.int(p.requests)} of ${fmt.int(sl.requests)} requests (${fmt.pct(p.share)}) while their prompts range ${fmt.num(p.prompt_min)}–${fmt.num(p.prompt_max)} tokens. `,
        "A cache that breaks at a fixed point of the prompt — not eviction. ",
        h("a", { href: PG.link("/doctor"), text: "See the doctor's diagnosis →" }))
      : h("div", { class: "callout good" }, "No pinned constant: cached lengths follow the prompts, as a healthy prefix cache does.");
    const modes = sl.modes.length ? PG.table([
      { label: "exact cached value", num: true, cell: (m) => fmt.int(m.cached) },
      { label: "requests", num: true, cell: (m) => fmt.int(m.requests) },
      { label: "share", num: true, cell: (m) => fmt.pct(m.share) },
      { label: "their prompts", num: true, cell: (m) => `${fmt.num(m.prompt_min)} – ${fmt.num(m.prompt_max)}` },
    ], sl.modes.slice(0, 3)) : null;
    const node = h("section", { class: "card slice-card", dataset: { slice: sl.value, pinned: p ? String(p.value) : "" } },
      h("div", { class: "card-head" },
        h("h2", {}, `${by} = `, h("span", { class: "mono", text: sl.value })),
        h("span", { class: "right" }, PG.rateBar(sl.hit_rate))),
      h("div", { class: "stats" },
        h("span", {}, h("b", { text: fmt.int(sl.requests) }), " requests"),
        h("span", {}, h("b", { text: fmt.num(sl.prompt_tokens) }), " prompt tokens"),
        h("span", {}, h("b", { text: fmt.num(sl.cached_tokens) }), " cached"),
        h("span", {}, h("b", { text: fmt.int(sl.zero) }), " with no hit"),
        h("span", {}, "bins of ", h("b", { text: fmt.int(data.width) }), " tokens")),
      callout, chart, modes);
    const nBins = Math.max(...data.slices.map((x) => x.cached_bins.length));
    return { node, draw: () => PGChart.histogram(chart, { width: data.width, nBins, bins: sl.cached_bins, ghost: sl.prompt_bins, markers }) };
  }

  async function load() {
    const content = document.getElementById("content");
    const by = PG.params().get("by") || "endpoint";
    let data;
    try { data = await PG.api("distribution", { by }); } catch (e) { PG.showError(e); return; }
    const split = PG.segmented("split", SPLITS, by, (v) => { PG.setParams({ by: v === "endpoint" ? null : v }); load(); });
    const b = data.block;
    const head = h("section", { class: "card" },
      h("div", { class: "card-head" }, h("h2", { text: "Cached length per request" }),
        h("span", { class: "sub", text: "one histogram per slice; outlines show the prompt lengths" }),
        h("span", { class: "right" }, split)),
      h("p", { class: "notes" },
        "A healthy slice's cached lengths follow its prompts. A spike at one exact value while prompts vary is a ",
        h("b", { text: "pinned constant" }),
        ": the prompt changes at the same place every time (a volatile header after the tool definitions, say).",
        b ? ` Cache block size inferred from ${fmt.int(b.distinct_values)} distinct hit lengths: ${b.block} tokens.` : ""));
    if (!data.slices.length) {
      content.replaceChildren(head, h("section", { class: "card" }, h("p", { class: "empty", text: "No successful requests in this window." })));
      return;
    }
    const cards = data.slices.map((sl) => sliceCard(sl, data, by));
    content.replaceChildren(head, h("div", { class: "grid-2" }, cards.map((c) => c.node)));
    cards.forEach((c) => c.draw());
  }

  PG.ready(() => {
    PG.filterBar({ fields: ["endpoint", "client", "channel", "model", "key"], onChange: load });
    load();
  });
})();
