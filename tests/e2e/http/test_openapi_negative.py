"""test_openapi_negative.py: bad input, generated from docs/openapi.json as a
third-party validator (schemathesis and the like) generates it, gets a clear
error and changes nothing.

Driven by the document, not by a list of cases: for every operation with a
JSON request body, and every operation with query or path parameters, the
cases are derived from its schemas:
  bodies      not JSON; JSON that is not an object (an array, a number, a
              string); text that is not UTF-8; a key twice; nesting deeper
              than the cap; a body over max_body_bytes (413); the valid body
              sent as a form, multipart, text/plain, with no Content-Type or
              gzipped (415); an empty object where minProperties asks for more;
              each required property missing, one at a time; each property
              (and each property of a nested object the body holds) with a
              value of each wrong JSON type and null where not nullable; an
              unknown property; numbers below minimum / above maximum and
              fractions for integers; strings over maxLength / under
              minLength, outside an enum, against a pattern, not a
              date-time; arrays over maxItems, with items of a wrong type
  query       each parameter with a wrong type (limit=abc), below minimum /
              above maximum, outside its enum, over maxLength / under
              minLength, against its pattern; cursors the API did not make;
              each required one missing; an
              unknown parameter, also on every operation that takes none
  path        an id of the right shape that does not exist, and another
              user's object (both 404, never 403 or 2xx)
Every other part of each request is valid: the right key (a user's; the
admin's for /v1/admin/*; signed like gpurent-gateway for /internal/*, like
the payment provider for the webhook), a body that validates against the
schema before it is broken (checked here, so a case breaks only what it
says), and path parameters that name real objects made in setup
(lib/openapi_world.py: the setup of test_openapi_conformance.py, smaller). Each answer must be a documented
4xx (400 or 422 for a body or parameter the schema refuses, 413 for one too
large, 404 for an id that is not the caller's), valid against the document
(openapi_check.Spec.check), and the database must be unchanged
(Daemon.dump(), before and after each case).

Not derived here, and why:
  * allOf/oneOf/anyOf request schemas: none in the document today; a schema
    using them fails test_every_body_operation_has_a_base_body until this
    file learns it (or the operation is listed in SKIP_BODY);
  * header parameters (Idempotency-Key, the webhook's signature headers,
    the terminal's Upgrade headers): tests/e2e/http/test_http_layer.py and
    the resources' tests cover them;
  * formats other than date-time: the document uses no other on requests.
"""
import json
import re
from urllib.parse import quote

import pytest
import requests

from openapi_check import Spec, protocol_problems
from openapi_world import (MAX_BODY, NOBODY, RAW, base_body, base_query, fill, op_of, open_world, operations,
                           path_values, resolve, send)

UNKNOWN = "zz_not_a_field"
NOT_IN_ENUM = "zz-not-a-choice"

SPEC = Spec()

# Statuses that say "your input is wrong" for a body or parameter the schema
# refuses; 413 only for a body over the cap (a long string may push it).
INPUT_REFUSED = {400, 422}
TOO_LARGE = 413


# ------------------------------------------------------------ the document

def body_schema(op):
    rb = resolve(op.get("requestBody"))
    if not rb:
        return None
    media = rb.get("content", {}).get("application/json")
    return resolve(media["schema"]) if media and "schema" in media else None


BODY_OPS = sorted((m, t) for m, t, op, _ in operations() if body_schema(op) is not None)
QUERY_OPS = sorted((m, t) for m, t, _, params in operations() if any(p["in"] == "query" for p in params))
PATH_OPS = sorted((m, t) for m, t, _, params in operations() if any(p["in"] == "path" for p in params))


def documented(method, template):
    return {int(s) for s in op_of(method, template)[0]["responses"] if s.isdigit()}


def schema_errors(schema, instance):
    """Why instance does not validate against an OpenAPI schema (converted,
    $refs resolved within the converted document)."""
    return SPEC._validate(json.loads(json.dumps(_converted(schema))), instance)


def _converted(schema):
    from openapi_check import to_json_schema
    return to_json_schema(schema)


# ------------------------------------------------------------ case generation

def types_of(schema):
    t = schema.get("type")
    if t is None:
        if "properties" in schema or "additionalProperties" in schema:
            return "object"
        if "items" in schema:
            return "array"
    return t


WRONG_VALUES = {
    "string": [12345, True, ["x"], {"x": 1}],
    "integer": ["7", 1.5, False, [1], {"n": 1}],
    "number": ["7", True, [1]],
    "boolean": ["true", 1, ["x"]],
    "array": ["x", 1, {"x": 1}],
    "object": ["x", 1, ["x"]],
}
PATTERN_BREAKERS = ["!!", "a b", " ", "-", "\u00e9t\u00e9", "..", "UPPER", "0", "x", "/"]


def breaks_pattern(pattern, base=None):
    rx = re.compile(pattern)
    for cand in PATTERN_BREAKERS + ([base + "!"] if isinstance(base, str) else []):
        if not rx.search(cand):
            return cand
    return None


def too_long(schema, base):
    """A string one over maxLength that still matches the pattern if one is
    easy to find, so the length is what is wrong."""
    n = schema["maxLength"] + 1
    pattern = schema.get("pattern")
    cands = []
    if isinstance(base, str) and base:
        cands.append((base * (n // len(base) + 1))[:n])
    cands += ["a" * n, "0" * n, "A" * n, "/" + "a" * (n - 1)]
    for c in cands:
        if not pattern or re.search(pattern, c):
            return c
    return cands[0]


def plausible_item(schema):
    """Some value of an array's item schema, for maxItems cases (valid or not,
    the array is too long either way)."""
    s = resolve(schema)
    t = types_of(s)
    if "enum" in s:
        return s["enum"][0]
    return {"string": "a", "integer": s.get("minimum", 1), "number": 1, "boolean": True,
            "object": {}, "array": []}.get(t, "a")


def value_cases(schema, base, where):
    """(label, value) for values that break schema, a property's schema whose
    valid value is base (None if the body does not hold it)."""
    s = resolve(schema)
    t = types_of(s)
    out = []
    if t in WRONG_VALUES:
        for v in WRONG_VALUES[t]:
            out.append((f"{where}: {type(v).__name__} for {t}", v))
        if not s.get("nullable"):
            out.append((f"{where}: null", None))
    if "enum" in s:
        bad = 999 if t == "integer" else NOT_IN_ENUM
        out.append((f"{where}: not in enum", bad))
    if t in ("integer", "number"):
        if "minimum" in s:
            out.append((f"{where}: below minimum", s["minimum"] - 1))
        if "maximum" in s:
            out.append((f"{where}: above maximum", s["maximum"] + 1))
        if t == "integer" and "maximum" not in s:
            out.append((f"{where}: beyond 64 bits", 2 ** 64))
    if t == "string":
        if "maxLength" in s:
            out.append((f"{where}: over maxLength", too_long(s, base)))
        if s.get("minLength", 0) >= 1:
            out.append((f"{where}: under minLength", "a" * (s["minLength"] - 1)))
        if "pattern" in s:
            bad = breaks_pattern(s["pattern"], base)
            if bad is not None and "enum" not in s:
                out.append((f"{where}: against pattern", bad))
        if s.get("format") == "date-time":
            out.append((f"{where}: not a date-time", "next tuesday"))
    if t == "array":
        items = resolve(s.get("items", {}))
        if "maxItems" in s:
            item = base[0] if isinstance(base, list) and base else plausible_item(items)
            out.append((f"{where}: over maxItems", [item] * (s["maxItems"] + 1)))
        it = types_of(items)
        if it in WRONG_VALUES:
            out.append((f"{where}[0]: {type(WRONG_VALUES[it][0]).__name__} for {it}", [WRONG_VALUES[it][0]]))
        if it == "object" and isinstance(base, list) and base and isinstance(base[0], dict):
            # an object item the body holds: break its properties in place
            for label, v in object_cases(items, base[0], f"{where}[0]"):
                out.append((label, [v] + base[1:]))
    if t == "object" and isinstance(base, dict):
        out += object_cases(s, base, where)
    if t == "object" and isinstance(s.get("additionalProperties"), dict):
        inner = resolve(s["additionalProperties"])
        if types_of(inner) in WRONG_VALUES:
            out.append((f"{where}.*: {type(WRONG_VALUES[types_of(inner)][0]).__name__}",
                        {**(base or {}), "k": WRONG_VALUES[types_of(inner)][0]}))
        if "maxProperties" in s:
            out.append((f"{where}: over maxProperties",
                        {f"k{i}": "v" for i in range(s["maxProperties"] + 1)}))
    return out


def object_cases(schema, base, where=""):
    """(label, object) for objects that break schema, each base (which
    validates) with one thing wrong."""
    s = resolve(schema)
    props = s.get("properties", {})
    out = []
    prefix = f"{where}." if where else ""
    for name in s.get("required", []):
        if name in base:
            out.append((f"{prefix}{name}: missing", {k: v for k, v in base.items() if k != name}))
    if s.get("minProperties", 0) >= 1:
        out.append((f"{where or 'body'}: empty object", {}))
    if s.get("additionalProperties") is False:
        out.append((f"{prefix}{UNKNOWN}: unknown property", {**base, UNKNOWN: 1}))
    for name, ps in props.items():
        for label, v in value_cases(ps, base.get(name), f"{prefix}{name}"):
            out.append((label, {**base, name: v}))
    return out


def body_cases(schema, base, required):
    """Every broken body for an operation: (label, bytes or JSON value)."""
    valid = json.dumps(base)
    twice = valid[:-1] + f', {json.dumps(next(iter(base)))}: 1}}' if base else '{"a": 1, "a": 1}'
    out = [("not JSON", b"{not json"), ("truncated JSON", b'{"a": '),
           ("JSON array", [base]), ("JSON number", 42), ("JSON string", "x"), ("JSON null", None),
           ("not UTF-8", valid.encode()[:-1] + b', "\xc3\x28": 1}' if base else b'{"\xff": 1}'),
           ("a key twice", twice.encode()),
           ("nested too deep", b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}")]
    if required:
        out.append(("empty body", b""))
    out += object_cases(schema, base)
    return out


# The valid body with headers that do not say it is JSON: (label, headers).
MEDIA_CASES = [("sent as a form", {"Content-Type": "application/x-www-form-urlencoded"}),
               ("sent as multipart", {"Content-Type": "multipart/form-data; boundary=x"}),
               ("sent as text/plain", {"Content-Type": "text/plain"}),
               ("sent with no Content-Type", {"Content-Type": None}),
               ("said to be gzipped", {"Content-Encoding": "gzip"})]
UNSUPPORTED_MEDIA = 415


def query_cases(params, base):
    """(label, params) for query strings that break the parameters."""
    out = []
    for p in params:
        if p["in"] != "query":
            continue
        name, s = p["name"], resolve(p.get("schema", {}))
        t = s.get("type")
        if p.get("required"):
            out.append((f"{name}: missing", {k: v for k, v in base.items() if k != name}))
        vals = []
        if t == "integer":
            vals += [("not an integer", "abc"), ("a fraction", "1.5"), ("empty", "")]
            if "minimum" in s:
                vals.append(("below minimum", str(s["minimum"] - 1)))
            if "maximum" in s:
                vals.append(("above maximum", str(s["maximum"] + 1)))
            else:
                vals.append(("beyond 64 bits", str(2 ** 64)))
        if t == "number":
            vals.append(("not a number", "abc"))
        if t == "boolean":
            vals.append(("not a boolean", "maybe"))
        if "enum" in s:
            vals.append(("not in enum", "99" if t == "integer" else NOT_IN_ENUM))
        if t == "string":
            if "maxLength" in s:
                vals.append(("over maxLength", too_long(s, base.get(name))))
            if s.get("minLength", 0) >= 1:
                vals.append(("under minLength", "a" * (s["minLength"] - 1)))
            if "pattern" in s:
                bad = breaks_pattern(s["pattern"], base.get(name))
                if bad is not None:
                    vals.append(("against pattern", bad))
            if s.get("format") == "date-time" and "pattern" not in s:
                vals.append(("not a date-time", "next tuesday"))
        if name == "cursor":
            # Opaque to the schema (a string), but only a next_cursor the API
            # made is one: other base64url, its text with a sign, spaces or
            # no id, or stray bits at the end.
            vals += [("not one the API made", "AAAA"), ("not base64url", "!!!!"),
                     ("a negative time", "LTEua2V5X3g"), ("no id", "MTc5NTk3NzExNy4"),
                     ("stray bits", "MTc5NTk3NzExNy5rZXlfeB")]
        for label, v in vals:
            out.append((f"{name}: {label}", {**base, name: v}))
    out.append((f"{UNKNOWN}: unknown parameter", {**base, UNKNOWN: "1"}))
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with open_world(tmp_path_factory.mktemp("negative")) as w:
        yield w


def record_rejected(r):
    """For a report whose one usage record is malformed: the documented
    per-record refusal (200, the record in rejected, none accepted), or a
    400 for the whole body when it is not JSON a parser can hold (an
    integer past 64 bits)."""
    if r.status_code == 400:
        return None
    body = r.json()
    if body.get("accepted") or len(body.get("rejected", [])) != 1:
        return f"want the record rejected and none accepted: {r.text[:300]}"
    return None


def judge(w, what, r, want, problems, extra=None):
    """Checks an answer: a wanted status, documented, valid against the
    document, with the error shape; notes what is wrong in problems."""
    try:
        SPEC.check(r)
    except AssertionError as e:
        problems.append(f"{what}: {e}")
        return
    if r.status_code not in want:
        problems.append(f"{what}: want one of {sorted(want)}, got {r.status_code}: {r.text[:300]}")
        return
    if r.request.method == "HEAD":
        return  # no body to hold the error
    if extra:
        why = extra(r)
        if why:
            problems.append(f"{what}: {why}")
        return
    err = r.json().get("error") if r.headers.get("Content-Type", "").startswith("application/json") else None
    if not isinstance(err, dict) or not {"code", "message", "field"} <= set(err):
        problems.append(f"{what}: not the error shape: {r.text[:300]}")


def run_cases(w, method, template, cases, problems):
    """Sends each (label, request kwargs, wanted statuses), checking that the
    database is as it was after each."""
    before = w.d.dump()
    for label, kw, want, *extra in cases:
        what = f"{method} {template} [{label}]"
        try:
            r = send(w, method, template, **kw)
        except requests.RequestException as e:
            problems.append(f"{what}: no answer: {e}")
            continue
        judge(w, what, r, want, problems, *extra)
        after = w.d.dump()
        if after != before:
            changed = sorted(t for t in set(before) | set(after) if before.get(t) != after.get(t))
            problems.append(f"{what}: answered {r.status_code} but changed the database: tables {changed}")
            before = after


def report(problems, n):
    print(f"{n} cases")
    for p in problems:
        print(p)
    assert not problems, f"{len(problems)} of {n} cases went wrong:\n" + "\n".join(problems)


# ------------------------------------------------------------ the tests

SKIP_BODY = {}  # (METHOD, template): why; none today


def test_every_body_operation_has_a_base_body(world):
    """Each operation with a JSON body has a base body here, and it
    validates: a new operation must be added (or skipped, with a reason)."""
    missing, invalid = [], []
    for method, template in BODY_OPS:
        if (method, template) in SKIP_BODY:
            continue
        base = base_body(world, method, template)
        schema = body_schema(op_of(method, template)[0])
        if base is None:
            missing.append(f"{method} {template}")
            continue
        for key in ("allOf", "oneOf", "anyOf"):
            assert key not in schema, f"{method} {template}: {key} request schema: teach this file"
        errs = schema_errors(schema, base)
        if errs:
            invalid.append(f"{method} {template}: {errs}")
    assert not missing, f"no base body for {missing}"
    assert not invalid, "base bodies that do not validate:\n" + "\n".join(invalid)


@pytest.mark.parametrize("method,template", BODY_OPS, ids=[f"{m} {t}" for m, t in BODY_OPS])
def test_bad_bodies(world, method, template):
    if (method, template) in SKIP_BODY:
        pytest.skip(SKIP_BODY[(method, template)])
    w = world
    op, params = op_of(method, template)
    schema = body_schema(op)
    base = base_body(w, method, template)
    assert base is not None, "see test_every_body_operation_has_a_base_body"
    path = fill(template, path_values(w, template, method))
    cases = []
    required = resolve(op["requestBody"]).get("required", False)
    for label, body in body_cases(schema, base, required):
        if isinstance(body, bytes):
            kw = {"raw": body}
        else:
            # The generator must break the schema, or the case proves nothing.
            # (Two kinds are wrong beyond what jsonschema checks here: a
            # date-time format, which it checks only with a module that is not
            # installed, and an integer past 64 bits where the schema gives no
            # maximum, which no server can store: both must be refused too.)
            assert schema_errors(schema, body) or label.endswith(("not a date-time", "beyond 64 bits")), \
                f"{label}: the body validates: {body}"
            kw = {"body": body}
        want = set(INPUT_REFUSED)
        if isinstance(body, dict) and len(json.dumps(body)) > MAX_BODY:
            want.add(TOO_LARGE)
        req = {"path": path, "params": base_query(w, method, template) or None, **kw}
        if template == "/internal/gateway/reports" and label.startswith("usage[0]"):
            # A malformed usage record is refused on its own, not with the
            # report (the gateway drops a refused record; the rest of the
            # batch settles), as the document says of usage's items.
            cases.append((label, req, {200, 400}, record_rejected))
        else:
            cases.append((label, req, want))
    big = b'{"a": "' + b"x" * MAX_BODY + b'"}'
    cases.append(("over max_body_bytes", {"path": path, "params": base_query(w, method, template) or None,
                                          "raw": big}, {TOO_LARGE}))
    for label, headers in MEDIA_CASES:
        cases.append((label, {"path": path, "params": base_query(w, method, template) or None, "body": base,
                              "headers": headers}, {UNSUPPORTED_MEDIA}))
    problems = []
    run_cases(w, method, template, cases, problems)
    report(problems, len(cases))


@pytest.mark.parametrize("method,template", QUERY_OPS, ids=[f"{m} {t}" for m, t in QUERY_OPS])
def test_bad_query_parameters(world, method, template):
    w = world
    op, params = op_of(method, template)
    base = base_query(w, method, template)
    path = fill(template, path_values(w, template, method))
    cases = [(label, {"path": path, "params": q}, set(INPUT_REFUSED)) for label, q in query_cases(params, base)]
    problems = []
    run_cases(w, method, template, cases, problems)
    n = len(cases)
    if method == "GET" and "head" in RAW["paths"][template]:
        # validators send HEAD too; its parameters are GET's (less a few)
        head = [(label, {"path": path, "params": q}, set(INPUT_REFUSED))
                for label, q in query_cases(op_of("HEAD", template)[1], base)]
        run_cases(w, "HEAD", template, head, problems)
        n += len(head)
    report(problems, n)


# Operations of the API that take no query parameter: one is refused all
# the same, before anything is done ("?force=1" on a DELETE, a misspelt
# "?limt=5"), with a valid body and path, so only the query is wrong.
NO_QUERY_OPS = sorted((m, t) for m, t, _, params in operations()
                      if t.startswith(("/v1/", "/internal/")) and not any(p["in"] == "query" for p in params))


@pytest.mark.parametrize("method,template", NO_QUERY_OPS, ids=[f"{m} {t}" for m, t in NO_QUERY_OPS])
def test_an_operation_without_query_parameters_refuses_one(world, method, template):
    w = world
    body = base_body(w, method, template)
    req = {"path": fill(template, path_values(w, template, method)), "body": NOBODY if body is None else body}
    cases = [(f"{UNKNOWN}: unknown parameter", {**req, "params": {UNKNOWN: "1"}}, set(INPUT_REFUSED)),
             ("a bare name", {**req, "params": UNKNOWN}, set(INPUT_REFUSED))]
    problems = []
    run_cases(w, method, template, cases, problems)
    report(problems, len(cases))


# Operations that need an API key (security without an empty, anonymous
# alternative); the signed routes have their own tests.
KEYED_OPS = sorted((m, t) for m, t, op, _ in operations()
                   if (op.get("security", RAW.get("security", [])) and {} not in op.get("security", RAW.get("security", [])))
                   and not t.startswith("/internal/") and t != "/v1/payments/webhook")
BAD_KEYS = [("no key", None), ("not a key", "nope"), ("a key of the right shape that names none",
                                                      "gpk_" + "0" * 20 + "_" + "0" * 64)]


@pytest.mark.parametrize("method,template", KEYED_OPS, ids=[f"{m} {t}" for m, t in KEYED_OPS])
def test_an_operation_that_needs_a_key_refuses_none_or_a_bad_one(world, method, template):
    """401 with WWW-Authenticate, documented, whatever else the request
    holds (a valid body and path), and nothing changes."""
    w = world
    body = base_body(w, method, template)
    req = {"path": fill(template, path_values(w, template, method)), "body": NOBODY if body is None else body,
           "params": base_query(w, method, template) or None}
    cases = [(label, {**req, "key": key}, {401}) for label, key in BAD_KEYS]
    problems = []
    run_cases(w, method, template, cases, problems)
    report(problems, len(cases))


# Path parameters whose schema says more than "a string": each with a value
# against its pattern or over its maxLength. The console's files are static
# and left out (a value against their pattern is a dot segment, which
# clients fold before sending).
SHAPED_PATH_OPS = sorted((m, t) for m, t in PATH_OPS if t.startswith("/v1/") and any(
    p["in"] == "path" and ({"pattern", "maxLength"} & set(resolve(p.get("schema", {}))))
    for p in op_of(m, t)[1]))


@pytest.mark.parametrize("method,template", SHAPED_PATH_OPS, ids=[f"{m} {t}" for m, t in SHAPED_PATH_OPS])
def test_misshapen_path_parameters(world, method, template):
    w = world
    op, params = op_of(method, template)
    values = path_values(w, template, method)
    body = base_body(w, method, template)
    body = NOBODY if body is None else body
    query = base_query(w, method, template) or None
    want = {s for s in documented(method, template) if s in (400, 404)}
    cases = []
    for p in params:
        sch = resolve(p.get("schema", {}))
        if p["in"] != "path":
            continue
        bad = []
        if "pattern" in sch:
            v = breaks_pattern(sch["pattern"], values[p["name"]])
            if v is not None and "/" not in v:
                bad.append(("against pattern", v))
        if "maxLength" in sch:
            bad.append(("over maxLength", too_long(sch, values[p["name"]])))
        for label, v in bad:
            path = fill(template, dict(values, **{p["name"]: quote(v, safe="")}))
            cases.append((f"{p['name']}: {label} {v[:40]!r}", {"path": path, "body": body, "params": query}, want))
    problems = []
    run_cases(w, method, template, cases, problems)
    report(problems, len(cases))


def no_such(value):
    """An id of the same shape that names nothing: its last characters
    changed to ones of the same kind."""
    head, tail = value[:-6], value[-6:]
    swap = "".join("2" if ch.isdigit() and ch != "2" else "3" if ch.isdigit() else
                   ("b" if ch != "b" else "c") if ch.islower() else
                   ("B" if ch != "B" else "C") if ch.isupper() else ch for ch in tail)
    return head + swap


# Path parameters that are not ids of a caller's object, so "does not
# exist" means something else: PUT /v1/admin/gpu-types/{code} creates the
# type it names; a statement month with no activity is an empty statement;
# {slug} of /v1/apps is public to every user for GET (this one is private,
# so it is tested); console files are static.
NOT_AN_ID = {("PUT", "/v1/admin/gpu-types/{code}"): "creates the type it names",
             ("PUT", "/v1/admin/storage-prices/{region}"): "any region word may be priced (documented)",
             ("GET", "/v1/statements/{month}"): "a month with no activity has an empty statement"}
WEBSOCKET = ("/v1/instances/{id}/terminal",)
# Objects of a user (the owner), to be asked for with the other user's key.
OWNED = ("/v1/api-keys/{id}", "/v1/ssh-keys/{id}", "/v1/volumes/{id}", "/v1/instances/{id}",
         "/v1/reservations/{id}", "/v1/apps/{slug}")


@pytest.mark.parametrize("method,template", PATH_OPS, ids=[f"{m} {t}" for m, t in PATH_OPS])
def test_unknown_and_foreign_ids(world, method, template):
    w = world
    if (method, template) in NOT_AN_ID:
        pytest.skip(NOT_AN_ID[(method, template)])
    op, params = op_of(method, template)
    values = path_values(w, template, method)
    body = base_body(w, method, template)
    body = NOBODY if body is None else body
    query = base_query(w, method, template) or None
    want = {404} if 404 in documented(method, template) else {s for s in documented(method, template)
                                                              if 400 <= s < 500}
    if template in WEBSOCKET:
        # A plain GET, as a validator sends it, is refused (400) before the
        # id is looked up; what matters is that it is never 403 or 2xx.
        want = {400, 404}
    cases = []
    for p in params:
        if p["in"] != "path":
            continue
        bad = dict(values, **{p["name"]: no_such(values[p["name"]])})
        cases.append((f"{p['name']}: no such {values[p['name']]!r} -> {bad[p['name']]!r}",
                      {"path": fill(template, bad), "body": body, "params": query}, want))
    if any(template == o or template.startswith(o + "/") for o in OWNED):
        cases.append(("the other user's object", {"path": fill(template, values), "body": body,
                                                      "params": query, "key": w.other.key},
                      want if template in WEBSOCKET else {404}))
    problems = []
    run_cases(w, method, template, cases, problems)
    report(problems, len(cases))


def test_refusals_carry_the_headers_http_asks_for(new_daemon):
    """401 and 429 checked as a validator checks them, with the headers HTTP
    asks for (openapi_check.protocol_problems), and a 405, which no
    operation documents, against those rules alone: a wrong key, a locked
    login, a wrong method."""
    d = new_daemon(options={"login_max_failures": 2, "login_lockout_s": 60})
    u = d.signup()
    answers = [d.get("/v1/me", key="gpk_nope")] + [d.login(u.email, "wrong password") for _ in range(3)]
    assert [r.status_code for r in answers] == [401, 401, 401, 429], [r.text for r in answers]
    for r in answers:
        SPEC.check(r)
    r = d.request("PUT", "/v1/me", key=u.key)
    assert r.status_code == 405 and not protocol_problems(r), r.headers
