// admin.js: the admins' pages: nodes (state, cards, health; drain, cordon,
// ready), prices with effective dates, invite codes, top-ups and grants,
// account look-up and suspension, and the audit trail of admin actions.
import { t } from "../i18n.js";
import { get, post, put, all, formKey } from "../api.js";
import { h, clear, money, time, table, field, busy, errorBox, badge, every, toast, keepFocus } from "../ui.js";

export async function nodes(main, params, ctx) {
  main.append(h("h1", {}, t("nodes.title")));
  const err = h("div"), pollErr = h("div", { id: "nodes-poll-error" }), box = h("div", { id: "nodes" });
  main.append(err, pollErr, box);
  // While a change is out the poll leaves the table as it is (it drew the
  // pressed button enabled again, and a second press sent the change
  // twice), and a poll sent before a change's answer is dropped: it would
  // draw the node as it was before.
  let changing = 0, changes = 0;
  const setState = (n, state, b) => {
    // Cancel in the reason's prompt cancels the change (it drained anyway).
    const reason = state === "ready" ? "" : prompt(t("nodes.reason_prompt"));
    if (reason === null) return;
    changing++;
    busy(b, async () => {
      try {
        await post(`/v1/admin/nodes/${n.id}/state`, reason ? { state, reason } : { state });
      } finally { changing--; changes++; }
      toast(t("nodes.state_set", { name: n.name, state: t(`state.${state === "ready" ? "active" : state}`) }));
      await draw();
    }, err);
  };
  const buttons = (n) => h("div", { class: "actions" }, ["draining", "cordoned", "maintenance", "ready"]
    .filter((s) => (s === "ready" ? n.admin_state !== "active" : n.admin_state !== s))
    .map((s) => {
      const verb = { draining: "drain", cordoned: "cordon", maintenance: "maintenance", ready: "ready" }[s];
      const b = h("button", { type: "button", class: "secondary", dataset: { node: n.name, action: verb }, "aria-label": `${t(`nodes.${verb}`)} ${n.name}` }, t(`nodes.${verb}`));
      b.addEventListener("click", () => setState(n, s, b));
      return b;
    }));
  const draw = async (polled) => {
    const seen = changes;
    const rows = await all("/v1/admin/nodes");
    if (polled && (changing || seen !== changes)) return;
    keepFocus(box, () => clear(box).append(table([
      [t("common.name"), (n) => h("strong", {}, n.name)], [t("nodes.model"), (n) => `${n.gpu_model} · ${n.fabric} · ${n.region}`],
      [t("nodes.state"), (n) => h("span", { class: "node-state", dataset: { node: n.name, state: n.state } }, badge(n.state))],
      [t("nodes.health"), (n) => badge(n.health)], [t("nodes.cards"), (n) => t("nodes.cards_text", { free: n.cards_free, used: n.cards_in_use, total: n.cards_total })],
      [t("nodes.last_seen"), (n) => time(n.last_seen_at)], [t("nodes.reason"), (n) => n.admin_reason || n.state_reason || ""],
      ["", buttons]], rows, t("nodes.empty"))));
  };
  try { await draw(); } catch (e) { pollErr.append(errorBox(e)); }
  every(5000, () => draw(true), ctx.alive, pollErr);
}

export async function prices(main) {
  main.append(h("h1", {}, t("prices.title")));
  const err = h("div"), box = h("div");
  const [types, list] = await Promise.all([get("/v1/gpu-types"), get("/v1/prices")]).catch((e) => { err.append(errorBox(e)); return [null, null]; });
  main.append(err);
  if (!types) return;
  // The admin forms' inputs are named as the API's fields: an error that
  // names one marks it (ui.js busy).
  const type = h("select", { id: "price-type", name: "gpu_type" }, types.data.map((g) => h("option", { value: g.code }, g.code)));
  const price = h("input", { id: "price-amount", name: "price_per_card_hour", required: true, inputmode: "decimal", placeholder: "1.20" });
  const at = h("input", { id: "price-at", name: "effective_at", type: "datetime-local" });
  const reason = h("input", { id: "price-reason", name: "reason" });
  const btn = h("button", { type: "submit" }, t("prices.set"));
  const form = h("form", { class: "inline card" }, field(t("catalog.type"), type), field(t("prices.per_card_hour"), price),
    field(t("prices.effective"), at, t("prices.effective_hint")), field(t("common.reason"), reason), btn);
  form.addEventListener("submit", (e) => { e.preventDefault(); busy(btn, async () => {
    const body = { price_per_card_hour: price.value.trim() };
    if (at.value) body.effective_at = new Date(at.value).toISOString().replace(/\.\d+Z$/, "Z");
    if (reason.value) body.reason = reason.value;
    await put(`/v1/admin/prices/${encodeURIComponent(type.value)}`, body);
    toast(t("prices.saved")); clear(box).append(priceTable((await get("/v1/prices")).data));
  }, err); });
  const priceTable = (rows) => table([[t("catalog.type"), (p) => p.gpu_type], [t("prices.per_card_hour"), (p) => money(p.price_per_card_hour, p.currency)],
    [t("prices.effective"), (p) => time(p.effective_at)], [t("prices.set_at"), (p) => time(p.set_at)]], rows, t("common.none"));
  box.append(priceTable(list.data));
  main.append(form, box);
}

export async function invites(main) {
  main.append(h("h1", {}, t("invites.title")));
  const err = h("div"), out = h("div", { id: "invite-result" });
  const code = h("input", { id: "invite-code", name: "code", required: true, pattern: "[A-Za-z0-9_\\-]+" });
  const amount = h("input", { id: "invite-amount", name: "amount", required: true, inputmode: "decimal", placeholder: "10.00" });
  const uses = h("input", { id: "invite-uses", name: "max_uses", type: "number", min: 1 });
  const days = h("input", { id: "invite-days", name: "credit_days", type: "number", min: 1 });
  const btn = h("button", { type: "submit" }, t("invites.create"));
  const form = h("form", { class: "inline card" }, field(t("invites.code"), code), field(t("invites.amount"), amount),
    field(t("invites.max_uses"), uses), field(t("invites.credit_days"), days), btn);
  const columns = [[t("invites.code"), (x) => h("code", {}, x.code)], [t("invites.amount"), (x) => money(x.amount, x.currency)],
    [t("invites.uses"), (x) => `${x.uses ?? 0} / ${x.max_uses ?? "∞"}`], [t("invites.credit_days"), (x) => x.credit_days ?? "—"], [t("apikeys.expires"), (x) => (x.expires_at ? time(x.expires_at) : t("common.never"))]];
  // Every code made so far, with its uses: drawn again after a new one.
  const list = h("div", { id: "invite-list" });
  const drawList = async () => {
    const codes = await all("/v1/admin/invite-codes");
    clear(list).append(h("h2", {}, t("invites.all")), codes.length ? table(columns, codes) : h("p", {}, t("invites.none")));
  };
  const show = (c) => clear(out).append(table(columns, [c]));
  form.addEventListener("submit", (e) => { e.preventDefault(); busy(btn, async () => {
    const body = { code: code.value.trim(), amount: amount.value.trim() };
    if (uses.value) body.max_uses = Number(uses.value);
    if (days.value) body.credit_days = Number(days.value);
    show(await post("/v1/admin/invite-codes", body));
    await drawList();
  }, err); });
  const look = h("input", { id: "invite-lookup", name: "code", required: true });
  const lbtn = h("button", { type: "submit", class: "secondary" }, t("invites.lookup"));
  const lform = h("form", { class: "inline card" }, field(t("invites.code"), look), lbtn);
  lform.addEventListener("submit", (e) => { e.preventDefault(); busy(lbtn, async () => show(await get(`/v1/admin/invite-codes/${encodeURIComponent(look.value.trim())}`)), err); });
  main.append(form, lform, err, out, list);
  await drawList().catch((e) => err.append(errorBox(e)));
}

// Finds one account by e-mail (the API's exact look-up).
async function findUser(email) {
  const r = await get("/v1/admin/users", { email });
  if (!r.data.length) return null;
  return r.data[0];
}

function userCard(u) {
  return h("div", { class: "card", id: "user-card", dataset: { user: u.id } }, h("strong", {}, u.email_display || u.email), " ", badge(u.status),
    h("div", { class: "hint mono" }, u.id), h("div", {}, t("users.role"), ": ", u.role, " · ", t("users.verified"), ": ", u.email_verified ? t("common.yes") : t("common.no"),
      " · ", t("common.created"), ": ", time(u.created_at), u.invite_code ? [" · ", t("invites.code"), ": ", u.invite_code] : null));
}

// Top-ups (cash, with the payment's id) and grants (credit, may expire).
export { moneyPage as money };
async function moneyPage(main) {
  main.append(h("h1", {}, t("funds.title")));
  const err = h("div"), out = h("div");
  const email = h("input", { id: "funds-email", name: "email", type: "email", required: true });
  const kind = h("select", { id: "funds-kind" }, h("option", { value: "topup" }, t("funds.topup")), h("option", { value: "grant" }, t("funds.grant")));
  const amount = h("input", { id: "funds-amount", name: "amount", required: true, inputmode: "decimal", placeholder: "100.00" });
  const payment = h("input", { id: "funds-payment", name: "payment_id", placeholder: t("funds.payment_hint") });
  const expires = h("input", { id: "funds-expires", name: "expires_at", type: "date" });
  const reason = h("input", { id: "funds-reason", name: "reason" });
  const btn = h("button", { type: "submit", id: "funds-submit" }, t("funds.submit"));
  const form = h("form", { class: "stack card" }, field(t("auth.email"), email), field(t("funds.kind"), kind), field(t("invites.amount"), amount),
    field(t("funds.payment_id"), payment), field(t("funds.expires"), expires, t("funds.expires_hint")), field(t("common.reason"), reason), btn);
  // Without a payment id typed in, one of the console's per filled-in form:
  // a retry after a lost answer is the same payment, not a second one.
  const idem = formKey(form);
  form.addEventListener("submit", (e) => { e.preventDefault(); busy(btn, async () => {
    clear(out);
    const u = await findUser(email.value.trim());
    if (!u) { out.append(h("div", { class: "error" }, t("users.not_found"))); return; }
    const body = { amount: amount.value.trim() };
    if (reason.value) body.reason = reason.value;
    let r;
    if (kind.value === "topup") {
      body.payment_id = payment.value.trim() || `console-${idem.get()}`;
      r = await post(`/v1/admin/users/${u.id}/topups`, body);
      idem.done();
    } else {
      if (expires.value) body.expires_at = new Date(expires.value + "T23:59:59").toISOString().replace(/\.\d+Z$/, "Z");
      r = await post(`/v1/admin/users/${u.id}/grants`, body);
    }
    out.append(userCard(u), h("p", { class: "ok", id: "funds-done" }, r.duplicate ? t("funds.duplicate") : t("funds.done"), " ", money(r.amount, r.currency)));
  }, err); });
  main.append(form, err, out);
}

export async function users(main) {
  main.append(h("h1", {}, t("users.title")));
  const err = h("div"), out = h("div");
  const email = h("input", { id: "users-email", name: "email", type: "email", required: true });
  const btn = h("button", { type: "submit" }, t("users.lookup"));
  const form = h("form", { class: "inline card" }, field(t("auth.email"), email), btn);
  const show = (u) => {
    clear(out);
    if (!u) { out.append(h("div", { class: "error" }, t("users.not_found"))); return; }
    // The API calls a suspended account's status "disabled"; both requests
    // want a reason, which the audit trail keeps.
    const suspended = u.status === "disabled";
    const b = h("button", { type: "button", class: suspended ? "" : "danger", id: "users-toggle" }, suspended ? t("users.reinstate") : t("users.suspend"));
    b.addEventListener("click", () => {
      const reason = (prompt(t("users.reason_prompt")) ?? "").trim();
      clear(err);
      if (!reason) { err.append(h("div", { class: "error", role: "alert" }, t("users.reason_required"))); return; }
      busy(b, async () => {
        const r = await post(`/v1/admin/users/${u.id}/${suspended ? "reinstate" : "suspend"}`, { reason });
        show(r.user);
        if (r.instances_stopped) toast(t("users.instances_stopped", { n: r.instances_stopped }));
      }, err);
    });
    out.append(userCard(u), h("div", { class: "actions" }, b));
  };
  form.addEventListener("submit", (e) => { e.preventDefault(); busy(btn, async () => show(await findUser(email.value.trim())), err); });
  main.append(form, err, out);
}

export async function audit(main) {
  main.append(h("h1", {}, t("audit.title")));
  const action = h("input", { id: "audit-action", name: "action", placeholder: "topup" });
  const target = h("input", { id: "audit-target", name: "target" });
  const btn = h("button", { type: "submit" }, t("audit.filter"));
  const box = h("div", { id: "audit" });
  const load = async () => {
    clear(box);
    try {
      const rows = await all("/v1/admin/audit", { action: action.value.trim(), target: target.value.trim() });
      box.append(table([[t("txn.at"), (a) => time(a.at)], [t("audit.action"), (a) => h("code", {}, a.action)], [t("audit.target"), (a) => h("code", {}, a.target)],
        [t("txn.amount"), (a) => (a.amount ? money(a.amount, a.currency) : "")], [t("audit.admin"), (a) => h("code", {}, a.admin_user_id)], [t("common.reason"), (a) => a.reason || ""]],
      rows, t("audit.empty"), t("audit.title")));
    } catch (e) { box.append(errorBox(e)); }
  };
  const form = h("form", { class: "inline card" }, field(t("audit.action"), action), field(t("audit.target"), target), btn);
  form.addEventListener("submit", (e) => { e.preventDefault(); busy(btn, load); });
  main.append(form, box);
  await load();
}
