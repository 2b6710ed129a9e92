"""The console's sources, without a browser: both message catalogues hold
the same keys, every key the JavaScript names exists, every error code the
API can return has words in both languages, and no page uses inline script,
inline style or innerHTML (the CSP forbids the first two; the third would
let API text become markup)."""
import json
import os
import re

from harness import REPO

CONSOLE = os.path.join(REPO, "console")


def catalogue(lang):
    with open(os.path.join(CONSOLE, "i18n", f"{lang}.json"), encoding="utf-8") as f:
        return json.load(f)


def sources():
    for base, dirs, files in os.walk(CONSOLE):
        dirs[:] = [d for d in dirs if d != "vendor"]
        for name in files:
            if name.endswith((".js", ".html", ".css")):
                path = os.path.join(base, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, CONSOLE), f.read()


def test_both_catalogues_have_the_same_keys_and_no_empty_text():
    zh, en = catalogue("zh"), catalogue("en")
    assert sorted(set(zh) - set(en)) == [] and sorted(set(en) - set(zh)) == []
    for lang, cat in (("zh", zh), ("en", en)):
        empty = [k for k, v in cat.items() if not isinstance(v, str) or not v.strip()]
        assert empty == [], (lang, empty)
    # Placeholders agree: {n} in one language is {n} in the other.
    for k in zh:
        assert sorted(re.findall(r"\{(\w+)\}", zh[k])) == sorted(re.findall(r"\{(\w+)\}", en[k])), k
    # Chinese really is Chinese.
    assert all(re.search(r"[\u4e00-\u9fff]", zh[k]) for k in ("nav.launch", "err.insufficient_funds", "auth.signup"))


def test_every_key_the_pages_use_is_in_the_catalogue():
    zh = catalogue("zh")
    used = set()
    for name, text in sources():
        used |= set(re.findall(r'\bt\("([a-z_.\-/:]*[a-z_])"', text))  # not t("nav." + name)
    missing = sorted(k for k in used if k not in zh)
    assert missing == [], missing
    assert len(used) > 150


def test_every_api_error_code_has_words():
    with open(os.path.join(REPO, "src", "common", "api_error.c")) as f:
        codes = set(re.findall(r'\{"([a-z_]+)", \d{3},', f.read()))
    assert "insufficient_funds" in codes and len(codes) > 30
    zh = catalogue("zh")
    assert sorted(c for c in codes if f"err.{c}" not in zh) == []


def test_every_state_and_transaction_kind_has_words():
    with open(os.path.join(REPO, "docs", "openapi.json")) as f:
        schemas = json.load(f)["components"]["schemas"]
    zh = catalogue("zh")
    states = schemas["InstanceState"]["enum"] + schemas["Node"]["properties"]["state"]["enum"]
    assert sorted(s for s in states if f"state.{s}" not in zh) == []
    kinds = {k for s in schemas.values() for k in (s.get("properties", {}).get("kind", {}).get("enum") or [])}
    assert "usage" in kinds
    assert sorted(k for k in kinds if f"txn.kind_{k}" not in zh and k in
                  ("usage", "refund", "grant", "expiry", "topup", "storage")) == []


def test_no_inline_script_style_or_markup_injection():
    for name, text in sources():
        if name.endswith(".html"):
            assert not re.search(r"<script(?![^>]*\bsrc=)", text), name
            assert "<style" not in text and " style=" not in text, name
            assert not re.search(r"\son[a-z]+=", text), name
        if name.endswith(".js"):
            assert "innerHTML" not in text and "outerHTML" not in text and "insertAdjacentHTML" not in text, name
            assert "eval(" not in text and "new Function" not in text, name
            assert "setAttribute(\"style\"" not in text, name
