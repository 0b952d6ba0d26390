/* A key holder's own view: their usage, what is left of their budgets, their hit rate,
   their sessions, the prefix breaks found in them and the doctor's findings about their
   requests. Only their own key's records: the
   API answers for the key the session was opened with. */
"use strict";

(() => {
  const { h, fmt } = PG;

  function budgets(list) {
    if (!list.length) return h("p", { class: "muted", text: "No budget." });
    return PG.table([
      { label: "budget", cell: (b) => h("b", { text: b.budget }) },
      { label: "used", num: true, cell: (b) => String(b.used) },
      { label: "left", num: true, cell: (b) => h("span", { class: "left", text: String(b.left) }) },
    ], list, { class: "my-budgets" });
  }

  async function load() {
    const content = document.getElementById("content");
    let d;
    try { d = await PG.api("me", new URLSearchParams(PG.params())); } catch (e) { PG.showError(e); return; }
    const kpis = h("div", { class: "kpis" },
      PG.kpi("Key", d.key, d.owner ? `owner ${d.owner}` : "no owner"),
      PG.kpi("Requests", fmt.int(d.requests), `${fmt.int(d.failed)} failed · last ${Math.round((Date.now() / 1000 - d.since) / 86400)} days`),
      PG.kpi("Hit rate", fmt.pct(d.hit_rate), `${fmt.num(d.cached_tokens)} of ${fmt.num(d.prompt_tokens)} prompt tokens cached`),
      PG.kpi("Output tokens", fmt.num(d.completion_tokens), d.cost === null ? "no price" : `cost ${d.cost} ${d.currency}`));
    const sessions = PG.table([
      { label: "session", cell: (s) => h("code", { text: s.session }) },
      { label: "requests", num: true, cell: (s) => fmt.int(s.requests) },
      { label: "hit rate", num: true, cell: (s) => PG.rateBar(s.hit_rate) },
      { label: "prefix breaks", num: true, cell: (s) => fmt.int(s.prefix_breaks) },
      { label: "last", cell: (s) => new Date(s.last_at * 1000).toISOString().replace("T", " ").slice(0, 19) },
    ], d.sessions, { class: "my-sessions" });
    const breaks = d.prefix_breaks.length ? PG.table([
      { label: "session", cell: (b) => h("code", { text: b.session }) },
      { label: "what changed", cell: (b) => h("b", { text: b.change }) },
      { label: "where", cell: (b) => b.segment || "–" },
      { label: "requests", num: true, cell: (b) => fmt.int(b.requests) },
      { label: "tokens prefilled again", num: true, cell: (b) => fmt.num(b.tokens_lost) },
    ], d.prefix_breaks, { class: "my-breaks" }) : h("p", { class: "muted", text: "No prefix break found in your sessions." });
    const cards = [
      h("div", { id: "me", dataset: { key: d.key } }, kpis),
      PG.card("Your budgets", "this window", budgets(d.budgets)),
      d.owner ? PG.card(`Budgets of ${d.owner}`, "shared with the owner's other keys", budgets(d.owner_budgets)) : null,
      PG.card("Your sessions", "most recent first", sessions),
      PG.card("What broke your prefix", "the doctor's view of your sessions: what changed between requests while later content was sent again", breaks),
      PG.card("The doctor's findings about your requests", "from your own records only",
        h("div", { id: "my-findings" }, d.findings.length ? d.findings.map(PG.finding) : h("p", { class: "muted", text: "Nothing found in your requests." }))),
    ];
    content.replaceChildren(...cards.filter((c) => c !== null));
  }

  PG.ready(load);
})();
