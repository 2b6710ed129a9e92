// terminal.js: a web terminal into one rank of a running instance. The API
// issues a short-lived token for this user, instance and rank (POST
// .../terminal-tokens); the page opens the WebSocket the reply names:
// binary frames carry the terminal's bytes both ways, a text frame
// {"type":"resize"} follows the window, and the server closes with the
// reason "exit N" when the shell ends. xterm.js draws the terminal.
import { t } from "../i18n.js";
import { post, errorText } from "../api.js";
import { h, clear } from "../ui.js";

// xterm.js styles its rows with <style> elements, which the console's
// Content-Security-Policy (style-src 'self', no inline style) refuses. While
// the terminal page is open, document.createElement("style") gives xterm an
// inert <gpurent-style> element instead (xterm only sets its textContent
// and removes it), and that text is applied through constructed style
// sheets, which CSP allows, kept in step as xterm rewrites it. The patch
// is an own property of document over Document.prototype's method, and
// the page removes it when it is left (ctx.onLeave), before the next page
// starts: a second terminal can never save the first one's patch as the
// "real" method and put it back later.
const realCreate = Document.prototype.createElement;
function bridgeStyles(root) {
  const sheets = new Map();
  document.createElement = function (tag, opts) {
    return realCreate.call(this, String(tag).toLowerCase() === "style" ? "gpurent-style" : tag, opts);
  };
  const sync = () => {
    for (const el of root.querySelectorAll("gpurent-style")) {
      let sheet = sheets.get(el);
      if (!sheet) {
        sheet = new CSSStyleSheet();
        sheets.set(el, sheet);
        document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet];
      }
      sheet.replaceSync(el.textContent || "");
    }
    for (const [el, sheet] of sheets)
      if (!el.isConnected) {
        sheets.delete(el);
        document.adoptedStyleSheets = document.adoptedStyleSheets.filter((x) => x !== sheet);
      }
  };
  const mo = new MutationObserver(sync);
  mo.observe(root, { childList: true, subtree: true, characterData: true });
  return () => {
    mo.disconnect();
    delete document.createElement; // Document.prototype's again
    const ours = new Set(sheets.values());
    document.adoptedStyleSheets = document.adoptedStyleSheets.filter((x) => !ours.has(x));
  };
}

let xtermModule = null;
async function loadXterm() {
  if (!xtermModule) {
    if (!document.querySelector("link[data-xterm]"))
      document.head.append(h("link", { rel: "stylesheet", href: "/console/vendor/xterm/xterm.css", "data-xterm": "1" }));
    xtermModule = await import("/console/vendor/xterm/xterm.mjs");
  }
  return xtermModule;
}

export async function page(main, params, ctx) {
  const { id, rank } = params;
  const status = h("p", { id: "terminal-status", role: "status" }, t("terminal.connecting"));
  const wrap = h("div", { class: "term-wrap", id: "terminal" });
  const back = h("a", { href: `#/instances/${id}`, id: "terminal-back" }, t("terminal.back"), " ", h("code", {}, id));
  // The terminal keeps Tab for the program in it; the way out is told here.
  const keys = h("p", { class: "hint", id: "terminal-keys" }, t("terminal.keys"));
  main.append(h("h1", {}, t("terminal.title", { rank })), h("p", {}, back), status, keys, wrap);
  let grant;
  try {
    grant = await post(`/v1/instances/${id}/terminal-tokens`, { rank: Number(rank) });
  } catch (e) {
    status.className = "error";
    status.dataset.code = e.code || "";
    // A server without the terminal back end has no such route at all.
    const noRoute = e.status === 404 && e.code === "not_found" && /no route/.test(e.message);
    if (noRoute) status.dataset.unavailable = "1";
    status.textContent = noRoute ? t("terminal.unavailable") : errorText(e);
    return;
  }
  let mod;
  try { mod = await loadXterm(); } catch { status.className = "error"; status.textContent = t("terminal.no_library"); return; }
  if (!ctx.alive()) return; // left while the token or the library came
  const term = new mod.Terminal({ cursorBlink: true, convertEol: false, fontSize: 14, scrollback: 5000 });
  const unbridge = bridgeStyles(wrap);
  term.open(wrap);
  // Ctrl+M leaves the terminal for the link above it: xterm keeps Tab (the
  // shell completes with it), and Ctrl+M costs the program nothing, it is
  // the byte Enter sends.
  term.attachCustomKeyEventHandler((e) => {
    if (!(e.ctrlKey && !e.altKey && !e.metaKey && !e.shiftKey && e.code === "KeyM")) return true;
    if (e.type === "keydown") { e.preventDefault(); back.focus(); }
    return false;
  });
  if (term.textarea) term.textarea.setAttribute("aria-describedby", "terminal-keys");
  window.gpurentTerminal = term; // lets the browser tests read the screen
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(`${proto}//${location.host}${grant.url}`);
  ws.binaryType = "arraybuffer";
  const enc = new TextEncoder();
  const fit = () => {
    // Cells from the box's size: xterm's own fit addon does the same sum.
    const core = term._core && term._core._renderService && term._core._renderService.dimensions;
    const cw = (core && core.css.cell.width) || 9, ch = (core && core.css.cell.height) || 17;
    const cols = Math.max(20, Math.floor((wrap.clientWidth - 8) / cw)), rows = Math.max(5, Math.floor((wrap.clientHeight - 8) / ch));
    if (cols !== term.cols || rows !== term.rows) term.resize(cols, rows);
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "resize", cols: term.cols, rows: term.rows }));
  };
  ws.addEventListener("open", () => { status.textContent = t("terminal.connected"); status.dataset.state = "open"; fit(); term.focus(); });
  ws.addEventListener("message", (ev) => term.write(typeof ev.data === "string" ? ev.data : new Uint8Array(ev.data)));
  ws.addEventListener("close", (ev) => {
    status.dataset.state = "closed";
    const m = /^exit (\d+)/.exec(ev.reason || "");
    status.textContent = m ? t("terminal.exited", { code: m[1] }) : t("terminal.closed", { reason: ev.reason || ev.code });
  });
  ws.addEventListener("error", () => { status.className = "error"; status.textContent = t("terminal.failed"); });
  term.onData((d) => { if (ws.readyState === WebSocket.OPEN) ws.send(enc.encode(d)); });
  const onResize = () => fit();
  window.addEventListener("resize", onResize);
  // Leaving the page closes the session and gives document back its own
  // createElement.
  ctx.onLeave(() => {
    window.removeEventListener("resize", onResize);
    ws.close(1000, "page closed");
    term.dispose();
    unbridge();
    clear(wrap);
  });
}
