/* prefixgate dashboard: shared helpers (DOM, number formats, API, filter bar). */
"use strict";

const PG = (() => {
  const body = document.body;
  const BASE = body.dataset.base || "/dashboard";

  // -- DOM ------------------------------------------------------------------------------
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "dataset") Object.assign(el.dataset, v);
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }

  function card(title, sub, ...kids) {
    return h("section", { class: "card" },
      h("div", { class: "card-head" }, h("h2", { text: title }), sub ? h("span", { class: "sub", text: sub }) : null),
      ...kids);
  }

  // -- formats --------------------------------------------------------------------------
  const DASH = "–";
  const fmt = {
    pct(x, digits = 1) {
      if (x === null || x === undefined || Number.isNaN(x)) return DASH;
      return (x * 100).toFixed(digits) + "%";
    },
    num(n) {
      if (n === null || n === undefined) return DASH;
      const a = Math.abs(n);
      if (a >= 1e9) return (n / 1e9).toFixed(a >= 1e10 ? 1 : 2) + "B";
      if (a >= 1e6) return (n / 1e6).toFixed(a >= 1e7 ? 1 : 2) + "M";
      if (a >= 1e4) return (n / 1e3).toFixed(1) + "k";
      return Math.round(n).toLocaleString("en-US");
    },
    tok(n) { // axis labels: 0, 512, 2k, 17.5k, 1.2M
      if (n >= 1e6) return +(n / 1e6).toFixed(1) + "M";
      if (n >= 1000) return +(n / 1000).toFixed(1) + "k";
      return String(Math.round(n));
    },
    int(n) {
      return n === null || n === undefined ? DASH : Math.round(n).toLocaleString("en-US");
    },
    ms(x) {
      if (x === null || x === undefined) return DASH;
      if (x >= 10000) return (x / 1000).toFixed(1) + " s";
      if (x >= 1000) return (x / 1000).toFixed(2) + " s";
      return (x >= 100 ? Math.round(x) : x.toFixed(1)) + " ms";
    },
    bytes(n) {
      if (n === null || n === undefined) return DASH;
      const u = ["B", "KB", "MB", "GB", "TB"];
      let i = 0;
      while (Math.abs(n) >= 1000 && i < u.length - 1) { n /= 1000; i++; }
      return (i ? n.toFixed(1) : n) + " " + u[i];
    },
    pad(n) { return String(n).padStart(2, "0"); },
    date(t) {
      if (t === null || t === undefined) return DASH;
      const d = new Date(t * 1000);
      return `${d.getUTCFullYear()}-${fmt.pad(d.getUTCMonth() + 1)}-${fmt.pad(d.getUTCDate())}`;
    },
    clock(t, withMs) {
      const d = new Date(t * 1000);
      let s = `${fmt.pad(d.getUTCHours())}:${fmt.pad(d.getUTCMinutes())}:${fmt.pad(d.getUTCSeconds())}`;
      if (withMs) s += "." + String(d.getUTCMilliseconds()).padStart(3, "0");
      return s;
    },
    time(t) {
      if (t === null || t === undefined) return DASH;
      return `${fmt.date(t)} ${fmt.clock(t)}`;
    },
    short(s, n = 10) {
      if (!s) return DASH;
      return s.length > n ? s.slice(0, n) + "…" : s;
    },
  };

  // -- state in the URL -----------------------------------------------------------------
  const FILTER_NAMES = ["endpoint", "key", "client", "channel", "model", "kind", "session", "replica"];
  const WINDOWS = [["1h", "1 h"], ["6h", "6 h"], ["24h", "24 h"], ["7d", "7 d"], ["30d", "30 d"], ["all", "All"]];

  function params() { return new URLSearchParams(location.search); }
  function setParams(changes) {
    const p = params();
    for (const [k, v] of Object.entries(changes)) {
      if (v === null || v === undefined || v === "") p.delete(k); else p.set(k, v);
    }
    const q = p.toString();
    history.replaceState(null, "", location.pathname + (q ? "?" + q : ""));
  }
  function scopeQuery(extra) {
    const p = params();
    const out = new URLSearchParams();
    out.set("since", p.get("since") || "24h");
    if (p.get("until")) out.set("until", p.get("until"));
    for (const n of FILTER_NAMES) if (p.get(n)) out.set(n, p.get(n));
    for (const [k, v] of Object.entries(extra || {})) if (v !== null && v !== undefined) out.set(k, v);
    return out;
  }
  function link(path, changes) {
    const q = scopeQuery();
    for (const [k, v] of Object.entries(changes || {})) {
      if (v === null) q.delete(k); else q.set(k, v);
    }
    return `${BASE}${path}?${q}`;
  }

  // -- API ------------------------------------------------------------------------------
  async function api(path, extra) {
    const q = extra instanceof URLSearchParams ? extra : scopeQuery(extra);
    const r = await fetch(`${BASE}/api/${path}?${q}`, { credentials: "same-origin" });
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (!r.ok) {
      const err = new Error((data && data.error) || `HTTP ${r.status}`);
      err.status = r.status;
      throw err;
    }
    return data;
  }

  function showError(err) {
    const content = document.getElementById("content");
    // A session that ended while the page was open: back to the login form, then here.
    const login = err.status === 401
      ? [" ", h("a", { href: `${BASE}/login?next=${encodeURIComponent(location.pathname + location.search)}` }, "Log in")]
      : [];
    content.replaceChildren(h("div", { class: "error-box", role: "alert" }, String(err.message), login));
  }

  // -- filter bar -----------------------------------------------------------------------
  const LABELS = { endpoint: "Entry", key: "Key", client: "Client", channel: "Channel", model: "Model", kind: "Session kind", session: "Session", replica: "Replica" };

  async function filterBar(opts) {
    const bar = document.getElementById("filters");
    const fields = opts.fields || ["endpoint", "client", "channel", "model", "key"];
    const p = params();
    const since = p.get("since") || "24h";
    const win = h("div", { class: "seg", role: "group", "aria-label": "time window" },
      WINDOWS.map(([v, label]) => h("button", {
        type: "button", class: since === v ? "on" : "", dataset: { window: v }, text: label,
        onclick: () => { setParams({ since: v === "24h" ? null : v }); opts.onChange(); filterBar(opts); },
      })));
    const items = [h("span", { class: "field" }, "Window"), win];
    let meta = null;
    try { meta = await api("meta"); } catch (e) { meta = null; }
    for (const f of fields) {
      const current = p.get(f) || "";
      if (f === "session") {
        const input = h("input", {
          type: "search", name: f, placeholder: "session id", value: current, class: current ? "set" : "",
          onchange: (ev) => { setParams({ [f]: ev.target.value.trim() }); opts.onChange(); filterBar(opts); },
        });
        items.push(h("label", { class: "field" }, LABELS[f], input));
        continue;
      }
      const values = (meta && meta.values[f]) || [];
      const select = h("select", {
        name: f, class: current ? "set" : "",
        onchange: (ev) => { setParams({ [f]: ev.target.value }); opts.onChange(); filterBar(opts); },
      }, h("option", { value: "", text: "all" }),
        values.map((v) => h("option", { value: v.value, text: `${v.value} (${fmt.int(v.requests)})`, selected: v.value === current })),
        current && !values.some((v) => v.value === current) ? h("option", { value: current, text: current, selected: true }) : null);
      items.push(h("label", { class: "field" }, LABELS[f], select));
    }
    const anySet = FILTER_NAMES.some((n) => p.get(n));
    if (anySet) {
      items.push(h("button", {
        type: "button", class: "clear", text: "Clear filters",
        onclick: () => { const c = {}; FILTER_NAMES.forEach((n) => { c[n] = null; }); setParams(c); opts.onChange(); filterBar(opts); },
      }));
    }
    items.push(h("span", { class: "spacer" }));
    if (meta) {
      const w = meta.window;
      items.push(h("span", { class: "window-note" },
        w.requests ? `${fmt.int(w.requests)} requests · ${fmt.time(w.first)} → ${fmt.clock(w.last)} UTC` : "no requests in this window"));
      const note = document.getElementById("store-note");
      if (note) note.textContent = `${fmt.int(meta.store.requests)} requests recorded`;
      if (!w.requests && meta.store.requests && since !== "all") {
        items.push(h("button", {
          type: "button", class: "clear", text: "Show all time",
          onclick: () => { setParams({ since: "all" }); opts.onChange(); filterBar(opts); },
        }));
      }
    }
    bar.replaceChildren(...items);
  }

  // A segmented control ("split by").
  function segmented(name, options, current, onPick) {
    return h("div", { class: "seg", role: "group", "aria-label": name },
      options.map(([v, label]) => h("button", {
        type: "button", class: v === current ? "on" : "", dataset: { [name]: v }, text: label,
        onclick: () => onPick(v),
      })));
  }

  // -- tables ---------------------------------------------------------------------------
  // columns: [{label, num, cell(row) -> Node|string, class}]
  function table(columns, rows, opts = {}) {
    return h("div", { class: "table-wrap" }, h("table", { class: "data" + (opts.class ? " " + opts.class : "") },
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { class: c.num ? "num" : "", text: c.label })))),
      h("tbody", {}, rows.map((r) => {
        const tr = h("tr", { class: opts.rowClass ? opts.rowClass(r) : "" },
          columns.map((c) => {
            const v = c.cell(r);
            return h("td", { class: (c.num ? "num " : "") + (c.class || "") }, v);
          }));
        if (opts.onRow) {
          tr.classList.add("link");
          tr.addEventListener("click", (ev) => opts.onRow(r, ev));
        }
        return tr;
      }))));
  }

  function rateBar(rate) {
    const cls = rate === null || rate === undefined ? "" : rate < 0.5 ? "low" : rate < 0.8 ? "mid" : "";
    const i = h("i");
    i.style.width = `${Math.max(0, Math.min(1, rate || 0)) * 100}%`;
    return h("span", { class: "bar-cell" }, h("span", { text: fmt.pct(rate) }), h("span", { class: "ratebar " + cls }, i));
  }

  function pill(kind, text) { return h("span", { class: `pill ${kind}`, text: text || kind }); }

  // The miss ledger's causes, in its order, with their colours (request page, overview).
  const CAUSES = [
    ["hit", "hit", "#0f766e"],
    ["prefix_changed", "prefix changed", "#b91c1c"],
    ["evicted", "evicted", "#d97706"],
    ["elsewhere", "elsewhere (routing)", "#7c3aed"],
    ["partial_block", "partial block", "#94a3b8"],
    ["cold", "cold", "#93c5fd"],
    ["unknown", "unknown", "#e5e7eb"],
  ];

  // A colour square (CSSOM, not a style attribute: the pages' CSP has no inline style).
  function swatch(color) {
    const i = h("i", { class: "swatch" });
    i.style.background = color;
    return i;
  }

  function kpi(label, value, note, cls) {
    return h("div", { class: "kpi" + (cls ? " " + cls : "") },
      h("div", { class: "label", text: label }), h("div", { class: "value", text: value }),
      note ? h("div", { class: "note", text: note }) : null);
  }

  // -- the doctor's findings (the doctor's page, a key holder's own view) ------------------
  const NUMERIC = /^[-+]?[\d.,]+\s?[kMB%]?$/; // 402.4k, 67.27%, 18,048
  const SEVERITY = { critical: "Critical", warning: "Warning", info: "Info" };

  function evidenceTable(t) {
    return h("div", { class: "evidence-table" + (t.columns.length > 4 ? " wide" : "") }, h("h4", { text: t.title }),
      table(t.columns.map((c, i) => ({
        label: c,
        num: t.rows.every((r) => r[i] === null || typeof r[i] === "number" || NUMERIC.test(String(r[i]))),
        cell: (r) => (r[i] === null || r[i] === undefined ? "–" : typeof r[i] === "number" ? fmt.int(r[i]) : String(r[i])),
      })), t.rows));
  }

  // Text with `code` spans, as the doctor writes them.
  function rich(text) {
    return text.split("`").map((part, i) => (i % 2 ? h("code", { text: part }) : part));
  }

  function finding(f) {
    return h("section", { class: `card finding ${f.severity}`, dataset: { kind: f.kind, severity: f.severity } },
      h("div", { class: "card-head" }, pill(f.severity, SEVERITY[f.severity] || f.severity), h("span", { class: "sub mono", text: f.kind })),
      h("h2", { text: f.title }),
      f.summary.length ? h("ul", { class: "summary" }, f.summary.map((s) => h("li", {}, rich(s)))) : null,
      f.fix.length ? h("div", { class: "fix" }, h("h3", { text: "Suggested fix" }), h("ul", {}, f.fix.map((s) => h("li", {}, rich(s))))) : null,
      f.evidence.length ? h("div", { class: "evidence" }, f.evidence.map(evidenceTable)) : null);
  }

  function ready(fn) {
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", fn); else fn();
  }

  return { BASE, h, card, fmt, params, setParams, scopeQuery, link, api, showError, filterBar, segmented, table, rateBar, pill, kpi, ready, CAUSES, swatch, finding };
})();
