/* Overview: the token-weighted hit rate over time, by slice; requests, tokens, TTFT. */
"use strict";

(() => {
  const { h, card, fmt } = PG;
  const SPLITS = [["endpoint", "Entry"], ["client", "Client"], ["channel", "Channel"], ["model", "Model"]];
  const DIM_TITLES = { endpoint: "Entry endpoint", client: "Client", kind: "Session kind", channel: "Channel", model: "Model", key: "API key" };

  function kpis(t) {
    const ttft = t.ttft || {};
    return h("div", { class: "kpis", id: "kpis" },
      PG.kpi("Hit rate", fmt.pct(t.hit_rate), "token-weighted, cached ÷ prompt", "hero"),
      PG.kpi("Requests", fmt.num(t.requests), `${fmt.int(t.sessions)} sessions · ${fmt.int(t.errors)} errors`),
      PG.kpi("Prompt tokens", fmt.num(t.prompt_tokens), `${fmt.num(t.cached_tokens)} served from cache`),
      PG.kpi("Prefill computed", fmt.num(t.prompt_tokens - t.cached_tokens), "prompt tokens not cached"),
      PG.kpi("Output tokens", fmt.num(t.completion_tokens), null),
      PG.kpi("TTFT p50", fmt.ms(ttft.p50), `p90 ${fmt.ms(ttft.p90)} · p99 ${fmt.ms(ttft.p99)}`));
  }

  function sliceTables(slices) {
    const groups = Object.entries(slices).filter(([, rows]) => rows.length).map(([dim, rows]) =>
      h("div", { class: "slice-group" }, h("h3", { text: DIM_TITLES[dim] || dim }),
        PG.table([
          { label: "value", cell: (r) => h("a", { href: PG.link("/requests", { [dim]: r.value }), text: r.value }) },
          { label: "requests", num: true, cell: (r) => fmt.int(r.requests) },
          { label: "prompt", num: true, cell: (r) => fmt.num(r.prompt_tokens) },
          { label: "hit rate", num: true, cell: (r) => PG.rateBar(r.hit_rate) },
        ], rows.slice(0, 8))));
    return card("Hit rate by slice", "every dimension, in the window", h("div", { class: "slice-groups" }, groups));
  }

  async function load() {
    const content = document.getElementById("content");
    const by = PG.params().get("by") || "endpoint";
    let data;
    try { data = await PG.api("overview", { by }); } catch (e) { PG.showError(e); return; }
    const parts = [kpis(data.totals)];
    const split = PG.segmented("split", SPLITS, by, (v) => { PG.setParams({ by: v === "endpoint" ? null : v }); load(); });
    if (!data.series) {
      parts.push(card("No requests in this window", null, h("p", { class: "empty", text: "Nothing recorded between these times. Pick a longer window." })));
      content.replaceChildren(...parts);
      return;
    }
    const S = data.series;
    const groups = S.groups;
    const rateChart = h("div", { id: "chart-hit-rate" });
    const rateCard = h("section", { class: "card" },
      h("div", { class: "card-head" }, h("h2", { text: "Prefix-cache hit rate" }),
        h("span", { class: "sub", text: `token-weighted, per ${span(S.width)}` }), h("span", { class: "right" }, split)),
      rateChart);
    const reqChart = h("div", { id: "chart-requests" });
    const tokChart = h("div", { id: "chart-tokens" });
    const ttftChart = h("div", { id: "chart-ttft" });
    parts.push(rateCard,
      h("div", { class: "grid-2" },
        card("Requests", `per ${span(S.width)}, by ${by}`, reqChart),
        card("Prompt tokens", "served from cache vs computed", tokChart)),
      card("Time to first token", "percentiles of successful requests", ttftChart),
      ledgerCard(data.ledger),
      sliceTables(data.slices));
    content.replaceChildren(...parts);

    PGChart.line(rateChart, {
      t: S.t, step: S.width, yMax: 1, yFormat: (v) => fmt.pct(v, 0),
      tipFormat: (v, ser, i) => {
        const p = ser.points[i];
        return `${fmt.pct(v)} (${fmt.num(p.cached_tokens)} / ${fmt.num(p.prompt_tokens)})`;
      },
      series: groups.map((g) => ({ name: g.name, points: g.points, values: g.points.map((p) => (p && p.prompt_tokens ? p.hit_rate : null)) })),
      height: 260,
    });
    PGChart.bars(reqChart, {
      t: S.t, step: S.width, yFormat: (v) => fmt.num(v),
      series: groups.map((g) => ({ name: g.name, values: g.points.map((p) => (p ? p.requests : 0)) })),
    });
    const sum = (key) => S.t.map((_, i) => groups.reduce((a, g) => a + (g.points[i] ? g.points[i][key] : 0), 0));
    const prompt = sum("prompt_tokens"), cached = sum("cached_tokens");
    PGChart.bars(tokChart, {
      t: S.t, step: S.width, yFormat: (v) => fmt.num(v),
      series: [
        { name: "cached", color: "#0f766e", values: cached },
        { name: "computed (prefill)", color: "#cbd5e1", values: prompt.map((p, i) => p - cached[i]) },
      ],
    });
    if (data.ledger) {
      PGChart.bars(document.getElementById("chart-ledger"), {
        t: S.t, step: S.width, yFormat: (v) => fmt.num(v), height: 240,
        series: PG.CAUSES.filter(([c]) => data.ledger.totals[c] > 0).map(([c, label, color]) => ({ name: label, color, values: data.ledger.causes[c] })),
      });
    }
    PGChart.line(ttftChart, {
      t: S.t, step: S.width, yFormat: (v) => fmt.ms(v), height: 220,
      series: [["p50", "#0f766e"], ["p90", "#d97706"], ["p99", "#b91c1c"]].map(([p, c]) => ({
        name: p, color: c, values: S.ttft.map((x) => (x ? x[p] : null)),
      })),
    });
  }

  // Prompt tokens by where they went (the miss ledger), over time.
  function ledgerCard(ledger) {
    if (!ledger) {
      return card("Where the prompt tokens went", "the miss ledger", h("p", { class: "empty", text: "No ledgers in this window." }));
    }
    const total = Object.values(ledger.totals).reduce((a, b) => a + b, 0) || 1;
    const sources = Object.entries(ledger.sources).map(([k, v]) => `${fmt.int(v)} from ${k}`).join(" · ");
    const legend = h("div", { class: "strip-legend", id: "ledger-totals" }, PG.CAUSES.filter(([c]) => ledger.totals[c] > 0).map(([c, label, color]) =>
      h("span", { "data-cause": c }, PG.swatch(color), `${label} ${fmt.num(ledger.totals[c])} (${fmt.pct(ledger.totals[c] / total)})`)));
    return card("Where the prompt tokens went", `by cause, the miss ledger (${sources})`, h("div", { id: "chart-ledger" }), legend);
  }

  function span(w) {
    if (w < 1) return `${Math.round(w * 1000)} ms`;
    if (w < 60) return `${w} s`;
    if (w < 3600) return `${w / 60} min`;
    if (w < 86400) return `${w / 3600} h`;
    return `${w / 86400} d`;
  }

  PG.ready(() => {
    PG.filterBar({ fields: ["endpoint", "client", "channel", "model", "key"], onChange: load });
    load();
  });
})();
