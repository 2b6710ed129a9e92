// reservations.js: capacity blocks (issue 16): the free reservable cards of
// a GPU type per hour, booking a block of whole hours with its price shown
// before it is paid, the user's reservations with their states, one
// reservation's page, and cancelling with the refund rule said first.
// Hours are entered and shown in the browser's time zone; the API speaks UTC.
import { t, locale } from "../i18n.js";
import { get, post, del, all, ApiError, errorText, formKey } from "../api.js";
import { h, add, clear, money, time, table, field, busy, errorBox, badge, toast } from "../ui.js";

const HOUR_MS = 3600000;

// The API's time form: UTC to the second, no milliseconds.
export function isoHour(ms) { return new Date(ms).toISOString().replace(/\.\d{3}Z$/, "Z"); }

// A Date as a datetime-local input's value, in the browser's time zone.
function localInput(ms) {
  const d = new Date(ms), p = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
}

function nextHour() { return Math.floor(Date.now() / HOUR_MS) * HOUR_MS + HOUR_MS; }

// The first hour the page shows: ?from=ISO (a link into a given day), else
// the browser's next whole hour.
function firstHour(ctx) {
  const q = Date.parse(ctx.query.get("from") || "");
  return isNaN(q) ? nextHour() : Math.floor(q / HOUR_MS) * HOUR_MS;
}

// A datetime-local value as milliseconds, refused unless it is a whole
// hour in UTC too (the API books whole hours; a zone offset of half an
// hour cannot name one).
function wholeHour(value, fieldName) {
  const ms = new Date(value).getTime();
  if (!value || isNaN(ms)) throw new ApiError(400, "console_time", value, fieldName);
  if (ms % HOUR_MS !== 0) throw new ApiError(400, "console_whole_hour", value, fieldName);
  return ms;
}

// Cards and hours are whole numbers of at least one (a fraction would
// also break the BigInt price below).
function wholeNumber(value, fieldName) {
  const n = Number(value);
  if (!/^\s*\d+\s*$/.test(value) || !Number.isSafeInteger(n) || n < 1) throw new ApiError(400, "console_whole_number", value, fieldName);
  return n;
}

// "2.00" x cards x hours exactly, in micro-yuan (BigInt), back as "96.00".
function microOf(amount) {
  const [i, f = ""] = String(amount).split(".");
  return BigInt(i) * 1000000n + BigInt((f + "000000").slice(0, 6));
}
function amountOf(micro) {
  const s = micro.toString().padStart(7, "0");
  return `${s.slice(0, -6)}.${s.slice(-6, -4)}${s.slice(-4).replace(/0+$/, "")}`;
}
export function blockPrice(price, cards, hours) { return amountOf(microOf(price) * BigInt(cards) * BigInt(hours)); }

export function zoneName() { return Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC"; }

function hourLabel(iso) {
  return new Date(iso).toLocaleString(locale(), { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
}

function refundRule() { return h("p", { class: "hint", id: "refund-rule" }, t("resv.refund_rule")); }

function reservableTypes(types) { return types.filter((g) => g.reservation_required || g.cards_reservable > 0); }

function availabilityView(types, ctx) {
  // Named as the query's fields (the hours as the window's end, "to"): an
  // error that names one marks it (ui.js busy).
  const type = h("select", { id: "avail-type", name: "gpu_type" }, types.map((g) => h("option", { value: g.code }, g.code)));
  if (ctx.query.get("gpu_type")) type.value = ctx.query.get("gpu_type");
  const from = h("input", { type: "datetime-local", id: "avail-from", name: "from", step: 3600, value: localInput(firstHour(ctx)), required: true });
  const hours = h("input", { type: "number", id: "avail-hours", name: "hours", "data-api-field": "to", min: 1, max: 168, value: 24, required: true });
  const err = h("div"), out = h("div", { id: "availability" });
  const btn = h("button", { type: "submit", id: "avail-show" }, t("resv.show"));
  const load = async () => {
    const start = wholeHour(from.value, "from");
    const r = await get("/v1/reservations/availability", { gpu_type: type.value, from: isoHour(start), to: isoHour(start + Number(hours.value) * HOUR_MS) });
    const max = Math.max(1, ...r.hours.map((x) => x.cards_free));
    clear(out).append(
      h("div", { class: "chart", role: "img", "aria-label": t("resv.availability") },
        r.hours.map((x) => h("div", { class: "bar", title: `${hourLabel(x.starts_at)}: ${x.cards_free}`, "data-height": Math.round((100 * x.cards_free) / max) }))),
      r.hours.length ? h("div", { class: "chart-labels" }, h("span", {}, hourLabel(r.hours[0].starts_at)), h("span", {}, hourLabel(r.hours[r.hours.length - 1].starts_at))) : null,
      h("details", {}, h("summary", {}, t("resv.as_table")),
        table([[t("resv.hour"), (x) => hourLabel(x.starts_at)], [t("resv.cards_free"), (x) => h("span", { "data-hour": x.starts_at }, String(x.cards_free))]], r.hours)));
    for (const b of out.querySelectorAll(".bar[data-height]")) b.style.height = `${b.dataset.height}%`;
  };
  const form = h("form", { class: "inline card", id: "avail-form" },
    field(t("catalog.type"), type), field(t("resv.from"), from), field(t("resv.hours"), hours), btn);
  form.addEventListener("submit", (e) => { e.preventDefault(); busy(btn, load, err); });
  return { box: h("div", { class: "card" }, h("h2", {}, t("resv.availability")), form, err, out), run: () => busy(btn, load, err) };
}

function bookForm(types, reload, ctx) {
  const byCode = Object.fromEntries(types.map((g) => [g.code, g]));
  const type = h("select", { id: "book-type", name: "gpu_type", required: true }, types.map((g) => h("option", { value: g.code }, g.code)));
  if (ctx.query.get("gpu_type") && byCode[ctx.query.get("gpu_type")]) type.value = ctx.query.get("gpu_type");
  const cards = h("input", { type: "number", id: "book-cards", name: "cards", min: 1, max: 256, value: 8, required: true });
  const start = h("input", { type: "datetime-local", id: "book-start", name: "starts_at", step: 3600, value: localInput(firstHour(ctx) + HOUR_MS), required: true });
  const hours = h("input", { type: "number", id: "book-hours", name: "hours", "data-api-field": "ends_at", min: 1, max: 8784, value: 3, required: true });
  const quote = h("div", { class: "card estimate", id: "book-quote", "aria-live": "polite" });
  const err = h("div", { id: "book-error" }), done = h("div", { id: "book-done" });
  const btn = h("button", { type: "submit", id: "book-submit" }, t("resv.book"));
  const refresh = () => {
    clear(quote);
    const g = byCode[type.value];
    const price = g && g.reservation_price_per_card_hour;
    if (!price) { quote.append(h("div", { class: "warn" }, t("resv.no_price"))); return; }
    let s, n, hrs;
    try {
      s = wholeHour(start.value, "starts_at");
      n = wholeNumber(cards.value, "cards");
      hrs = wholeNumber(hours.value, "hours");
    } catch (e) { quote.append(errorBox(e)); return; }
    quote.append(
      h("div", {}, t("resv.window", { zone: zoneName() }), " ", time(isoHour(s)), " → ", time(isoHour(s + hrs * HOUR_MS))),
      h("div", {}, t("resv.price_formula", { cards: n, hours: hrs, price: money(price, g.currency).textContent }), " ",
        h("strong", { id: "book-total" }, money(blockPrice(price, n, hrs), g.currency))),
      h("div", { class: "hint" }, t("resv.paid_now")));
  };
  for (const el of [type, cards, start, hours]) el.addEventListener("input", refresh);
  const form = h("form", { class: "stack card", id: "book-form" }, h("h2", {}, t("resv.book_title")),
    field(t("catalog.type"), type), field(t("resv.cards"), cards, t("resv.cards_hint")),
    field(t("resv.start"), start, t("resv.zone_hint", { zone: zoneName() })), field(t("resv.hours"), hours), quote, refundRule(), err, done, btn);
  const idem = formKey(form);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(btn, async () => {
      const s = wholeHour(start.value, "starts_at");
      const n = wholeNumber(cards.value, "cards"), hrs = wholeNumber(hours.value, "hours");
      const r = await post("/v1/reservations", { gpu_type: type.value, cards: n, starts_at: isoHour(s), ends_at: isoHour(s + hrs * HOUR_MS) },
        { headers: { "Idempotency-Key": idem.get() } });
      idem.done(); // booking the same block again is a second booking
      clear(done).append(h("div", { class: "ok" }, t("resv.booked", { id: r.id }), " ", money(r.amount, r.currency)));
      toast(t("resv.booked", { id: r.id }));
      await reload();
    }, err);
  });
  refresh();
  return form;
}

// Cancels after saying what comes back; the answer's refund is told.
function cancelButton(r, after, err) {
  const b = h("button", { type: "button", class: "danger", id: `cancel-${r.id}`, "data-reservation": r.id, "aria-label": `${t("resv.cancel")} ${r.id}` }, t("resv.cancel"));
  b.addEventListener("click", () => {
    if (!confirm(`${t("resv.confirm_cancel")}\n${t("resv.refund_rule")}`)) return;
    busy(b, async () => {
      const c = await del(`/v1/reservations/${r.id}`);
      toast(t("resv.cancelled", { amount: money(c.refunded, c.currency).textContent }));
      await after(c);
    }, err);
  });
  return b;
}

function reservationColumns(after, err) {
  return [
    [t("resv.id"), (r) => h("a", { href: `#/reservations/${r.id}` }, r.id)],
    [t("catalog.type"), (r) => `${r.cards} × ${r.gpu_type}`],
    [t("resv.start"), (r) => time(r.starts_at)], [t("resv.end"), (r) => time(r.ends_at)],
    [t("resv.state"), (r) => h("span", { class: "resv-state", "data-reservation": r.id, "data-state": r.state }, badge(r.state))],
    [t("resv.amount"), (r) => money(r.amount, r.currency)],
    [t("resv.refunded"), (r) => h("span", { class: "resv-refunded", "data-reservation": r.id }, money(r.refunded, r.currency))],
    ["", (r) => [r.state === "active" ? h("a", { href: `#/launch?reservation_id=${r.id}` }, t("resv.launch_in")) : null,
      r.state === "upcoming" ? cancelButton(r, after, err) : null]],
  ];
}

export async function page(main, params, ctx) {
  main.append(h("h1", {}, t("resv.title")), h("p", { class: "hint" }, t("resv.intro", { zone: zoneName() })));
  let types;
  try { types = reservableTypes((await get("/v1/gpu-types")).data); } catch (e) { main.append(errorBox(e)); return; }
  const listErr = h("div"), listBox = h("div", { id: "reservations" });
  let avail = null;
  // After a booking or a cancellation the list and the free cards are read
  // again: the chart showed the cards just booked as still free.
  const reload = async () => {
    clear(listErr);
    if (avail) avail.run();
    try {
      const rows = (await all("/v1/reservations")).sort((a, b) => Date.parse(b.created_at) - Date.parse(a.created_at));
      clear(listBox).append(table(reservationColumns(reload, listErr), rows, t("resv.empty")));
    } catch (e) { listErr.append(errorBox(e)); }
  };
  if (!types.length) main.append(h("p", { class: "hint" }, t("resv.no_types")));
  else {
    avail = availabilityView(types, ctx);
    main.append(avail.box, bookForm(types, reload, ctx));
  }
  main.append(h("h2", {}, t("resv.mine")), listErr, listBox);
  await reload();
}

export async function detail(main, params) {
  main.append(h("h1", {}, t("resv.detail"), " ", h("code", {}, params.id)));
  const box = h("div"), err = h("div");
  main.append(err, box);
  const draw = (r) => {
    add(clear(box), h("div", { class: "card grid", id: "reservation" },
      h("div", {}, h("div", { class: "hint" }, t("resv.state")), h("span", { id: "reservation-state", "data-state": r.state }, badge(r.state))),
      h("div", {}, h("div", { class: "hint" }, t("catalog.type")), `${r.cards} × ${r.gpu_type}`),
      h("div", {}, h("div", { class: "hint" }, t("resv.window", { zone: zoneName() })), time(r.starts_at), " → ", time(r.ends_at)),
      h("div", {}, h("div", { class: "hint" }, t("resv.amount")), money(r.amount, r.currency), " ",
        t("resv.price_formula", { cards: r.cards, hours: r.hours, price: money(r.price_per_card_hour, r.currency).textContent })),
      h("div", {}, h("div", { class: "hint" }, t("resv.refunded")), h("span", { id: "reservation-refunded" }, money(r.refunded, r.currency))),
      Number(r.credited) ? h("div", {}, h("div", { class: "hint" }, t("resv.credited")), money(r.credited, r.currency)) : null,
      r.fabric ? h("div", {}, h("div", { class: "hint" }, t("resv.fabric")), r.fabric) : null,
      r.cancelled_at ? h("div", {}, h("div", { class: "hint" }, t("resv.cancelled_at")), time(r.cancelled_at)) : null),
    h("div", { class: "actions" },
      r.state === "active" ? h("a", { href: `#/launch?reservation_id=${r.id}`, id: "reservation-launch" }, t("resv.launch_in")) : null,
      r.state === "upcoming" ? cancelButton(r, async (c) => draw(c), err) : null),
    r.state === "upcoming" ? refundRule() : null);
  };
  try { draw(await get(`/v1/reservations/${encodeURIComponent(params.id)}`)); } catch (e) {
    err.append(h("div", { class: "error", id: "reservation-error" }, errorText(e)));
  }
}
