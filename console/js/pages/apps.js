// apps.js: the app marketplace (issue 17): the public list of apps with
// their prices, an app's page with its gateway base URL and snippets to
// call it, and for publishers the publish form, their apps with replicas,
// editing, deleting and the per-day stats. An app's gateway_url (the
// operator's gateway_public_url) gives its address; where the operator set
// none, the page asks for it once (remembered in localStorage; by default
// this host's port 8084, where `make run` puts it).
import { t, locale } from "../i18n.js";
import { get, post, patch, del, all, getUser, getKey, ApiError } from "../api.js";
import { h, add, clear, time, table, field, busy, errorBox, badge, toast, scrollable } from "../ui.js";

const PRICES = [["per_request", "price_per_request"], ["per_1k_input_tokens", "price_per_1k_input_tokens"],
  ["per_1k_output_tokens", "price_per_1k_output_tokens"], ["per_second", "price_per_second"]];

function gatewayBase() { return localStorage.getItem("gpurent.gateway") || `${location.protocol}//${location.hostname}:8084`; }

// App prices are fractions of a fen (0.002 per 1k tokens): all six
// decimals the API allows, not money()'s two.
function price(amount, currency = "CNY") {
  const shown = Number(amount).toLocaleString(locale(), { minimumFractionDigits: 2, maximumFractionDigits: 6 });
  return h("span", { class: "money", title: `${amount} ${currency}`, "data-amount": amount }, `${shown} ${currency}`);
}

function priceList(a) {
  const p = a.prices || {};
  const shown = PRICES.filter(([k]) => p[k] && Number(p[k]) > 0);
  if (!shown.length) return t("apps.free");
  return h("span", { class: "prices" }, shown.map(([k], i) => [i ? " · " : "", price(p[k]), " ", t(`apps.${k}`)]));
}

export async function market(main) {
  main.append(h("h1", {}, t("apps.title")), h("p", { class: "hint" }, t("apps.intro")));
  if (getKey()) main.append(h("div", { class: "actions" }, h("a", { href: "#/publish", id: "apps-publish" }, t("nav.publish")), h("a", { href: "#/my-apps" }, t("nav.my-apps"))));
  const box = h("div", { id: "apps" });
  main.append(box);
  try {
    const apps = await all("/v1/apps");
    box.append(table([
      [t("common.name"), (a) => (getKey() ? h("a", { href: `#/apps/${a.slug}`, "data-slug": a.slug }, a.name) : h("strong", { "data-slug": a.slug }, a.name))],
      [t("apps.description"), (a) => a.description || ""],
      [t("apps.prices"), priceList],
      [t("catalog.type"), (a) => `${a.cards_per_replica || 1} × ${a.gpu_type}`]], apps, t("apps.empty")));
  } catch (e) { box.append(errorBox(e)); }
}

function snippets(a) {
  const url = a.gateway_url ? `${a.gateway_url.replace(/\/+$/, "")}/v1` : `${gatewayBase()}/apps/${a.slug}/v1`;
  const curl = `curl -s ${url}/chat/completions -H "Authorization: Bearer $GPURENT_KEY" \\\n  -H "Content-Type: application/json" \\\n  -d '{"messages":[{"role":"user","content":"hi"}],"stream":true}'`;
  const py = `from openai import OpenAI\nclient = OpenAI(base_url="${url}", api_key=os.environ["GPURENT_KEY"])\nr = client.chat.completions.create(model="${a.slug}",\n    messages=[{"role": "user", "content": "hi"}])\nprint(r.choices[0].message.content)`;
  return h("div", { id: "app-snippets" },
    h("div", {}, t("apps.base_url"), " ", h("code", { id: "app-base-url" }, url)),
    h("h3", {}, "curl"), scrollable(h("pre", { class: "cmd", id: "app-curl" }, curl), "curl"),
    h("h3", {}, t("apps.openai_client")), scrollable(h("pre", { class: "cmd", id: "app-python" }, "import os\n" + py), t("apps.openai_client")),
    h("p", { class: "hint" }, t("apps.key_hint")));
}

function gatewayField(redraw) {
  const input = h("input", { id: "app-gateway", value: gatewayBase(), placeholder: "https://gateway.example.com" });
  input.addEventListener("change", () => {
    const v = input.value.trim().replace(/\/+$/, "");
    if (v) localStorage.setItem("gpurent.gateway", v); else localStorage.removeItem("gpurent.gateway");
    redraw();
  });
  return field(t("apps.gateway"), input, t("apps.gateway_hint"));
}

// The stored command as the form shows it: a line for sh -c as it was
// typed, any other argument list as JSON; commandOf() reads it back, so a
// command passes through the edit form unchanged (joining the array with
// spaces and wrapping it in sh -c again nested one more shell each save).
function commandText(cmd) {
  if (!cmd || !cmd.length) return "";
  if (cmd.length === 3 && cmd[0] === "sh" && cmd[1] === "-c" && !/^\s*\[/.test(cmd[2])) return cmd[2];
  return JSON.stringify(cmd);
}
function commandOf(text) {
  const s = text.trim();
  if (!s) return [];
  if (s.startsWith("[")) {
    let v;
    try { v = JSON.parse(s); } catch { v = null; }
    if (Array.isArray(v) && v.every((x) => typeof x === "string")) return v;
  }
  return ["sh", "-c", s];
}

// Fields of POST /v1/apps (and PATCH, without slug), with their inputs.
function appFields(a) {
  const v = (k, d) => (a && a[k] !== undefined ? a[k] : d);
  const p = (a && a.prices) || {};
  const f = {
    slug: h("input", { id: "app-slug", required: true, pattern: "[a-z0-9][a-z0-9\\-]{2,39}", value: v("slug", "") }),
    name: h("input", { id: "app-name", required: true, maxlength: 80, value: v("name", "") }),
    description: h("textarea", { id: "app-description", maxlength: 2000, value: v("description", "") }),
    image: h("input", { id: "app-image", required: true, value: v("image", "rocm/pytorch:2.3-rocm6.2") }),
    command: h("input", { id: "app-command", class: "mono", value: commandText(v("command", [])), placeholder: "python3 -m vllm.entrypoints.openai.api_server --port 8000" }),
    env: h("textarea", { id: "app-env", class: "mono", placeholder: "KEY=value\nSECRET_TOKEN=…" }),
    port: h("input", { id: "app-port", type: "number", min: 1, max: 65535, required: true, value: v("port", 8000) }),
    gpu_type: h("input", { id: "app-gpu-type", required: true, value: v("gpu_type", "MI450") }),
    cards_per_replica: h("input", { id: "app-cards", type: "number", min: 1, max: 64, value: v("cards_per_replica", 1) }),
    min_replicas: h("input", { id: "app-min", type: "number", min: 0, max: 64, value: v("min_replicas", 0) }),
    max_replicas: h("input", { id: "app-max", type: "number", min: 1, max: 64, value: v("max_replicas", 1) }),
    concurrency_target: h("input", { id: "app-concurrency", type: "number", min: 1, max: 10000, value: v("concurrency_target", 4) }),
    idle_seconds: h("input", { id: "app-idle", type: "number", min: 10, max: 86400, value: v("idle_seconds", 300) }),
    visibility: h("select", { id: "app-visibility" }, ["public", "private"].map((x) => h("option", { value: x }, t(`apps.${x}`)))),
    allowed_users: h("input", { id: "app-allowed", class: "mono", value: (v("allowed_users", []) || []).join(", "), placeholder: "usr_…, usr_…" }),
    price_per_request: h("input", { id: "app-price-request", inputmode: "decimal", value: p.per_request || "0" }),
    price_per_1k_input_tokens: h("input", { id: "app-price-in", inputmode: "decimal", value: p.per_1k_input_tokens || "0" }),
    price_per_1k_output_tokens: h("input", { id: "app-price-out", inputmode: "decimal", value: p.per_1k_output_tokens || "0" }),
    price_per_second: h("input", { id: "app-price-second", inputmode: "decimal", value: p.per_second || "0" }),
    rate_limit_per_key: h("input", { id: "app-rate-key", type: "number", min: 0, max: 100000, value: v("rate_limit_per_key", 0) }),
    rate_limit_per_app: h("input", { id: "app-rate-app", type: "number", min: 0, max: 1000000, value: v("rate_limit_per_app", 0) }),
  };
  f.visibility.value = v("visibility", "public");
  for (const [k, el] of Object.entries(f)) el.name = k; // the API's field names: an error's field finds its input
  return f;
}

function fieldRows(f, withSlug) {
  return [withSlug ? field(t("apps.slug"), f.slug, t("apps.slug_hint")) : null,
    field(t("common.name"), f.name), field(t("apps.description"), f.description),
    field(t("launch.image"), f.image), field(t("launch.command"), f.command, t("apps.command_hint")),
    field(t("launch.env"), f.env, t("apps.env_hint")), field(t("apps.port"), f.port),
    field(t("catalog.type"), f.gpu_type), field(t("apps.cards_per_replica"), f.cards_per_replica),
    h("div", { class: "inline" }, field(t("apps.min_replicas"), f.min_replicas, t("apps.min_hint")), field(t("apps.max_replicas"), f.max_replicas),
      field(t("apps.concurrency"), f.concurrency_target), field(t("apps.idle_seconds"), f.idle_seconds)),
    field(t("apps.visibility"), f.visibility), field(t("apps.allowed_users"), f.allowed_users, t("apps.allowed_hint")),
    h("fieldset", {}, h("legend", {}, t("apps.prices")),
      PRICES.map(([k, body]) => field(t(`apps.${k}`), f[body]))),
    h("div", { class: "inline" }, field(t("apps.rate_per_key"), f.rate_limit_per_key), field(t("apps.rate_per_app"), f.rate_limit_per_app))];
}

// The inputs as a request body; env lines "KEY=value" (a "!" before the
// name marks it secret), numbers as numbers.
function bodyOf(f, withSlug) {
  const b = {};
  if (withSlug) b.slug = f.slug.value.trim();
  for (const k of ["name", "description", "image", "gpu_type", "visibility", "price_per_request", "price_per_1k_input_tokens", "price_per_1k_output_tokens", "price_per_second"])
    b[k] = f[k].value.trim();
  for (const k of ["port", "cards_per_replica", "min_replicas", "max_replicas", "concurrency_target", "idle_seconds", "rate_limit_per_key", "rate_limit_per_app"])
    b[k] = Number(f[k].value);
  b.command = commandOf(f.command.value);
  const env = f.env.value.split("\n").map((l) => l.trim()).filter(Boolean).map((l) => {
    const i = l.indexOf("=");
    if (i <= 0) throw new ApiError(400, "console_env", l, "env");
    const secret = l.startsWith("!");
    return { name: l.slice(secret ? 1 : 0, i), value: l.slice(i + 1), secret };
  });
  if (env.length || withSlug) b.env = env;
  b.allowed_users = f.allowed_users.value.split(/[\s,]+/).filter(Boolean);
  return b;
}

export async function publish(main, params, ctx) {
  main.append(h("h1", {}, t("apps.publish_title")), h("p", { class: "hint" }, t("apps.publish_intro")));
  const f = appFields(null);
  const err = h("div", { id: "publish-error" }), btn = h("button", { type: "submit", id: "publish-submit" }, t("apps.publish"));
  const form = h("form", { class: "stack card", id: "publish-form" }, fieldRows(f, true), err, btn);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(btn, async () => {
      const a = await post("/v1/apps", bodyOf(f, true));
      toast(t("apps.published", { slug: a.slug }));
      ctx.navigate(`#/apps/${a.slug}`);
    }, err);
  });
  main.append(form);
}

function replicaSummary(a) {
  const rs = a.replicas || [];
  return rs.length ? rs.map((r, i) => [i ? " " : "", h("a", { href: `#/instances/${r.instance_id}` }, badge(r.state))]) : t("apps.no_replicas");
}

export async function mine(main) {
  main.append(h("h1", {}, t("nav.my-apps")), h("div", { class: "actions" }, h("a", { href: "#/publish" }, t("nav.publish"))));
  const box = h("div", { id: "my-apps" });
  main.append(box);
  try {
    // The caller's own apps, private ones too; each read whole for its replicas.
    const slugs = (await all("/v1/apps", { mine: 1 })).map((a) => a.slug);
    const own = [];
    for (const slug of slugs) {
      try { own.push(await get(`/v1/apps/${encodeURIComponent(slug)}`)); } catch (e) {
        if (e.code !== "not_found") throw e; // deleted meanwhile
      }
    }
    box.append(table([
      [t("common.name"), (a) => h("a", { href: `#/apps/${a.slug}` }, a.name)], [t("apps.slug"), (a) => h("code", {}, a.slug)],
      [t("apps.visibility"), (a) => t(`apps.${a.visibility}`)],
      [t("apps.replicas"), (a) => [`${(a.replicas || []).length} / ${a.desired_replicas ?? "—"} (${a.min_replicas}–${a.max_replicas}) `, replicaSummary(a)]],
      [t("apps.prices"), priceList], [t("common.created"), (a) => time(a.created_at)]], own, t("apps.none_published")));
  } catch (e) { box.append(errorBox(e)); }
}

function microAmount(m) { return (Number(m || 0) / 1e6).toFixed(6); }

function statsTable(days) {
  return table([
    [t("apps.day"), (d) => d.day], [t("apps.calls"), (d) => String(d.calls)],
    [t("apps.tokens"), (d) => `${d.input_tokens} / ${d.output_tokens}`],
    [t("apps.earnings"), (d) => price(microAmount(d.earnings_micro))],
    [t("apps.error_rate"), (d) => `${(100 * Number(d.error_rate || 0)).toFixed(1)}%`],
    [t("apps.latency"), (d) => `${d.latency_p50_ms} / ${d.latency_p99_ms} ms`],
    [t("apps.cold_starts"), (d) => String(d.cold_starts)]], days, t("apps.no_calls"));
}

function publisherPanel(a, main, ctx) {
  const box = h("div");
  const stats = h("div", { id: "app-stats" }), statsErr = h("div");
  const days = h("input", { type: "number", id: "stats-days", min: 1, max: 366, value: 30 });
  const loadStats = async () => {
    clear(statsErr);
    try { clear(stats).append(statsTable((await get(`/v1/apps/${a.slug}/stats`, { days: days.value })).days || [])); } catch (e) { statsErr.append(errorBox(e)); }
  };
  days.addEventListener("change", loadStats);
  const f = appFields(a);
  const err = h("div", { id: "edit-error" }), btn = h("button", { type: "submit", id: "edit-submit" }, t("common.save"));
  const form = h("form", { class: "stack", id: "edit-form" }, fieldRows(f, false), h("p", { class: "hint" }, t("apps.env_kept")), err, btn);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(btn, async () => {
      const body = bodyOf(f, false);
      if (!f.env.value.trim()) delete body.env; // leave the secrets as they are
      if (f.command.value === commandText(a.command)) body.command = a.command || []; // untouched: exactly as stored
      await patch(`/v1/apps/${a.slug}`, body);
      toast(t("apps.saved"));
      ctx.navigate(`#/apps/${a.slug}?saved=${Date.now()}`);
    }, err);
  });
  const delErr = h("div"), delBtn = h("button", { type: "button", class: "danger", id: "app-delete" }, t("common.delete"));
  delBtn.addEventListener("click", () => {
    if (!confirm(t("apps.confirm_delete"))) return;
    busy(delBtn, async () => { await del(`/v1/apps/${a.slug}`); toast(t("apps.deleted")); ctx.navigate("#/my-apps"); }, delErr);
  });
  add(box,
    h("div", { class: "card" }, h("h2", {}, t("apps.replicas")),
      h("p", {}, t("apps.replica_counts", { have: (a.replicas || []).length, want: a.desired_replicas ?? 0, min: a.min_replicas, max: a.max_replicas })),
      table([[t("txn.instance"), (r) => h("a", { href: `#/instances/${r.instance_id}` }, r.instance_id)], [t("instances.state"), (r) => badge(r.state)]], a.replicas || [], t("apps.no_replicas"))),
    h("div", { class: "card" }, h("h2", {}, t("apps.stats")), field(t("apps.days"), days), statsErr, stats),
    (a.events || []).length ? h("div", { class: "card" }, h("h2", {}, t("apps.events")),
      h("ol", { class: "timeline" }, a.events.slice(-20).reverse().map((e) => h("li", {}, time(new Date(e.at * 1000).toISOString()), " ", h("code", {}, e.kind), " ", e.detail || "")))) : null,
    h("div", { class: "card" }, h("h2", {}, t("apps.edit")), form),
    h("div", { class: "card" }, h("h2", {}, t("apps.delete_title")), h("p", { class: "hint" }, t("apps.delete_hint")), delErr, delBtn));
  loadStats();
  return box;
}

export async function detail(main, params, ctx) {
  let a;
  try { a = await get(`/v1/apps/${encodeURIComponent(params.slug)}`); } catch (e) {
    main.append(h("h1", {}, t("apps.detail")), h("div", { id: "app-error" }, errorBox(e)));
    return;
  }
  const mineToo = a.publisher_id === (getUser() || {}).id;
  const snip = h("div");
  const drawSnippets = () => clear(snip).append(snippets(a));
  drawSnippets();
  main.append(h("h1", {}, a.name, " ", h("code", {}, a.slug)),
    h("div", { class: "card grid", id: "app" },
      h("div", {}, h("div", { class: "hint" }, t("apps.description")), a.description || "—"),
      h("div", {}, h("div", { class: "hint" }, t("apps.prices")), priceList(a)),
      h("div", {}, h("div", { class: "hint" }, t("catalog.type")), `${a.cards_per_replica || 1} × ${a.gpu_type}`),
      h("div", {}, h("div", { class: "hint" }, t("apps.visibility")), t(`apps.${a.visibility}`))),
    h("div", { class: "card" }, h("h2", {}, t("apps.call_it")), a.gateway_url ? null : gatewayField(drawSnippets), snip));
  if (mineToo) main.append(publisherPanel(a, main, ctx));
}
