/* Request log: the newest requests first, filtered; a row opens the request view. */
"use strict";

(() => {
  const { h, fmt } = PG;

  const COLUMNS = [
    { label: "time (UTC)", cell: (r) => h("span", { title: fmt.time(r.received_at), text: `${fmt.date(r.received_at).slice(5)} ${fmt.clock(r.received_at, true)}` }) },
    { label: "entry", cell: (r) => r.endpoint },
    { label: "client", cell: (r) => r.client || "–" },
    { label: "session", cell: (r) => h("span", { class: "mono", title: r.session_id || "", text: fmt.short(r.session_id, 12) }) },
    { label: "model", cell: (r) => r.requested_model || "–" },
    { label: "channel", cell: (r) => r.channel || "–" },
    { label: "status", cell: (r) => PG.pill(r.status >= 200 && r.status < 300 ? "ok" : "bad", String(r.status)) },
    { label: "prompt", num: true, cell: (r) => fmt.int(r.prompt_tokens) },
    { label: "cached", num: true, cell: (r) => fmt.int(r.cached_tokens) },
    { label: "hit", num: true, cell: (r) => PG.rateBar(r.hit_rate) },
    { label: "TTFT", num: true, cell: (r) => fmt.ms(r.ttft_ms) },
    { label: "latency", num: true, cell: (r) => fmt.ms(r.latency_ms) },
  ];

  function open(r, ev) {
    const url = `${PG.BASE}/requests/${encodeURIComponent(r.request_id)}`;
    if (ev.metaKey || ev.ctrlKey) window.open(url, "_blank"); else location.href = url;
  }

  async function load() {
    const content = document.getElementById("content");
    let page;
    try { page = await PG.api("requests", { limit: 100 }); } catch (e) { PG.showError(e); return; }
    if (!page.rows.length) {
      content.replaceChildren(h("section", { class: "card" }, h("p", { class: "empty", text: "No requests match these filters." })));
      return;
    }
    const wrap = h("div", { id: "log" });
    const more = h("div", { class: "more" });
    const card = h("section", { class: "card" },
      h("div", { class: "card-head" }, h("h2", { text: "Requests" }), h("span", { class: "sub", text: "newest first · click a row for its segments" })),
      wrap, more);
    content.replaceChildren(card);
    let rows = page.rows;
    const render = (next) => {
      wrap.replaceChildren(PG.table(COLUMNS, rows, { onRow: open, class: "log" }));
      more.replaceChildren(next ? h("button", {
        type: "button", text: "Load more",
        onclick: async () => {
          const p = await PG.api("requests", { limit: 100, before: next });
          rows = rows.concat(p.rows);
          render(p.next);
        },
      }) : h("span", { class: "notes", text: `${fmt.int(rows.length)} request${rows.length === 1 ? "" : "s"}` }));
    };
    render(page.next);
  }

  PG.ready(() => {
    PG.filterBar({ fields: ["endpoint", "key", "client", "channel", "model", "session"], onChange: load });
    load();
  });
})();
