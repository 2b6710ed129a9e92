// instances.js: launching an instance (with the live cost estimate), the
// list, and one instance's page: live state, phases per rank, actions,
// renaming, the connect panel (SSH per rank, ssh-config, published
// ports), the event timeline and the logs (tail, or follow as they are
// written).
import { t, has, locale } from "../i18n.js";
import { get, post, patch, del, all, raw, ApiError, errorText, formKey } from "../api.js";
import { h, add, clear, money, money2, time, table, field, busy, errorBox, badge, download, every, toast, copyText, keepFocus, scrollable } from "../ui.js";


// "KEY=value" lines into the API's env list.
function parseEnv(text) {
  return text.split("\n").map((l) => l.trim()).filter(Boolean).map((l) => {
    const i = l.indexOf("=");
    if (i <= 0) throw new ApiError(400, "console_env", l, "env");
    return { name: l.slice(0, i), value: l.slice(i + 1) };
  });
}

function parsePorts(text) {
  return text.split(/[\s,]+/).filter(Boolean).map((p) => {
    const n = Number(p);
    if (!Number.isInteger(n) || n < 1 || n > 65535) throw new ApiError(400, "console_ports", p, "ports");
    return n;
  });
}

export async function launch(main, params, ctx) {
  main.append(h("h1", {}, t("launch.title")));
  let types, images, vols, keys, balance, resvs;
  try {
    [types, images, vols, keys, balance, resvs] = await Promise.all([get("/v1/gpu-types"), get("/v1/images"), all("/v1/volumes"), all("/v1/ssh-keys"), get("/v1/balance"),
      all("/v1/reservations")]);
  } catch (e) { main.append(errorBox(e)); return; }
  // An active reservation of the user's can be launched into, whatever its
  // type; on demand only the types with a price and no booking required.
  const active = resvs.filter((r) => r.state === "active");
  const launchable = types.data.filter((g) => (!g.reservation_required && g.price_per_card_hour) || active.some((r) => r.gpu_type === g.code));
  // Each type says how many cards are free now and how many of them one
  // instance can get (free cards spread over nodes are not one launch's
  // worth); one with none stays in the list (its price and estimate may
  // still be wanted) but says it is unavailable, and the form opens on a
  // type that has free cards: it opened on the first type, none of whose
  // cards were free, and Launch was refused for want of GPUs.
  const type = h("select", { id: "launch-type", name: "gpu_type", required: true },
    launchable.map((g) => h("option", { value: g.code, class: g.cards_launchable > 0 ? null : "unavailable", "data-free": g.cards_free },
      `${g.code} · ${g.memory_gb} GB · ${g.cards_launchable > 0 ? t("launch.free_cards", { n: g.cards_free, max: g.cards_launchable }) : t("launch.none_free")}`)));
  const firstFree = launchable.find((g) => g.cards_launchable > 0);
  if (firstFree) type.value = firstFree.code;
  if (launchable.some((g) => g.code === ctx.query.get("gpu_type"))) type.value = ctx.query.get("gpu_type");
  const cards = h("input", { type: "number", id: "launch-cards", name: "card_count", min: 1, max: 256, value: 8, required: true });
  const reservation = h("select", { id: "launch-reservation", name: "reservation_id" }, h("option", { value: "" }, t("launch.on_demand")),
    active.map((r) => h("option", { value: r.id }, t("launch.reservation_option", { id: r.id, cards: r.cards, type: r.gpu_type }))));
  if (active.some((r) => r.id === ctx.query.get("reservation_id"))) reservation.value = ctx.query.get("reservation_id");
  const image = h("input", { id: "launch-image", name: "image", list: "launch-images", required: true, value: (images.data[0] || {}).ref || "" });
  const imageList = h("datalist", { id: "launch-images" }, images.data.map((i) => h("option", { value: i.ref }, i.description || i.stack)));
  const volume = h("select", { id: "launch-volume", name: "volume_id" }, h("option", { value: "" }, t("launch.no_volume")), vols.map((v) => h("option", { value: v.id }, `${v.name} (${v.size_gb} GB)`)));
  const keyBoxes = keys.map((k) => h("label", {}, h("input", { type: "checkbox", value: k.id, checked: true, name: "ssh_key" }), " ", k.name, " ", h("code", { class: "hint" }, k.fingerprint)));
  const name = h("input", { id: "launch-name", name: "name", placeholder: t("launch.name_hint") });
  const command = h("input", { id: "launch-command", name: "command", class: "mono", placeholder: "python train.py" });
  const env = h("textarea", { id: "launch-env", name: "env", class: "mono", placeholder: "KEY=value" });
  const ports = h("input", { id: "launch-ports", name: "ports", placeholder: "8888, 6006" });
  const hours = h("input", { type: "number", id: "launch-hours", min: 1, max: 8760, value: 24 });
  const estimate = h("div", { class: "card estimate", id: "launch-estimate", "aria-live": "polite" });
  const err = h("div", { id: "launch-error" });
  const btn = h("button", { type: "submit", id: "launch-submit" }, t("launch.submit"));

  let seq = 0;
  const refresh = async () => {
    const mine = ++seq;
    const r = active.find((x) => x.id === reservation.value);
    if (r) {
      // Paid when booked: instances inside it are not billed per second.
      clear(estimate).append(h("div", { id: "estimate-reservation" }, t("launch.in_reservation", { cards: r.cards, type: r.gpu_type })), " ", time(r.ends_at));
      return;
    }
    // More cards than one instance can get is said before Launch is
    // pressed (as free when the page was read: the server has the last word).
    const g = launchable.find((x) => x.code === type.value);
    const short = g && Number(cards.value) > g.cards_launchable
      ? h("div", { class: "warn", id: "launch-capacity" },
        t("launch.short_cards", { type: g.code, free: g.cards_free, max: g.cards_launchable, cards: cards.value })) : null;
    const q = { gpu_type: type.value, card_count: cards.value };
    try {
      const [hour, span] = await Promise.all([get("/v1/estimate", { ...q, hours: 1 }), get("/v1/estimate", { ...q, hours: hours.value || 1 })]);
      if (mine !== seq) return;
      const warn = Number(hour.total) > Number(balance.available);
      add(clear(estimate),
        h("div", {}, t("launch.estimate_hour"), " ", h("strong", { id: "estimate-hour" }, money(hour.total, hour.currency)), " ", t("common.per_hour")),
        h("div", {}, t("launch.estimate_span", { hours: hours.value || 1 }), " ", h("strong", { id: "estimate-span" }, money(span.total, span.currency))),
        h("div", { class: "hint" }, t("launch.available"), " ", money(balance.available, balance.currency),
          " · ", t("launch.price", { price: money2(hour.price_per_card_hour) })),
        warn ? h("div", { class: "warn" }, t("launch.funds_short")) : null, short);
    } catch (e) { if (mine === seq) add(clear(estimate), errorBox(e), short); }
  };
  for (const el of [type, cards, hours]) el.addEventListener("input", refresh);
  const pickReservation = () => {
    const r = active.find((x) => x.id === reservation.value);
    if (r) { type.value = r.gpu_type; cards.max = r.cards; if (Number(cards.value) > r.cards) cards.value = r.cards; matchImage(); } else cards.max = 256;
    refresh();
  };
  reservation.addEventListener("input", pickReservation);
  // An image of the chosen type's software stack (ROCm, CUDA) by default.
  const matchImage = () => {
    const g = launchable.find((x) => x.code === type.value);
    const cur = images.data.find((i) => i.ref === image.value);
    if (g && (!image.value || (cur && cur.stack !== g.stack))) {
      const fit = images.data.find((i) => i.stack === g.stack);
      if (fit) image.value = fit.ref;
    }
  };
  type.addEventListener("input", matchImage);
  matchImage();
  if (reservation.value) pickReservation();

  const form = h("form", { class: "stack card", id: "launch-form" },
    active.length ? field(t("launch.reservation"), reservation, t("launch.reservation_hint")) : null,
    field(t("launch.type"), type), field(t("launch.cards"), cards), field(t("launch.image"), image, t("launch.image_hint")), imageList,
    field(t("launch.volume"), volume),
    h("fieldset", {}, h("legend", {}, t("launch.ssh_keys")), keyBoxes.length ? keyBoxes : h("p", { class: "hint" }, t("launch.no_keys"), " ", h("a", { href: "#/ssh-keys" }, t("nav.ssh-keys")))),
    field(t("common.name"), name), field(t("launch.command"), command, t("launch.command_hint")), field(t("launch.env"), env, t("launch.env_hint")),
    field(t("launch.ports"), ports, t("launch.ports_hint")), field(t("launch.duration"), hours), estimate, err, btn);
  const idem = formKey(form);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(btn, async () => {
      const body = { gpu_type: type.value, card_count: Number(cards.value), image: image.value.trim() };
      if (volume.value) body.volume_id = volume.value;
      if (reservation.value) body.reservation_id = reservation.value;
      if (name.value.trim()) body.name = name.value.trim();
      const ids = keyBoxes.map((l) => l.querySelector("input")).filter((i) => i.checked).map((i) => i.value);
      if (ids.length) body.ssh_key_ids = ids;
      if (command.value.trim()) body.command = ["sh", "-c", command.value.trim()];
      const envList = parseEnv(env.value);
      if (envList.length) body.env = envList;
      const portList = parsePorts(ports.value);
      if (portList.length) body.ports = portList;
      const inst = await post("/v1/instances", body, { headers: { "Idempotency-Key": idem.get() } });
      idem.done();
      toast(t("launch.launched", { id: inst.id }));
      ctx.navigate(`#/instances/${inst.id}`);
    }, err);
  });
  main.append(form);
  refresh();
}

export async function list(main, params, ctx) {
  main.append(h("h1", {}, t("instances.title")), h("div", { class: "actions" }, h("a", { href: "#/launch" }, t("nav.launch"))));
  const box = h("div"), pollErr = h("div", { id: "instances-poll-error" });
  main.append(pollErr, box);
  const draw = async () => {
    const rows = await all("/v1/instances");
    keepFocus(box, () => clear(box).append(table([
      [t("common.name"), (i) => h("a", { href: `#/instances/${i.id}` }, i.name || i.id)],
      [t("instances.state"), (i) => badge(i.state)],
      [t("instances.gpus"), (i) => `${i.card_count} × ${i.gpu_type}`],
      [t("launch.image"), (i) => h("code", {}, i.image)],
      [t("common.created"), (i) => time(i.created_at)]], rows, t("instances.empty"))));
  };
  // A first read that fails is told like a failed poll, and the polls
  // go on: the list comes when the API is back.
  try { await draw(); } catch (e) { pollErr.append(errorBox(e)); }
  every(3000, draw, ctx.alive, pollErr);
}

function connectPanel(inst) {
  const box = h("div", { id: "connect" });
  const running = inst.state === "running";
  if (!running) box.append(h("p", { class: "hint" }, t("connect.not_running")));
  for (const n of inst.nodes || []) {
    const rows = [h("h3", {}, t("connect.rank", { rank: n.rank }), " · ", n.node_name)];
    if (n.ssh) {
      const pre = scrollable(h("pre", { class: "cmd", id: `ssh-${n.rank}` }, n.ssh.command), t("connect.ssh_command", { rank: n.rank }));
      rows.push(pre, h("button", { type: "button", class: "secondary", id: `copy-ssh-${n.rank}`, onclick: () => copyText(n.ssh.command, pre),
        "aria-label": `${t("connect.copy")}: ${t("connect.ssh_command", { rank: n.rank })}` }, t("connect.copy")));
    }
    // Each rank's button and link name their rank: "Copy" and "Open web
    // terminal" once per rank said nothing of which.
    if (running) rows.push(" ", h("a", { href: `#/terminal/${inst.id}/${n.rank}`, id: `terminal-${n.rank}`,
      "aria-label": `${t("connect.terminal")}: ${t("connect.rank", { rank: n.rank })}` }, t("connect.terminal")));
    for (const p of n.published || [])
      rows.push(h("div", {}, t("connect.port", { port: p.container_port }), " → ", h("a", { href: `http://${p.address}/`, target: "_blank", rel: "noopener noreferrer" }, p.address)));
    box.append(h("div", { class: "rank" }, rows));
  }
  if (running) {
    const b = h("button", { type: "button", class: "secondary", id: "ssh-config" }, t("connect.ssh_config"));
    b.addEventListener("click", () => busy(b, async () => download(`${inst.id}.ssh-config`, await get(`/v1/instances/${inst.id}/ssh-config`))));
    box.append(h("div", { class: "actions" }, b), h("p", { class: "hint" }, t("connect.ssh_config_hint", { id: inst.id })));
  }
  return box;
}

function logsView(id, ctx) {
  const rank = h("input", { type: "number", min: 0, value: 0, id: "logs-rank" });
  const tail = h("input", { type: "number", min: 1, max: 10000, value: 200, id: "logs-tail" });
  const follow = h("input", { type: "checkbox", id: "logs-follow" });
  const out = h("pre", { class: "logs", id: "logs", tabindex: 0, "aria-label": t("logs.title") });
  const err = h("div");
  const show = h("button", { type: "button", id: "logs-show" }, t("logs.show"));
  let controller = null;
  // Leaving the page ends the request: a quiet stream would keep its
  // connection open for good, and six of them freeze the console.
  ctx.onLeave(() => { if (controller) controller.abort(); });
  const line = (time_, stream, text) => out.append(`${time_ ? new Date(time_).toLocaleTimeString(locale()) + " " : ""}${stream === "stderr" ? "! " : ""}${text}\n`);
  const load = async () => {
    if (controller) controller.abort();
    controller = new AbortController();
    const mine = controller;
    clear(out); clear(err);
    const q = { rank: rank.value, tail: tail.value };
    try {
      if (!follow.checked) {
        const r = await get(`/v1/instances/${id}/logs`, q, { signal: mine.signal });
        r.data.forEach((l) => line(l.time, l.stream, l.text));
        if (!r.data.length) out.append(t("logs.empty") + "\n");
        return;
      }
      const r = await raw("GET", `/v1/instances/${id}/logs`, { query: { ...q, follow: "true" }, signal: mine.signal });
      const reader = r.body.getReader(), dec = new TextDecoder();
      let buf = "";
      for (;;) {
        if (!ctx.alive()) { mine.abort(); break; }
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n")) >= 0) {
          const l = buf.slice(0, i); buf = buf.slice(i + 1);
          const m = l.match(/^(\S+) (stdout|stderr) (.*)$/);
          if (m) line(m[1], m[2], m[3]); else line("", "", l);
          out.scrollTop = out.scrollHeight;
        }
      }
      out.append(t("logs.ended") + "\n");
    } catch (e) {
      if (e.name !== "AbortError") err.append(errorBox(e));
    }
  };
  // Before its workload reaches a node an instance has no output to read
  // (the node would answer that it has no such workload): say so instead.
  const waiting = () => { clear(out); clear(err); out.append(t("logs.waiting") + "\n"); };
  show.addEventListener("click", load);
  follow.addEventListener("change", load);
  const box = h("div", { class: "card" }, h("h2", {}, t("logs.title")),
    h("div", { class: "inline" }, field(t("logs.rank"), rank), field(t("logs.tail"), tail),
      h("label", {}, follow, " ", t("logs.follow")), show), err, out);
  return { box, load, waiting };
}

const starting = (state) => state === "pending" || state === "provisioning";

// An event's state is a state entered, a provisioning phase reached
// (pulling, mounting, starting) or a warning (max_runtime_warning), each
// in the user's words: the timeline showed "state.starting".
function eventBadge(state) {
  if (has(`state.${state}`)) return badge(state);
  const key = [`phase.${state}`, `event.${state}`].find(has);
  return h("span", { class: `badge ${state}` }, key ? t(key) : state);
}

export async function detail(main, params, ctx) {
  const id = params.id;
  let inst;
  try { inst = await get(`/v1/instances/${id}`); } catch (e) {
    main.append(h("h1", {}, t("instances.detail")), h("div", { class: "error", id: "instance-error" }, errorText(e)));
    return;
  }
  // The volume mounted in it (the instance names its id only), read once.
  const volume = inst.volume_id ? await get(`/v1/volumes/${inst.volume_id}`).catch(() => null) : null;
  // The state is a live region, kept (not drawn again) and written only
  // when the state or phase changes: a screen reader says "running" when
  // the instance gets there, once.
  const stateCell = h("div", { id: "instance-state-live", role: "status", "aria-live": "polite", "aria-atomic": "true" });
  const grid = h("div", { class: "card grid" }, stateCell);
  const head = h("div", {}, grid), actions = h("div", { class: "actions" }), err = h("div"), ranks = h("div"), connect = h("div", { class: "card" }), events = h("div");
  // A failed poll's error stays until a poll succeeds (ui.js every); an
  // action's own error (err) until the next action.
  const pollErr = h("div", { id: "instance-poll-error" });
  const logs = logsView(id, ctx);
  // The name the renter gave it (the list links by it) heads the page,
  // before the id, written from each poll like the rest of the page (it
  // was drawn once, and a name changed meanwhile never showed).
  const nameCell = h("span", { id: "instance-name" });
  // Renaming: the API takes a new name in any state but terminated or
  // being terminated (nothing the instance runs reads it). The form is
  // drawn once and kept, not drawn again at each poll, so what is being
  // typed stays; a poll writes a name changed elsewhere into its input
  // only while the input still holds the name it was last given.
  const renameInput = h("input", { id: "rename-name", name: "name", autocomplete: "off", value: inst.name || "" });
  const renameBtn = h("button", { type: "submit", class: "secondary", id: "rename-submit" }, t("instances.rename"));
  const renameErr = h("div", { id: "rename-error" });
  const renameForm = h("form", { class: "inline card", id: "rename-form" },
    field(t("common.name"), renameInput, t("instances.rename_hint")), renameBtn, renameErr);
  let namedAs = inst.name || "";
  main.append(h("h1", {}, t("instances.detail"), " ", nameCell, " ", h("code", {}, id)),
    head, actions, err, pollErr, renameForm,
    h("div", { class: "card" }, h("h2", {}, t("instances.ranks")), ranks),
    h("div", { class: "card" }, h("h2", {}, t("connect.title")), connect), logs.box,
    h("div", { class: "card" }, h("h2", {}, t("instances.events")), events));
  let lastState = "";
  // While an action's request is out every action button stays disabled
  // and no poll draws them again (a poll drew them enabled, and a second
  // click sent a second stop or terminate). A poll sent before the
  // action's answer came is dropped: it could show the state from before
  // the action over the one the action's answer gave.
  let acting = false, actionsDone = 0;
  const act = (label, cls, fn) => {
    const b = h("button", { type: "button", class: cls, id: `action-${label}` }, t(`instances.${label}`));
    b.addEventListener("click", () => {
      if (acting || (label === "terminate" && !confirm(t("instances.confirm_terminate")))) return;
      acting = true;
      for (const x of actions.querySelectorAll("button")) x.disabled = true;
      busy(b, async () => {
        try { inst = await fn(); } finally { acting = false; actionsDone++; draw(); }
      }, err);
    });
    return b;
  };
  let shownState = null;
  // Drawn again at every poll; the focused button or link is given its
  // focus back (keepFocus), the state written in place.
  const draw = () => keepFocus(main, () => {
    if (nameCell.textContent !== (inst.name || "")) nameCell.textContent = inst.name || "";
    nameCell.hidden = !inst.name;
    if (renameInput.value === namedAs) renameInput.value = inst.name || "";
    namedAs = inst.name || "";
    // Terminated, or on its way there, it can no longer be renamed (the
    // API answers 409): the form goes for good, as neither state ends.
    if (inst.state === "terminated" || inst.desired_state === "terminated") renameForm.remove();
    if (shownState !== `${inst.state} ${inst.phase || ""}`) {
      shownState = `${inst.state} ${inst.phase || ""}`;
      add(clear(stateCell), h("div", { class: "hint" }, t("instances.state")), h("span", { id: "instance-state", "data-state": inst.state }, badge(inst.state)),
        inst.phase ? [" ", t(`phase.${inst.phase}`)] : null);
    }
    while (grid.lastChild !== stateCell) grid.lastChild.remove();
    add(grid,
      h("div", {}, h("div", { class: "hint" }, t("instances.gpus")), `${inst.card_count} × ${inst.gpu_type}`),
      h("div", {}, h("div", { class: "hint" }, t("launch.image")), h("code", {}, inst.image)),
      h("div", {}, h("div", { class: "hint" }, t("instances.since")), time(inst.state_since)),
      inst.state_reason ? h("div", {}, h("div", { class: "hint" }, t("instances.reason")), inst.state_reason) : null,
      inst.volume_id ? h("div", { id: "instance-volume" }, h("div", { class: "hint" }, t("instances.volume")),
        volume ? `${volume.name} ` : null, h("code", {}, inst.volume_id), " → ", h("code", {}, (volume && volume.mount_path) || "/shared")) : null,
      inst.low_balance ? h("div", { class: "warn" }, t("overview.low_balance")) : null);
    if (!acting) {
      const a = clear(actions);
      if (["pending", "provisioning", "running", "unreachable"].includes(inst.state)) a.append(act("stop", "secondary", () => post(`/v1/instances/${id}/stop`)));
      if (["stopped", "succeeded", "lost", "failed"].includes(inst.state)) a.append(act("start", "", () => post(`/v1/instances/${id}/start`)));
      if (inst.state !== "terminated") a.append(act("terminate", "danger", () => del(`/v1/instances/${id}`)));
    }
    clear(ranks).append(table([[t("connect.rank_col"), (n) => n.rank], [t("instances.node"), (n) => n.node_name], [t("instances.cards"), (n) => (n.cards || []).join(", ")],
      [t("instances.phase"), (n) => (n.phase ? t(`phase.${n.phase}`) : "—")], [t("instances.message"), (n) => n.message || ""]], inst.nodes || [], t("instances.no_ranks")));
    if (inst.state !== lastState) {
      clear(connect).append(connectPanel(inst));
      // Logs load once the instance is past starting, and again when it gets there.
      if (starting(inst.state)) logs.waiting();
      else if (!lastState || starting(lastState)) logs.load();
      lastState = inst.state;
    }
  });
  // The answer is the instance as renamed: drawn at once, and a poll
  // sent before it came is dropped (actionsDone), as after an action, so
  // the old name does not come back for a moment.
  renameForm.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(renameBtn, async () => {
      const now = await patch(`/v1/instances/${id}`, { name: renameInput.value.trim() });
      inst = now; actionsDone++;
      renameInput.value = namedAs = inst.name || "";
      draw();
      toast(t("instances.renamed"));
    }, renameErr);
  });
  const drawEvents = async () => {
    const ev = await all(`/v1/instances/${id}/events`);
    clear(events).append(h("ol", { class: "timeline", id: "events" }, ev.map((e) => h("li", {}, time(e.at), " ", eventBadge(e.state), " ", e.reason || ""))));
  };
  draw();
  drawEvents().catch((e) => events.append(errorBox(e)));
  every(2000, async () => {
    const before = actionsDone;
    const now = await get(`/v1/instances/${id}`);
    if (acting || before !== actionsDone) return;
    inst = now; draw(); await drawEvents();
  }, ctx.alive, pollErr);
}
