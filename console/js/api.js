// api.js: the console's only way to the REST API (/v1 on the same origin).
// The user's API key lives in sessionStorage: it is gone when the tab
// closes. Every failure becomes an ApiError whose code is the API's error
// code, and errorText() words it in the user's language.
import { t, has } from "./i18n.js";

export class ApiError extends Error {
  constructor(status, code, message, field, extra) {
    super(message);
    this.status = status; this.code = code; this.field = field; this.extra = extra || {};
  }
}

export function getKey() { return sessionStorage.getItem("gpurent.key"); }
export function setSession(token, user) {
  sessionStorage.setItem("gpurent.key", token);
  sessionStorage.setItem("gpurent.user", JSON.stringify(user));
}
export function getUser() {
  try { return JSON.parse(sessionStorage.getItem("gpurent.user") || "null"); } catch { return null; }
}
export function clearSession() {
  sessionStorage.removeItem("gpurent.key");
  sessionStorage.removeItem("gpurent.user");
}

// A proxy or gateway in front of the daemon answers with a page of its own,
// not the API's JSON error: its status still says what happened.
const STATUS_CODES = { 429: "too_many_requests", 502: "unavailable", 503: "unavailable", 504: "unavailable" };

// Retry-After (seconds, or an HTTP date) as whole seconds from now; 0 if none.
function retryAfter(r) {
  const v = (r.headers.get("Retry-After") || "").trim();
  if (!v) return 0;
  const n = /^\d+$/.test(v) ? Number(v) : Math.ceil((Date.parse(v) - Date.now()) / 1000);
  return Number.isFinite(n) && n > 0 ? n : 0;
}

// Until when the server asked to be left alone (its last Retry-After to
// a read): the pages' polls (ui.js every) wait until then. A Retry-After
// to an action is that action's own wait (one account's password guesses
// locked out for 15 minutes, a mail resent a minute early): it held up
// every page's polls, and an instance page stood still that long.
let quietUntil = 0;
export function retryWait() { return Math.max(0, quietUntil - Date.now()); }

// Listeners told when a call answers 401: the key expired or was revoked.
const onUnauthorized = [];
export function whenUnauthorized(fn) { onUnauthorized.push(fn); }

export async function raw(method, path, { body, query, headers, signal, accept } = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(query || {}))
    if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, v);
  const h = { ...(headers || {}) };
  const key = getKey();
  if (key) h.Authorization = `Bearer ${key}`;
  if (body !== undefined) h["Content-Type"] = "application/json";
  if (accept) h.Accept = accept;
  let r;
  try {
    r = await fetch(url, { method, headers: h, body: body === undefined ? undefined : JSON.stringify(body), signal });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, "network", e.message);
  }
  if (!r.ok) {
    let err = {};
    try { err = (await r.json()).error || {}; } catch { /* not JSON */ }
    const { code, message, field, ...extra } = err;
    const e = new ApiError(r.status, code || STATUS_CODES[r.status] || `http_${r.status}`, message || r.statusText, field, extra);
    e.retryAfter = retryAfter(r);
    if (e.retryAfter && method === "GET") quietUntil = Math.max(quietUntil, Date.now() + e.retryAfter * 1000);
    // Told once per session: a page's other requests with the same key
    // answer 401 too, and one sent with an earlier session's key must not
    // end the session logged in since. A wrong password (the login
    // form's invalid_credentials, typed while a session is open) is not
    // the key refused: it ended the session and drew the form again
    // without saying what was wrong.
    if (r.status === 401 && key && key === getKey() && e.code !== "invalid_credentials") onUnauthorized.forEach((fn) => fn(e));
    throw e;
  }
  return r;
}

export async function api(method, path, opts) {
  const r = await raw(method, path, opts);
  if (r.status === 204) return null;
  const type = r.headers.get("Content-Type") || "";
  return type.startsWith("application/json") ? r.json() : r.text();
}

export const get = (p, query, opts) => api("GET", p, { query, ...(opts || {}) });
export const post = (p, body, opts) => api("POST", p, { body, ...(opts || {}) });
export const put = (p, body) => api("PUT", p, { body });
export const patch = (p, body) => api("PATCH", p, { body });
export const del = (p) => api("DELETE", p);

// A random UUID (version 4) for an Idempotency-Key or a payment id.
// crypto.randomUUID exists only in secure contexts (https, loopback): a
// console opened at http://gpu.lan/ has getRandomValues alone.
export function newKey() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const x = [...b].map((v) => v.toString(16).padStart(2, "0")).join("");
  return `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20)}`;
}

// One key per filled-in form: pressing the button again after an answer
// was lost (the request may well have been done) sends the same key, so
// the server answers with what it did instead of doing it twice. A change
// to the form, or done() after a success, makes the next press a new one.
export function formKey(form) {
  let key = null, content = null;
  const snapshot = () => JSON.stringify([...form.querySelectorAll("input, select, textarea")]
    .map((el) => (el.type === "checkbox" || el.type === "radio" ? el.checked : el.value)));
  return {
    get() {
      const now = snapshot();
      if (!key || now !== content) { key = newKey(); content = now; }
      return key;
    },
    done() { key = null; },
  };
}

// All pages of a list (the API pages with cursor/next_cursor), up to max
// pages of 100; a list cut there says so (out.truncated, which table()
// tells the user), never silently.
export async function all(path, query, max = 20) {
  let out = [], cursor;
  for (let i = 0; i < max; i++) {
    const page = await get(path, { limit: 100, ...(query || {}), cursor });
    out = out.concat(page.data || []);
    if (!page.next_cursor) return out;
    cursor = page.next_cursor;
  }
  out.truncated = true;
  return out;
}

// The user's words for an error: the API's code in this language, the
// field, then the server's own message (exact, in English: it says what
// was wrong with the value, which the code alone does not).
export function errorText(e) {
  if (!(e instanceof ApiError)) return t("err.unexpected", { message: String(e && e.message || e) });
  // A code and field the catalogue words together ("err.forbidden.
  // current_password": the current password is wrong, not "you are not
  // allowed to do that") need no field named after them.
  const pair = `err.${e.code}.${e.field}`, k = e.field && has(pair) ? pair : `err.${e.code}`;
  let s = has(k) ? t(k, { field: e.field || "" }) : t("err.other", { code: e.code });
  if (e.field && has(k) && k !== pair) s += " " + t("err.field", { field: e.field });
  // The console's own checks (code console_*) carry the value typed; a
  // network failure the browser's words; the server's message is detail.
  const fromServer = e.status > 0 && !e.code.startsWith("console_");
  if (e.message && (fromServer || e.code.startsWith("console_"))) s += " " + t("err.detail", { message: e.message });
  if (e.retryAfter) s += " " + t("err.retry_in", { n: e.retryAfter });
  return s;
}
