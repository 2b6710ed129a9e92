// i18n.js: the console's two languages. Every string the console shows
// comes from one catalogue per language (i18n/zh.json, i18n/en.json, the
// same keys: tests/e2e/console/test_console_files.py checks it). Chinese is
// the default; the choice is remembered in localStorage.
const LANGS = ["zh", "en"];
let lang = "zh";
let catalogue = {};

export function currentLang() { return lang; }
export function locale() { return lang === "zh" ? "zh-CN" : "en-GB"; }

// Loads a language whole or not at all: a catalogue that cannot be read
// (a proxy's error page) throws and leaves the language in use as it was.
export async function loadLang(wanted) {
  const stored = wanted || localStorage.getItem("gpurent.lang");
  const next = LANGS.includes(stored) ? stored : "zh";
  const r = await fetch(`/console/i18n/${next}.json`);
  if (!r.ok) throw new Error(`/console/i18n/${next}.json: HTTP ${r.status}`);
  catalogue = await r.json();
  lang = next;
  localStorage.setItem("gpurent.lang", lang);
  document.documentElement.lang = locale();
}

// t("launch.estimate", {amount: "9.60"}): {name} in the text is replaced.
export function t(key, vars) {
  let s = catalogue[key];
  if (s === undefined) s = key; // a missing key shows itself, never nothing
  if (vars) s = s.replace(/\{(\w+)\}/g, (m, k) => (k in vars ? String(vars[k]) : m));
  return s;
}

export function has(key) { return key in catalogue; }
