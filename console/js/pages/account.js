// account.js: the overview (funds, grants, burn rate, runway), the GPU
// catalog, and the user's volumes, SSH keys and API keys.
import { t } from "../i18n.js";
import { get, post, del, all, getUser, getKey, setSession } from "../api.js";
import { h, clear, money, time, minutesText, table, field, busy, errorBox, every, keepFocus, scrollable } from "../ui.js";

function stat(label, value, id) {
  return h("div", { class: "card stat", id }, h("div", { class: "label" }, label), h("div", { class: "value" }, value));
}

export async function overview(main, params, ctx) {
  main.append(h("h1", {}, t("overview.title")));
  const body = h("div"), pollErr = h("div", { id: "overview-poll-error" });
  main.append(pollErr, body);
  const draw = async () => {
    // The account as the server has it now, not the snapshot this tab
    // took at login: the address may have been verified in another tab
    // (the mailed link), and the snapshot is brought up to date.
    const [b, fresh] = await Promise.all([get("/v1/balance"), get("/v1/me").catch(() => null)]);
    if (fresh && getKey()) setSession(getKey(), { ...(getUser() || {}), ...fresh });
    const me = fresh || getUser() || {};
    keepFocus(body, () => drawBody(b, me));
  };
  const drawBody = (b, me) => {
    clear(body);
    if (me.email_verified === false)
      body.append(h("div", { class: "warn" }, t("overview.verify_first"), " ", h("a", { href: "#/verify" }, t("auth.verify"))));
    if (b.low_balance) body.append(h("div", { class: "warn", id: "low-balance" }, t("overview.low_balance")));
    body.append(h("div", { class: "grid" },
      stat(t("overview.available"), money(b.available, b.currency), "available"),
      stat(t("overview.cash"), money(b.cash, b.currency)),
      stat(t("overview.credit"), money(b.credit, b.currency)),
      stat(t("overview.unbilled"), money(b.unbilled, b.currency)),
      stat(t("overview.burn_rate"), [money(b.burn_rate_per_hour, b.currency), " ", t("common.per_hour")]),
      stat(t("overview.runway"), b.runway_minutes === null ? t("overview.no_burn") : minutesText(b.runway_minutes), "runway")));
    body.append(h("h2", {}, t("overview.grants")),
      table([[t("overview.grant_source"), (g) => g.source], [t("overview.grant_amount"), (g) => money(g.amount, b.currency)],
        [t("overview.grant_remaining"), (g) => money(g.remaining, b.currency)],
        [t("overview.grant_expires"), (g) => (g.expired ? t("overview.expired") : g.expires_at ? time(g.expires_at) : t("common.never"))]],
      b.grants || [], t("overview.no_grants")));
    body.append(h("div", { class: "actions" }, h("a", { href: "#/launch" }, t("nav.launch")), h("a", { href: "#/password" }, t("auth.change_password"))));
  };
  try { await draw(); } catch (e) { pollErr.append(errorBox(e)); }
  every(10000, draw, ctx.alive, pollErr);
}

export async function catalog(main) {
  main.append(h("h1", {}, t("catalog.title")));
  try {
    const types = (await get("/v1/gpu-types")).data;
    main.append(table([
      [t("catalog.type"), (g) => h("strong", {}, g.code)],
      [t("catalog.vendor"), (g) => `${g.vendor} · ${g.stack}`],
      [t("catalog.memory"), (g) => `${g.memory_gb} GB ${g.memory_type || ""}`],
      [t("catalog.price"), (g) => (g.price_per_card_hour ? [money(g.price_per_card_hour, g.currency), " ", t("common.per_card_hour")] : t("catalog.no_price"))],
      [t("catalog.price_gb"), (g) => (g.price_per_gb_hour ? money(g.price_per_gb_hour, g.currency) : "—")],
      [t("catalog.free"), (g) => `${g.cards_free} / ${g.cards_total}`],
      [t("catalog.booking"), (g) => (g.reservation_required ? h("span", { class: "badge pending" }, t("catalog.needs_booking")) : t("catalog.on_demand"))],
      [t("catalog.reservable"), (g) => (g.reservation_required || g.cards_reservable
        ? [h("span", { "data-reservable": g.code }, String(g.cards_reservable || 0)),
          g.reservation_price_per_card_hour ? [" · ", money(g.reservation_price_per_card_hour, g.currency), " ", t("common.per_card_hour")] : null]
        : "—")],
      ["", (g) => (g.reservation_required
        ? h("a", { href: `#/reservations?gpu_type=${encodeURIComponent(g.code)}`, "data-book": g.code }, t("catalog.book"))
        : !g.price_per_card_hour ? "" : h("a", { href: `#/launch?gpu_type=${encodeURIComponent(g.code)}` }, t("nav.launch")))],
    ], types, t("catalog.empty")));
  } catch (e) { main.append(errorBox(e)); }
}

// A list page with a create form: list() draws the rows, the form adds one.
async function listPage(main, title, load, columns, form, empty) {
  main.append(h("h1", {}, title));
  const listBox = h("div"), err = h("div");
  const reload = async () => {
    clear(err);
    try { clear(listBox).append(table(columns(reload, err), await load(), empty)); } catch (e) { err.append(errorBox(e)); }
  };
  if (form) main.append(form(reload));
  main.append(err, listBox);
  await reload();
}

// A row's button, named for assistive technology with the row's thing
// ("Delete laptop"): a list of buttons all named "Delete" does not say
// which is which.
function deleteButton(path, reload, err, what, label) {
  const text = label || t("common.delete");
  const b = h("button", { type: "button", class: "secondary", "aria-label": `${text} ${what}` }, text);
  b.addEventListener("click", () => { if (confirm(t("common.confirm"))) busy(b, async () => { await del(path); await reload(); }, err); });
  return b;
}

export async function volumes(main) {
  await listPage(main, t("volumes.title"), () => all("/v1/volumes"), (reload, err) => [
    [t("common.name"), (v) => v.name], [t("volumes.size"), (v) => `${v.size_gb} GB`], [t("volumes.region"), (v) => v.region],
    [t("volumes.in_use"), (v) => (v.in_use ? t("common.yes") : t("common.no"))], [t("common.created"), (v) => time(v.created_at)],
    ["", (v) => deleteButton(`/v1/volumes/${v.id}`, reload, err, v.name)]],
  (reload) => {
    const name = h("input", { required: true, id: "volume-name", name: "name" }), size = h("input", { type: "number", min: 1, value: 100, required: true, id: "volume-size", name: "size_gb" });
    const err = h("div"), btn = h("button", { type: "submit" }, t("volumes.create"));
    const f = h("form", { class: "inline card" }, field(t("common.name"), name), field(t("volumes.size_gb"), size), btn, err);
    f.addEventListener("submit", (e) => { e.preventDefault(); busy(btn, async () => { await post("/v1/volumes", { name: name.value, size_gb: Number(size.value) }); name.value = ""; await reload(); }, err); });
    return f;
  }, t("volumes.empty"));
}

export async function sshKeys(main) {
  await listPage(main, t("sshkeys.title"), () => all("/v1/ssh-keys"), (reload, err) => [
    [t("common.name"), (k) => k.name], [t("sshkeys.type"), (k) => `${k.type} ${k.bits || ""}`], [t("sshkeys.fingerprint"), (k) => h("code", {}, k.fingerprint)],
    [t("common.created"), (k) => time(k.created_at)], ["", (k) => deleteButton(`/v1/ssh-keys/${k.id}`, reload, err, k.name)]],
  (reload) => {
    const name = h("input", { required: true, id: "sshkey-name", name: "name" }), key = h("textarea", { required: true, id: "sshkey-public", name: "public_key", placeholder: "ssh-ed25519 AAAA…" });
    const err = h("div"), btn = h("button", { type: "submit" }, t("sshkeys.add"));
    const f = h("form", { class: "stack card" }, field(t("common.name"), name), field(t("sshkeys.public_key"), key), err, btn);
    f.addEventListener("submit", (e) => { e.preventDefault(); busy(btn, async () => { await post("/v1/ssh-keys", { name: name.value, public_key: key.value.trim() }); name.value = key.value = ""; await reload(); }, err); });
    return f;
  }, t("sshkeys.empty"));
}

export async function apiKeys(main) {
  const me = getUser() || {};
  await listPage(main, t("apikeys.title"), () => all("/v1/api-keys"), (reload, err) => [
    [t("common.name"), (k) => [k.name, k.id === me.api_key_id ? [" ", h("span", { class: "badge" }, t("apikeys.this_session"))] : null]],
    [t("common.created"), (k) => time(k.created_at)], [t("apikeys.last_used"), (k) => time(k.last_used_at)],
    [t("apikeys.expires"), (k) => (k.expires_at ? time(k.expires_at) : t("common.never"))],
    [t("apikeys.revoked"), (k) => (k.revoked_at ? time(k.revoked_at) : "")],
    ["", (k) => (k.revoked_at || k.id === me.api_key_id ? "" : deleteButton(`/v1/api-keys/${k.id}`, reload, err, k.name, t("apikeys.revoke")))]],
  (reload) => {
    const name = h("input", { required: true, id: "apikey-name", name: "name" });
    const err = h("div"), shown = h("div"), btn = h("button", { type: "submit" }, t("apikeys.create"));
    const f = h("form", { class: "inline card" }, field(t("common.name"), name), btn, err, shown);
    f.addEventListener("submit", (e) => { e.preventDefault(); busy(btn, async () => {
      const k = await post("/v1/api-keys", { name: name.value });
      clear(shown).append(h("div", { class: "warn" }, t("apikeys.shown_once"), scrollable(h("pre", { class: "cmd", id: "new-api-key" }, k.token), t("apikeys.new_key"))));
      name.value = ""; await reload();
    }, err); });
    return f;
  }, t("apikeys.empty"));
}
