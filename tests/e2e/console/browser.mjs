// browser.mjs: the console's browser scenarios, in headless Chromium driven
// by playwright-core, against a gpurentd that test_console_browser.py has
// started with sim agents. Run as: node browser.mjs SCENARIO; the world's
// facts come in CONSOLE_WORLD (JSON). When the scenario needs the test
// (a mailed code, moving the testing clock) it writes "ASK {json}" to stdout
// and reads one JSON line back on stdin. Every wait polls a condition with
// a deadline; nothing sleeps for a fixed time. Exit status 0: passed.
import { chromium } from "playwright-core";
import { createInterface } from "node:readline";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const world = JSON.parse(process.env.CONSOLE_WORLD || "{}");
const base = world.base_url;
const DEADLINE = Number(process.env.CONSOLE_DEADLINE_MS || 60000);

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function ask(what) {
  process.stdout.write(`ASK ${JSON.stringify(what)}\n`);
  const { value, done } = await lines.next();
  if (done) throw new Error(`no answer to ${JSON.stringify(what)}`);
  return JSON.parse(value);
}
// Console errors a scenario causes on purpose (a dropped connection).
const expected = [];
const note = (s) => process.stdout.write(`NOTE ${s}\n`);

// Waits until the element matching selector has text containing want.
async function waitText(page, selector, want, timeout = DEADLINE) {
  try {
    await page.waitForFunction(([sel, w]) => {
      const el = document.querySelector(sel);
      return el && el.textContent.includes(w);
    }, [selector, want], { timeout, polling: 100 });
  } catch (e) {
    const got = await page.locator(selector).first().textContent().catch(() => "(absent)");
    throw new Error(`waiting for ${selector} to contain ${JSON.stringify(want)}; it holds ${JSON.stringify(got)}`);
  }
}

// Polls a condition of the test's own (not the page's) every 100 ms.
async function poll(cond, timeout = DEADLINE) {
  const end = Date.now() + timeout;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error("timed out");
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function login(page, email, password) {
  await page.goto(`${base}/console#/login`);
  await page.fill("#login-email", email);
  await page.fill("#login-password", password);
  await page.click("#login-submit");
  await page.waitForFunction(() => !location.hash.startsWith("#/login"), null, { timeout: DEADLINE });
}

// Picks the console's language and waits until the page is drawn in it:
// <html lang> changes first, the header's words (the menu toggle's name
// among them) when the page is drawn again a moment later.
async function setLang(page, lang) {
  await page.selectOption("#lang", lang);
  const menu = { zh: "菜单", en: "Menu" }[lang];
  await page.waitForFunction(([l, m]) => document.documentElement.lang.startsWith(l) &&
    document.getElementById("nav-toggle").getAttribute("aria-label") === m, [lang, menu], { timeout: DEADLINE });
}

async function fillLaunch(page, { cards = 8, command } = {}) {
  await page.waitForSelector("#launch-type");
  await page.selectOption("#launch-type", "MI450");
  await page.fill("#launch-cards", String(cards));
  await page.fill("#launch-image", "rocm/pytorch:2.3-rocm6.2");
  if (command) await page.fill("#launch-command", command);
}

// Focuses selector, waits until the page's poll has drawn it again (a new
// element in its place) and fails unless the focus moved to the new one.
async function focusSurvivesRedraw(page, selector, what) {
  await page.focus(selector);
  await page.evaluate((sel) => { window.gpurentFocused = document.querySelector(sel); }, selector);
  await page.waitForFunction((sel) => document.querySelector(sel) !== window.gpurentFocused, selector, { timeout: DEADLINE, polling: 100 });
  const ok = await page.evaluate((sel) => document.activeElement === document.querySelector(sel), selector);
  if (!ok) {
    const now = await page.evaluate(() => document.activeElement.outerHTML.slice(0, 120));
    throw new Error(`${what}: focus was lost when the page drew it again; it is on ${now}`);
  }
}

// The boxes in main that scroll (content wider or taller than the box,
// overflow auto or scroll) and that the keyboard cannot reach: neither
// focusable themselves with a name, nor holding anything focusable.
async function unreachableScrollers(page) {
  return page.evaluate(() => [...document.querySelectorAll("main *")].filter((el) => {
    const st = getComputedStyle(el);
    const scrolls = (/(auto|scroll)/.test(st.overflowX) && el.scrollWidth > el.clientWidth + 1)
      || (/(auto|scroll)/.test(st.overflowY) && el.scrollHeight > el.clientHeight + 1);
    if (!scrolls) return false;
    if (el.querySelector("a[href], button, input, select, textarea, [tabindex]")) return false;
    return !(el.tabIndex >= 0 && (el.getAttribute("aria-label") || "").trim());
  }).map((el) => el.outerHTML.slice(0, 80)));
}

const scenarios = {
  // Sign-up to statement: the renter's whole path through the console.
  async journey(page) {
    await page.goto(`${base}/`); // GET / redirects to the console
    await page.waitForURL(/\/console#\/login/, { timeout: DEADLINE });
    await waitText(page, "nav", "注册"); // Chinese by default
    await page.click("nav a[href='#/signup']");
    await page.fill("#signup-email", world.email);
    await page.fill("#signup-password", world.password);
    await page.fill("#signup-invite", "AMD6GW");
    await page.click("#signup-submit");
    await page.waitForSelector("#verify-token");
    const { code } = await ask({ mail_code: world.email });
    await page.fill("#verify-token", code);
    await page.click("#verify-submit");
    await waitText(page, "main", "10.00");
    await page.goto(`${base}/console#/overview`);
    await waitText(page, "#available", "10.00");

    await page.click("nav a[href='#/launch']");
    await fillLaunch(page, { command: "echo hello-from-console; sleep 3600" });
    await waitText(page, "#estimate-hour", "9.60");
    await page.fill("#launch-hours", "10");
    await waitText(page, "#estimate-span", "96.00");
    await page.click("#launch-submit");
    await page.waitForURL(/#\/instances\/ins_/, { timeout: DEADLINE });
    const id = page.url().split("#/instances/")[1];
    await page.waitForSelector("#instance-state[data-state='running']", { timeout: DEADLINE });
    // Its logs load once it runs, whether the page opened before or after.
    await waitText(page, "#logs", "hello-from-console");
    await waitText(page, "#ssh-0", `${id}-0`);

    // The web terminal: rank 0, a command typed and its output read back.
    await page.click("#terminal-0");
    await page.waitForFunction(() => {
      const s = document.getElementById("terminal-status");
      return s && (s.dataset.state === "open" || s.dataset.unavailable === "1" || s.classList.contains("error"));
    }, null, { timeout: DEADLINE });
    const st = await page.$eval("#terminal-status", (s) => ({ ...s.dataset, text: s.textContent }));
    if (st.state !== "open") throw new Error(`terminal did not open: ${st.text}`);
    await page.click("#terminal");
    await page.keyboard.type("echo console-$((6*7))\n");
    await page.waitForFunction(() => {
      const b = window.gpurentTerminal && window.gpurentTerminal.buffer.active;
      if (!b) return false;
      for (let i = 0; i < b.length; i++) if ((b.getLine(i)?.translateToString() || "").includes("console-42")) return true;
      return false;
    }, null, { timeout: DEADLINE });
    await page.goto(`${base}/console#/instances/${id}`);

    // The log line the command wrote, followed as it streams.
    await page.check("#logs-follow");
    await waitText(page, "#logs", "hello-from-console");

    await ask({ advance_clock: 1800 }); // half an hour of running: 4.80
    await page.click("#action-stop");
    await page.waitForSelector("#instance-state[data-state='stopped']", { timeout: DEADLINE });
    await ask({ billing: true });

    await page.goto(`${base}/console#/transactions`);
    await waitText(page, "#transactions", "-4.80");
    await waitText(page, "#transactions", id);
    await page.goto(`${base}/console#/statement`);
    await page.waitForSelector("#statement table");
    const [download] = await Promise.all([page.waitForEvent("download", { timeout: DEADLINE }), page.click("#statement-csv")]);
    const csv = readFileSync(await download.path(), "utf8");
    if (!csv.includes(id) || !csv.includes("-4.80")) throw new Error(`the CSV statement lacks the charge:\n${csv}`);
  },

  // Too little credit: the refusal in words, in both languages.
  async poor(page) {
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/launch`);
    await fillLaunch(page);
    await page.click("#launch-submit");
    await waitText(page, "#launch-error", "余额不足");
    await setLang(page, "en");
    await fillLaunch(page);
    await page.click("#launch-submit");
    await waitText(page, "#launch-error", "Insufficient funds");
    // Remembered: a new visit is still in English.
    await page.reload();
    await waitText(page, "nav", "Launch");
  },

  // An admin drains a node and sees it change.
  async drain(page) {
    page.on("dialog", (d) => d.accept("console test"));
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/admin/nodes`);
    const sel = `.node-state[data-node='${world.node}']`;
    await page.waitForSelector(`${sel}[data-state='ready']`, { timeout: DEADLINE });
    await focusSurvivesRedraw(page, `button[data-node='${world.node}'][data-action='cordon']`, "nodes page");
    await page.click(`button[data-node='${world.node}'][data-action='drain']`);
    await page.waitForSelector(`${sel}[data-state='draining']`, { timeout: DEADLINE });
    await waitText(page, sel, "排空中");
  },

  // Cancel in the drain's reason prompt leaves the node as it was; only
  // the drain answered with a reason is sent.
  async drain_cancelled(page) {
    const sent = [];
    let answer = null; // null: the prompt is cancelled
    page.on("dialog", (d) => (answer === null ? d.dismiss() : d.accept(answer)));
    page.on("request", (r) => { if (r.method() === "POST" && r.url().includes("/v1/admin/nodes/")) sent.push(r.postData()); });
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/admin/nodes`);
    const sel = `.node-state[data-node='${world.node}']`;
    await page.waitForSelector(`${sel}[data-state='ready']`, { timeout: DEADLINE });
    const drain = `button[data-node='${world.node}'][data-action='drain']`;
    await page.click(drain);
    // Settled: the button back (cancelled) or the node draining (sent).
    await page.waitForSelector(`${drain}:not([disabled]), ${sel}[data-state='draining']`, { timeout: DEADLINE });
    if (sent.length) throw new Error(`a cancelled drain was sent: ${sent.join(", ")}`);
    answer = "kernel update";
    await page.click(drain);
    await page.waitForSelector(`${sel}[data-state='draining']`, { timeout: DEADLINE });
    if (sent.length !== 1 || JSON.parse(sent[0]).reason !== "kernel update") throw new Error(`drains sent: ${sent.join(", ")}`);
  },

  // A node's drain in flight keeps its button disabled through the polls
  // that answer meanwhile; one drain is sent.
  async node_change_in_flight(page) {
    page.on("dialog", (d) => d.accept("kernel update"));
    const sent = [];
    let release, seen = false;
    const gate = new Promise((r) => { release = r; });
    page.on("request", (r) => { if (r.method() === "POST" && r.url().includes("/v1/admin/nodes/")) sent.push(r.url()); });
    await login(page, world.email, world.password);
    await page.route("**/v1/admin/nodes/*/state", async (route) => { seen = true; await gate; await route.continue(); });
    await page.goto(`${base}/console#/admin/nodes`);
    const sel = `.node-state[data-node='${world.node}']`;
    await page.waitForSelector(`${sel}[data-state='ready']`, { timeout: DEADLINE });
    const drain = `button[data-node='${world.node}'][data-action='drain']`;
    await page.click(drain);
    await poll(() => seen);
    const polled = () => page.waitForResponse((r) => new URL(r.url()).pathname === "/v1/admin/nodes" && r.request().method() === "GET", { timeout: DEADLINE });
    await polled();
    await polled();
    if (!(await page.$eval(drain, (b) => b.disabled))) throw new Error("the drain button was enabled again while the drain was in flight");
    await page.$eval(drain, (b) => b.click());
    release();
    await page.waitForSelector(`${sel}[data-state='draining']`, { timeout: DEADLINE });
    if (sent.length !== 1) throw new Error(`${sent.length} drains sent`);
  },

  // An admin suspends an account and reinstates it from the users page:
  // the suspended account (status "disabled" in the API) is shown so and
  // offered Reinstate, and each request carries the reason the API wants;
  // an empty reason is refused in the page, nothing sent.
  async suspend(page) {
    const answers = ["", "console abuse", "console appeal"], sent = [];
    page.on("dialog", (d) => d.accept(answers.shift()));
    page.on("request", (r) => { if (r.method() === "POST" && r.url().includes("/v1/admin/users/")) sent.push(r.postData()); });
    await login(page, world.email, world.password);
    await setLang(page, "en");
    await page.goto(`${base}/console#/admin/users`);
    await page.fill("#users-email", world.target_email);
    await page.click("main form button[type=submit]");
    await waitText(page, "#users-toggle", "Suspend");
    await page.click("#users-toggle");
    await waitText(page, "main .error", "A reason is needed");
    if (sent.length) throw new Error(`sent without a reason: ${sent}`);
    await page.click("#users-toggle");
    await waitText(page, "#users-toggle", "Reinstate");
    await waitText(page, "#user-card", "suspended");
    await page.click("#users-toggle");
    await waitText(page, "#users-toggle", "Suspend");
    await waitText(page, "#user-card", "active");
    if (sent.length !== 2 || !sent.every((b) => JSON.parse(b).reason)) throw new Error(`requests sent: ${sent.join(", ")}`);
  },

  // An admin's top-up shows in the audit trail. A value the API refuses
  // on an admin form marks its input (the inputs carry the API's field
  // names), and the mark goes with the next try.
  async topup(page) {
    expected.push(/status of (400|409)/);
    const marked = async (sel) => page.waitForSelector(`${sel}[aria-invalid='true']:focus`, { timeout: DEADLINE });
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/admin/money`);
    await page.fill("#funds-email", world.target_email);
    await page.fill("#funds-amount", "50,00");
    await page.fill("#funds-reason", "console audit test");
    await page.click("#funds-submit");
    await marked("#funds-amount");
    await page.fill("#funds-amount", "50.00");
    await page.click("#funds-submit");
    await waitText(page, "#funds-done", "50.00");
    if (await page.getAttribute("#funds-amount", "aria-invalid")) throw new Error("the amount stays marked after it was taken");
    await page.goto(`${base}/console#/admin/prices`);
    await page.fill("#price-amount", "1.2.3");
    await page.click("main form button[type=submit]");
    await marked("#price-amount");
    await page.goto(`${base}/console#/admin/audit`);
    await waitText(page, "#audit", world.target_id);
    await waitText(page, "#audit", "console audit test");
    // An invite code made on its page joins the list of every code.
    await page.goto(`${base}/console#/admin/invites`);
    await page.waitForSelector("#invite-list h2", { timeout: DEADLINE });
    await page.fill("#invite-code", "CONSOLE-LIST");
    await page.fill("#invite-amount", "5.00");
    await page.fill("#invite-uses", "3");
    await page.click("#invite-code ~ button, form.inline button[type='submit']");
    await waitText(page, "#invite-list", "CONSOLE-LIST");
    await waitText(page, "#invite-list", "0 / 3");
    await page.click("#invite-code ~ button, form.inline button[type='submit']"); // the same code again: taken
    await marked("#invite-code");
  },

  // The terminal page against the terminal contract, the server's side
  // played here (the token POST and the WebSocket are routed in the
  // browser): the bytes typed arrive as binary frames, a resize is sent as
  // text, output is drawn, and the close reason "exit N" is told.
  async terminal(page) {
    const id = "ins_0000000000000000test";
    const seen = { resize: null, typed: "" };
    await page.route("**/v1/instances/*/terminal-tokens", async (route) => {
      const body = JSON.parse(route.request().postData() || "{}");
      if (route.request().method() !== "POST" || body.rank !== 1) return route.fulfill({ status: 400, body: "{}" });
      await route.fulfill({ status: 201, contentType: "application/json",
        body: JSON.stringify({ token: "tt", url: `/v1/instances/${id}/terminal?token=tt`, rank: 1, expires_at: "2030-01-01T00:00:00Z" }) });
    });
    await page.routeWebSocket(/\/v1\/instances\/.*\/terminal\?token=tt$/, (ws) => {
      ws.send(Buffer.from("welcome to rank 1\r\n$ "));
      ws.onMessage((m) => {
        if (typeof m === "string") { seen.resize = JSON.parse(m); return; }
        const text = Buffer.from(m).toString();
        seen.typed += text;
        ws.send(Buffer.from(text.replace(/\r/g, "\r\n")));
        if (seen.typed.endsWith("exit\r")) ws.close({ code: 1000, reason: "exit 3" });
        else if (text.includes("\r")) ws.send(Buffer.from("fake-shell-output-7\r\n$ "));
      });
    });
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/terminal/${id}/1`);
    await page.waitForSelector("#terminal-status[data-state='open']", { timeout: DEADLINE });
    const screen = (want) => page.waitForFunction((w) => {
      const b = window.gpurentTerminal && window.gpurentTerminal.buffer.active;
      if (!b) return false;
      for (let i = 0; i < b.length; i++) if ((b.getLine(i)?.translateToString() || "").includes(w)) return true;
      return false;
    }, want, { timeout: DEADLINE });
    await screen("welcome to rank 1");
    await page.click("#terminal");
    await page.keyboard.type("ls\n");
    await screen("fake-shell-output-7");
    if (!seen.resize || seen.resize.type !== "resize" || !(seen.resize.cols >= 20 && seen.resize.rows >= 5))
      throw new Error(`no resize message: ${JSON.stringify(seen.resize)}`);
    if (!seen.typed.startsWith("ls\r")) throw new Error(`typed bytes: ${JSON.stringify(seen.typed)}`);
    // Tab belongs to the shell; Ctrl+M, told beside the terminal, leaves it
    // for the link above and sends the shell nothing.
    await waitText(page, "#terminal-keys", "Ctrl+M");
    await page.keyboard.press("Tab");
    await poll(() => seen.typed.endsWith("\t"));
    if (!(await page.evaluate(() => document.getElementById("terminal").contains(document.activeElement))))
      throw new Error("Tab left the terminal: the shell can no longer complete");
    const before = seen.typed;
    await page.keyboard.press("Control+m");
    await page.waitForFunction(() => document.activeElement.id === "terminal-back", null, { timeout: DEADLINE });
    await page.keyboard.press("Tab"); // and back into the terminal
    await page.waitForFunction(() => document.getElementById("terminal").contains(document.activeElement), null, { timeout: DEADLINE });
    await page.keyboard.type("x");
    await poll(() => seen.typed.length > before.length);
    if (seen.typed !== before + "x") throw new Error(`Ctrl+M reached the shell: ${JSON.stringify(seen.typed.slice(before.length))}`);
    // xterm's own styles reached the page through constructed style sheets.
    const sheets = await page.evaluate(() => document.adoptedStyleSheets.length);
    if (sheets < 1) throw new Error("xterm's styles were not bridged");
    await page.keyboard.type("exit\n");
    await page.waitForSelector("#terminal-status[data-state='closed']", { timeout: DEADLINE });
    await waitText(page, "#terminal-status", "退出码 3");
    // One terminal page straight after another, then away: document's own
    // createElement is back (it was left patched, making every <style> inert).
    expected.push(/status of 400/);
    await page.goto(`${base}/console#/terminal/${id}/0`);
    await page.waitForSelector("#terminal-status.error", { timeout: DEADLINE }); // rank 0: refused, no terminal
    await page.goto(`${base}/console#/terminal/${id}/1`);
    await page.waitForSelector("#terminal-status[data-state='open']", { timeout: DEADLINE });
    await page.goto(`${base}/console#/terminal/${id.replace("test", "tst2")}/1`);
    await page.waitForSelector("#terminal-status[data-state='open']", { timeout: DEADLINE });
    await setLang(page, "en"); // the way out is told in English too
    await waitText(page, "#terminal-keys", "Press Ctrl+M to leave the terminal");
    await page.waitForSelector("#terminal-status[data-state='open']", { timeout: DEADLINE });
    await page.goto(`${base}/console#/overview`);
    await page.waitForSelector("#available", { timeout: DEADLINE });
    const patched = await page.evaluate(() => Object.prototype.hasOwnProperty.call(document, "createElement")
      || document.createElement("style").tagName !== "STYLE");
    if (patched) throw new Error("document.createElement is still patched after the terminal pages were left");
  },

  // A block of a reservation-only type booked in the browser: its price
  // before paying, the booking listed, the charge in the transactions;
  // then cancelled well ahead of the start and the whole refund seen.
  async reserve(page) {
    page.on("dialog", (d) => d.accept());
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/catalog`);
    await waitText(page, "[data-reservable='H100-SXM']", "16");
    await page.click("a[data-book='H100-SXM']");
    await page.waitForSelector("#avail-form");
    // The test's browser runs in Asia/Shanghai (UTC+8): the hour as typed there.
    const local = new Date(Date.parse(world.start) + 8 * 3600000).toISOString().slice(0, 16);
    await page.fill("#avail-from", local);
    await page.click("#avail-show");
    await waitText(page, `#availability [data-hour='${world.start}']`, "16");
    await page.selectOption("#book-type", "H100-SXM");
    await page.fill("#book-cards", "8");
    await page.fill("#book-start", local);
    await page.fill("#book-hours", "3");
    await waitText(page, "#book-quote", "8 张 × 3 小时 × 2.00 CNY");
    await waitText(page, "#book-total", "48.00");
    await waitText(page, "#book-quote", "Asia/Shanghai");
    await page.click("#book-submit");
    await waitText(page, "#book-done", "rsv_");
    const id = (await page.textContent("#book-done")).match(/rsv_[0-9a-z]{20}/)[0];
    await page.waitForSelector(`.resv-state[data-reservation='${id}'][data-state='upcoming']`, { timeout: DEADLINE });
    // The free cards are read again after the booking, without asking.
    await waitText(page, `#availability [data-hour='${world.start}']`, "8");
    await page.goto(`${base}/console#/transactions`);
    await waitText(page, "#transactions", "-48.00");
    await waitText(page, "#transactions", "预留");
    await page.goto(`${base}/console#/reservations/${id}`);
    await waitText(page, "#refund-rule", "48");
    await page.click(`#cancel-${id}`);
    await page.waitForSelector("#reservation-state[data-state='cancelled']", { timeout: DEADLINE });
    await waitText(page, "#reservation-refunded", "48.00");
    await page.goto(`${base}/console#/transactions`);
    await waitText(page, "#transactions", "预留退款");
    await waitText(page, "#transactions", "48.00");
    process.stdout.write(`NOTE reservation ${id}\n`);
  },

  // Launching into an active reservation: from its page, the launch form
  // comes with the reservation chosen and no per-hour estimate.
  async launch_reserved(page) {
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/reservations/${world.reservation_id}`);
    await page.waitForSelector("#reservation-state[data-state='active']", { timeout: DEADLINE });
    await page.click("#reservation-launch");
    await page.waitForSelector("#launch-reservation");
    const chosen = await page.$eval("#launch-reservation", (s) => s.value);
    if (chosen !== world.reservation_id) throw new Error(`the reservation was not chosen: ${chosen}`);
    await waitText(page, "#estimate-reservation", "8 × H100-SXM");
    if ((await page.$eval("#launch-type", (s) => s.value)) !== "H100-SXM") throw new Error("the type did not follow the reservation");
    await page.fill("#launch-cards", "8");
    await page.fill("#launch-image", world.image);
    await page.click("#launch-submit");
    await page.waitForURL(/#\/instances\/ins_/, { timeout: DEADLINE });
    await page.waitForSelector("#instance-state[data-state='running']", { timeout: DEADLINE });
  },

  // A publisher publishes an app in the browser; it is in the public list,
  // even for a visitor who is not logged in, and on the publisher's page.
  async publish(page) {
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/publish`);
    await page.fill("#app-slug", world.slug);
    await page.fill("#app-name", "Console Echo");
    await page.fill("#app-description", "an echo model published from the console");
    await page.fill("#app-command", world.command);
    await page.fill("#app-port", String(world.port));
    await page.fill("#app-gpu-type", "MI450");
    await page.fill("#app-price-request", "0.01");
    await page.fill("#app-price-out", "0.004");
    await page.click("#publish-submit");
    await page.waitForURL(new RegExp(`#/apps/${world.slug}$`), { timeout: DEADLINE });
    if (world.gateway) {
      // The operator's gateway_public_url gives the address: nothing to ask.
      await waitText(page, "#app-base-url", `${world.gateway}/apps/${world.slug}/v1`);
      if (await page.$("#app-gateway")) throw new Error("the gateway address is asked for though the app has one");
    } else {
      await waitText(page, "#app-base-url", `/apps/${world.slug}/v1`);
      await page.waitForSelector("#app-gateway", { timeout: DEADLINE });
    }
    await waitText(page, "#app-curl", "chat/completions");
    await page.waitForSelector("#app-stats", { timeout: DEADLINE });
    await page.goto(`${base}/console#/my-apps`);
    await waitText(page, "#my-apps", world.slug);
    await page.goto(`${base}/console#/apps`);
    await waitText(page, "#apps", "Console Echo");
    await waitText(page, "#apps", "0.01");
    await page.evaluate(() => sessionStorage.clear()); // a visitor without a key
    await page.goto(`${base}/console#/catalog`);
    await page.goto(`${base}/console#/apps`);
    await waitText(page, "#apps", "an echo model published from the console");
  },

  // Someone else's reservation id in the address: not found, nothing of theirs.
  async foreign_reservation(page) {
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/reservations/${world.reservation_id}`);
    await waitText(page, "#reservation-error", "未找到");
    const text = await page.textContent("main");
    if (text.includes("H100-SXM") || text.includes("48.00")) throw new Error(`another user's reservation leaked: ${text}`);
  },

  // An instance still pulling its image has no output on a node yet: its
  // page says when logs come rather than asking the node for them.
  async provisioning(page) {
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/instances/${world.instance_id}`);
    await page.waitForSelector("#instance-state[data-state='provisioning']", { timeout: DEADLINE });
    await waitText(page, "#logs", "实例运行后才有日志");
  },

  // Crafted addresses sent in a link: a route's id is used in API paths, so
  // one that decodes to other segments ("..%2Fapi-keys" would make the
  // instance page load /v1/api-keys and its Terminate a DELETE of every
  // other key) or cannot be decoded matches no route: the console goes to
  // the overview and asks the API for nothing outside it.
  async crafted_route(page) {
    await login(page, world.email, world.password);
    const asked = [];
    page.on("request", (r) => { const u = new URL(r.url()); if (u.pathname.startsWith("/v1/")) asked.push(`${r.method()} ${u.pathname}`); });
    for (const route of ["instances/..%2Fapi-keys", "instances/..", "terminal/..%2F..%2Fapi-keys/0", "apps/%2E%2E%2Fapi-keys",
                         "reservations/%E0%A4%A", "instances/ins_x%3Fstate=running"]) {
      await page.goto(`${base}/console#/${route}`);
      await page.waitForFunction(() => location.hash === "#/overview", null, { timeout: DEADLINE });
    }
    const bad = asked.filter((a) => /api-keys|^(DELETE|POST) |\/instances\/[^/]*$/.test(a));
    if (bad.length) throw new Error(`crafted routes reached the API: ${bad.join(", ")}`);
  },

  // Following the logs of a quiet instance, then leaving its page: the
  // stream ends with the page (it sends nothing more that could end it),
  // so seven visits leave no connection held and the console still draws.
  async follow_leave(page) {
    const open = new Set();
    page.on("request", (q) => { if (q.url().includes("follow=true")) open.add(q); });
    page.on("requestfinished", (q) => open.delete(q));
    page.on("requestfailed", (q) => open.delete(q));
    await login(page, world.email, world.password);
    for (let i = 0; i < 7; i++) {
      await page.goto(`${base}/console#/instances/${world.instance_id}`);
      await page.waitForSelector("#instance-state[data-state='running']", { timeout: DEADLINE });
      await waitText(page, "#logs", "quiet-now");
      await page.check("#logs-follow");
      await waitText(page, "#logs", "quiet-now");
      await page.goto(`${base}/console#/overview`);
      await page.waitForSelector("#available", { timeout: DEADLINE });
      try {
        await poll(() => open.size === 0, 10000);
      } catch { throw new Error(`visit ${i + 1}: ${open.size} log streams still open after leaving the page`); }
    }
  },

  // The answer to a launch, a booking and a top-up is lost on the way back
  // (the server did the work; the connection drops): the console says so,
  // the user presses the button again, and the retry carries the same
  // Idempotency-Key (payment id) as the first, so nothing is done twice.
  async retry_lost_answer(page) {
    const seen = {};
    expected.push(/net::ERR_CONNECTION_RESET/);
    await page.route(/\/v1\/(instances|reservations|admin\/users\/[^/]+\/topups)$/, async (route) => {
      const req = route.request();
      if (req.method() !== "POST") return route.continue();
      const what = new URL(req.url()).pathname.split("/").pop();
      const id = req.headers()["idempotency-key"] || JSON.parse(req.postData()).payment_id;
      (seen[what] = seen[what] || []).push(id);
      if (seen[what].length === 1) { await route.fetch(); return route.abort("connectionreset"); }
      return route.continue();
    });
    const twice = (what) => {
      const ids = seen[what] || [];
      if (ids.length !== 2 || !ids[0] || ids[0] !== ids[1]) throw new Error(`${what}: the retry's key differs: ${JSON.stringify(ids)}`);
    };
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/launch`);
    await fillLaunch(page, { cards: 1 });
    await page.click("#launch-submit");
    await page.waitForSelector("#launch-error .error", { timeout: DEADLINE });
    await page.click("#launch-submit");
    await page.waitForURL(/#\/instances\/ins_/, { timeout: DEADLINE });
    twice("instances");

    await page.goto(`${base}/console#/reservations?gpu_type=H100-SXM`);
    await page.waitForSelector("#book-total");
    await page.fill("#book-cards", "1");
    await page.fill("#book-hours", "1");
    // The test's browser runs in Asia/Shanghai (UTC+8): the hour as typed there.
    await page.fill("#book-start", new Date(Date.parse(world.start) + 8 * 3600000).toISOString().slice(0, 16));
    await page.click("#book-submit");
    await page.waitForSelector("#book-error .error", { timeout: DEADLINE });
    await page.click("#book-submit");
    await waitText(page, "#book-done", "rsv_");
    twice("reservations");

    await page.evaluate(() => sessionStorage.clear());
    await login(page, world.admin_email, world.password);
    await page.goto(`${base}/console#/admin/money`);
    await page.fill("#funds-email", world.email);
    await page.fill("#funds-amount", "50.00");
    await page.click("#funds-submit");
    await page.waitForSelector("main .error", { timeout: DEADLINE });
    await page.click("#funds-submit");
    await page.waitForSelector("#funds-done", { timeout: DEADLINE });
    twice("topups");
  },

  // An app's edit form shows its stored command as it is and saving a
  // price change leaves the command alone: a line for sh -c shows as the
  // line, any other argument list as JSON (world.apps: slug -> shown text).
  async app_edit(page) {
    await login(page, world.email, world.password);
    for (const [slug, shown] of Object.entries(world.apps)) {
      for (let i = 1; i <= 2; i++) {
        await page.goto(`${base}/console#/apps/${slug}?visit=${i}`);
        // The address changes only its hash: until this app's page is drawn
        // the form on screen is the last app's, so wait for this one's value.
        const drawn = await page.waitForFunction((want) => document.querySelector("#edit-form #app-command")?.value === want,
          shown, { timeout: DEADLINE }).then(() => true, () => false);
        if (!drawn) {
          const got = await page.inputValue("#edit-form #app-command").catch(() => "(no form)");
          throw new Error(`${slug}: the edit form shows ${JSON.stringify(got)}, not ${JSON.stringify(shown)}`);
        }
        await page.fill("#edit-form #app-price-request", `0.00${i}`);
        await page.click("#edit-submit");
        await page.waitForURL(/\?saved=/, { timeout: DEADLINE });
      }
    }
  },

  // A page still waiting for the API when the next one is opened draws
  // nothing where the next one is: app A's answer is held until app B's
  // page is drawn, then let go.
  async stale_page(page) {
    await login(page, world.email, world.password);
    const [a, b] = Object.keys(world.apps);
    let release;
    const held = new Promise((r) => { release = r; });
    await page.route(`**/v1/apps/${a}`, async (route) => { await held; await route.continue(); });
    await page.goto(`${base}/console#/apps/${a}`);
    await page.goto(`${base}/console#/apps/${b}`);
    await page.waitForFunction((slug) => document.querySelector("main h1 code")?.textContent === slug, b, { timeout: DEADLINE });
    const answered = page.waitForResponse((r) => r.url().endsWith(`/v1/apps/${a}`), { timeout: DEADLINE });
    release();
    await answered;
    await page.waitForTimeout(500); // time for A's page to draw, had it anywhere to draw
    const shown = await page.$$eval("main h1 code", (els) => els.map((e) => e.textContent));
    if (shown.length !== 1 || shown[0] !== b) throw new Error(`after app ${a}'s late answer the page shows ${JSON.stringify(shown)}`);
  },

  // The console at a plain-HTTP host name that is not loopback (a LAN
  // name; gpu.lan is mapped to 127.0.0.1): not a secure context, so no
  // crypto.randomUUID and no navigator.clipboard. Launch still works and
  // Copy says what it did, without a page error.
  async plain_http(page) {
    const lan = base.replace("127.0.0.1", "gpu.lan");
    await page.goto(`${lan}/console#/login`);
    if (await page.evaluate(() => window.isSecureContext)) throw new Error("gpu.lan is a secure context: the scenario tests nothing");
    await page.fill("#login-email", world.email);
    await page.fill("#login-password", world.password);
    await page.click("#login-submit");
    await page.waitForFunction(() => !location.hash.startsWith("#/login"), null, { timeout: DEADLINE });
    await page.goto(`${lan}/console#/launch`);
    await fillLaunch(page, { cards: 1, command: "sleep 3600" });
    await page.click("#launch-submit");
    await page.waitForURL(/#\/instances\/ins_/, { timeout: DEADLINE });
    await page.waitForSelector("#instance-state[data-state='running']", { timeout: DEADLINE });
    await page.click("#copy-ssh-0");
    await page.waitForFunction(() => document.getElementById("toast").textContent.length > 0, null, { timeout: DEADLINE });
    const sel = await page.evaluate(() => String(window.getSelection()));
    const cmd = await page.textContent("#ssh-0");
    if (!(await page.textContent("#toast")).includes("已复制") && sel !== cmd)
      throw new Error(`copy neither copied nor selected the command: ${JSON.stringify(sel)}`);
  },

  // More transactions than the console reads in one go (world.n grants,
  // "grant-0001" the oldest): the page starts at the newest, "Show older"
  // brings the rest, and in the end every one is listed, none dropped.
  async many_transactions(page) {
    const n = world.n, name = (i) => `grant-${String(i).padStart(4, "0")}`;
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/transactions`);
    await page.waitForSelector("#transactions tbody tr", { timeout: DEADLINE });
    const top = await page.locator("#transactions tbody tr").first().textContent();
    if (!top.includes(name(n))) throw new Error(`the first row is not the newest: ${top}`);
    while (await page.isVisible("#txn-older")) {
      await page.click("#txn-older");
      await page.waitForFunction(() => !document.querySelector("#txn-older:disabled"), null, { timeout: DEADLINE });
    }
    await waitText(page, "#txn-count", String(n + world.others));
    const rows = await page.locator("#transactions tbody tr").count();
    if (rows !== n + world.others) throw new Error(`${rows} rows listed, not ${n + world.others}`);
    const text = await page.textContent("#transactions");
    for (const i of [1, 2, n - 1, n]) if (!text.includes(name(i))) throw new Error(`${name(i)} is not listed`);
    // The statement opens at the newest transaction's month.
    await page.goto(`${base}/console#/statement`);
    await page.waitForSelector("#statement table", { timeout: DEADLINE });
    const month = await page.inputValue("#statement-month");
    if (month !== world.month) throw new Error(`the statement opens at ${month}, not ${world.month}`);
    await page.goto(`${base}/console#/usage`); // its chart reads the period's spending, every page
    await page.waitForSelector("#card-hours", { timeout: DEADLINE });
  },

  // Pages whose optional parts are absent (funds that cover an hour, a
  // cancelled reservation, an app without events) show no word "null".
  async no_null_text(page) {
    await login(page, world.email, world.password);
    const pages = [["launch", "#estimate-hour"], [`reservations/${world.reservation_id}`, "#reservation-state[data-state='cancelled']"],
      [`apps/${world.slug}`, "#edit-form"]];
    for (const [route, ready] of pages) {
      await page.goto(`${base}/console#/${route}`);
      await page.waitForSelector(ready, { timeout: DEADLINE });
      const hits = await page.evaluate(() => {
        const w = document.createTreeWalker(document.querySelector("main"), NodeFilter.SHOW_TEXT);
        const out = [];
        for (let n; (n = w.nextNode());) if (/^(null|undefined|false)$/.test(n.data.trim())) out.push(`${n.parentElement.tagName}#${n.parentElement.id}`);
        return out;
      });
      if (hits.length) throw new Error(`#/${route} shows "null" in ${hits.join(", ")}`);
    }
  },

  // A refused value is explained with the server's own message (it says
  // what is wrong with it), and the password forms ask for the server's
  // least length, 10.
  async server_message(page) {
    expected.push(/status of 400/);
    await login(page, world.email, world.password);
    await setLang(page, "en");
    await page.goto(`${base}/console#/volumes`);
    await page.fill("#volume-name", world.bad_volume_name);
    await page.click("main form button[type=submit]");
    await waitText(page, "main .error", world.volume_message);
    await waitText(page, "main .error", "(field: name)");
    await page.goto(`${base}/console#/password`);
    await page.waitForSelector("#pw-new");
    const hint = await page.locator("label.field", { has: page.locator("#pw-new") }).textContent();
    if (!hint.includes("10")) throw new Error(`the new password's hint: ${hint}`);
    await page.fill("#pw-new", "nine-char");
    if (await page.$eval("#pw-new", (e) => e.checkValidity())) throw new Error("a 9-character password passes the form's check");
    await page.evaluate(() => sessionStorage.clear());
    await page.goto(`${base}/console#/signup`);
    await page.fill("#signup-password", "nine-char");
    if (await page.$eval("#signup-password", (e) => e.checkValidity())) throw new Error("sign-up takes a 9-character password");
    await waitText(page, "main", "At least 10 characters");
  },

  // Money is formatted exactly from the API's decimal strings, one way
  // everywhere; a fraction of an hour or card in the booking form is told,
  // not a page error; the launch page fits a phone with an SSH key listed.
  async exact_money_fractions_phone(page) {
    await login(page, world.email, world.password);
    const got = await page.evaluate(async () => {
      const ui = await import("/console/js/ui.js");
      return ["1.005", "2.675", "0.125", "-0.005", "-0.001", "12345678901.995", "3"].map((a) => [ui.money(a).textContent, ui.money2(a)]);
    });
    const want = ["1.01", "2.68", "0.13", "-0.01", "0.00", "12,345,678,902.00", "3.00"];
    want.forEach((w, i) => {
      if (got[i][0] !== `${w} CNY` || got[i][1] !== w) throw new Error(`amount ${i}: ${JSON.stringify(got[i])}, not ${w}`);
    });
    await page.goto(`${base}/console#/reservations?gpu_type=H100-SXM`);
    await page.waitForSelector("#book-total");
    for (const [sel, v] of [["#book-hours", "1.5"], ["#book-cards", "2.5"]]) {
      await page.fill(sel, v);
      await page.waitForSelector("#book-quote .error", { timeout: DEADLINE });
      await page.fill(sel, "1");
      await page.waitForSelector("#book-total", { timeout: DEADLINE });
    }
    // Windows past the booking horizon (world.horizon hours): the API
    // names the window's end ("to", "ends_at"), and the hours that make it
    // are marked, in the availability form and the booking form.
    expected.push(/status of 400/);
    const over = String(world.horizon + 10);
    // The test's browser runs in Asia/Shanghai (UTC+8): the hour as typed there.
    await page.fill("#book-start", new Date(Date.parse(world.start) + 8 * 3600000).toISOString().slice(0, 16));
    for (const [hours, button] of [["#avail-hours", "#avail-show"], ["#book-hours", "#book-submit"]]) {
      await page.fill(hours, over);
      await page.click(button);
      await page.waitForSelector(`${hours}[aria-invalid='true']:focus`, { timeout: DEADLINE });
      await page.fill(hours, "1");
    }
    await page.click("#avail-show");
    await page.waitForSelector("#avail-hours:not([aria-invalid])", { timeout: DEADLINE });
    await page.setViewportSize({ width: 375, height: 800 });
    await page.goto(`${base}/console#/launch`);
    await page.waitForSelector("#launch-form code");
    const [scroll, client] = await page.evaluate(() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]);
    if (scroll > client) throw new Error(`the launch page is ${scroll}px wide on a ${client}px phone`);
  },

  // Polled pages keep the keyboard's place: the instance list's link and
  // the instance page's Stop button keep focus when the poll draws them
  // again, and the state is a live region written in place, so a screen
  // reader hears it change once.
  async poll_focus(page) {
    const id = world.instance_id;
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/instances`);
    await focusSurvivesRedraw(page, `main a[href='#/instances/${id}']`, "instance list");
    await page.keyboard.press("Enter");
    await page.waitForSelector("#instance-state[data-state='running']", { timeout: DEADLINE });
    await page.evaluate(() => { window.gpurentLive = document.getElementById("instance-state").closest("[aria-live='polite']"); });
    if (!(await page.evaluate(() => !!window.gpurentLive))) throw new Error("the instance's state is in no polite live region");
    await focusSurvivesRedraw(page, "#action-stop", "instance page");
    await page.keyboard.press("Enter"); // Stop, from the keyboard
    await page.waitForSelector("#instance-state[data-state='stopped']", { timeout: DEADLINE });
    const same = await page.evaluate(() => window.gpurentLive.isConnected && window.gpurentLive.contains(document.getElementById("instance-state")));
    if (!same) throw new Error("the state's live region was replaced, not written in place");
  },

  // The address verified in another tab (the mailed link): the overview
  // asks the server, not this tab's snapshot from the login, and stops
  // asking to verify; the verify page with no session names no address.
  async verified_elsewhere(page) {
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/overview`);
    await page.waitForSelector("#available", { timeout: DEADLINE });
    if (!(await page.$("main .warn a[href='#/verify']"))) throw new Error("an unverified account is not asked to verify");
    // A code sent again, then a second press within the minute refused
    // (429): the page says the refusal, no longer that a code is coming.
    expected.push(/status of 429/);
    await page.click("main .warn a[href='#/verify']");
    await page.click("#verify-resend");
    await page.waitForSelector("#verify-resent", { timeout: DEADLINE });
    await page.click("#verify-resend");
    await waitText(page, "main form .error", "秒后重试");
    if (await page.$("#verify-resent")) throw new Error("a refused resend is shown beside 'a new code is on its way'");
    await page.goto(`${base}/console#/overview`);
    await page.waitForSelector("#available", { timeout: DEADLINE });
    await ask({ verify: world.email });
    await page.reload();
    await page.waitForSelector("#available", { timeout: DEADLINE });
    if (await page.$("main .warn a[href='#/verify']")) throw new Error("the overview still asks to verify an address verified elsewhere");
    const snapshot = await page.evaluate(() => JSON.parse(sessionStorage.getItem("gpurent.user")).email_verified);
    if (snapshot !== true) throw new Error(`the session's snapshot still says email_verified ${snapshot}`);
    await page.evaluate(() => sessionStorage.clear());
    await page.goto(`${base}/console#/verify`);
    await page.waitForSelector("#verify-token");
    const said = await page.textContent("main form p");
    if (/(至|to)\s*[，,:：]/.test(said) || !said.includes("验证码")) throw new Error(`the verify page without an address says ${JSON.stringify(said)}`);
  },

  // Enter pressed three times quickly in the launch form: the button stays
  // disabled from the first until the instance's page replaces the form
  // (it was enabled again in between), so one instance is made. Before
  // that, the form opens on the one type with free cards (MI450), not on
  // the first in the list (MI300X, none free, which says so and is marked
  // unavailable), and a type short of the cards asked for says so before
  // Launch is pressed.
  async enter_thrice(page) {
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/launch`);
    await page.waitForSelector("#launch-type");
    const opened = await page.$eval("#launch-type", (s) => ({ value: s.value,
      unavailable: [...s.options].filter((o) => o.classList.contains("unavailable")).map((o) => o.textContent) }));
    if (opened.value !== "MI450") throw new Error(`the launch form opens on ${opened.value}, not the type with free cards`);
    if (!opened.unavailable.some((x) => x.startsWith("MI300X") && x.includes("暂无空闲")))
      throw new Error(`MI300X, with no free card, is not marked unavailable: ${JSON.stringify(opened.unavailable)}`);
    await page.selectOption("#launch-type", "MI300X");
    await waitText(page, "#launch-capacity", "MI300X 目前单个实例最多 0 张（共空闲 0 张）");
    await page.selectOption("#launch-type", "MI450");
    await page.fill("#launch-cards", "16");
    await waitText(page, "#launch-capacity", "MI450 目前单个实例最多 8 张（共空闲 8 张），创建 16 张");
    await fillLaunch(page, { cards: 1 });
    await page.waitForSelector("#launch-capacity", { state: "detached", timeout: DEADLINE });
    await page.waitForSelector("#estimate-hour", { timeout: DEADLINE });
    await page.evaluate(() => {
      // Every change of the button's disabled attribute, with its value before.
      window.gpurentEnabled = [];
      new MutationObserver((ms) => ms.forEach((m) => window.gpurentEnabled.push(m.oldValue !== null)))
        .observe(document.getElementById("launch-submit"), { attributes: true, attributeFilter: ["disabled"], attributeOldValue: true });
    });
    await page.focus("#launch-name");
    for (let i = 0; i < 3; i++) await page.keyboard.press("Enter");
    await page.waitForURL(/#\/instances\/ins_/, { timeout: DEADLINE });
    await page.waitForSelector("#instance-state", { timeout: DEADLINE });
    const seen = await page.evaluate(() => window.gpurentEnabled);
    if (!seen.length || seen.some((wasDisabled) => wasDisabled)) throw new Error(`the launch button was enabled again before the page changed: ${JSON.stringify(seen)}`);
  },

  // A log line's time is written in the console's language (24-hour
  // clock in both), not the browser's (en-US here: "2:15:18 PM").
  async log_times(page) {
    await login(page, world.email, world.password);
    for (const lang of ["zh", "en"]) {
      await setLang(page, lang);
      await page.goto(`${base}/console#/instances/${world.instance_id}?lang=${lang}`);
      await waitText(page, "#logs", "quiet-now");
      const text = await page.textContent("#logs");
      if (!/(^|\n)\d{2}:\d{2}:\d{2} quiet-now/.test(text)) throw new Error(`${lang}: the log's time is not the console's: ${JSON.stringify(text)}`);
    }
  },

  // The keyboard's focus ring stands out 3:1 (WCAG 1.4.11) against the
  // dark header and against the page, in the header and in the page.
  async focus_contrast(page) {
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/overview`);
    await page.waitForSelector("#available", { timeout: DEADLINE });
    const ring = async () => page.evaluate(() => {
      const rgb = (c) => c.match(/[\d.]+/g).slice(0, 3).map(Number);
      const lum = (c) => {
        const [r, g, b] = rgb(c).map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
        return 0.2126 * r + 0.7152 * g + 0.0722 * b;
      };
      const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
      const el = document.activeElement, st = getComputedStyle(el);
      const header = getComputedStyle(document.querySelector("header.top")).backgroundColor;
      const body = getComputedStyle(document.body).backgroundColor;
      return { el: el.outerHTML.slice(0, 60), style: st.outlineStyle, header: ratio(st.outlineColor, header), page: ratio(st.outlineColor, body) };
    });
    await page.keyboard.press("Tab"); // the keyboard in use: focus is drawn as for it
    for (const [where, sel] of [["header", "header .brand"], ["page", "main a[href='#/launch']"]]) {
      await page.locator(sel).focus();
      const r = await ring();
      if (r.style === "none" || r.header < 3 || r.page < 3) throw new Error(`the focus ring in the ${where}: ${JSON.stringify(r)}`);
    }
  },

  // On a phone the SSH command and the audit table scroll sideways: each
  // is a named region the keyboard reaches (Tab) and scrolls.
  async scroll_regions(page) {
    const allReachable = async (where) => {
      let bad = [];
      try { await poll(async () => (bad = await unreachableScrollers(page)).length === 0, 10000); } catch {
        throw new Error(`${where}: scrolling boxes the keyboard cannot reach: ${bad.join(" | ")}`);
      }
    };
    await page.setViewportSize({ width: 375, height: 800 });
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/instances/${world.instance_id}`);
    await page.waitForSelector("#instance-state[data-state='running']", { timeout: DEADLINE });
    await page.waitForSelector("#ssh-0", { timeout: DEADLINE });
    await allReachable("instance page");
    await page.evaluate(() => sessionStorage.clear());
    await login(page, world.admin_email, world.admin_password);
    await page.goto(`${base}/console#/admin/audit`);
    await page.waitForSelector("#audit .table-wrap", { timeout: DEADLINE });
    await allReachable("audit page");
    // Reached with Tab from the filter form's button, and scrolled with an arrow key.
    await page.focus("main form button[type=submit]");
    await page.keyboard.press("Tab");
    const on = await page.evaluate(() => document.activeElement.matches("#audit .table-wrap"));
    if (!on) throw new Error("Tab does not reach the audit table");
    await page.keyboard.press("ArrowRight");
    await page.waitForFunction(() => document.querySelector("#audit .table-wrap").scrollLeft > 0, null, { timeout: DEADLINE });
  },

  // An action in flight keeps every action button disabled through the
  // polls that answer meanwhile (a poll drew them enabled, and a second
  // click sent a second stop), and a poll sent before the action's answer
  // does not draw the state from before it over the answer's.
  async action_in_flight(page) {
    const id = world.instance_id;
    const sent = [];
    let releaseStop, stopSeen = false, holdGets = false, heldGet = null, releaseGet;
    const stopGate = new Promise((r) => { releaseStop = r; });
    const getGate = new Promise((r) => { releaseGet = r; });
    await login(page, world.email, world.password);
    page.on("request", (r) => { if (r.method() !== "GET" && r.url().includes(`/v1/instances/${id}`)) sent.push(`${r.method()} ${new URL(r.url()).pathname}`); });
    await page.route(`**/v1/instances/${id}/stop`, async (route) => { stopSeen = true; await stopGate; await route.continue(); });
    await page.route(`**/v1/instances/${id}`, async (route) => {
      if (route.request().method() !== "GET" || !holdGets || heldGet) return route.continue();
      heldGet = await route.fetch(); // the state as it is now, answered late
      await getGate;
      await route.fulfill({ response: heldGet });
    });
    await page.goto(`${base}/console#/instances/${id}`);
    await page.waitForSelector("#instance-state[data-state='running']", { timeout: DEADLINE });
    await page.evaluate(() => {
      window.gpurentStates = [];
      const cell = document.getElementById("instance-state-live");
      new MutationObserver(() => { const s = document.getElementById("instance-state"); if (s) window.gpurentStates.push(s.dataset.state); })
        .observe(cell, { childList: true, subtree: true });
    });
    const polled = () => page.waitForResponse((r) => r.request().method() === "GET" && new URL(r.url()).pathname === `/v1/instances/${id}`, { timeout: DEADLINE });
    await page.click("#action-stop");
    await poll(() => stopSeen);
    await polled(); // a poll answered while the stop is out
    await polled();
    const enabled = await page.$$eval("button[id^=action-]", (bs) => bs.filter((b) => !b.disabled).map((b) => b.id));
    if (enabled.length) throw new Error(`action buttons enabled while the stop is in flight: ${enabled.join(", ")}`);
    await page.$$eval("button[id^=action-]", (bs) => bs.forEach((b) => b.click()));
    holdGets = true;
    await poll(() => heldGet !== null); // a poll sent before the stop's answer
    releaseStop();
    await page.waitForSelector("#instance-state:not([data-state='running'])", { timeout: DEADLINE });
    const late = polled();
    releaseGet();
    await late;
    await polled(); // the late answer has been handled, and one after it
    const states = await page.evaluate(() => window.gpurentStates);
    const after = states.slice(states.findIndex((x) => x !== "running"));
    if (after.includes("running")) throw new Error(`a poll from before the stop drew its state over the stop's answer: ${states.join(" → ")}`);
    if (sent.length !== 1 || sent[0] !== `POST /v1/instances/${id}/stop`) throw new Error(`actions sent: ${sent.join(", ")}`);
    await page.waitForSelector("#instance-state[data-state='stopped']", { timeout: DEADLINE });
    await page.waitForSelector("#action-start:not([disabled])", { timeout: DEADLINE });
  },

  // The skip link, from the keyboard, takes the focus to the page it is on
  // (it went to #main, no route, and so to the overview), and the next Tab
  // reaches the page's first field.
  async skip_link(page) {
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/launch`);
    await page.waitForSelector("#launch-type");
    await page.focus("#skip-link");
    await page.keyboard.press("Enter");
    await page.waitForFunction(() => document.activeElement.id === "main", null, { timeout: DEADLINE });
    const hash = await page.evaluate(() => location.hash);
    if (hash !== "#/launch") throw new Error(`the skip link left the launch page for ${hash}`);
    await page.keyboard.press("Tab");
    const on = await page.evaluate(() => document.activeElement.id);
    if (on !== "launch-type") throw new Error(`Tab after the skip link went to #${on}, not the form's first field`);
  },

  // On a phone the menu's toggle is named in words (its face is ☰), opens
  // from the keyboard, and once a page is chosen from it says it is closed.
  async phone_menu(page) {
    await page.setViewportSize({ width: 375, height: 800 });
    await login(page, world.email, world.password);
    for (const [lang, name] of [["zh", "菜单"], ["en", "Menu"]]) {
      await setLang(page, lang);
      const toggle = page.getByRole("button", { name, exact: true });
      if ((await toggle.count()) !== 1) throw new Error(`${lang}: no button named ${name}`);
    }
    await page.focus("#nav-toggle");
    await page.keyboard.press("Enter");
    await page.waitForSelector("nav a[href='#/transactions']", { state: "visible", timeout: DEADLINE });
    if ((await page.getAttribute("#nav-toggle", "aria-expanded")) !== "true") throw new Error("the open menu's toggle does not say it is expanded");
    // Escape from inside the menu closes it, back on the toggle.
    await page.focus("nav a[href='#/launch']");
    await page.keyboard.press("Escape");
    await page.waitForSelector("nav a[href='#/launch']", { state: "hidden", timeout: DEADLINE });
    const back = await page.evaluate(() => [document.activeElement.id, document.getElementById("nav-toggle").getAttribute("aria-expanded")]);
    if (back[0] !== "nav-toggle" || back[1] !== "false") throw new Error(`after Escape: focus on #${back[0]}, aria-expanded ${back[1]}`);
    await page.keyboard.press("Enter");
    await page.waitForSelector("nav a[href='#/transactions']", { state: "visible", timeout: DEADLINE });
    await page.focus("nav a[href='#/transactions']");
    await page.keyboard.press("Enter");
    await page.waitForSelector("#transactions", { timeout: DEADLINE });
    await page.waitForSelector("nav a[href='#/transactions']", { state: "hidden", timeout: DEADLINE });
    const expanded = await page.getAttribute("#nav-toggle", "aria-expanded");
    if (expanded !== "false") throw new Error(`the menu closed but its toggle says aria-expanded=${expanded}`);
  },

  // The instance page while the API in front of it fails: a proxy's 502
  // page is said as the service being unavailable (not "http_502"), a 429
  // tells its Retry-After and the polls wait that long, and once a poll
  // succeeds again its error is gone (it stayed on the page for good).
  async api_trouble(page) {
    const id = world.instance_id;
    let mode = "pass", refusedAt = 0, nextAt = 0;
    expected.push(/status of (502|429)/);
    await login(page, world.email, world.password);
    await setLang(page, "en");
    await page.route(`**/v1/instances/${id}`, async (route) => {
      if (route.request().method() !== "GET") return route.continue();
      if (mode === "502") { mode = "pass"; return route.fulfill({ status: 502, contentType: "text/html", body: "<html><body>502 Bad Gateway</body></html>" }); }
      if (mode === "429") {
        mode = "pass";
        refusedAt = Date.now();
        return route.fulfill({ status: 429, contentType: "application/json", headers: { "Retry-After": "4" },
          body: JSON.stringify({ error: { code: "too_many_requests", message: "too many requests" } }) });
      }
      if (refusedAt && !nextAt) nextAt = Date.now();
      return route.continue();
    });
    await page.goto(`${base}/console#/instances/${id}`);
    await page.waitForSelector("#instance-state[data-state='running']", { timeout: DEADLINE });
    const cleared = () => page.waitForFunction(() => document.getElementById("instance-poll-error").textContent === "", null, { timeout: DEADLINE, polling: 100 });
    mode = "502";
    await waitText(page, "#instance-poll-error", "The service is unavailable for now");
    const said = await page.textContent("#instance-poll-error");
    if (said.includes("http_502")) throw new Error(`a 502 is told as ${said}`);
    await cleared();
    mode = "429";
    await waitText(page, "#instance-poll-error", "Try again in 4 s.");
    await cleared();
    if (nextAt - refusedAt < 3500) throw new Error(`the page polled again ${nextAt - refusedAt} ms after a 429 with Retry-After: 4`);
  },

  // The console's key revoked elsewhere: the page's requests all answer
  // 401, the session ends with one notice (one per request, before), and
  // logging in again leads back to the page it ended on.
  async session_revoked(page) {
    expected.push(/status of 401/);
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/instances`);
    await page.waitForSelector("main h1", { timeout: DEADLINE });
    const keyId = await page.evaluate(() => JSON.parse(sessionStorage.getItem("gpurent.user")).api_key_id);
    const r = await fetch(`${base}/v1/api-keys/${keyId}`, { method: "DELETE", headers: { Authorization: `Bearer ${world.key}` } });
    if (r.status !== 200) throw new Error(`revoking the console's key: ${r.status}`);
    // The launch page sends six requests at once with the revoked key. The
    // first 401 ends the session and the page, which may cancel the others
    // before their answers come: they are counted as sent, not as answered.
    const refused = [], sent = [];
    page.on("request", (x) => { if (x.url().includes("/v1/") && x.headers().authorization) sent.push(x.url()); });
    page.on("response", (x) => { if (x.status() === 401) refused.push(x.url()); });
    await page.goto(`${base}/console#/launch`);
    await page.waitForFunction(() => location.hash.startsWith("#/login"), null, { timeout: DEADLINE });
    await poll(() => refused.length >= 1);
    if (sent.length < 2) throw new Error(`only ${sent.length} requests went with the revoked key`);
    const notices = await page.locator("#toast div").count();
    if (notices !== 1) throw new Error(`${notices} notices that the session ended, for ${sent.length} requests with the revoked key`);
    await page.fill("#login-email", world.email);
    await page.fill("#login-password", world.password);
    await page.click("#login-submit");
    await page.waitForSelector("#launch-form", { timeout: DEADLINE });
    // Logging out with a key revoked meanwhile (or expired) just logs out:
    // no "session ended" notice and no way back to the page (the revoking
    // DELETE's 401 ended the session first, with both).
    const again = await page.evaluate(() => JSON.parse(sessionStorage.getItem("gpurent.user")).api_key_id);
    const r2 = await fetch(`${base}/v1/api-keys/${again}`, { method: "DELETE", headers: { Authorization: `Bearer ${world.key}` } });
    if (r2.status !== 200) throw new Error(`revoking the console's second key: ${r2.status}`);
    await page.evaluate(() => {
      const box = document.getElementById("toast");
      while (box.firstChild) box.firstChild.remove();
      window.gpurentToasts = [];
      new MutationObserver(() => { if (box.textContent) window.gpurentToasts.push(box.textContent); }).observe(box, { childList: true, subtree: true });
    });
    const revoking = page.waitForResponse((x) => x.request().method() === "DELETE" && x.url().endsWith(`/v1/api-keys/${again}`), { timeout: DEADLINE });
    await page.click("#logout");
    const answer = await revoking;
    await answer.finished();
    if (answer.status() !== 401) throw new Error(`the logout's DELETE of a revoked key answered ${answer.status()}`);
    await page.waitForSelector("#login-email", { timeout: DEADLINE });
    const out = await page.evaluate(() => ({ hash: location.hash, key: sessionStorage.getItem("gpurent.key"), toasts: window.gpurentToasts,
      logout: document.getElementById("logout").hidden }));
    if (out.hash !== "#/login" || out.key || out.toasts.length || !out.logout) throw new Error(`logging out with a revoked key: ${JSON.stringify(out)}`);
  },

  // Every kind of event the API documents is named in words in the
  // timeline: a phase reached (mounting, starting) and the runtime warning
  // showed as the catalogue's keys ("state.starting").
  async event_names(page) {
    const id = world.instance_id;
    await login(page, world.email, world.password);
    await setLang(page, "en");
    await page.route(`**/v1/instances/${id}/events*`, async (route) => {
      const real = await route.fetch();
      const body = await real.json();
      const at = body.data[body.data.length - 1].at;
      body.data.push({ seq: 1e9, at, state: "mounting", reason: "" }, { seq: 1e9 + 1, at, state: "starting", reason: "" },
        { seq: 1e9 + 2, at, state: "max_runtime_warning", reason: "max_runtime_minutes ends it soon" });
      await route.fulfill({ response: real, json: body });
    });
    await page.goto(`${base}/console#/instances/${id}`);
    await waitText(page, "#events", "runtime limit near");
    const text = await page.textContent("#events");
    for (const want of ["mounting", "starting", "running"]) if (!text.includes(want)) throw new Error(`the timeline lacks ${want}: ${text}`);
    const keys = text.match(/\b(state|phase|event)\.[a-z_]+/g);
    if (keys) throw new Error(`the timeline shows catalogue keys: ${keys.join(", ")}`);
  },

  // On a phone the header's language menu and Log out keep the width they
  // have on a laptop (the menu was squeezed to "Er" of English by a long
  // e-mail address beside it), a notice keeps off the screen's edges, and
  // Log out works.
  async phone_header(page) {
    await login(page, world.email, world.password);
    await setLang(page, "en");
    const widths = () => page.evaluate(() => ["lang", "logout"].map((id) => document.getElementById(id).getBoundingClientRect().width));
    const wide = await widths();
    await page.setViewportSize({ width: 375, height: 800 });
    await page.waitForFunction(() => document.documentElement.clientWidth === 375, null, { timeout: DEADLINE });
    const narrow = await widths();
    if (narrow.some((w, i) => w < wide[i] - 1)) throw new Error(`the header's controls are squeezed on a phone: ${narrow} px, ${wide} px on a laptop`);
    // A long notice keeps a margin on both sides (it sat flush with the
    // screen's left edge).
    const edges = await page.evaluate(async () => {
      (await import("/console/js/ui.js")).toast("Something went wrong: " + "the server said a long thing about it, ".repeat(3), true);
      const r = document.querySelector("#toast div").getBoundingClientRect();
      return [r.left, document.documentElement.clientWidth - r.right];
    });
    if (edges.some((m) => m < 8)) throw new Error(`a notice on a 375 px phone has margins of ${edges.join(" and ")} px`);
    // Log out, there, revokes the session's key (it is ended here first).
    const keyId = await page.evaluate(() => JSON.parse(sessionStorage.getItem("gpurent.user")).api_key_id);
    const revoking = page.waitForResponse((x) => x.request().method() === "DELETE" && x.url().endsWith(`/v1/api-keys/${keyId}`), { timeout: DEADLINE });
    await page.click("#logout");
    if ((await revoking).status() !== 200) throw new Error("Log out did not revoke the session's key");
    await page.waitForSelector("#login-email", { timeout: DEADLINE });
  },

  // Every page, logged out, as a user and as an admin, in both languages,
  // passes axe-core's WCAG 2.2 A and AA rules and its best practices
  // (labels, names, contrast, landmarks, table headings, lang).
  async axe_every_page(page) {
    const axeSource = readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");
    const found = [];
    const check = async (route) => {
      await page.goto(`${base}/console#/${route}`);
      await page.waitForSelector("main h1", { timeout: DEADLINE });
      await page.waitForSelector("#loading", { state: "detached", timeout: DEADLINE });
      // Run through the DevTools protocol, which the page's CSP does not govern.
      if (!(await page.evaluate(() => typeof window.axe === "object"))) await page.evaluate(axeSource);
      const result = await page.evaluate(() => window.axe.run(document, {
        runOnly: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa", "best-practice"] }));
      for (const v of result.violations)
        found.push(`#/${route} (${await page.evaluate(() => document.documentElement.lang)}): ${v.id}: ${v.help}: ` +
          v.nodes.slice(0, 3).map((n) => n.target.join(" ")).join(", "));
    };
    const pages = {
      public: ["login", "signup", "reset", "catalog", "apps"],
      user: ["overview", "catalog", "launch", "instances", `instances/${world.instance_id}`,
        `terminal/${world.instance_id}/0`, "reservations", `reservations/${world.reservation_id}`, "apps",
        `apps/${world.slug}`, "publish", "my-apps", "volumes", "ssh-keys", "api-keys", "usage", "transactions",
        "statement", "password"],
      admin: ["admin/nodes", "admin/prices", "admin/invites", "admin/money", "admin/users", "admin/audit"],
    };
    const everyPage = async (routes) => {
      for (const lang of ["zh", "en"]) {
        await setLang(page, lang);
        for (const route of routes) await check(route);
      }
    };
    await page.goto(`${base}/console#/login`);
    await everyPage(pages.public);
    await login(page, world.email, world.password);
    await everyPage(pages.user);
    await page.click("#logout");
    await page.waitForSelector("#login-email", { timeout: DEADLINE });
    await login(page, world.admin_email, world.admin_password);
    await everyPage(pages.admin);
    if (found.length) throw new Error(`axe-core found ${found.length}:\n${found.join("\n")}`);
  },

  // Every page has a title of its own, in the console's language.
  async page_titles(page) {
    await login(page, world.email, world.password);
    const seen = new Set();
    for (const [route, zh, en] of [["overview", "概览", "Overview"], ["launch", "创建实例", "Launch"], ["transactions", null, "Transactions"]]) {
      await page.goto(`${base}/console#/${route}`);
      await page.waitForSelector("main h1", { timeout: DEADLINE });
      const title = await page.title();
      if (zh && !title.startsWith(zh)) throw new Error(`#/${route} is titled ${JSON.stringify(title)}`);
      seen.add(title);
    }
    if (seen.size !== 3) throw new Error(`pages share a title: ${[...seen].join(" | ")}`);
    await setLang(page, "en");
    await page.waitForFunction(() => document.title.startsWith("Transactions"), null, { timeout: DEADLINE });
  },

  // A page whose API answers slowly says it is loading (it showed its
  // title over nothing), and stops saying so once drawn.
  async slow_page(page) {
    let release;
    const gate = new Promise((r) => { release = r; });
    await login(page, world.email, world.password);
    await setLang(page, "en");
    await page.route("**/v1/instances?*", async (route) => { await gate; await route.continue(); });
    await page.goto(`${base}/console#/instances`);
    await page.waitForSelector("#loading", { state: "visible", timeout: DEADLINE });
    await waitText(page, "#loading", "Loading");
    if ((await page.getAttribute("#main", "aria-busy")) !== "true") throw new Error("main is not aria-busy while the page loads");
    release();
    await waitText(page, "main", "No instances");
    await page.waitForSelector("#loading", { state: "detached", timeout: DEADLINE });
    if (await page.getAttribute("#main", "aria-busy")) throw new Error("main stays aria-busy after the page is drawn");
  },

  // A row's button is named with its row's thing for assistive
  // technology: a list of buttons all named "Delete" said nothing of which.
  async row_names(page) {
    await login(page, world.email, world.password);
    await setLang(page, "en");
    for (const [route, want] of [["volumes", ["Delete data-a", "Delete data-b"]], ["ssh-keys", ["Delete laptop", "Delete desktop"]],
      ["api-keys", ["Revoke ci"]]]) {
      await page.goto(`${base}/console#/${route}`);
      await page.waitForSelector("main table", { timeout: DEADLINE });
      for (const name of want)
        if ((await page.getByRole("button", { name, exact: true }).count()) !== 1) throw new Error(`#/${route}: no button named ${name}`);
      const names = await page.$$eval("main table button", (bs) => bs.map((b) => b.getAttribute("aria-label") || b.textContent));
      if (new Set(names).size !== names.length) throw new Error(`#/${route}: buttons share a name: ${names.join(", ")}`);
    }
  },

  // The statement lists the storage charged per volume and the app calls,
  // and the usage page the app calls: the API sends them and the pages
  // showed only GPU time. (The app call row is added to the usage answer
  // here; the storage charge is the daemon's own.)
  async statement_lines(page) {
    const call = { app_id: "app_00000000000000000000", slug: "echo-model", calls: 3, input_tokens: 120, output_tokens: 480,
      charged_micro: 30000, charged: "0.03" };
    await page.route("**/v1/usage?*", async (route) => {
      const real = await route.fetch();
      const body = await real.json();
      body.apps = [...(body.apps || []), call];
      await route.fulfill({ response: real, json: body });
    });
    await login(page, world.email, world.password);
    await setLang(page, "en");
    await page.goto(`${base}/console#/statement`);
    await waitText(page, "#statement-storage", world.volume);
    await waitText(page, "#statement-storage", world.cost);
    await waitText(page, "#statement-apps", "No app calls");
    await page.goto(`${base}/console#/usage`);
    await waitText(page, "#usage-apps", "echo-model");
    await waitText(page, "#usage-apps", "0.03");
    await waitText(page, "#usage-apps", "120 / 480");
  },

  // A value the server refuses marks its input: invalid, described by the
  // error (a screen reader says it there) and focused; a good value
  // clears the mark. The launch form's own check (ports) does the same.
  async field_error(page) {
    expected.push(/status of 400/);
    await login(page, world.email, world.password);
    await setLang(page, "en");
    await page.goto(`${base}/console#/volumes`);
    await page.fill("#volume-name", "My Data");
    await page.click("main form button[type=submit]");
    await page.waitForSelector("#volume-name[aria-invalid='true']", { timeout: DEADLINE });
    const said = await page.evaluate(() => {
      const el = document.getElementById("volume-name");
      return { focused: document.activeElement === el, text: (document.getElementById(el.getAttribute("aria-describedby")) || {}).textContent };
    });
    if (!said.focused || !(said.text || "").includes("(field: name)")) throw new Error(`the refused name is not marked: ${JSON.stringify(said)}`);
    await page.fill("#volume-name", "my-data");
    await page.click("main form button[type=submit]");
    await waitText(page, "main table", "my-data");
    if (await page.getAttribute("#volume-name", "aria-invalid")) throw new Error("the name stays marked invalid after it was taken");
    await page.goto(`${base}/console#/launch`);
    await page.waitForSelector("#launch-estimate strong", { timeout: DEADLINE });
    await page.fill("#launch-ports", "8888, 99999");
    await page.click("#launch-submit");
    await page.waitForSelector("#launch-ports[aria-invalid='true']:focus", { timeout: DEADLINE });
  },

  // The language catalogue failing to load (a proxy's 502) is said in both
  // languages rather than a blank page and an uncaught error; switching to
  // a language whose catalogue fails keeps the one in use, and says so.
  async catalogue_fails(page) {
    expected.push(/status of 502/);
    let fail = "zh";
    await page.route("**/console/i18n/*.json", (route) => (route.request().url().endsWith(`/${fail}.json`)
      ? route.fulfill({ status: 502, contentType: "text/html", body: "<html>502 Bad Gateway</html>" }) : route.continue()));
    await page.goto(`${base}/console#/login`);
    await waitText(page, "#no-catalogue", "The console could not load");
    fail = "en";
    await page.reload();
    await page.waitForSelector("#login-email", { timeout: DEADLINE });
    await page.selectOption("#lang", "en");
    await page.waitForSelector("#toast div.bad", { timeout: DEADLINE });
    const [lang, chosen, nav] = await page.evaluate(() => [document.documentElement.lang, document.getElementById("lang").value, document.querySelector("nav").textContent]);
    if (lang !== "zh-CN" || chosen !== "zh" || !nav.includes("登录")) throw new Error(`after a failed switch: lang ${lang}, menu ${chosen}, nav ${nav}`);
  },

  // The instance list while the API fails: the failure is said (polls
  // failed silently and the list looked current), the list comes when the
  // API is back, and the notice goes.
  async list_poll_error(page) {
    let fail = true;
    expected.push(/status of 502/);
    await login(page, world.email, world.password);
    await setLang(page, "en");
    await page.route("**/v1/instances?*", (route) => (fail
      ? route.fulfill({ status: 502, contentType: "text/html", body: "<html>502 Bad Gateway</html>" }) : route.continue()));
    await page.goto(`${base}/console#/instances`);
    await waitText(page, "#instances-poll-error", "The service is unavailable for now");
    fail = false;
    await page.waitForSelector(`main a[href='#/instances/${world.instance_id}']`, { timeout: DEADLINE });
    await page.waitForFunction(() => document.getElementById("instances-poll-error").textContent === "", null, { timeout: DEADLINE });
    fail = true;
    await waitText(page, "#instances-poll-error", "The service is unavailable for now");
    if (!(await page.$(`main a[href='#/instances/${world.instance_id}']`))) throw new Error("the list went with the failed poll");
  },

  // An instance launched with a volume says so on its page: the volume's
  // name and where it is mounted (the page showed nothing of it).
  // Its own name too (the page showed only the id), within a phone's
  // width however long the name's words, and kept current. On the same
  // phone it is renamed from the page with the keyboard alone: a name too
  // long (in bytes, as the API counts: 22 CJK characters are 66) is
  // marked on the input as the API refused it, a good one heads the page
  // and the list; once it is being terminated there is nothing to rename.
  async instance_volume(page) {
    expected.push(/status of 400/);
    await login(page, world.email, world.password);
    await setLang(page, "en");
    await page.setViewportSize({ width: 375, height: 800 });
    await page.goto(`${base}/console#/instances/${world.instance_id}`);
    await waitText(page, "#instance-volume", "shared-data");
    await waitText(page, "#instance-volume", "/shared");
    await waitText(page, "main h1", world.name);
    const narrow = async () => {
      const wide = await page.evaluate(() => document.documentElement.scrollWidth);
      if (wide > 375) throw new Error(`the instance page is ${wide} px wide on a 375 px phone`);
    };
    await narrow();
    // A name changed elsewhere (the API) while the page is open heads it
    // from the next poll, and the rename input, untouched, follows it.
    await ask({ rename: "renamed-run" });
    await waitText(page, "#instance-name", "renamed-run");
    if ((await page.textContent("main h1")).includes(world.name)) throw new Error("the old name still heads the instance page");
    await page.waitForSelector("#rename-form #rename-name", { timeout: DEADLINE });
    await page.waitForFunction(() => document.getElementById("rename-name").value === "renamed-run", null, { timeout: DEADLINE, polling: 100 });
    const label = await page.evaluate(() => [...document.getElementById("rename-name").labels].map((l) => l.textContent).join(" "));
    if (!label.includes("Name")) throw new Error(`the rename input is not labelled: ${JSON.stringify(label)}`);

    await page.focus("#rename-name");
    await page.keyboard.press("Control+A");
    await page.keyboard.type("名".repeat(22));
    await page.keyboard.press("Enter");
    await page.waitForSelector("#rename-name[aria-invalid='true']:focus", { timeout: DEADLINE });
    const said = await page.evaluate(() => (document.getElementById(document.getElementById("rename-name").getAttribute("aria-describedby")) || {}).textContent || "");
    if (!said.includes("(field: name)") || !said.includes("63")) throw new Error(`the refused name is not told on its input: ${JSON.stringify(said)}`);
    await waitText(page, "#instance-name", "renamed-run");
    await narrow();

    const renamed = "llama-70b 微调 v2";
    await page.keyboard.press("Control+A");
    await page.keyboard.type(renamed);
    await page.keyboard.press("Tab");
    if (!(await page.evaluate(() => document.activeElement.id === "rename-submit"))) throw new Error("Tab from the name does not reach Rename");
    await page.keyboard.press("Enter");
    await waitText(page, "#instance-name", renamed);
    await page.waitForFunction(() => !document.getElementById("rename-name").hasAttribute("aria-invalid"), null, { timeout: DEADLINE, polling: 100 });
    await waitText(page, "#toast", "Name changed");
    await narrow();
    await page.goto(`${base}/console#/instances`);
    await waitText(page, `main a[href='#/instances/${world.instance_id}']`, renamed);

    await page.goto(`${base}/console#/instances/${world.instance_id}`);
    await page.waitForSelector("#rename-form", { timeout: DEADLINE });
    await ask({ terminate: true });
    await page.waitForSelector("#instance-state[data-state='terminated']", { timeout: DEADLINE });
    if (await page.$("#rename-form, #rename-name")) throw new Error("a terminated instance is offered a rename");
    await waitText(page, "#instance-name", renamed);
  },

  // A wrong password typed while a session is open (the login page
  // reached again with Back, or to log in as someone else) is said as a
  // wrong password, where it was typed: it is not the session's key
  // refused, so the session stays and the form keeps its next page. (The
  // 401 ended the session, drew the form again without the error and
  // dropped ?next.) A wrong current password in the password form is
  // marked on its input, and its lockout holds up no page's polls.
  async wrong_password(page) {
    expected.push(/status of 401/);
    await login(page, world.email, world.password);
    await setLang(page, "en");
    await page.goto(`${base}/console#/login?next=%2Finstances`);
    await page.fill("#login-email", world.email);
    await page.fill("#login-password", "not the password at all");
    await page.click("#login-submit");
    await waitText(page, "main", "Wrong e-mail or password");
    const after = await page.evaluate(() => ({ hash: location.hash, key: !!sessionStorage.getItem("gpurent.key"), toast: document.getElementById("toast").textContent }));
    if (after.hash !== "#/login?next=%2Finstances" || !after.key || after.toast) throw new Error(`a wrong password ended the session: ${JSON.stringify(after)}`);
    await page.fill("#login-password", world.password);
    await page.click("#login-submit");
    await page.waitForFunction(() => location.hash === "#/instances", null, { timeout: DEADLINE });
    // A wrong current password on the change-password form marks that
    // input (its name is the field the API's error names) and focuses it.
    expected.push(/status of 403/);
    await page.goto(`${base}/console#/password`);
    await page.fill("#pw-current", "not the password at all");
    await page.fill("#pw-new", "a brand new password");
    await page.click("main form button[type=submit]");
    await page.waitForSelector("#pw-current[aria-invalid='true']:focus", { timeout: DEADLINE });
    // Said as a wrong password (403 forbidden read "You are not allowed
    // to do that").
    await waitText(page, "main form .error", "The current password is wrong");
    // Guessed again, the account's password guesses are locked out for
    // login_lockout_s (429, Retry-After 900): that wait is this form's,
    // and the pages' polls go on at their pace (every poll of the console
    // waited the 900 s, so an instance page stood still, saying nothing).
    expected.push(/status of 429/);
    for (const want of ["password is wrong", "Try again in"]) {
      await page.click("main form button[type=submit]");
      await waitText(page, "main form .error", want);
    }
    const polls = [];
    page.on("response", (r) => { if (r.request().method() === "GET" && new URL(r.url()).pathname === "/v1/instances") polls.push(Date.now()); });
    await page.goto(`${base}/console#/instances`);
    await poll(() => polls.length >= 3); // the first draw, then two polls
  },

  // Someone else's instance id in the address: not found, nothing of theirs.
  async foreign(page) {
    await login(page, world.email, world.password);
    await page.goto(`${base}/console#/instances/${world.instance_id}`);
    await waitText(page, "#instance-error", "未找到");
    const text = await page.textContent("main");
    if (text.includes(world.secret_image) || text.includes("MI450")) throw new Error(`another user's instance leaked: ${text}`);
  },

  // A forgotten password: the login page's link, the address, the mailed
  // code with a new password (a wrong code first: the one error, marked on
  // the code's input), then the old password refused and the new one in.
  async reset(page) {
    expected.push(/the server responded with a status of (400|401)/);
    await page.goto(`${base}/console#/login`);
    await page.click("#login-forgot");
    await page.waitForURL(/#\/reset$/, { timeout: DEADLINE });
    await page.fill("#reset-email", world.email);
    await page.click("#reset-submit");
    await page.waitForSelector("#reset-code:focus", { timeout: DEADLINE });
    await waitText(page, "#reset-sent", world.email);
    await waitText(page, "#reset-sent", "30");
    const { code } = await ask({ reset_code: world.email, n: 1 });
    await page.fill("#reset-code", "prc_aaaaaaaaaaaaaaaaaaaa");
    await page.fill("#reset-password", world.new_password);
    await page.click("#reset-confirm");
    await page.waitForSelector("#reset-code[aria-invalid='true']:focus", { timeout: DEADLINE });
    await waitText(page, "#reset-confirm-form", await page.evaluate(() => document.documentElement.lang.startsWith("zh")
      ? "验证码无效" : "That code does not work"));
    // "Send a new code" replaces the first: the first is refused now.
    await page.click("#reset-again");
    const { code: second } = await ask({ reset_code: world.email, n: 2 });
    if (second === code) throw new Error("the second code is the first");
    await page.fill("#reset-code", `${code} `);
    await page.click("#reset-confirm");
    await page.waitForSelector("#reset-code[aria-invalid='true']:focus", { timeout: DEADLINE });
    // Pasted from the mail with a space around it: taken.
    await page.fill("#reset-code", ` ${second}\n`);
    await page.click("#reset-confirm");
    await page.waitForSelector("#reset-login", { timeout: DEADLINE });
    // One login session (the test's) ended; the admin-made key kept.
    await waitText(page, "#reset-done", "1");
    if (await page.getAttribute("#reset-code", "aria-invalid")) throw new Error("the code stays marked after it was taken");
    await page.click("#reset-login");
    await page.fill("#login-email", world.email);
    await page.fill("#login-password", world.password);
    await page.click("#login-submit");
    await page.waitForSelector("main form [role='alert']", { timeout: DEADLINE });
    if (!page.url().includes("#/login")) throw new Error(`the old password logged in: ${page.url()}`);
    await login(page, world.email, world.new_password);
    await waitText(page, "nav", await page.evaluate(() => document.documentElement.lang.startsWith("zh") ? "概览" : "Overview"));
  },
};

async function main() {
  const name = process.argv[2];
  if (!scenarios[name]) throw new Error(`no scenario ${name}`);
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox", "--host-resolver-rules=MAP gpu.lan 127.0.0.1"] });
  const context = await browser.newContext({ acceptDownloads: true, viewport: { width: 1366, height: 900 }, timezoneId: "Asia/Shanghai",
    locale: "en-US" }); // the browser's own language is not the console's
  const page = await context.newPage();
  const problems = [];
  page.on("console", (m) => { if (m.type() === "error") problems.push(`console error: ${m.text()}`); });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  try {
    await scenarios[name](page);
  } catch (e) {
    await page.screenshot({ path: process.env.CONSOLE_FAIL_PNG || "/tmp/console-fail.png" }).catch(() => {});
    throw new Error(`${e.message}\n${problems.join("\n")}`);
  } finally {
    await browser.close();
  }
  // A page error or a CSP violation is a failure even when the steps passed.
  const real = problems.filter((p) => !/Failed to load resource: the server responded with a status of (402|404)/.test(p) && !expected.some((x) => x.test(p)));
  if (real.length) throw new Error(real.join("\n"));
  process.stdout.write("PASS\n");
  process.exit(0);
}

main().catch((e) => { process.stderr.write(`FAIL ${e.stack || e}\n`); process.exit(1); });
