"""test_openapi_fuzz.py: a seeded property-based fuzz of every operation of
docs/openapi.json, as schemathesis would run it: requests drawn from the
document's schemas, valid and broken, and every answer held to the document.

Where test_openapi_negative.py derives one fixed case per rule, this draws
cases at random (GPURENT_FUZZ_SEED, printed on failure; GPURENT_FUZZ_ROUNDS
cases per operation, 10 by default, more for a soak) from families that a
hand-written list leaves out, each sent over a raw socket so that nothing
on the client side repairs it:
  valid       the base body with optional fields dropped and values drawn
              anew from their schemas, the query drawn from its parameters
  numbers     JSON number texts in integer and number fields: 1e400, -0,
              -0.0, 9007199254740993, 2**63, 2**64, a 401-digit integer,
              1.0, 1e2, each schema bound and one past it
  strings     NUL, lone and reversed surrogates as \\ud800 escapes, RTL and
              zero-width marks, a BOM, controls, astral characters up to
              and past maxLength, bytes that are not UTF-8 (overlong,
              surrogates, beyond U+10FFFF, cut short), a string of 60 KiB and
              one past max_body_bytes, injection-looking text
  structure   a wrong JSON type at any field, an unknown or odd field name,
              each required field missing, a key twice (top level or
              nested), nesting 33 to 5000 deep inside a field, not an object,
              trailing bytes, a BOM before the body
  media       Content-Type spelt otherwise: charsets, +json, not JSON, none,
              empty, twice
  query       repeated and empty parameters, bare names, percent-encoding
              errors, %00, bytes that are not UTF-8, number texts, odd
              strings, unknown names, separators, 150 parameters
  path        malformed ids (%00, %ff, dot segments, %2F, 300 and 2100
              characters, numbers, injection-looking text) and the other
              user's objects asked for with the owner's key
  auth        no key, an empty or lone scheme, Basic, the scheme in other
              cases, a token cut short or with a byte changed, a revoked
              key, Authorization twice; signatures missing, wrong or stale
  methods     every method a path does not document (405 with Allow)
Every answer must: come (no dropped connection); not be a 5xx; have a
status the operation documents, a 2xx or 3xx by its own code rather than
`default`; carry X-Request-Id, the Content-Type and JSON body the document
gives that status (no field the schema does not name), the error shape on
a 4xx, WWW-Authenticate on a 401, Allow on a 405 (naming exactly the
methods the document gives the path), Retry-After on a 429 or 503. A
request that breaks the document must get a 4xx, and a 4xx must leave the
database as it was (Daemon.dump() right before and right after). A 2xx to
a string field sent with odd characters gives it back as sent. At the end
`gpurentd ledger verify` passes.

Cases that might succeed (valid, or odd but allowed by the schema) are not
sent to operations that destroy or set aside the world's objects (DELETE,
stop, suspend, a node's state or address): only cases that must be refused
go there. DELETE /v1/api-keys is sent with a user of its own.
"""
import copy
import dataclasses
import http.client
import json
import os
import random
import re
import socket
import time
import types
from urllib.parse import quote, urlencode

import pytest
from requests.structures import CaseInsensitiveDict

from money_util import iso, ledger_verify
from openapi_check import Spec, to_json_schema
from openapi_world import (IMAGE, MAX_BODY, RAW, base_body, base_query, credentials, fill, ok, op_of, open_world,
                           path_values, resolve)

SEED = int(os.environ.get("GPURENT_FUZZ_SEED", "0")) or random.randrange(1, 10 ** 9)
ROUNDS = int(os.environ.get("GPURENT_FUZZ_ROUNDS", "10"))
SPEC = Spec(strict_fields=True)
SSH_KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHoLl8pD0m3bSXvZ1Zp5u0jWm6E1o8y3j0Qy2m3d7f9a other@box"

METHODS = ("get", "head", "options", "post", "put", "patch", "delete")
OPERATIONS = sorted((m.upper(), t) for t, item in RAW["paths"].items() for m in METHODS if m in item)
PATHS = sorted(RAW["paths"])
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

# Operations that end or set aside a world object the other cases need:
# only cases that must be refused are sent to them.
DESTRUCTIVE = {("POST", "/v1/instances/{id}/stop"), ("POST", "/v1/admin/users/{id}/suspend"),
               ("POST", "/v1/admin/nodes/{id}/state"), ("PATCH", "/v1/admin/nodes/{id}")}
# Path parameters that name nothing to own: a value of the right shape may
# be taken (PUT creates the GPU type it names; any month has a statement).
FREE_PATHS = {("PUT", "/v1/admin/gpu-types/{code}"), ("PUT", "/v1/admin/storage-prices/{region}"),
              ("GET", "/v1/statements/{month}"), ("HEAD", "/v1/statements/{month}")}
# Objects a user owns: the other user's, asked for with the owner's key, is 404.
OWNED = ("/v1/api-keys/{id}", "/v1/ssh-keys/{id}", "/v1/volumes/{id}", "/v1/instances/{id}",
         "/v1/reservations/{id}", "/v1/apps/{slug}")
# Fields a 2xx may give back in another spelling (normalised), so the
# echo check leaves them: addresses are lowercased, keys reformatted,
# image references resolved. An empty region is the global one.
NORMALISED = {"email", "public_key", "image", "ref", "agent_url", "data_host", "amount", "price_per_card_hour",
              "price_per_gb_month", "price_per_request", "effective_at", "expires_at", "starts_at", "ends_at"}


def is_destructive(method, template):
    return method == "DELETE" or (method, template) in DESTRUCTIVE


# ------------------------------------------------------------ the wire

@dataclasses.dataclass
class Case:
    label: str
    path: str                        # the target's path, percent-encoded as sent
    query: str = None                # the raw query, without "?"
    body: bytes = None
    ctype: str = "application/json"  # None: no Content-Type
    headers: list = dataclasses.field(default_factory=list)  # extra (name, value), as they are
    key: object = "owner"            # as openapi_world.credentials; False: none of its headers
    refuse: bool = False             # the request breaks the document: only a 4xx is right
    want: set = None                 # the statuses that alone are right, where known
    echo: dict = None                # body fields a 2xx gives back as sent
    method: str = None               # another method than the operation's
    one_rejected: bool = False       # a 200 must refuse the report's one usage record


class Dropped(Exception):
    pass


class Answer:
    """What openapi_check.Spec.check reads of a requests.Response."""

    def __init__(self, method, target, resp, content):
        self.status_code = resp.status
        self.headers = CaseInsensitiveDict()
        for name, value in resp.getheaders():
            self.headers[name] = value if name not in self.headers else self.headers[name] + ", " + value
        self.header_counts = {}
        for name, _ in resp.getheaders():
            self.header_counts[name.lower()] = self.header_counts.get(name.lower(), 0) + 1
        self.content = content
        self.text = content.decode("utf-8", "replace")
        self.request = types.SimpleNamespace(method=method, url=target)

    def json(self):
        return json.loads(self.content)


def exchange(w, method, template, case):
    """Sends case on a new connection and reads the answer; raises Dropped
    when the connection ends without one."""
    method = case.method or method
    target = case.path + ("" if case.query is None else "?" + case.query)
    head = [("Host", f"127.0.0.1:{w.d.port}"), ("Connection", "close")]
    if case.body is not None:
        if case.ctype is not None:
            head.append(("Content-Type", case.ctype))
        head.append(("Content-Length", str(len(case.body))))
    if case.key is not False:
        head += list(credentials(w, method, template, case.path, case.body, case.key).items())
    head += case.headers
    raw = f"{method} {target} HTTP/1.1\r\n".encode("latin-1") + b"".join(
        f"{k}: {v}\r\n".encode("utf-8") for k, v in head) + b"\r\n" + (case.body or b"")
    sock = socket.create_connection(("127.0.0.1", w.d.port), timeout=60)
    try:
        sent = True
        try:
            sock.sendall(raw)
        except (BrokenPipeError, ConnectionResetError):
            sent = False  # answered and closed before the body was all sent (a 413)
        resp = http.client.HTTPResponse(sock, method=method)
        try:
            resp.begin()
            content = resp.read()
        except (http.client.HTTPException, ConnectionError, socket.timeout) as e:
            if not sent:
                return None
            raise Dropped(f"{type(e).__name__}: {e}")
        return Answer(method, target, resp, content)
    finally:
        sock.close()


# ------------------------------------------------------------ the document

def converted(schema):
    return json.loads(json.dumps(to_json_schema(schema)))


RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def breaks(schema, value):
    """Whether value breaks an OpenAPI schema: its JSON Schema errors, a
    date-time format (which jsonschema checks only with a module not
    installed here) and an integer past 64 bits (which no server stores)."""
    if SPEC._validate(converted(schema), value):
        return True
    return bool(_beyond(schema, value))


def _beyond(schema, value):
    s = resolve(schema)
    if isinstance(value, bool):
        return False
    if isinstance(value, int) and not -2 ** 63 <= value < 2 ** 63:
        return True
    if isinstance(value, str) and s.get("format") == "date-time" and not RFC3339.match(value):
        return True
    if isinstance(value, dict):
        props = s.get("properties", {})
        extra = s.get("additionalProperties") if isinstance(s.get("additionalProperties"), dict) else None
        return any(_beyond(props[k] if k in props else extra, v) for k, v in value.items()
                   if k in props or extra)
    if isinstance(value, list) and isinstance(s.get("items"), dict):
        return any(_beyond(s["items"], v) for v in value)
    return False


def type_of(s):
    t = s.get("type")
    if t is None:
        if "properties" in s or "additionalProperties" in s:
            return "object"
        if "items" in s:
            return "array"
    return t


def leaves(schema, value, where=()):
    """(path, schema) of every field of value and of the optional fields
    its object schemas name that value leaves out."""
    s = resolve(schema)
    out = []
    if isinstance(value, dict) and type_of(s) == "object":
        props = s.get("properties", {})
        for name, ps in props.items():
            out.append((where + (name,), resolve(ps)))
            if name in value:
                out += leaves(ps, value[name], where + (name,))
        extra = s.get("additionalProperties")
        if isinstance(extra, dict):
            for name in value:
                if name not in props:
                    out.append((where + (name,), resolve(extra)))
    elif isinstance(value, list) and value and isinstance(s.get("items"), dict):
        out.append((where + (0,), resolve(s["items"])))
        out += leaves(s["items"], value[0], where + (0,))
    return out


def put(body, where, value):
    """A copy of body with the field at where set to value (made if missing)."""
    body = copy.deepcopy(body)
    node = body
    for step in where[:-1]:
        node = node[step]
    if isinstance(node, list) and where[-1] >= len(node):
        node.append(value)
    else:
        node[where[-1]] = value
    return body


def drop(body, where):
    body = copy.deepcopy(body)
    node = body
    for step in where[:-1]:
        node = node[step]
    del node[where[-1]]
    return body


def get(body, where):
    for step in where:
        body = body[step]
    return body


SENTINEL = "\u0001zz-raw-text\u0001"


def with_raw(body, where, text):
    """The body's bytes with the field at where written as the raw JSON text
    (bytes), so it may hold what Python's json would not write."""
    doc = json.dumps(put(body, where, SENTINEL), ensure_ascii=False).encode()
    return doc.replace(json.dumps(SENTINEL, ensure_ascii=False).encode(), text, 1)


# ------------------------------------------------------------ drawing values

ALPHABET = "abcxyzABC019-_. é中😀\u202e\u200b"


def draw(rng, schema, base=None, now=0):
    """A value valid for schema (base when one is hard to make: a pattern,
    a format the document gives meaning to)."""
    s = resolve(schema)
    t = type_of(s)
    if "enum" in s:
        return rng.choice(s["enum"])
    if t == "boolean":
        return rng.random() < 0.5
    if t in ("integer", "number"):
        lo = s.get("minimum", -2 ** 31 if t == "integer" else -1e9)
        hi = s.get("maximum", 2 ** 31 if t == "integer" else 1e9)
        lo += 1 if s.get("exclusiveMinimum") else 0
        hi -= 1 if s.get("exclusiveMaximum") else 0
        v = rng.choice([lo, hi, rng.randint(int(lo), int(hi))]) if t == "integer" else rng.uniform(lo, hi)
        return v
    if t == "string":
        if s.get("format") == "date-time":
            return iso(now + rng.randint(3600, 30 * 86400) // 3600 * 3600)
        if "pattern" in s or s.get("format"):
            return base
        lo, hi = s.get("minLength", 0), min(s.get("maxLength", 40), 40)
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(lo, max(lo, hi))))
    if t == "array":
        if base is not None:
            return base
        n = rng.randint(s.get("minItems", 0), min(s.get("maxItems", 3), 3))
        return [draw(rng, s.get("items", {}), None, now) for _ in range(n)]
    if t == "object":
        return base if base is not None else {}
    return base


def valid_variant(rng, schema, base, now):
    """The base body with some optional fields dropped and some values
    drawn anew, if the result still validates; else the base."""
    s = resolve(schema)
    body = copy.deepcopy(base)
    required = set(s.get("required", []))
    for name in list(body):
        ps = resolve(s.get("properties", {}).get(name, {}))
        if name not in required and rng.random() < 0.3:
            del body[name]
        elif rng.random() < 0.5 and type_of(ps) not in ("object",):
            v = draw(rng, ps, body[name], now)
            if v is not None:
                body[name] = v
    return body if not breaks(schema, body) else copy.deepcopy(base)


# ------------------------------------------------------------ case families

def number_texts(s):
    texts = ["1e400", "-1e400", "-0", "-0.0", "0.0", "9007199254740993", str(2 ** 63 - 1), str(2 ** 63),
             str(-2 ** 63 - 1), str(2 ** 64), "1" + "0" * 400, "1.0", "1e2", "1E+2", "0.1e1", "2.5", "1e-400", "-1",
             "0", str(2 ** 31), str(2 ** 32)]
    for k in ("minimum", "maximum"):
        if k in s:
            texts += [str(s[k]), str(s[k] - 1), str(s[k] + 1)]
    return texts


def number_refused(s, text):
    """Whether the number text must be refused for schema s (None: either
    answer is right)."""
    if "e400" in text:
        return True  # no double holds it
    if re.fullmatch(r"-?[0-9]+", text):
        v = int(text)
        if not -2 ** 63 <= v < 2 ** 63:
            return True
        return breaks(s, v)
    if type_of(s) == "integer":
        # A fraction is never an integer; 1.0 and 1e2 are integers to some
        # readings of JSON and not to others.
        v = float(text)
        return True if v != int(v) else None
    return breaks(s, float(text))


# (label, raw JSON text of the string, its value where it has one, must be refused)
ODD_STRINGS = [
    ("NUL inside", b'"a\\u0000b"', "a\x00b", None),
    ("NUL alone", b'"\\u0000"', "\x00", None),
    ("lone high surrogate", b'"a\\ud800b"', None, True),
    ("lone low surrogate", b'"\\udc00"', None, True),
    ("reversed surrogates", b'"\\udc00\\ud800"', None, True),
    ("high surrogate at the end", b'"ab\\ud83d"', None, True),
    ("escaped pair", b'"\\ud83d\\ude00"', "\U0001F600", None),
    ("RTL override", None, "\u202eabc", None),
    ("RTL mark", None, "\u200fabc\u200f", None),
    ("zero-width space", None, "a\u200bb", None),
    ("BOM", None, "\ufeffabc", None),
    ("combining mark", None, "e\u0301", None),
    ("line separator", None, "a\u2028b", None),
    ("C0 controls", None, "a\x01\x1fb", None),
    ("DEL and C1", None, "a\x7f\x85b", None),
    ("newline", None, "a\nb", None),
    ("empty", None, "", None),
    ("blanks", None, "   ", None),
    ("astral", None, "\U0001D54F" * 8, None),
    ("byte not UTF-8", b'"a\xffb"', None, True),
    ("overlong slash", b'"\xc0\xaf"', None, True),
    ("surrogate in UTF-8", b'"\xed\xa0\x80"', None, True),
    ("beyond U+10FFFF", b'"\xf4\x90\x80\x80"', None, True),
    ("cut short", b'"ab\xe2\x82"', None, True),
    ("quote and SQL", None, "x' OR '1'='1", None),
    ("dot segments", None, "../../etc/passwd", None),
    ("percent NUL", None, "%00", None),
    ("markup", None, "<script>alert(1)</script>", None),
]


def string_values(s):
    """ODD_STRINGS and the lengths the schema sets."""
    out = list(ODD_STRINGS)
    if "maxLength" in s:
        n = s["maxLength"]
        out += [("maxLength in astral characters", None, "\U0001F600" * n, None),
                ("one over maxLength in astral characters", None, "\U0001F600" * (n + 1), True)]
    out += [("60 KiB", None, "x" * 60000, None), ("past max_body_bytes", None, "x" * (MAX_BODY + 10), True)]
    return out


WRONG_TYPED = [1, -1, 0.5, True, False, None, "x", "", [], ["x"], [[]], {}, {"x": 1}]
ODD_NAMES = ["zz_unknown", "", " ", "__proto__", "constructor", "NAME", "name ", "na\u0000me", "\u202ename",
             "a" * 300, "é"]


def body_families(rng, w, method, template, schema, base, required):
    """Each family: () -> Case or None (the family does not fit)."""
    path = fill(template, path_values(w, template, method))
    q = urlencode(base_query(w, method, template)) or None
    fields = leaves(schema, base)
    now = w.d.now()

    def case(label, body, refuse, **kw):
        return Case(label=label, path=path, query=q, body=body, refuse=bool(refuse), **kw)

    def from_value(label, value):
        """A case with the JSON value as the body, judged by the schema."""
        return case(label, json.dumps(value, ensure_ascii=False).encode(), breaks(schema, value))

    def valid():
        body = valid_variant(rng, schema, base, now)
        return case(f"valid: {sorted(body)}", json.dumps(body, ensure_ascii=False).encode(), False)

    def number():
        nums = [(p, s) for p, s in fields if type_of(s) in ("integer", "number")]
        if not nums:
            return None
        where, s = rng.choice(nums)
        text = rng.choice(number_texts(s))
        refused = number_refused(s, text)
        return case(f"{'.'.join(map(str, where))} = {text[:30]}", with_raw(base, where, text.encode()), refused)

    def string():
        strs = [(p, s) for p, s in fields if type_of(s) == "string"]
        if not strs:
            return None
        where, s = rng.choice(strs)
        label, raw, value, must = rng.choice(string_values(s))
        name = ".".join(map(str, where))
        if raw is None:
            body = put(base, where, value)
            refused = must or breaks(schema, body)
            data = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
        else:
            refused = must or (value is not None and breaks(schema, put(base, where, value)))
            data = with_raw(base, where, raw)
        echo = {where[0]: value} if len(where) == 1 and value is not None and where[0] not in NORMALISED \
            and (where[0], value) != ("region", "") else None
        return case(f"{name}: {label}", data, refused, echo=echo,
                    want={413} if len(data) > MAX_BODY else None)

    def wrong_type():
        where, s = rng.choice(fields) if fields else ((), None)
        if not where:
            return None
        value = rng.choice(WRONG_TYPED)
        body = put(base, where, value)
        return case(f"{'.'.join(map(str, where))} = {json.dumps(value)}", json.dumps(body).encode(),
                    breaks(schema, body))

    def unknown_field():
        objs = [((), schema)] + [(p, s) for p, s in fields if type_of(s) == "object"]
        where, s = rng.choice(objs)
        try:
            target = get(base, where)
        except (KeyError, IndexError):
            return None
        if not isinstance(target, dict):
            return None
        name = rng.choice(ODD_NAMES)
        body = put(base, where + (name,), 1)
        refused = breaks(schema, body) or resolve(s).get("additionalProperties") is False
        return case(f"unknown field {name[:20]!r} at {'.'.join(map(str, where)) or 'top'}",
                    json.dumps(body, ensure_ascii=False).encode(), refused)

    def missing():
        reqs = [(p, s) for p, s in [((), schema)] + fields if type_of(s) == "object" and s.get("required")]
        if not reqs:
            return None
        where, s = rng.choice(reqs)
        try:
            target = get(base, where)
        except (KeyError, IndexError):
            return None
        names = [n for n in s["required"] if isinstance(target, dict) and n in target]
        if not names:
            return None
        name = rng.choice(names)
        return from_value(f"{'.'.join(map(str, where + (name,)))} missing", drop(base, where + (name,)))

    def duplicate():
        if not base:
            return None
        name = rng.choice(list(base))
        text = json.dumps(base, ensure_ascii=False)
        again = json.dumps(rng.choice([base[name], 1, "x", None]))
        data = (text[:-1] + f", {json.dumps(name, ensure_ascii=False)}: {again}}}").encode()
        return case(f"{name} twice", data, True)

    def deep():
        where = rng.choice(fields)[0] if fields else ("a",)
        depth = rng.choice([33, 64, 1000, 5000])
        nest = rng.choice(["[]", "{}"])
        text = (b"[" * depth + b"]" * depth) if nest == "[]" else (b'{"a":' * depth + b"1" + b"}" * depth)
        return case(f"{'.'.join(map(str, where))}: {nest} {depth} deep", with_raw(base, where, text), True)

    def shape():
        valid_text = json.dumps(base, ensure_ascii=False).encode()
        label, data, refused = rng.choice([
            ("an array", b"[" + valid_text + b"]", True), ("a number", b"7", True), ("a string", b'"x"', True),
            ("null", b"null", True), ("true", b"true", True), ("empty", b"", required),
            ("blanks", b"  \r\n", True), ("trailing bytes", valid_text + b" x", True),
            ("two objects", valid_text + b"{}", True), ("a NUL after", valid_text + b"\x00", True),
            ("trailing blanks", valid_text + b" \n", False), ("a BOM first", b"\xef\xbb\xbf" + valid_text, None),
            ("not JSON", b"{not json", True), ("cut short", valid_text[:-1], True),
            ("an empty object", b"{}", breaks(schema, {})), ("NaN", valid_text[:-1] + b', "zz": NaN}', True),
            ("single quotes", valid_text.replace(b'"', b"'"), True)])
        c = case(f"body {label}", data, refused)
        if label == "empty":
            c.body, c.ctype = (b"", None) if rng.random() < 0.5 else (b"", "application/json")
        return c

    def media():
        valid_text = json.dumps(base, ensure_ascii=False).encode()
        label, ctype, refused = rng.choice([
            ("charset utf-8", "application/json; charset=utf-8", False),
            ("charset UTF-8 quoted", 'application/json;charset="UTF-8"', False),
            ("upper case", "APPLICATION/JSON", False), ("+json", "application/vnd.gpurent+json", False),
            ("charset latin1", "application/json; charset=latin1", True),
            ("charset utf-16", "application/json; charset=utf-16", True),
            ("jsonx", "application/jsonx", True), ("text/json", "text/json", True),
            ("text/plain", "text/plain", True), ("form", "application/x-www-form-urlencoded", True),
            ("multipart", "multipart/form-data; boundary=zz", True), ("none", None, True), ("empty", "", True),
            ("a list", "application/json, text/plain", None), ("a parameter only", ";charset=utf-8", True),
            ("json with junk", "application/json garbage", True)])
        c = case(f"Content-Type {label}", valid_text, refused, ctype=ctype)
        if rng.random() < 0.1:
            c.label += ", twice"
            c.headers = [("Content-Type", "application/json")]
            c.ctype, c.refuse, c.want = "application/json", True, {400}
        return c

    return [valid, number, string, wrong_type, unknown_field, missing, duplicate, deep, shape, media]


def query_families(rng, w, method, template, params, body):
    path = fill(template, path_values(w, template, method))
    base = base_query(w, method, template)
    qparams = {p["name"]: resolve(p.get("schema", {})) for p in params if p["in"] == "query"}
    # ?follow=true streams a log until the instance ends: never drawn as a
    # valid value (only broken ones are sent)
    drawable = {n: s for n, s in qparams.items() if n != "follow"}
    strict = template.startswith(("/v1/", "/internal/"))  # their routes refuse unknown parameters

    def case(label, query, refuse, **kw):
        return Case(label=f"?{label}", path=path, query=query, body=body, refuse=bool(refuse), **kw)

    def enc(pairs):
        return "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in pairs)

    def valid():
        pairs = dict(base)
        for name, s in drawable.items():
            if rng.random() < 0.5 and type_of(s) in ("integer", "boolean") or "enum" in s:
                v = draw(rng, s)
                pairs[name] = str(v).lower() if isinstance(v, bool) else str(v)
        return case(f"valid {pairs}", enc(pairs.items()), False)

    def value_of(name, raw, label, refused):
        pairs = [(k, v) for k, v in base.items() if k != name]
        return case(f"{name}={label}", "&".join([enc(pairs)] if pairs else []) + ("&" if pairs else "")
                    + f"{quote(name, safe='')}={raw}", refused)

    def number():
        ints = [n for n, s in qparams.items() if type_of(s) == "integer"]
        if not ints:
            return None
        name = rng.choice(ints)
        s = qparams[name]
        text = rng.choice(number_texts(s) + ["+1", "01", "0x10", " 1", "1 ", "1\t", "", "1_000", "١"])
        if text.strip() != text or text in ("", "0x10", "1_000", "١"):
            refused = True
        elif text in ("+1", "01"):
            refused = None
        else:
            refused = number_refused(s, text)
        return value_of(name, quote(text, safe=""), text, refused)

    def string():
        strs = [n for n, s in qparams.items() if type_of(s) == "string" or "$ref" in s]
        if not strs:
            return None
        name = rng.choice(strs)
        s = qparams[name]
        label, raw, value, must = rng.choice([x for x in ODD_STRINGS if x[3] is None] +
                                             [("long", None, "a" * 2000, None)])
        refused = breaks(s, value) or None
        return value_of(name, quote(value.encode("utf-8", "surrogatepass"), safe=""), label, refused)

    def encoding():
        name = rng.choice(sorted(qparams) or ["zz_unknown"])
        raw, label, refused = rng.choice([
            ("%zz", "%zz", None), ("%", "%", None), ("%4", "%4", None), ("a%", "a%", None),
            ("%ff", "%ff (not UTF-8)", None), ("%c3%28", "%c3%28 (not UTF-8)", None),
            ("%ed%a0%80", "a UTF-8 surrogate", None), ("a%00b", "a%00b", True), ("%00", "%00", True),
            ("%E2%80%AE", "an RTL override", None), ("+", "+", None), ("%2B1", "%2B1", None)])
        c = value_of(name, raw, label, refused or (name not in qparams and strict))
        if "%00" in raw:
            c.want = {400}
        return c

    def repeated():
        if not drawable:
            return None
        name = rng.choice(sorted(drawable))
        v = base.get(name) or str(draw(rng, drawable[name], "x"))
        if isinstance(v, bool):
            v = str(v).lower()
        pairs = list(base.items()) + [(name, v), (name, v)] if name not in base else list(base.items()) + [(name, v)]
        return case(f"{name} twice", enc(pairs), None)

    def empty():
        name = rng.choice(sorted(qparams) or ["zz_unknown"])
        s = qparams.get(name)
        pairs = [(k, v) for k, v in base.items() if k != name]
        bare = rng.random() < 0.5
        q = (enc(pairs) + "&" if pairs else "") + (name if bare else name + "=")
        if s is None:
            refused = strict
        elif type_of(s) == "integer" or "enum" in s:
            refused = True
        else:
            refused = breaks(s, "")
        return case(f"{name}{'' if bare else '='} empty", q, refused)

    def unknown():
        name = rng.choice(["zz_unknown", "LIMIT", "limit[]", "a.b", "é", "__proto__", "x" * 300])
        return case(f"unknown {name[:20]}", enc(list(base.items()) + [(name, "1")]), strict or None)

    def separators():
        extra = rng.choice(["&&&", "=", "&=&", ";x=1", "?", "#frag", "=%3D", "&" * 50])
        q = (enc(base.items()) if base else "") + extra
        return case(f"separators {extra[:10]}", q, None)

    def many():
        n = rng.choice([101, 150])
        return case(f"{n} parameters", "&".join(f"p{i}=1" for i in range(n)), True, want={414})

    return [valid, number, string, encoding, repeated, empty, unknown, separators, many]


MALFORMED_IDS = [("%00", {400}), ("%ff", None), ("%c3%28", None), ("%zz", None), ("%", None), ("..", None),
                 (".", None), ("%2e%2e", None), ("%2F", {404}), ("a%2Fb", {404}), ("-1", None), ("0", None),
                 ("9007199254740993", None), ("null", None), ("%20", None), ("x%0a", None), ("%E2%80%AE", None),
                 ("%C3%A9", None), ("A" * 300, None), ("a" * 2100, {414}), ("*", None), ("%2A", None),
                 ("%3F", None), ("%23", None), ("'%20OR%20'1'%3D'1", None), ("%2e", None), ("~", None)]


def path_families(rng, w, method, template, params, body):
    values = path_values(w, template, method)
    q = urlencode(base_query(w, method, template)) or None
    names = [p["name"] for p in params if p["in"] == "path"]
    if not names:
        return []
    static = template.startswith("/console")

    def malformed():
        name = rng.choice(names)
        raw, want = rng.choice(MALFORMED_IDS + [(v, None) for v in (values[name].upper(), values[name].lower(),
                                                                     values[name] + "x", values[name][:-1])
                                                if v != values[name] and not (
                                                    # invite codes compare in upper case (documented)
                                                    "invite-codes" in template and v.upper() == values[name])])
        refused = True
        if (method, template) in FREE_PATHS or static:
            refused = want is not None or None
            if refused is None and method != "GET":
                return None  # would make the object it names, which other operations' cases then find
        if raw in (values[name].upper(),) and (method, template) in FREE_PATHS:
            refused = None
        return Case(label=f"{{{name}}} = {raw[:30]}", path=fill(template, dict(values, **{name: raw})), query=q,
                    body=body, refuse=bool(refused), want=want)

    def foreign():
        owned = next((o for o in OWNED if template == o or template.startswith(o + "/")), None)
        if owned is None:
            return None
        other = w.b_objects[owned]
        return Case(label="the other user's object", path=fill(template, dict(values, **other)), query=q,
                    body=body, refuse=True, want={404} if "terminal" not in template else {400, 404})

    return [malformed, foreign]


def auth_families(rng, w, method, template, op, params, body):
    path = fill(template, path_values(w, template, method))
    q = urlencode(base_query(w, method, template)) or None
    security = op.get("security", RAW.get("security", []))
    keyed = bool(security) and {} not in security and template.startswith("/v1/") and \
        template != "/v1/payments/webhook"
    signed = template.startswith("/internal/") or template == "/v1/payments/webhook"
    if not (keyed or signed):
        return []
    token = w.admin if template.startswith("/v1/admin/") else w.owner.key

    def case(label, headers, refuse, want=None, key=False):
        return Case(label=label, path=path, query=q, body=body, headers=headers, key=key, refuse=bool(refuse),
                    want=want)

    def bearer():
        flipped = token[:-1] + ("0" if token[-1] != "0" else "1")
        label, value, want = rng.choice([
            ("no key", None, {401}), ("empty", "", {401}), ("scheme only", "Bearer", {401}),
            ("scheme and a blank", "Bearer ", {401}), ("Basic", "Basic dXNlcjpwYXNz", {401}),
            ("lower-case scheme", "bearer " + token, None), ("upper-case scheme", "BEARER " + token, None),
            ("two blanks", "Bearer  " + token, None), ("a byte changed", "Bearer " + flipped, {401}),
            ("cut short", "Bearer " + token[:-1], {401}), ("one too long", "Bearer " + token + "0", {401}),
            ("a trailing blank", "Bearer " + token + " ", None), ("a revoked key", "Bearer " + w.revoked, {401}),
            ("not ASCII", "Bearer " + token[:-1] + "é", {401}), ("a tab", "Bearer\t" + token, None),
            ("the secret alone", "Bearer " + token.split("_", 2)[-1], {401})])
        return case(f"Authorization: {label}", [] if value is None else [("Authorization", value)],
                    want is not None, want)

    def twice():
        return case("Authorization twice", [("Authorization", f"Bearer {token}")] * 2, True, {400})

    def signature():
        good = credentials(w, method, template, path, body)
        name = rng.choice(sorted(good))
        label, value = rng.choice([("missing", None), ("empty", ""), ("wrong", "0" * 64), ("stale", "1")])
        headers = [(k, v) for k, v in good.items() if k != name]
        if value is not None:
            headers.append((name, value))
        if label == "stale":
            return None if "Timestamp" not in name else case(f"{name} stale", headers, True, {401})
        return case(f"{name} {label}", headers, True, {401})

    return [bearer, twice] if keyed else [signature]


def options_families(rng, w, method, template, params):
    path = fill(template, path_values(w, template, method))

    def preflight():
        label, headers = rng.choice([
            ("no Origin", []), ("a foreign Origin", [("Origin", "https://evil.example"),
                                                     ("Access-Control-Request-Method", "DELETE")]),
            ("an odd request method", [("Origin", "https://evil.example"),
                                       ("Access-Control-Request-Method", "FOO\u00e9")]),
            ("an odd header list", [("Origin", "null"), ("Access-Control-Request-Headers", ",,,%00")])])
        return Case(label=f"OPTIONS {label}", path=path, headers=headers, key=False)

    return [preflight]


# ------------------------------------------------------------ judging

def documented_methods(template):
    """The methods Allow must name: the document's, less OPTIONS, which
    the document gives every path for CORS preflights and its own
    description leaves out of Allow."""
    return {m.upper() for m in METHODS if m in RAW["paths"][template]} - {"OPTIONS"}


def problems_of(w, method, template, case, ans):
    """What is wrong with an answer, by the rules in the module's docstring."""
    out = []
    sent = case.method or method
    s = ans.status_code
    if s >= 500:
        out.append(f"a {s}")
    if sent != method:
        # a method the path does not document
        if s != 405:
            out.append(f"want 405 for an undocumented method, got {s}")
        allow = {m.strip() for m in ans.headers.get("Allow", "").split(",") if m.strip()}
        if allow != documented_methods(template):
            out.append(f"Allow {sorted(allow)} is not the document's methods {sorted(documented_methods(template))}")
    else:
        try:
            SPEC.check(ans, method, case.path)
        except AssertionError as e:
            out.append(str(e).split("\nbody:")[0])
        else:
            _, key = SPEC.response_spec((method, template), s)
            if s < 400 and key == "default":
                out.append(f"a {s} that the operation documents only as `default`")
        if s == 405:
            out.append("405 for a documented method")
        if method == "OPTIONS" and s == 204:
            allow = {m.strip() for m in ans.headers.get("Allow", "").split(",") if m.strip()}
            if allow != documented_methods(template):
                out.append(f"Allow {sorted(allow)} is not the document's methods "
                           f"{sorted(documented_methods(template))}")
    # what docs/ARCHITECTURE.md ("The life of a request", 6.) promises of
    # every answer
    if "X-Request-Id" not in ans.headers:
        out.append("no X-Request-Id")
    if ans.headers.get("X-Content-Type-Options") != "nosniff":
        out.append(f"X-Content-Type-Options {ans.headers.get('X-Content-Type-Options')!r}, not nosniff")
    rspec = SPEC.response_spec((method, template), s)[0] if sent == method else None
    documented_headers = {h.lower() for h in (rspec or {}).get("headers", {})}
    if ans.headers.get("Cache-Control") != "no-store" and not (
            "cache-control" in documented_headers and ans.headers.get("Cache-Control")):
        out.append(f"Cache-Control {ans.headers.get('Cache-Control')!r}, not no-store nor one documented")
    if s == 201 and "location" in documented_headers and not ans.headers.get("Location"):
        out.append("a 201 without the Location it documents")
    for name in ("content-type", "content-length", "allow", "www-authenticate", "retry-after", "location"):
        if ans.header_counts.get(name, 0) > 1:
            out.append(f"{name} given {ans.header_counts[name]} times")
    if s >= 400 and sent != "HEAD":
        try:
            err = ans.json()["error"]
            assert set(err) >= {"code", "message", "field"} and isinstance(err["code"], str) \
                and isinstance(err["message"], str) and err["message"] and \
                (err["field"] is None or isinstance(err["field"], str))
        except (ValueError, KeyError, TypeError, AssertionError):
            out.append(f"not the error shape: {ans.content[:200]!r}")
    if case.refuse and not 400 <= s < 500:
        out.append(f"the request breaks the document, yet {s}")
    if case.want and s not in case.want:
        out.append(f"want {sorted(case.want)}, got {s}")
    if case.one_rejected and s == 200:
        got = ans.json()
        if got.get("accepted") or len(got.get("rejected", [])) != 1:
            out.append("want the one usage record rejected and none accepted")
    if case.echo and 200 <= s < 300 and sent != "HEAD":
        try:
            got = ans.json()
        except ValueError:
            got = None
        for k, v in case.echo.items():
            if isinstance(got, dict) and k in got and got[k] != v:
                out.append(f"{k} sent as {v!r} came back as {got[k]!r}")
    return out


def settle(d, patience=30.0):
    """Waits until no instance is on its way (pending, provisioning,
    stopping) and the database has stopped changing: what a 2xx set going
    is done (an instance placed and running, a node polled), so that a
    later case's "before" and "after" see only that case."""
    last, same, deadline = d.dump(), 0, time.monotonic() + patience
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = d.dump()
        same = same + 1 if now == last else 0
        last = now
        moving = d.sql("SELECT count(*) FROM instances WHERE state IN ('pending', 'provisioning', 'stopping')")
        if same >= 3 and moving[0][0] == 0:
            break
    return last


# Operations whose success sets the background loops going (the reconciler
# places and starts an instance, the heartbeat polls a new node): after a
# 2xx, the database is left to settle before the next case's "before".
CHURNS = {("POST", "/v1/instances"), ("POST", "/v1/instances/{id}/start"), ("POST", "/v1/instances/{id}/stop"),
          ("DELETE", "/v1/instances/{id}"), ("POST", "/v1/admin/nodes"), ("PATCH", "/v1/admin/nodes/{id}"),
          ("POST", "/v1/admin/nodes/{id}/state"), ("DELETE", "/v1/admin/nodes/{id}"), ("POST", "/v1/apps"),
          ("PATCH", "/v1/apps/{slug}"), ("DELETE", "/v1/apps/{slug}"),
          # the mailer sends (and marks) the code a sign-up queued
          ("POST", "/v1/signup"), ("POST", "/v1/verify-email/resend")}
SAFE = ("GET", "HEAD", "OPTIONS")


def undo(w, method, template, case, ans):
    """Puts back what a 2xx of an operation that churns started, so the
    world stays one the other cases know and the loops fall quiet: a new
    instance terminated, a started one stopped, a new node removed, an
    app's replicas taken back to none."""
    d, o = w.d, w.owner.key
    body = ans.json() if ans.content and ans.headers.get("Content-Type", "").startswith("application/json") else {}
    if (method, template) == ("POST", "/v1/instances") and "id" in body:
        ok(d.request("DELETE", f"/v1/instances/{body['id']}", key=o), 200)
    elif (method, template) == ("POST", "/v1/instances/{id}/start"):
        ok(d.request("POST", f"/v1/instances/{w.stopped['id']}/stop", key=o), 200)
    elif (method, template) == ("POST", "/v1/admin/nodes") and "id" in body:
        ok(d.request("DELETE", f"/v1/admin/nodes/{body['id']}", key=w.admin), 200, 204)
    elif template.startswith("/v1/apps") and method in ("POST", "PATCH") and "slug" in body:
        ok(d.request("PATCH", f"/v1/apps/{body['slug']}", key=o, json={"min_replicas": 0}), 200)


def db_diff(before, after):
    """The tables that differ, with a few rows gone and come."""
    out = []
    for t in sorted(set(before) | set(after)):
        b, a = set(before.get(t, [])), set(after.get(t, []))
        if a != b:
            out.append(f"{t}: gone {sorted(b - a, key=repr)[:2]} came {sorted(a - b, key=repr)[:2]}")
    return "\n      " + "\n      ".join(out)


def run(w, method, template, cases):
    problems = []
    for case in cases:
        sent = case.method or method
        what = f"{sent} {template} [{case.label}]"
        before = w.d.dump()
        try:
            ans = exchange(w, method, template, case)
        except Dropped as e:
            problems.append(f"{what}: the connection ended without an answer: {e}")
            continue
        except OSError as e:
            problems.append(f"{what}: no answer: {e}")
            continue
        if ans is None:
            continue
        # the trail of what was sent, which pytest shows for a failing test
        print(f"{what} -> {ans.status_code} {ans.content[:120]!r}")
        found = problems_of(w, method, template, case, ans)
        if sent == "GET" and "head" in RAW["paths"][template]:
            # HEAD is GET without the body: the same status and type
            head = exchange(w, method, template, dataclasses.replace(case, method="HEAD"))
            if head is None or (head.status_code, head.headers.get("Content-Type")) != \
                    (ans.status_code, ans.headers.get("Content-Type")):
                found.append(f"HEAD answers {head and head.status_code} {head and head.headers.get('Content-Type')}"
                             f", GET {ans.status_code} {ans.headers.get('Content-Type')}")
            elif head.content:
                found.append(f"HEAD answers a body: {head.content[:100]!r}")
        if 400 <= ans.status_code < 500 or sent in SAFE:
            after = w.d.dump()
            if after != before:
                found.append(f"answered {ans.status_code} but changed the database: {db_diff(before, after)}")
        elif (sent, template) in CHURNS:
            undo(w, sent, template, case, ans)
            settle(w.d)
        if found:
            problems.append(f"{what} -> {ans.status_code}:\n    " + "\n    ".join(found)
                            + f"\n    body: {ans.content[:300]!r}")
    return problems


# ------------------------------------------------------------ the world

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with open_world(tmp_path_factory.mktemp("fuzz")) as w:
        d, b = w.d, w.other
        w.revoked = d.create_key(w.owner.key, "fuzz-revoked")
        ok(d.request("DELETE", f"/v1/api-keys/{w.revoked['id']}", key=w.owner.key), 200, 204)
        w.revoked = w.revoked["token"]
        w.revoker = d.signup()  # DELETE /v1/api-keys's caller
        key = d.create_key(b.key, "b")
        ssh = ok(d.request("POST", "/v1/ssh-keys", key=b.key, json={"name": "b", "public_key": SSH_KEY_B}), 201)
        vol = ok(d.request("POST", "/v1/volumes", key=b.key, json={"name": "b", "size_gb": 5}), 201)
        inst = ok(d.request("POST", "/v1/instances", key=b.key, json={
            "gpu_type": "MI450", "card_count": 1, "image": IMAGE, "name": "b"}), 201)
        start = w.now - w.now % 3600 + 30 * 3600
        res = ok(d.request("POST", "/v1/reservations", key=b.key, json={
            "gpu_type": "H100-SXM", "cards": 8, "starts_at": iso(start), "ends_at": iso(start + 3600)}), 201)
        slug = f"fuzz-b-{SEED % 100000}"
        ok(d.request("POST", "/v1/apps", key=b.key, json={
            "slug": slug, "name": "B", "image": IMAGE, "gpu_type": "MI450", "port": 8000,
            "visibility": "private"}), 201)
        w.c.wait_state(b, inst["id"], "running")
        w.b_objects = {"/v1/api-keys/{id}": {"id": key["id"]}, "/v1/ssh-keys/{id}": {"id": ssh["id"]},
                       "/v1/volumes/{id}": {"id": vol["id"]}, "/v1/instances/{id}": {"id": inst["id"]},
                       "/v1/reservations/{id}": {"id": res["id"]}, "/v1/apps/{slug}": {"slug": slug}}
        settle(d)
        yield w
        rc, out = ledger_verify(d.db_path)
        assert rc == 0, f"ledger verify after the fuzz (GPURENT_FUZZ_SEED={SEED}):\n{out}"


def fuzz_base_body(w, method, template):
    """openapi_world's base body, less what would make a valid case's
    instance end on its own (its base command, sleep 1, is a job that
    succeeds a second later, a change of the database no later case made)."""
    body = base_body(w, method, template)
    if (method, template) in (("POST", "/v1/instances"), ("PATCH", "/v1/instances/{id}")):
        body["command"] = ["sleep", "86400"]
    return body


def families_of(rng, w, method, template):
    op, params = op_of(method, template)
    if method == "HEAD":
        get_op, get_params = op_of("GET", template)
        params = get_params
    if method == "OPTIONS":
        return options_families(rng, w, method, template, params)
    body_op = op if method not in ("HEAD",) else get_op
    schema = None
    rb = resolve(body_op.get("requestBody"))
    if rb and "application/json" in rb.get("content", {}):
        schema = resolve(rb["content"]["application/json"].get("schema"))
    base = fuzz_base_body(w, method, template)
    body = None if base is None else json.dumps(base, ensure_ascii=False).encode()
    fams = []
    if schema is not None and base is not None:
        fams += body_families(rng, w, method, template, schema, base, rb.get("required", False))
    else:
        path = fill(template, path_values(w, template, method))
        fams.append(lambda: Case(label="valid", path=path, query=urlencode(base_query(w, method, template)) or None))
    fams += query_families(rng, w, method, template, params, body)
    fams += path_families(rng, w, method, template, params, body)
    fams += auth_families(rng, w, method, template, op, params, body)
    return fams


def draw_cases(rng, w, method, template):
    fams = families_of(rng, w, method, template)
    cases = []
    for _ in range(ROUNDS * 4):
        if len(cases) >= ROUNDS:
            break
        c = rng.choice(fams)()
        if c is None:
            continue
        if is_destructive(method, template) and not c.refuse:
            continue
        if template == "/v1/api-keys" and method == "DELETE" and c.key == "owner":
            c.key = w.revoker.key
        if template == "/internal/gateway/reports" and c.label.startswith(("usage.0", "unknown field")) \
                and "usage.0" in c.label and c.refuse:
            # A malformed usage record is refused on its own (the gateway
            # drops it, the rest of the batch settles), as the document
            # says of usage's items; the report is refused only when it
            # cannot be read.
            c.refuse, c.want, c.one_rejected, c.echo = False, {200, 400, 413}, True, None
        cases.append(c)
    return cases


@pytest.mark.parametrize("method,template", OPERATIONS, ids=[f"{m} {t}" for m, t in OPERATIONS])
def test_fuzz_operation(world, method, template):
    rng = random.Random(f"{SEED}/{method} {template}")
    problems = run(world, method, template, draw_cases(rng, world, method, template))
    assert not problems, f"GPURENT_FUZZ_SEED={SEED}: {len(problems)} problems:\n" + "\n".join(problems)


@pytest.mark.parametrize("template", PATHS)
def test_undocumented_methods(world, template):
    """Every method the document does not give the path: 405, with Allow
    naming exactly the ones it gives, and nothing changed."""
    values = path_values(world, template)
    path = fill(template, values)
    methods = documented_methods(template) | {"OPTIONS"}
    # any documented method's credentials do: the route's auth runs after
    # the method is matched
    base_method = sorted(documented_methods(template))[0]
    cases = [Case(label=m, path=path, method=m, body=b"{}" if m in ("POST", "PUT", "PATCH") else None)
             for m in HTTP_METHODS if m not in methods]
    problems = run(world, base_method, template, cases)
    assert not problems, "\n".join(problems)
