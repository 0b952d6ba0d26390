/* Request view: one request, its prompt segments, and where it first differs from the
   previous request of its session (where the upstream's prefix cache stopped hitting). */
"use strict";

(() => {
  const { h, fmt } = PG;
  const CONTEXT = 160; // characters shown around a difference

  function statuses(segs, change) {
    return segs.map((_, i) => {
      if (!change) return "new";
      if (change.index === null) return i < change.prev_len ? "same" : "new";
      return i < change.index ? "same" : i === change.index ? "changed" : "after";
    });
  }

  function field(k, v) { return h("div", { class: "f" }, h("div", { class: "k", text: k }), h("div", { class: "v" }, v)); }

  function strip(segs, st, r) {
    const shown = segs.map((s, i) => [s, st[i]]).filter(([s]) => s.kind !== "tool");
    const bar = h("div", { class: "strip", id: "strip" }, shown.map(([s, status]) => {
      const span = h("span", { class: status, title: `${s.name} · ≈${fmt.int(s.tokens)} tokens · ${status}` });
      span.style.flex = `${Math.max(s.tokens, 1)} 0 0`;
      return span;
    }));
    const wrap = h("div", { class: "strip-wrap" }, bar);
    if (r.prompt_tokens && r.cached_tokens !== null) {
      const frac = Math.min(1, r.cached_tokens / r.prompt_tokens);
      const mark = h("div", { class: "strip-cache" }, h("span", { text: `cache hit ends · ${fmt.int(r.cached_tokens)} tokens` }));
      mark.style.left = `${frac * 100}%`;
      if (frac > 0.7) { mark.firstChild.style.left = "auto"; mark.firstChild.style.right = "4px"; }
      wrap.appendChild(mark);
    }
    return h("div", {}, wrap, h("div", { class: "strip-legend" },
      h("span", {}, h("i", { class: "same" }), "same as the previous request"),
      h("span", {}, h("i", { class: "changed" }), "first changed segment"),
      h("span", {}, h("i", { class: "after" }), "after the change (cannot hit)"),
      h("span", {}, h("i", { class: "new" }), "new (appended)")));
  }

  async function texts(hashes) {
    const q = new URLSearchParams();
    hashes.filter(Boolean).forEach((x) => q.append("h", x));
    return (await PG.api("texts", q)).texts;
  }

  function diffNodes(a, b) {
    let p = 0;
    while (p < a.length && p < b.length && a[p] === b[p]) p++;
    let sfx = 0;
    while (sfx < a.length - p && sfx < b.length - p && a[a.length - 1 - sfx] === b[b.length - 1 - sfx]) sfx++;
    const side = (text, tag) => {
      const start = Math.max(0, p - CONTEXT);
      const mid = text.slice(p, text.length - sfx);
      const endCtx = text.slice(text.length - sfx, text.length - sfx + CONTEXT);
      return h("pre", { class: "text" }, start > 0 ? "…" : "", text.slice(start, p),
        h(tag, { text: mid.length > 2000 ? mid.slice(0, 2000) + " …" : mid }), endCtx, text.length - sfx + CONTEXT < text.length ? "…" : "");
    };
    return [side(a, "del"), side(b, "ins")];
  }

  function segTable(segs, st, r, prevHash, changeIndex) {
    const cols = [
      { label: "#", num: true, cell: (x) => String(x.i) },
      { label: "kind", cell: (x) => x.s.kind, class: "muted" },
      { label: "segment", cell: (x) => h("span", { class: "mono", text: x.s.name }) },
      { label: "≈tokens", num: true, cell: (x) => fmt.int(x.s.tokens) },
      { label: "chars", num: true, cell: (x) => fmt.int(x.s.chars) },
      { label: "hash", cell: (x) => h("span", { class: "mono muted", text: x.s.hash.slice(0, 12) }) },
      { label: "vs previous", cell: (x) => h("span", { class: `seg-status ${x.st}`, text: x.st }) },
      {
        label: "text", cell: (x) => {
          if (!r.captured) return "–";
          const holder = h("div");
          const btn = h("button", {
            type: "button", class: "link", text: x.i === changeIndex && prevHash ? "show diff" : "show",
            onclick: async () => {
              if (holder.childNodes.length) { holder.replaceChildren(); return; }
              const got = await texts([x.s.hash, x.i === changeIndex ? prevHash : null]);
              const cur = got[x.s.hash];
              if (cur === undefined) { holder.replaceChildren(h("span", { class: "notes", text: "not stored" })); return; }
              if (x.i === changeIndex && prevHash && got[prevHash] !== undefined) {
                const [a, b] = diffNodes(got[prevHash], cur);
                holder.replaceChildren(h("div", { class: "diff" }, h("h4", { text: "previous request" }), a, h("h4", { text: "this request" }), b));
              } else {
                holder.replaceChildren(h("pre", { class: "text", text: cur.length > 20000 ? cur.slice(0, 20000) + " …" : cur }));
              }
            },
          });
          return h("div", {}, btn, holder);
        },
      },
    ];
    const rows = segs.map((s, i) => ({ s, i, st: st[i] }));
    return PG.table(cols, rows, { rowClass: (x) => `seg-${x.st}`, class: "segments" });
  }

  // The change found at capture time: what kind of value, where, its character skeleton.
  function changeText(c) {
    const sh = c.shape || {};
    const against = c.scope === "sessions" ? "the previous session's first request" : "the previous request";
    const where = sh.paragraph ? `, paragraph ${sh.paragraph} line ${sh.line} (char ${fmt.int(sh.char_offset || 0)})` : "";
    const skel = sh.new_skeleton ? ` ${sh.old_skeleton} → ${sh.new_skeleton}` : "";
    const detail = sh.detail ? ` (${sh.detail})` : "";
    return `${c.cls.replace(/_/g, " ")}${skel}${detail} in ${c.segment}${where} vs ${against}; ≈${fmt.int(c.at_tokens)} tokens in, ≈${fmt.int(c.lost_tokens)} re-sent after it`;
  }

  function explain(r, change, side) {
    if (!r.previous) return "The first request of its session: nothing earlier to compare with.";
    if (!change) return "No segments recorded.";
    if (change.index === null) {
      return `Every segment of the previous request comes back unchanged, in order (${fmt.int(change.prev_len)} segments), and new ones are appended: the whole previous prompt can be served from cache.`;
    }
    const segs = side === "out" ? r.segments_out : r.segments_in;
    const s = segs[change.index];
    return `The prompt first differs at segment #${change.index} ${s ? s.name : ""}, after ≈${fmt.int(change.offset)} tokens: everything from there on must be computed again.`;
  }

  // The miss ledger: where each prompt token went, and the hit as each predictor saw it.
  function ledgerCard(r) {
    const L = r.ledger;
    if (!L) {
      return h("section", { class: "card", id: "ledger" }, h("div", { class: "card-head" }, h("h2", { text: "Where the prompt tokens went" })),
        h("p", { class: "empty", text: "No ledger for this request (not computed yet, or the request had no prompt tokens)." }));
    }
    const total = L.prompt_tokens || 1;
    const parts = PG.CAUSES.filter(([c]) => L.parts[c] > 0);
    const bar = h("div", { class: "strip ledger-bar", id: "ledger-bar" }, parts.map(([c, label, color]) => {
      const span = h("span", { "data-cause": c, title: `${label} · ${fmt.int(L.parts[c])} tokens` });
      span.style.flex = `${L.parts[c]} 0 0`;
      span.style.background = color;
      return span;
    }));
    const rows = parts.map(([c, label, color]) => ({ c, label, color, n: L.parts[c] }));
    const tbl = PG.table([
      { label: "cause", cell: (x) => h("span", {}, PG.swatch(x.color), x.label) },
      { label: "tokens", num: true, cell: (x) => fmt.int(x.n) },
      { label: "share", num: true, cell: (x) => fmt.pct(x.n / total) },
    ], rows, { class: "ledger" });
    const mark = (ok) => (ok === null ? "" : ok ? " ✓" : " ✗");
    const notes = [
      `From ${L.source === "events" ? "the engine's KV events (the index as of the request's time)" : "the cache model replayed on the recorded segments (no engine events)"}, block ${L.block_size}.`,
      L.changed_segment ? `The prompt first changed at segment #${L.changed_index} ${L.changed_segment}.` : null,
      L.elsewhere_replica ? `Tokens lost to routing were cached on ${L.elsewhere_replica}.` : null,
      L.host_missed ? `${fmt.int(L.host_missed)} tokens were in the replica's host tier and were not loaded back.` : null,
      L.cleared ? `${fmt.int(L.cleared)} of the evicted tokens were lost when the engine cleared its whole cache (a flush, a reset, a restart), not evicted for room.` : null,
    ].filter(Boolean);
    return h("section", { class: "card", id: "ledger" },
      h("div", { class: "card-head" }, h("h2", { text: "Where the prompt tokens went" }), h("span", { class: "sub", text: `source: ${L.source}` })),
      bar, tbl,
      h("div", { class: "fields" },
        field("engine's cached tokens", fmt.int(L.engine_cached)),
        field("index predicted", fmt.int(L.index_predicted) + mark(L.agree.index)),
        field("cache model predicted", fmt.int(L.model_predicted) + mark(L.agree.model))),
      ...notes.map((t) => h("p", { class: "explain", text: t })));
  }

  async function load() {
    const content = document.getElementById("content");
    const id = document.body.dataset.requestId;
    let r;
    try { r = await PG.api(`requests/${encodeURIComponent(id)}`, new URLSearchParams()); } catch (e) { PG.showError(e); return; }
    document.querySelector(".page-title").textContent = `Request ${r.request_id}`;
    const ok = r.status >= 200 && r.status < 300;
    const sessionLink = r.session_id ? h("a", { href: `${PG.BASE}/requests?since=all&session=${encodeURIComponent(r.session_id)}`, class: "mono", text: r.session_id }) : "–";
    const facts = h("section", { class: "card" },
      h("div", { class: "card-head" }, PG.pill(ok ? "ok" : "bad", String(r.status)), h("h2", { text: `${r.endpoint} · ${r.requested_model || "–"}` }),
        h("span", { class: "sub", text: `${fmt.time(r.received_at)} UTC` })),
      h("div", { class: "fields" },
        field("client", `${r.client || "–"} ${r.client_version || ""}`),
        field("key", r.key_name || "–"),
        field("session", sessionLink),
        field("position in session", r.session_position ? `#${r.session_position}` : "–"),
        field("upstream model", r.upstream_model || "–"),
        field("channel / replica", h("span", {}, r.channel || "–", h("br"), h("span", { class: "mono", text: r.replica || "" }))),
        field("prompt tokens", fmt.int(r.prompt_tokens)),
        field("cached tokens", `${fmt.int(r.cached_tokens)} (${fmt.pct(r.hit_rate)})`),
        field("output tokens", fmt.int(r.completion_tokens)),
        field("shown to client", r.reported_input_tokens === null ? "–" : `in ${fmt.int(r.reported_input_tokens)} · cache read ${fmt.int(r.reported_cache_read_tokens)} · out ${fmt.int(r.reported_output_tokens)}`),
        field("TTFT / latency", `${fmt.ms(r.ttft_ms)} / ${fmt.ms(r.latency_ms)}`),
        field("stream · retries", `${r.stream ? "yes" : "no"} · ${r.retries}`),
        r.error_type ? field("error", r.error_message ? `${r.error_type}: ${r.error_message}` : r.error_type) : null,
        r.change ? field("prefix broke", changeText(r.change)) : null));
    const nav = h("div", { class: "nav-row" },
      r.previous ? h("a", { href: `${PG.BASE}/requests/${r.previous.request_id}`, id: "prev-link", text: "← previous in session" }) : null,
      r.next ? h("a", { href: `${PG.BASE}/requests/${r.next}`, id: "next-link", text: "next in session →" }) : null);
    const parts = [facts, ledgerCard(r)];
    if (!r.segments_out.length && !r.segments_in.length) {
      parts.push(h("section", { class: "card" }, h("p", { class: "empty", text: "No segments were recorded for this request (capture off)." })));
      content.replaceChildren(...parts);
      return;
    }
    let side = "out";
    const body = h("div");
    const render = () => {
      const segs = side === "out" ? r.segments_out : r.segments_in;
      const change = side === "out" ? r.changed_out : r.changed_in;
      const st = statuses(segs, r.previous ? change : null);
      const prevHash = change ? change.prev_hash : null;
      body.replaceChildren(
        h("p", { class: "explain", id: "explain", text: explain(r, change, side) }),
        strip(segs, st, r),
        h("div", { class: "card-head" }),
        segTable(segs, st, r, prevHash, change ? change.index : null));
    };
    const toggle = r.segments_same ? h("span", { class: "sub", text: "sent upstream as received" })
      : PG.segmented("side", [["out", "As sent upstream"], ["in", "As received"]], side, (v) => {
        side = v;
        toggle.querySelectorAll("button").forEach((b) => b.classList.toggle("on", b.dataset.side === v));
        render();
      });
    parts.push(h("section", { class: "card", id: "segments" },
      h("div", { class: "card-head" }, h("h2", { text: "Prompt segments against the previous request" }), h("span", { class: "right" }, toggle)),
      nav, body));
    content.replaceChildren(...parts);
    render();
  }

  PG.ready(load);
})();
