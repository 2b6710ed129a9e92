// billing.js: usage (a chart of daily spend, card-hours per GPU type), the
// transactions list and the monthly statement with its CSV download.
// Daily spend is summed in the browser from the usage and storage
// transactions, by the user's own calendar day.
import { t, locale } from "../i18n.js";
import { get, all, raw } from "../api.js";
import { h, clear, money, money2, time, table, field, busy, errorBox, download } from "../ui.js";

const DAY_MS = 86400000;

function dayKey(d) { return `${d.getFullYear()}-${String(d.getMonth() + 1).padStart(2, "0")}-${String(d.getDate()).padStart(2, "0")}`; }

function spendChart(txns, currency) {
  const spend = txns.filter((x) => x.kind === "usage" || x.kind === "storage" || x.kind === "refund");
  if (!spend.length) return h("p", { class: "hint" }, t("usage.no_spend"));
  const last = new Date(Math.max(...spend.map((x) => Date.parse(x.at))));
  const days = [];
  for (let i = 29; i >= 0; i--) days.push(dayKey(new Date(last.getTime() - i * DAY_MS)));
  const sums = Object.fromEntries(days.map((d) => [d, 0]));
  for (const x of spend) {
    const k = dayKey(new Date(x.at));
    if (k in sums) sums[k] -= Number(x.amount); // charges are negative amounts
  }
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
    const [byType, txns] = await Promise.all([get("/v1/usage", { group_by: "gpu_type" }), all("/v1/transactions")]);
    const maxH = Math.max(0.01, ...byType.data.map((r) => Number(r.card_hours)));
    const box = h("div", {},
      h("div", { class: "card" }, h("h2", {}, t("usage.daily_spend")), spendChart(txns, byType.currency)),
      h("div", { class: "card", id: "card-hours" }, h("h2", {}, t("usage.card_hours")),
        byType.data.length ? byType.data.map((r) => h("div", { class: "hbar" }, h("span", {}, r.gpu_type),
          h("div", {}, h("div", { class: "fill", "data-width": Math.round((100 * Number(r.card_hours)) / maxH) })),
          h("span", { title: r.card_hours }, Number(r.card_hours).toFixed(2)))) : h("p", { class: "hint" }, t("usage.no_usage")),
        h("p", { class: "hint" }, t("usage.period", { from: new Date(byType.from).toLocaleDateString(locale()), to: new Date(byType.to).toLocaleDateString(locale()) }))),
      h("h2", {}, t("usage.by_type")),
      table([[t("catalog.type"), (r) => r.gpu_type], [t("usage.card_hours_col"), (r) => r.card_hours], [t("usage.cost"), (r) => money(r.cost, byType.currency)],
        [t("usage.by_credit"), (r) => money(r.paid_by_credit, byType.currency)], [t("usage.by_cash"), (r) => money(r.paid_by_cash, byType.currency)]], byType.data, t("usage.no_usage")));
    main.append(box);
    sizeBars(box);
  } catch (e) { main.append(errorBox(e)); }
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
  const box = h("div", { id: "transactions" });
  const load = async () => {
    clear(box);
    try { box.append(txnTable((await all("/v1/transactions", { kind: kind.value })).reverse())); } catch (e) { box.append(errorBox(e)); }
  };
  kind.addEventListener("change", load);
  main.append(h("div", { class: "inline card" }, field(t("txn.kind"), kind)), box);
  await load();
}

export async function statement(main) {
  main.append(h("h1", {}, t("statement.title")));
  let month;
  try {
    // The month of the newest transaction (the list is oldest first).
    const txns = await all("/v1/transactions");
    const d = txns.length ? new Date(txns[txns.length - 1].at) : new Date();
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
