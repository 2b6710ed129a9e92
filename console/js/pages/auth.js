// auth.js: sign up (with an invite code), the e-mail verification step, log
// in, change password, and reset a forgotten one (a code by mail, then the
// code with a new password). A successful sign-up or login keeps the API key
// it returns in sessionStorage (api.js).
import { t } from "../i18n.js";
import { post, get, setSession, getUser, getKey } from "../api.js";
import { h, add, field, busy, money } from "../ui.js";

// The server's least password length (PASSWORD_MIN in the daemon).
const PASSWORD_MIN = 10;

function remember(res) {
  setSession(res.api_key.token, { ...res.user, api_key_id: res.api_key.id });
}

export async function login(main, params, ctx) {
  const email = h("input", { type: "email", name: "email", autocomplete: "username", required: true, id: "login-email" });
  const pw = h("input", { type: "password", name: "password", autocomplete: "current-password", required: true, id: "login-password" });
  const err = h("div");
  const btn = h("button", { type: "submit", id: "login-submit" }, t("auth.login"));
  const form = h("form", { class: "stack card" }, field(t("auth.email"), email), field(t("auth.password"), pw), err, btn,
    h("p", { class: "hint" }, t("auth.no_account"), " ", h("a", { href: "#/signup" }, t("auth.signup"))),
    h("p", { class: "hint" }, h("a", { href: "#/reset", id: "login-forgot" }, t("auth.forgot"))));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(btn, async () => {
      const res = await post("/v1/login", { email: email.value, password: pw.value, key_name: "console" });
      remember(res);
      ctx.navigate(ctx.query.get("next") || (res.user.email_verified ? "#/overview" : "#/verify"));
    }, err);
  });
  main.append(h("h1", {}, t("auth.login")), form);
  email.focus();
}

export async function signup(main, params, ctx) {
  const email = h("input", { type: "email", name: "email", autocomplete: "username", required: true, id: "signup-email" });
  const pw = h("input", { type: "password", name: "password", autocomplete: "new-password", required: true, minlength: PASSWORD_MIN, id: "signup-password" });
  const code = h("input", { type: "text", name: "invite_code", id: "signup-invite", value: ctx.query.get("invite") || "" });
  const err = h("div");
  const btn = h("button", { type: "submit", id: "signup-submit" }, t("auth.signup"));
  const form = h("form", { class: "stack card" }, field(t("auth.email"), email), field(t("auth.password"), pw, t("auth.password_hint")),
    field(t("auth.invite_code"), code, t("auth.invite_hint")), err, btn);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(btn, async () => {
      const body = { email: email.value, password: pw.value };
      if (code.value.trim()) body.invite_code = code.value.trim();
      const res = await post("/v1/signup", body);
      remember(res);
      sessionStorage.setItem("gpurent.sent_to", (res.email_verification || {}).sent_to || res.user.email);
      ctx.navigate("#/verify");
    }, err);
  });
  main.append(h("h1", {}, t("auth.signup")), form);
  email.focus();
}

export async function verify(main, params, ctx) {
  const token = h("input", { type: "text", name: "token", id: "verify-token", required: true, autocomplete: "one-time-code",
    value: ctx.query.get("token") || "" });
  const err = h("div");
  const done = h("div", { role: "status" });
  const btn = h("button", { type: "submit", id: "verify-submit" }, t("auth.verify"));
  const resend = h("button", { type: "button", class: "secondary", id: "verify-resend" }, t("auth.resend"));
  const sentTo = sessionStorage.getItem("gpurent.sent_to") || (getUser() || {}).email || "";
  const form = h("form", { class: "stack card" }, h("p", {}, sentTo ? t("auth.verify_sent", { email: sentTo }) : t("auth.verify_sent_nowhere")),
    field(t("auth.verify_code"), token), err, h("div", { class: "actions" }, btn, getKey() ? resend : null), done);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(btn, async () => {
      const res = await post("/v1/verify-email", { token: token.value.trim() });
      const user = getUser();
      if (user && getKey()) setSession(getKey(), { ...user, email_verified: true });
      resent.remove();
      add(done, h("p", { class: "ok" }, t("auth.verified")),
        res.credit ? h("p", {}, t("auth.credit_granted"), " ", money(res.credit.amount, res.credit.currency)) : null,
        h("a", { href: getKey() ? "#/overview" : "#/login" }, t("auth.continue")));
    }, err);
  });
  // "A new code is on its way" says what the last press did: a resend
  // refused after one that went (429, asked again within the minute) was
  // shown beside it, as if a code were coming after all.
  const resent = h("p", { id: "verify-resent" }, t("auth.resent"));
  resend.addEventListener("click", () => busy(resend, async () => {
    resent.remove();
    await post("/v1/verify-email/resend");
    done.append(resent);
  }, err));
  main.append(h("h1", {}, t("auth.verify_title")), form);
  token.focus();
}

export async function password(main) {
  // Named as the API's fields: a refused one (a wrong current password)
  // is marked on its input (ui.js busy).
  const cur = h("input", { type: "password", name: "current_password", autocomplete: "current-password", required: true, id: "pw-current" });
  const nw = h("input", { type: "password", name: "new_password", autocomplete: "new-password", required: true, minlength: PASSWORD_MIN, id: "pw-new" });
  const err = h("div"), done = h("div", { role: "status" });
  const btn = h("button", { type: "submit" }, t("auth.change_password"));
  const form = h("form", { class: "stack card" }, field(t("auth.current_password"), cur), field(t("auth.new_password"), nw, t("auth.password_hint")), err, btn, done);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(btn, async () => {
      const res = await post("/v1/me/password", { current_password: cur.value, new_password: nw.value });
      done.append(h("p", { class: "ok" }, t("auth.password_changed", { n: res.login_keys_revoked })));
      cur.value = nw.value = "";
    }, err);
  });
  const me = await get("/v1/me").catch(() => null);
  add(main, h("h1", {}, t("auth.change_password")), me ? h("p", { class: "hint" }, me.email) : null, form);
}

// A forgotten password, in two steps on one page: the address (the server
// answers the same whether or not it has an account, so this page cannot
// say either), then the mailed code with the new password. "#/reset?email=…"
// opens at the second step for someone who has a code already.
export async function reset(main, params, ctx) {
  const email = h("input", { type: "email", name: "email", autocomplete: "username", required: true, id: "reset-email",
    value: ctx.query.get("email") || "" });
  const err1 = h("div");
  const send = h("button", { type: "submit", id: "reset-submit" }, t("auth.reset_send"));
  const ask = h("form", { class: "stack card", id: "reset-ask" }, h("p", {}, t("auth.reset_intro")),
    field(t("auth.email"), email), err1, send,
    h("p", { class: "hint" }, h("a", { href: "#/login" }, t("auth.login"))));

  const code = h("input", { type: "text", name: "code", id: "reset-code", required: true, autocomplete: "one-time-code",
    spellcheck: "false" });
  const nw = h("input", { type: "password", name: "new_password", autocomplete: "new-password", required: true,
    minlength: PASSWORD_MIN, id: "reset-password" });
  const err2 = h("div"), done = h("div", { role: "status", id: "reset-done" });
  const sent = h("p", { id: "reset-sent" });
  const setBtn = h("button", { type: "submit", id: "reset-confirm" }, t("auth.reset_submit"));
  const again = h("button", { type: "button", class: "secondary", id: "reset-again" }, t("auth.reset_again"));
  const confirm = h("form", { class: "stack card", id: "reset-confirm-form" }, sent,
    field(t("auth.reset_code"), code), field(t("auth.new_password"), nw, t("auth.password_hint")), err2,
    h("div", { class: "actions" }, setBtn, again), done);

  function second(minutes) {
    sent.textContent = minutes ? t("auth.reset_sent", { email: email.value, minutes }) : t("auth.reset_have_code", { email: email.value });
    ask.replaceWith(confirm);
    code.focus();
  }
  async function request() {
    const res = await post("/v1/password-reset", { email: email.value });
    return Math.round(res.expires_in_s / 60);
  }
  ask.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(send, async () => second(await request()), err1);
  });
  again.addEventListener("click", () => busy(again, async () => second(await request()), err2));
  confirm.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(setBtn, async () => {
      // A code pasted from the mail may bring a space or a line end along.
      const res = await post("/v1/password-reset/confirm", { email: email.value, code: code.value.trim(), new_password: nw.value });
      nw.value = code.value = "";
      setBtn.disabled = again.disabled = true;
      add(done, h("p", { class: "ok" }, t("auth.reset_done", { n: res.login_keys_revoked, k: res.api_keys_kept })),
        res.credit ? h("p", {}, t("auth.credit_granted"), " ", money(res.credit.amount, res.credit.currency)) : null,
        h("a", { href: "#/login", id: "reset-login" }, t("auth.login")));
    }, err2);
  });
  main.append(h("h1", {}, t("auth.reset_title")));
  if (email.value) {
    main.append(confirm);
    second(0);
  } else {
    main.append(ask);
    email.focus();
  }
}
