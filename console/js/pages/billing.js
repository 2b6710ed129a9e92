// billing.js: usage (a chart of daily spend, card-hours per GPU type, app
// calls), the transactions list and the monthly statement (GPU usage,
// storage per volume, app calls, transactions) with its CSV download.
// Daily spend is summed in the browser from the usage and storage
// transactions, by the user's own calendar day. The API lists
// transactions oldest first; pages that want the newest read them a window
// of time at a time, going back (newestFirst), each window read whole.
import { t, locale } from "../i18n.js";
import { get, raw } from "../api.js";
import { h, clear, money, money2, time, table, field, busy, errorBox, download } from "../ui.js";

const DAY_MS = 86400000;
const WINDOW_PAGES = 10; // pages of 200 read for one window before it is cut smaller

// The API's time form: UTC to the second.
function isoSec(ms) { return new Date(Math.floor(ms / 1000) * 1000).toISOString().replace(/\.\d{3}Z$/, "Z"); }

// Every transaction of query in [from, to) (to null: no end), oldest first;
// null where there are more than max pages of them.
async function windowRows(query, from, to, max = WINDOW_PAGES) {
  let rows = [], cursor;
  for (let i = 0; i < max; i++) {
    const page = await get("/v1/transactions", { ...query, limit: 200, from: isoSec(from), to: to === null ? undefined : isoSec(to), cursor });
    rows = rows.concat(page.data || []);
    if (!page.next_cursor) return rows;
    cursor = page.next_cursor;
  }
  return null;
}

// The transactions of query newest first, one window of time at a time:
// next() gives the window before the last one (newest first, whole), or
// null once the oldest has been given. A window that holds more than
// WINDOW_PAGES pages is read again a quarter as long, so the newest come
// first however many there are.
function newestFirst(query) {
  let first, to = null, span = 31 * DAY_MS;
  const reader = {
    done: false,
    async next() {
      if (first === undefined) {
        const p = await get("/v1/transactions", { ...query, limit: 1 });
        first = p.data.length ? Math.floor(Date.parse(p.data[0].at) / 1000) * 1000 : null;
      }
      if (first === null || (to !== null && to <= first)) { reader.done = true; return null; }
      // The first window has no end: the server's clock may be ahead of ours.
      const end = to === null ? Date.now() : to;
      for (;;) {
        const from = Math.max(Math.floor((end - span) / 1000) * 1000, first);
        const rows = await windowRows(query, from, to, span > 1000 ? WINDOW_PAGES : Infinity);
        if (rows === null) { span = Math.max(1000, Math.floor(span / 4)); continue; }
        to = from;
        reader.done = to <= first;
        return rows.reverse();
      }
    },
  };
  return reader;
}

function dayKey(d) { return `${d.getFullYear()}-${String(d.getMonth() + 1).padStart(2, "0")}-${String(d.getDate()).padStart(2, "0")}`; }

// The 30 days up to the end of the usage period (the server's "now").
function spendChart(txns, currency, until) {
  const spend = txns.filter((x) => x.kind === "usage" || x.kind === "storage" || x.kind === "refund");
  if (!spend.length) return h("p", { class: "hint" }, t("usage.no_spend"));
  const last = new Date(until - 1000);
  const days = [];
  for (let i = 29; i >= 0; i--) days.push(dayKey(new Date(last.getTime() - i * DAY_MS)));
  // Summed in whole micro-yuan (exact integers), shown as yuan.
  const sums = Object.fromEntries(days.map((d) => [d, 0]));
  for (const x of spend) {
    const k = dayKey(new Date(x.at));
    if (k in sums) sums[k] -= Math.round(Number(x.amount) * 1e6); // charges are negative amounts
  }
  for (const d of days) sums[d] /= 1e6;
  const max = Math.max(0.01, ...Object.values(sums));
  return h("div", { id: "spend-chart" },
    h("div", { class: "chart", role: "img", "aria-label": t("usage.daily_spend") },
      days.map((d) => h("div", { class: "bar", title: `${d}: ${money2(sums[d])} ${currency}`, "data-height": Math.round((100 * sums[d]) / max) }))),
    h("div", { class: "chart-labels" }, h("span", {}, days[0]), h("span", {}, days[days.length - 1])),
    h("table", { class: "sr-only" }, days.map((d) => h("tr", {}, h("td", {}, d), h("td", {}, money2(sums[d]))))));
}

// Bar heights go through CSSOM, which the CSP allows (no style attribute).
function sizeBars(root) {
  for (const b of root.querySelectorAll(".bar[data-height]")) b.style.height = `${b.dataset.height}%`;
  for (const b of root.querySelectorAll(".fill[data-width]")) b.style.width = `${b.dataset.width}%`;
}

export async function usage(main) {
  main.append(h("h1", {}, t("usage.title")));
  try {
    const byType = await get("/v1/usage", { group_by: "gpu_type" });
    // Every spending transaction of the period the usage covers, all pages.
    const until = Date.parse(byType.to), since = Math.min(Date.parse(byType.from), until - 30 * DAY_MS);
    const txns = (await Promise.all(["usage", "storage", "refund"].map((kind) => windowRows({ kind }, since, null, Infinity)))).flat();
    const maxH = Math.max(0.01, ...byType.data.map((r) => Number(r.card_hours)));
    const box = h("div", {},
      h("div", { class: "card" }, h("h2", {}, t("usage.daily_spend")), spendChart(txns, byType.currency, until)),
      h("div", { class: "card", id: "card-hours" }, h("h2", {}, t("usage.card_hours")),
        byType.data.length ? byType.data.map((r) => h("div", { class: "hbar" }, h("span", {}, r.gpu_type),
          h("div", {}, h("div", { class: "fill", "data-width": Math.round((100 * Number(r.card_hours)) / maxH) })),
          h("span", { title: r.card_hours }, Number(r.card_hours).toFixed(2)))) : h("p", { class: "hint" }, t("usage.no_usage")),
        h("p", { class: "hint" }, t("usage.period", { from: new Date(byType.from).toLocaleDateString(locale()), to: new Date(byType.to).toLocaleDateString(locale()) }))),
      h("h2", {}, t("usage.by_type")),
      table([[t("catalog.type"), (r) => r.gpu_type], [t("usage.card_hours_col"), (r) => r.card_hours], [t("usage.cost"), (r) => money(r.cost, byType.currency)],
        [t("usage.by_credit"), (r) => money(r.paid_by_credit, byType.currency)], [t("usage.by_cash"), (r) => money(r.paid_by_cash, byType.currency)]], byType.data, t("usage.no_usage")),
      h("h2", {}, t("usage.apps")), h("div", { id: "usage-apps" }, appsTable(byType.apps || [], byType.currency)));
    main.append(box);
    sizeBars(box);
  } catch (e) { main.append(errorBox(e)); }
}

// Marketplace calls per app (the usage's and the statement's apps) and
// storage per volume (the statement's): charges the GPU tables leave out.
function appsTable(rows, currency) {
  return table([[t("apps.slug"), (a) => h("code", {}, a.slug)], [t("apps.calls"), (a) => String(a.calls)],
    [t("apps.tokens"), (a) => `${a.input_tokens} / ${a.output_tokens}`], [t("usage.cost"), (a) => money(a.charged, currency)]],
  rows, t("usage.no_apps"));
}

function storageTable(rows, currency) {
  return table([[t("common.name"), (v) => v.name], [t("volumes.size"), (v) => `${v.size_gb} GB`], [t("volumes.region"), (v) => v.region],
    [t("usage.cost"), (v) => money(v.cost, currency)], [t("usage.by_credit"), (v) => money(v.paid_by_credit, currency)],
    [t("usage.by_cash"), (v) => money(v.paid_by_cash, currency)]], rows, t("statement.no_storage"));
}

function txnTable(rows, currency) {
  return table([[t("txn.at"), (x) => time(x.at)], [t("txn.kind"), (x) => t(`txn.kind_${x.kind}`)], [t("txn.amount"), (x) => money(x.amount, currency || x.currency)],
    [t("txn.instance"), (x) => (x.instance_id ? h("a", { href: `#/instances/${x.instance_id}` }, x.instance_id) : x.volume_id || "")],
    [t("txn.reason"), (x) => x.reason || ""]], rows, t("txn.empty"));
}

export async function transactions(main) {
  main.append(h("h1", {}, t("txn.title")));
  const kind = h("select", { id: "txn-kind" }, h("option", { value: "" }, t("txn.all")),
    ["usage", "refund", "grant", "expiry", "topup", "storage", "reservation", "reservation_refund", "app_call"]
      .map((k) => h("option", { value: k }, t(`txn.kind_${k}`))));
  const box = h("div", { id: "transactions" }), err = h("div"), count = h("p", { class: "hint", id: "txn-count", "aria-live": "polite" });
  const more = h("button", { type: "button", class: "secondary", id: "txn-older", hidden: true }, t("txn.older"));
  let reader, rows, gen = 0;
  // Windows until 50 more rows (or the oldest) are shown: a quiet month
  // is not an empty page.
  const older = async () => {
    const mine = gen;
    const want = rows.length + 50;
    while (rows.length < want && !reader.done) {
      const w = await reader.next();
      if (mine !== gen) return;
      if (w) rows = rows.concat(w);
    }
    clear(box).append(txnTable(rows));
    count.textContent = reader.done ? t("txn.all_shown", { n: rows.length }) : t("txn.shown", { n: rows.length });
    more.hidden = reader.done;
  };
  const load = async () => {
    gen++;
    reader = newestFirst(kind.value ? { kind: kind.value } : {});
    rows = [];
    clear(box); clear(err); count.textContent = ""; more.hidden = true;
    try { await older(); } catch (e) { err.append(errorBox(e)); }
  };
  more.addEventListener("click", () => busy(more, older, err));
  kind.addEventListener("change", load);
  main.append(h("div", { class: "inline card" }, field(t("txn.kind"), kind)), err, count, box, h("div", { class: "actions" }, more));
  await load();
}

export async function statement(main) {
  main.append(h("h1", {}, t("statement.title")));
  let month;
  try {
    // The month of the newest transaction.
    const reader = newestFirst({});
    let w = null;
    while (!reader.done && !(w && w.length)) w = await reader.next();
    const d = w && w.length ? new Date(w[0].at) : new Date();
    month = `${d.getUTCFullYear()}-${String(d.getUTCMonth() + 1).padStart(2, "0")}`;
  } catch (e) { main.append(errorBox(e)); return; }
  const pick = h("input", { type: "month", id: "statement-month", value: month, required: true });
  const err = h("div"), box = h("div", { id: "statement" });
  const csv = h("button", { type: "button", id: "statement-csv", class: "secondary" }, t("statement.csv"));
  const load = async () => {
    clear(box); clear(err);
    try {
      const s = await get(`/v1/statements/${pick.value}`);
      box.append(h("div", { class: "grid" },
        h("div", { class: "card stat" }, h("div", { class: "label" }, t("statement.opening")), h("div", { class: "value" }, money(s.opening_balance, s.currency))),
        h("div", { class: "card stat" }, h("div", { class: "label" }, t("statement.closing")), h("div", { class: "value" }, money(s.closing_balance, s.currency)))),
      h("h2", {}, t("statement.usage")),
      table([[t("txn.instance"), (u) => u.instance_id], [t("catalog.type"), (u) => u.gpu_type], [t("usage.card_hours_col"), (u) => u.card_hours], [t("usage.cost"), (u) => money(u.cost, s.currency)]], s.usage, t("usage.no_usage")),
      h("h2", {}, t("statement.storage")), h("div", { id: "statement-storage" }, storageTable(s.storage || [], s.currency)),
      h("h2", {}, t("usage.apps")), h("div", { id: "statement-apps" }, appsTable(s.apps || [], s.currency)),
      h("h2", {}, t("statement.transactions")), txnTable(s.transactions, s.currency));
    } catch (e) { err.append(errorBox(e)); }
  };
  pick.addEventListener("change", load);
  csv.addEventListener("click", () => busy(csv, async () => {
    const r = await raw("GET", `/v1/statements/${pick.value}`, { query: { format: "csv" } });
    download(`gpurent-statement-${pick.value}.csv`, await r.text(), "text/csv");
  }, err));
  main.append(h("div", { class: "inline card" }, field(t("statement.month"), pick), csv), err, box);
  await load();
}
