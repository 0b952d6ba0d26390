/* Keys and budgets: the admin's console. Create a key (shown once), give it budgets,
   rotate it (a new key, shown once; the old one stops working), revoke it; give an owner
   budgets (all its keys together); each key's and owner's budgets with what is used and
   left; the audit log. Every action is a POST to
   the admin JSON API (same origin), which scripts can call too. */
"use strict";

(() => {
  const { h } = PG;

  async function post(path, body) {
    const r = await fetch(`${PG.BASE}/api/${path}`, {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body || {}),
    });
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (!r.ok) throw new Error((data && data.error) || `HTTP ${r.status}`);
    return data;
  }

  function budgetCell(list) {
    if (!list.length) return "–";
    return h("div", { class: "budgets" }, list.map((b) =>
      h("div", { class: "budget", dataset: { budget: b.budget } },
        h("b", { text: b.budget }), ` used ${b.used}, `, h("span", { class: "left", text: `${b.left} left` }))));
  }

  function secret(where, title, key) {
    where.replaceChildren(h("div", { class: "secret", role: "status" },
      h("b", { text: title }), " ",
      h("code", { id: "shown-key", text: key }),
      h("div", { class: "note", text: "Copy it now: it is shown once, and only its digest is kept." })));
  }

  function message(where, err) {
    where.replaceChildren(h("div", { class: "error-box", role: "alert", text: String(err.message || err) }));
  }

  function createForm(out) {
    const form = h("form", { id: "create-key", class: "console-form" },
      h("label", {}, "Name ", h("input", { name: "name", required: true, autocomplete: "off" })),
      h("label", {}, "Owner ", h("input", { name: "owner", autocomplete: "off" })),
      h("label", {}, "Models ", h("input", { name: "models", placeholder: "every model", autocomplete: "off" })),
      h("label", {}, "Budgets ", h("textarea", { name: "budgets", rows: "2", placeholder: "2M tokens/day\n50 USD/month" })),
      h("button", { type: "submit", text: "Create key" }));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const f = new FormData(form);
      try {
        const d = await post("keys", {
          name: f.get("name"), owner: f.get("owner"), models: f.get("models"), budgets: f.get("budgets"),
        });
        form.reset();
        secret(out, `Key ${d.name}:`, d.key);
        await load(false);
      } catch (e) { message(out, e); }
    });
    return form;
  }

  function actions(k, out) {
    if (!k.active) return PG.pill("revoked");
    const act = async (what, body, confirmText) => {
      if (confirmText && !window.confirm(confirmText)) return;
      try {
        const d = await post(`keys/${encodeURIComponent(k.name)}/${what}`, body);
        if (d.key) secret(out, `New key for ${k.name}:`, d.key); else out.replaceChildren();
        await load(false);
      } catch (e) { message(out, e); }
    };
    const budgets = h("form", { class: "inline", dataset: { budgets: k.name } },
      h("input", { name: "budgets", value: k.budgets.map((b) => b.budget).join(", "), "aria-label": `budgets of ${k.name}` }),
      h("button", { type: "submit", text: "Set budgets" }));
    budgets.addEventListener("submit", (ev) => {
      ev.preventDefault();
      act("budgets", { budgets: new FormData(budgets).get("budgets") });
    });
    return h("div", { class: "actions" },
      h("button", { type: "button", dataset: { rotate: k.name }, text: "Rotate", onclick: () => act("rotate", {}, `Rotate ${k.name}? The current key stops working at once.`) }),
      h("button", { type: "button", dataset: { revoke: k.name }, text: "Revoke", onclick: () => act("revoke", {}, `Revoke ${k.name}?`) }),
      budgets);
  }

  function ownerForm(owner, value, out) {
    const named = owner === null;
    const form = h("form", { class: named ? "console-form" : "inline", id: named ? "owner-budgets" : null,
      dataset: named ? {} : { ownerBudgets: owner } },
      named ? h("label", {}, "Owner ", h("input", { name: "owner", required: true, autocomplete: "off" })) : null,
      h("input", { name: "budgets", value, placeholder: "10M tokens/month", "aria-label": `budgets of owner ${owner || ""}` }),
      h("button", { type: "submit", text: "Set owner's budgets" }));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const f = new FormData(form);
      const who = named ? f.get("owner") : owner;
      try {
        await post(`owners/${encodeURIComponent(who)}/budgets`, { budgets: f.get("budgets") });
        out.replaceChildren();
        await load(false);
      } catch (e) { message(out, e); }
    });
    return form;
  }

  async function load(clearOut = true) {
    const content = document.getElementById("content");
    let keys, audit;
    try {
      [keys, audit] = await Promise.all([PG.api("keys", new URLSearchParams()), PG.api("audit", new URLSearchParams())]);
    } catch (e) { PG.showError(e); return; }
    let out = document.getElementById("console-out");
    if (!out || clearOut) out = h("div", { id: "console-out" });
    const rows = PG.table([
      { label: "key", cell: (k) => h("b", { text: k.name }) },
      { label: "owner", cell: (k) => k.owner || "–" },
      { label: "models", cell: (k) => k.models.join(", ") || "every model" },
      { label: "sha256", cell: (k) => h("code", { text: `${k.digest_prefix}…` }) },
      { label: "budgets (this window)", cell: (k) => budgetCell(k.budgets) },
      { label: "owner's budgets", cell: (k) => budgetCell(k.owner_budgets) },
      { label: "", cell: (k) => actions(k, out) },
    ], keys.keys, { class: "keys", rowClass: (k) => (k.active ? "" : "muted") });
    const owners = PG.table([
      { label: "owner", cell: (o) => h("b", { text: o.owner }) },
      { label: "keys", cell: (o) => o.keys.join(", ") || "–" },
      { label: "budgets from", cell: (o) => o.source || "–" },
      { label: "budgets (this window, all its keys)", cell: (o) => budgetCell(o.budgets) },
      { label: "", cell: (o) => ownerForm(o.owner, o.source === "console" ? o.budgets.map((b) => b.budget).join(", ") : "", out) },
    ], keys.owners, { class: "owners" });
    const log = PG.table([
      { label: "when", cell: (e) => new Date(e.at * 1000).toISOString().replace("T", " ").slice(0, 19) },
      { label: "who", cell: (e) => e.actor },
      { label: "what", cell: (e) => h("b", { text: e.action }) },
      { label: "key or owner", cell: (e) => e.target },
      { label: "detail", cell: (e) => e.detail },
    ], audit.entries, { class: "audit" });
    content.replaceChildren(
      PG.card("New key", "shown once; only its digest is stored", createForm(out), out),
      PG.card("Keys", `${keys.keys.filter((k) => k.active).length} active · budgets in ${keys.currency} or tokens`, rows),
      PG.card("Owners", "budgets an owner's keys share; set here, they take the place of the config's (empty: the config's again)",
        h("div", { id: "owners" }, ownerForm(null, "", out), owners)),
      PG.card("Audit log", "every change made here, newest first", h("div", { id: "audit" }, log)));
  }

  PG.ready(() => load());
})();
