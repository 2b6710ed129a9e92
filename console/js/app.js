// app.js: the console's entry: loads the language, draws the navigation and
// shows the page the location's #/route names. A page is a function
// (main, params, ctx) that fills main; ctx.alive() turns false once the
// user has gone to another page, so its polls stop, and the functions it
// gave ctx.onLeave() run then (a stream that never sends another chunk
// would otherwise hold one of the browser's six connections to the host).
import { loadLang, t, currentLang } from "./i18n.js";
import { getKey, getUser, clearSession, whenUnauthorized, raw } from "./api.js";
import { h, clear, toast } from "./ui.js";
import * as auth from "./pages/auth.js";
import * as account from "./pages/account.js";
import * as instances from "./pages/instances.js";
import * as terminal from "./pages/terminal.js";
import * as billing from "./pages/billing.js";
import * as admin from "./pages/admin.js";
import * as reservations from "./pages/reservations.js";
import * as apps from "./pages/apps.js";

// [pattern, page, needs a key, admins only]
const ROUTES = [
  ["login", auth.login, false],
  ["signup", auth.signup, false],
  ["verify", auth.verify, false],
  ["reset", auth.reset, false],
  ["password", auth.password, true],
  ["overview", account.overview, true],
  ["catalog", account.catalog, false],
  ["launch", instances.launch, true],
  ["instances", instances.list, true],
  ["instances/:id", instances.detail, true],
  ["terminal/:id/:rank", terminal.page, true],
  ["volumes", account.volumes, true],
  ["ssh-keys", account.sshKeys, true],
  ["api-keys", account.apiKeys, true],
  ["usage", billing.usage, true],
  ["transactions", billing.transactions, true],
  ["statement", billing.statement, true],
  ["reservations", reservations.page, true],
  ["reservations/:id", reservations.detail, true],
  ["apps", apps.market, false],
  ["apps/:slug", apps.detail, true],
  ["publish", apps.publish, true],
  ["my-apps", apps.mine, true],
  ["admin/nodes", admin.nodes, true, true],
  ["admin/prices", admin.prices, true, true],
  ["admin/invites", admin.invites, true, true],
  ["admin/money", admin.money, true, true],
  ["admin/users", admin.users, true, true],
  ["admin/audit", admin.audit, true, true],
];

const USER_NAV = ["overview", "catalog", "launch", "instances", "reservations", "apps", "volumes", "ssh-keys", "api-keys", "usage", "transactions", "statement"];
const ADMIN_NAV = ["admin/nodes", "admin/prices", "admin/invites", "admin/money", "admin/users", "admin/audit"];

let generation = 0;
let leaving = []; // the current page's ctx.onLeave functions

// A route's :id, :rank or :slug as the pages use it: in API paths, so only
// the characters of the daemon's ids and slugs. Anything else ("..%2Fapi-keys",
// which would turn the instance page's Terminate into DELETE /v1/api-keys,
// or a broken %-escape) matches no route.
function routeParam(raw) {
  let v;
  try { v = decodeURIComponent(raw); } catch { return null; }
  return /^[A-Za-z0-9_-]{1,64}$/.test(v) ? v : null;
}

function match(hash) {
  const [pathPart, queryPart] = hash.replace(/^#\/?/, "").split("?");
  const parts = pathPart.split("/").filter(Boolean);
  for (const [pattern, page, needsKey, adminOnly] of ROUTES) {
    const pp = pattern.split("/");
    if (pp.length !== parts.length) continue;
    const params = {};
    if (pp.every((p, i) => (p.startsWith(":") ? (params[p.slice(1)] = routeParam(parts[i])) !== null : p === parts[i])))
      return { name: pattern, page, needsKey, adminOnly, params, query: new URLSearchParams(queryPart || "") };
  }
  return null;
}

function drawNav(current) {
  const nav = clear(document.getElementById("nav"));
  const user = getUser();
  const items = getKey() ? USER_NAV : ["catalog", "apps", "login", "signup"];
  for (const name of items)
    nav.append(h("a", { href: `#/${name}`, "aria-current": current === name || current.startsWith(name + "/") ? "page" : null }, t(`nav.${name}`)));
  if (getKey() && user && user.role === "admin") {
    nav.append(h("span", { class: "sep", "aria-hidden": "true" }));
    for (const name of ADMIN_NAV)
      nav.append(h("a", { href: `#/${name}`, "aria-current": current === name ? "page" : null }, t(`nav.${name}`)));
  }
  document.getElementById("who").textContent = user && getKey() ? user.email : "";
  const out = document.getElementById("logout");
  out.hidden = !getKey();
  out.textContent = t("nav.logout");
  document.getElementById("skip-link").textContent = t("nav.skip");
  document.getElementById("lang-label").textContent = t("nav.language");
  // The toggle shows a glyph (☰); its name for a screen reader is a word.
  document.getElementById("nav-toggle").setAttribute("aria-label", t("nav.menu"));
  // Each page's own title: a screen reader tells it, the tab and the
  // history list show it (every page was "gpurent · GPU cloud console").
  document.title = `${t(`nav.${current}`)} · gpurent`;
}

async function show() {
  const gen = ++generation;
  for (const fn of leaving.splice(0)) {
    try { fn(); } catch { /* one page's clean-up must not stop the next page */ }
  }
  const root = clear(document.getElementById("main"));
  // Each page draws into a box of its own: a page still awaiting the API
  // when the next navigation starts then draws into a box no longer shown,
  // rather than beside (or over) the page that replaced it.
  const main = h("div", { class: "page" });
  root.append(main);
  document.getElementById("banner").textContent = "";
  let route = match(location.hash || "");
  if (!route) {
    location.replace(getKey() ? "#/overview" : "#/login");
    return;
  }
  if (route.needsKey && !getKey()) {
    location.replace(`#/login?next=${encodeURIComponent(location.hash.slice(1))}`);
    return;
  }
  drawNav(route.name);
  // A page chosen from the phone's menu closes it, and the toggle says so.
  document.getElementById("nav").classList.remove("open");
  document.getElementById("nav-toggle").setAttribute("aria-expanded", "false");
  if (route.adminOnly && (getUser() || {}).role !== "admin") {
    main.append(h("h1", {}, t("nav." + route.name)), h("div", { class: "error" }, t("err.forbidden")));
    return;
  }
  const ctx = { alive: () => gen === generation, query: route.query, navigate: (to) => { location.hash = to; },
    onLeave: (fn) => { if (gen === generation) leaving.push(fn); else fn(); } };
  // While the page still waits for the API it says so (shown after a
  // moment, console.css), rather than a title over nothing; main is
  // aria-busy meanwhile.
  const loading = h("p", { class: "hint loading", id: "loading", role: "status" }, t("common.loading"));
  root.append(loading);
  root.setAttribute("aria-busy", "true");
  try {
    await route.page(main, route.params, ctx);
  } catch (e) {
    if (ctx.alive()) main.append(h("div", { class: "error" }, t("err.unexpected", { message: e.message })));
  } finally {
    loading.remove();
    if (ctx.alive()) root.removeAttribute("aria-busy");
  }
  if (ctx.alive() && document.activeElement === document.body) root.focus({ preventScroll: true });
}

async function start() {
  try {
    await loadLang();
  } catch {
    // No catalogue, so no words but these, in both languages.
    document.getElementById("main").append(h("div", { class: "error", role: "alert", id: "no-catalogue" },
      "控制台无法加载，请稍后刷新页面。 The console could not load: reload the page in a moment."));
    return;
  }
  const sel = document.getElementById("lang");
  sel.value = currentLang();
  sel.addEventListener("change", async () => {
    try { await loadLang(sel.value); } catch (e) {
      sel.value = currentLang();
      toast(t("err.unexpected", { message: e.message }), true);
      return;
    }
    show();
  });
  // Logging out ends the session here first, then revokes its key with
  // the key in hand: a key already revoked or expired answers 401, which
  // with the session still open ended it again with "session ended" (and
  // a ?next= back to the page) over a plain logout. Requests of the page
  // still out answer for a key no longer the session's, and say nothing.
  document.getElementById("logout").addEventListener("click", () => {
    const key = getKey(), id = (getUser() || {}).api_key_id;
    clearSession();
    if (location.hash === "#/login") show(); else location.hash = "#/login";
    if (key && id) raw("DELETE", `/v1/api-keys/${encodeURIComponent(id)}`, { headers: { Authorization: `Bearer ${key}` } })
      .catch(() => { /* gone already, or unreachable: this tab has forgotten it either way */ });
  });
  // The skip link moves the focus to the page, nothing else: followed as a
  // link it set the location's hash to #main, which names no route, and
  // the console left the page for the overview.
  document.getElementById("skip-link").addEventListener("click", (e) => {
    e.preventDefault();
    document.getElementById("main").focus();
  });
  document.getElementById("nav-toggle").addEventListener("click", (e) => {
    const nav = document.getElementById("nav");
    nav.classList.toggle("open");
    e.currentTarget.setAttribute("aria-expanded", nav.classList.contains("open"));
  });
  // Escape in the open phone menu closes it and gives the focus back to
  // its toggle, as a disclosure menu does.
  document.getElementById("nav").addEventListener("keydown", (e) => {
    const nav = e.currentTarget, toggle = document.getElementById("nav-toggle");
    if (e.key !== "Escape" || !nav.classList.contains("open")) return;
    nav.classList.remove("open");
    toggle.setAttribute("aria-expanded", "false");
    toggle.focus();
  });
  // After logging in again the user is back on the page the session ended on.
  whenUnauthorized(() => {
    clearSession();
    toast(t("err.session_ended"), true);
    const here = location.hash.slice(1);
    location.hash = here && !here.startsWith("/login") ? `#/login?next=${encodeURIComponent(here)}` : "#/login";
  });
  window.addEventListener("hashchange", show);
  show();
}

start();
