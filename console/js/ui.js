// ui.js: building the page from elements, never parsed markup (every API value is
// text, never markup), formatting money and times for a person, and the
// shared pieces: error boxes, busy buttons, tables, toasts.
import { t, locale } from "./i18n.js";
import { errorText, retryWait } from "./api.js";

// h("button", {class: "x", onclick: fn}, "text", child...)
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "value") el.value = v;
    else if (k === "checked") el.checked = !!v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// el.append(...children) as h() takes children: null, undefined and false
// are skipped (DOM append() writes them as the words "null" and "false"),
// arrays are flattened.
export function add(el, ...children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

export function clear(el) { while (el.firstChild) el.firstChild.remove(); return el; }

// An amount (the API's exact decimal string, or a number) to two decimals,
// rounded half away from zero in whole cents counted as BigInt: the same
// digits everywhere (Intl and toFixed rounded 1.005 differently, both
// through binary floating point), grouped in the user's language, and no
// "-0.00" for a sliver of a fen.
export function money2(amount) {
  const s = typeof amount === "number" ? amount.toFixed(6) : String(amount).trim();
  const m = /^([+-]?)(\d*)(?:\.(\d*))?$/.exec(s);
  if (!m || (!m[2] && !m[3])) return s;
  const micro = BigInt(m[2] || "0") * 1000000n + BigInt(((m[3] || "") + "000000").slice(0, 6));
  const cents = micro / 10000n + (micro % 10000n >= 5000n ? 1n : 0n);
  const sign = m[1] === "-" && cents > 0n ? "-" : "";
  return `${sign}${(cents / 100n).toLocaleString(locale())}.${String(cents % 100n).padStart(2, "0")}`;
}

// Money as a person reads it: two decimals and the currency; the exact
// amount the API gave (micro-yuan precision) in the tooltip.
export function money(amount, currency = "CNY") {
  if (amount === null || amount === undefined || amount === "") return h("span", { class: "money" }, "—");
  return h("span", { class: "money", title: `${amount} ${currency}`, "data-amount": amount }, `${money2(amount)} ${currency}`);
}

// Times in the browser's own time zone, in the user's language.
export function time(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  if (isNaN(d)) return iso;
  return h("time", { datetime: iso, title: iso }, d.toLocaleString(locale(), { dateStyle: "medium", timeStyle: "medium" }));
}

export function minutesText(m) {
  if (m === null || m === undefined) return t("common.unlimited");
  if (m < 60) return t("common.minutes", { n: m });
  if (m < 48 * 60) return t("common.hours", { n: (m / 60).toFixed(1) });
  return t("common.days", { n: (m / 1440).toFixed(1) });
}

export function badge(state) { return h("span", { class: `badge ${state}` }, t(`state.${state}`)); }

export function errorBox(e) { return h("div", { class: "error", role: "alert" }, errorText(e)); }

export function toast(text, bad) {
  const box = document.getElementById("toast");
  const el = h("div", { class: bad ? "bad" : "" }, text);
  box.append(el);
  setTimeout(() => el.remove(), 6000);
}

// Copies text to the clipboard and says so. navigator.clipboard exists only
// in secure contexts (not at http://gpu.lan/) and may be refused: then
// the text in el is selected and copied the old way, and where even that
// fails the user is told to copy the selection.
export async function copyText(text, el) {
  try {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
      toast(t("connect.copied"));
      return;
    }
  } catch { /* refused: the old way below */ }
  let ok = false;
  if (el) {
    const range = document.createRange();
    range.selectNodeContents(el);
    const sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
    try { ok = document.execCommand("copy"); } catch { ok = false; }
  }
  toast(ok ? t("connect.copied") : t("connect.copy_by_hand"), !ok);
}

// The input that an error names (its field, the input's name, or its
// data-api-field where the API gets its value under another name: a
// window's length in hours sent as the window's end), in errSlot's form or
// else the pressed button's (an admin page's error line sits below its
// forms): marked invalid, described by the error's box and focused, so a
// screen reader says what is wrong where the user is. Without this the
// error was a line under the form that named the field by its API name.
let errorBoxes = 0;
function markField(form, e, box) {
  const input = form && e && e.field && [...form.elements].find((el) => el.name === e.field || el.dataset.apiField === e.field);
  if (!input) return;
  box.id = `error-${++errorBoxes}`;
  input.setAttribute("aria-invalid", "true");
  input.setAttribute("aria-describedby", box.id);
  input.focus();
}
// The marks the errors in errSlot made, taken off with them (one slot may
// serve two forms).
function unmarkFields(errSlot) {
  for (const box of errSlot.querySelectorAll("[id^='error-']"))
    for (const el of document.querySelectorAll(`[aria-describedby="${box.id}"]`)) {
      el.removeAttribute("aria-invalid");
      el.removeAttribute("aria-describedby");
    }
}

// Runs fn with the button disabled and showing progress; an error goes
// into errSlot (or a toast), never silently. A button whose action took
// the console to another page (ctx.navigate) stays disabled: that page
// replaces this one a moment later, and an Enter pressed in between
// submitted the form again (a second instance).
export async function busy(button, fn, errSlot) {
  const label = button.textContent;
  const from = location.hash;
  button.disabled = true;
  button.classList.add("progress");
  if (errSlot) { unmarkFields(errSlot); clear(errSlot); }
  try {
    return await fn();
  } catch (e) {
    if (errSlot) markField(errSlot.closest("form") || button.form, e, errSlot.appendChild(errorBox(e)));
    else toast(errorText(e), true);
    return undefined;
  } finally {
    if (location.hash === from) button.disabled = false;
    button.classList.remove("progress");
    button.textContent = label;
  }
}

// A box that may scroll (a wide table on a phone, a long command): while
// its content overflows it is a region named label that the keyboard can
// reach (tabindex 0) and scroll with the arrow keys, and no tab stop
// otherwise. Without this a table or command wider than the screen could
// be scrolled with a mouse only.
const reached = new WeakSet();
const overflowWatch = new ResizeObserver((entries) => {
  for (const { target: el } of entries) {
    if (!el.isConnected) { if (reached.has(el)) overflowWatch.unobserve(el); continue; }
    reached.add(el);
    const over = el.scrollWidth > el.clientWidth + 1 || el.scrollHeight > el.clientHeight + 1;
    if (over && !el.hasAttribute("tabindex")) {
      const label = el.dataset.scrollLabel || (document.querySelector("main h1") || {}).textContent || "";
      el.setAttribute("tabindex", "0");
      el.setAttribute("role", "region");
      el.setAttribute("aria-label", label);
    } else if (!over && el.hasAttribute("tabindex")) {
      for (const a of ["tabindex", "role", "aria-label"]) el.removeAttribute(a);
    }
  }
});
export function scrollable(el, label) {
  if (label) el.dataset.scrollLabel = label;
  overflowWatch.observe(el);
  return el;
}

// A table of rows (columns: [heading, row => cell]); label names it where
// it must scroll sideways (the page's title if none).
export function table(columns, rows, empty, label) {
  if (!rows.length) return h("p", { class: "hint" }, empty || t("common.none"));
  return scrollable(h("div", { class: "table-wrap" }, rows.truncated ? h("p", { class: "warn" }, t("common.truncated", { n: rows.length })) : null,
    h("table", {},
      // A column of buttons has no heading to show, but a screen reader
      // still names it.
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col" },
        c[0] === "" ? h("span", { class: "sr-only" }, t("common.actions")) : c[0])))),
      h("tbody", {}, rows.map((r) => h("tr", {}, columns.map((c) => h("td", {}, c[1](r)))))))), label);
}

export function field(label, input, hint) {
  return h("label", { class: "field" }, h("span", {}, label), input, hint ? h("span", { class: "hint" }, hint) : null);
}

export function download(name, text, type) {
  const url = URL.createObjectURL(new Blob([text], { type: type || "text/plain" }));
  const a = h("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

// What names a focusable element across redraws: its id, else its tag with
// its data-* attributes, href and name (a node's Drain button, an instance
// link in a list).
function focusKey(el) {
  if (el.id) return `#${el.id}`;
  const parts = [el.tagName];
  for (const a of el.attributes) if (a.name.startsWith("data-") || a.name === "href" || a.name === "name") parts.push(`${a.name}=${a.value}`);
  return parts.length > 1 ? parts.join(" ") : null;
}

// Runs redraw(), which replaces what box holds (a polled page's table or
// buttons), and gives the keyboard focus back to the element of the same
// key in the new content, with the caret or selection where it was: a
// poll threw focus back to <body> every few seconds, and the next Tab
// started again at the top of the page.
export function keepFocus(box, redraw) {
  const was = document.activeElement;
  const key = was && was !== box && box.contains(was) ? focusKey(was) : null;
  let range = null;
  try { if (key && typeof was.selectionStart === "number") range = [was.selectionStart, was.selectionEnd, was.selectionDirection]; } catch { /* no selection on this input type */ }
  const out = redraw();
  if (key && !was.isConnected) {
    const now = [...box.querySelectorAll("a[href], button, input, select, textarea, [tabindex]")].find((el) => focusKey(el) === key);
    if (now) {
      now.focus({ preventScroll: true });
      if (range) try { now.setSelectionRange(...range); } catch { /* no selection on this input type */ }
    }
  }
  return out;
}

// Polls fn every ms while the page is the current one (alive() true), and
// no sooner than the server's last Retry-After allows: a page polling a
// server that answered 429 or 503 every two seconds kept it busy. While
// polls fail, errSlot says why (a page that silently stopped updating
// looked current); the next poll that succeeds empties it.
export function every(ms, fn, alive, errSlot) {
  let timer;
  const tick = async () => {
    if (!alive()) return;
    try {
      await fn();
      clear(errSlot);
    } catch (e) {
      // Written again only when it changes: an alert at every poll would
      // be read out at every poll.
      const box = errorBox(e);
      if (box.textContent !== errSlot.textContent) clear(errSlot).append(box);
    } finally { if (alive()) timer = setTimeout(tick, Math.max(ms, retryWait())); }
  };
  timer = setTimeout(tick, ms);
  return () => clearTimeout(timer);
}
