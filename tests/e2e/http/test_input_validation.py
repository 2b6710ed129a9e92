"""Bad request bodies on every endpoint that takes one: each gets its 4xx
status and stable error code in the one error shape, naming the field at
fault where there is one, and leaves the database exactly as it was."""
import atexit
import gzip
import json
import shutil
import subprocess
import tempfile

import pytest

from harness import DEFAULT_PASSWORD, assert_error, unique_email
from ssh_util import keygen

KEY_DIR = tempfile.mkdtemp(prefix="gpurent-keys-")
atexit.register(shutil.rmtree, KEY_DIR, True)


class Endpoint:
    def __init__(self, path, fields, required, needs_key, valid):
        self.path = path
        self.fields = fields      # every field it takes, with its JSON type
        self.required = required  # fields that must be present
        self.needs_key = needs_key
        self.valid = valid        # () -> a body it accepts

    def __repr__(self):
        return self.path


ENDPOINTS = [
    Endpoint("/v1/signup", {"email": str, "password": str, "invite_code": str}, ["email", "password"], False,
             lambda: {"email": unique_email(), "password": DEFAULT_PASSWORD, "invite_code": "AMD6GW"}),
    Endpoint("/v1/login", {"email": str, "password": str, "key_name": str}, ["email", "password"], False,
             None),  # filled in by the fixture: needs an existing account
    Endpoint("/v1/api-keys", {"name": str}, [], True, lambda: {"name": "laptop"}),
    # A fresh key each time: the same key twice is a 409.
    Endpoint("/v1/ssh-keys", {"name": str, "public_key": str}, ["name", "public_key"], True,
             lambda: {"name": "laptop", "public_key": keygen(KEY_DIR)[0]}),
]


@pytest.fixture(params=ENDPOINTS, ids=repr)
def endpoint(request, daemon, user):
    ep = request.param
    key = user.key if ep.needs_key else None
    valid = ep.valid or (lambda: {"email": user.email, "password": user.password, "key_name": "x"})

    def send(body, headers=None):
        """Sends body (bytes, or a JSON-able value to encode) and returns the response."""
        data = body if isinstance(body, (bytes, bytearray)) or hasattr(body, "__next__") else json.dumps(body)
        h = {"Content-Type": "application/json", **(headers or {})}
        return daemon.post(ep.path, key=key, data=data, headers=h)

    return ep, valid, send


def refused(daemon, send, body, status, code, field=None):
    before = daemon.dump()
    err = assert_error(send(body), status, code, field)
    assert daemon.dump() == before, "a refused request changed the database"
    return err


def test_the_valid_body_is_accepted(daemon, endpoint):
    # Guards the other tests: each bad body below is a valid one spoiled.
    ep, valid, send = endpoint
    r = send(valid())
    assert r.status_code in (200, 201), r.text


@pytest.mark.parametrize("raw", [b"{", b'{"email": ', b"{'email': 'a'}", b"{} {}", b"{}x", b"{,}", b'{"a" 1}',
                                 b"nul", b"   ", b'{"email": "a\\u0000b"}', b"\xef\xbb\xbf{}"])
def test_malformed_json(daemon, endpoint, raw):
    ep, valid, send = endpoint
    refused(daemon, send, raw, 400, "malformed_json")


@pytest.mark.parametrize("body", [[], [{"name": "x"}], [[]], b" [ ] "])
def test_not_an_object(daemon, endpoint, body):
    ep, valid, send = endpoint
    refused(daemon, send, body, 400, "not_an_object")


@pytest.mark.parametrize("body", ["a string", 42, 1.5, True, None])
def test_scalar_is_not_an_object(daemon, endpoint, body):
    # Valid JSON, just not an object: not_an_object rather than malformed_json.
    ep, valid, send = endpoint
    refused(daemon, send, body, 400, "not_an_object")


def test_array_where_the_object_belongs(daemon, endpoint):
    ep, valid, send = endpoint
    refused(daemon, send, [valid()], 400, "not_an_object")


@pytest.mark.parametrize("wrong", [1, -1, 1.5, True, False, [], ["x"], {}, {"x": "y"}])
def test_wrong_types(daemon, endpoint, wrong):
    ep, valid, send = endpoint
    for field in ep.fields:
        refused(daemon, send, {**valid(), field: wrong}, 400, "invalid_field", field)


def test_missing_required_fields(daemon, endpoint):
    ep, valid, send = endpoint
    for field in ep.required:
        body = valid()
        del body[field]
        refused(daemon, send, body, 400, "missing_field", field)
        refused(daemon, send, {**valid(), field: None}, 400, "missing_field", field)
    if ep.required:
        refused(daemon, send, b"", 400, "missing_field", ep.required[0])
        refused(daemon, send, {}, 400, "missing_field", ep.required[0])


@pytest.mark.parametrize("extra", ["unknown", "Email", "name ", "id", "role", "admin", "password_hash"])
def test_unknown_fields(daemon, endpoint, extra):
    ep, valid, send = endpoint
    if extra in ep.fields:
        pytest.skip(f"{extra} is a field of {ep.path}")
    refused(daemon, send, {**valid(), extra: "x"}, 400, "unknown_field", extra)


def duplicated(body, field):
    text = json.dumps(body)
    return (text[:-1] + ", " + json.dumps(field) + ": " + json.dumps(body[field]) + "}").encode()


def duplicate_bodies(valid, fields):
    """(body, repeated field) pairs: each field repeated, once spelt with a
    \\u escape, which is still the same key."""
    for field in fields:
        yield duplicated(valid(), field), field
    field = next(iter(fields))
    escaped = json.dumps(valid())[:-1] + ', "\\u00' + format(ord(field[0]), "02x") + field[1:] + '": "x"}'
    yield escaped.encode(), field


def test_duplicate_keys(daemon, endpoint):
    ep, valid, send = endpoint
    for body, field in duplicate_bodies(valid, ep.fields):
        before = daemon.dump()
        r = send(body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "duplicate_key", (body, r.text)
        # Which field is named is checked by the next test.
        assert_error(r, 400, "duplicate_key", r.json()["error"]["field"])
        assert r.json()["error"]["field"] == field
        assert daemon.dump() == before
    # A repeat inside a nested object is refused too, naming the inner key.
    refused(daemon, send, b'{"name": {"a": 1, "a": 1}}', 400, "duplicate_key", "a")


def test_duplicate_key_names_the_field(daemon, endpoint):
    ep, valid, send = endpoint
    for body, field in duplicate_bodies(valid, ep.fields):
        refused(daemon, send, body, 400, "duplicate_key", field)


TWO_MIB = 2 * 1024 * 1024


def test_two_mib_body_is_413(daemon, endpoint):
    ep, valid, send = endpoint
    padded = b'{"name": "' + b"x" * TWO_MIB + b'"}'
    refused(daemon, send, padded, 413, "body_too_large")


def test_two_mib_chunked_body_is_413(daemon, endpoint):
    # Without Content-Length the cap is enforced while reading.
    ep, valid, send = endpoint

    def chunks():
        yield b'{"name": "'
        for _ in range(TWO_MIB // 65536):
            yield b"x" * 65536
        yield b'"}'

    refused(daemon, send, chunks(), 413, "body_too_large")


def test_body_cap_is_exact(daemon, user):
    # 1 MiB (the default cap) of whitespace around an object is accepted.
    cap = 1024 * 1024
    body = b"{}" + b" " * (cap - 2)
    r = daemon.post("/v1/api-keys", key=user.key, data=body)
    assert r.status_code == 201, r.text
    before = daemon.dump()
    assert_error(daemon.post("/v1/api-keys", key=user.key, data=body + b" "), 413, "body_too_large")
    assert daemon.dump() == before


def nested(depth, leaf=b"1"):
    return b"[" * depth + leaf + b"]" * depth


@pytest.mark.parametrize("depth", [17, 100, 100000])
def test_deep_nesting(daemon, endpoint, depth):
    ep, valid, send = endpoint
    field = next(iter(ep.fields))
    inner = b'{"' + field.encode() + b'": ' + nested(depth - 1) + b"}"
    refused(daemon, send, inner, 400, "too_deep")
    refused(daemon, send, nested(depth), 400, "too_deep")
    objects = b'{"a": ' * depth + b"1" + b"}" * depth
    refused(daemon, send, objects, 400, "too_deep")


def test_nesting_up_to_the_cap_is_parsed(daemon, endpoint):
    # 16 levels (the default cap) are read, so the error is the field's type.
    ep, valid, send = endpoint
    field = next(iter(ep.fields))
    body = json.dumps({**valid(), field: json.loads(nested(15))}).encode()
    refused(daemon, send, body, 400, "invalid_field", field)


def test_brackets_inside_strings_are_not_nesting(daemon, user):
    r = daemon.post("/v1/api-keys", key=user.key, json={"name": "[" * 100 + "{" * 20})
    assert r.status_code == 201 and r.json()["name"] == "[" * 100 + "{" * 20


@pytest.mark.parametrize("bad", [b"\xff", b"\xc3\x28", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80",
                                 b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80"])
def test_non_utf8_body(daemon, endpoint, bad):
    ep, valid, send = endpoint
    field = next(iter(ep.fields))
    body = json.dumps(valid()).encode()
    spoiled = body.replace(b'"' + field.encode() + b'": "', b'"' + field.encode() + b'": "' + bad, 1)
    assert spoiled != body
    refused(daemon, send, spoiled, 400, "invalid_encoding")
    refused(daemon, send, b"\xff\xfe{\x00}\x00", 400, "invalid_encoding")


def test_utf8_is_accepted(daemon, user):
    name = "笔记本 ☃ 𝄞"
    r = daemon.post("/v1/api-keys", key=user.key, json={"name": name})
    assert r.status_code == 201 and r.json()["name"] == name


def test_bad_body_with_a_bad_key_is_401_first(daemon):
    before = daemon.dump()
    assert_error(daemon.post("/v1/api-keys", key="gpk_nope", data=b"{"), 401, "unauthorized")
    assert daemon.dump() == before


@pytest.mark.parametrize("path,status,code,field", [
    ("/v1/instances/%ff", 404, "not_found", None),
    ("/v1/instances/ins_%C0%AF", 404, "not_found", None),
    ("/v1/volumes/%ED%A0%80", 404, "not_found", None),
    ("/v1/instances/a" + "%C3%A9" * 150, 404, "not_found", None),  # UTF-8, cut where the message ends
    ("/v1/instances?state=%ff", 400, "invalid_query", "state"),
    ("/v1/instances?state=a" + "%C3%A9" * 20, 400, "invalid_query", "state"),
    ("/v1/instances?x%ff=1", 400, "invalid_query", "x?"),
    ("/v1/%ff", 404, "not_found", None),
    ("/%ff", 404, "not_found", None),
])
def test_an_error_quoting_bytes_that_are_not_utf8_keeps_its_body(daemon, user, path, status, code, field):
    """A message that quoted the client's bytes (or cut a character in two)
    was not UTF-8, jansson would not encode it, and the error went out with
    no body at all; the bytes are shown as '?' now."""
    err = assert_error(daemon.get(path, key=user.key), status, code, field)
    err["message"].encode("utf-8")


def test_an_unknown_field_with_a_long_name_not_in_ascii_is_named(daemon, user):
    before = daemon.dump()
    name = "a" + "é" * 300
    r = daemon.post("/v1/api-keys", key=user.key, data=json.dumps({"name": "x", name: 1}),
                    headers={"Content-Type": "application/json"})
    err = assert_error(r, 400, "unknown_field", r.json()["error"]["field"])
    assert name.startswith(err["field"].rstrip("?")) and len(err["field"]) > 1, err
    assert daemon.dump() == before


@pytest.mark.parametrize("ctype", [
    "application/x-www-form-urlencoded",  # curl -d, an HTML form
    "multipart/form-data; boundary=x",
    "text/plain",                         # what a page elsewhere sends without a preflight
    "text/plain; charset=utf-8",
    "application/xml",
    "application/json; charset=iso-8859-1",
    None,                                 # no Content-Type at all
])
def test_a_body_not_sent_as_json_is_415(daemon, endpoint, ctype):
    """A valid JSON body is still refused when its headers do not say it is
    JSON: 415 naming Content-Type, nothing written, and Accept-Post saying
    what to send."""
    ep, valid, send = endpoint
    before = daemon.dump()
    r = send(valid(), headers={"Content-Type": ctype})
    err = assert_error(r, 415, "unsupported_media_type", "Content-Type")
    assert "application/json" in err["message"], err
    assert r.headers.get("Accept-Post") == "application/json", r.headers
    assert daemon.dump() == before, "a refused request changed the database"


@pytest.mark.parametrize("ctype", ["application/json", "application/json; charset=utf-8",
                                   "Application/JSON;charset=\"UTF-8\"", "application/merge-patch+json"])
def test_json_by_any_spelling_is_accepted(daemon, endpoint, ctype):
    ep, valid, send = endpoint
    r = send(valid(), headers={"Content-Type": ctype})
    assert r.status_code in (200, 201), r.text


def test_a_compressed_body_is_415(daemon, user):
    body = gzip.compress(b'{"name": "zipped"}')
    r = daemon.post("/v1/api-keys", key=user.key, data=body, headers={"Content-Encoding": "gzip"})
    assert_error(r, 415, "unsupported_media_type", "Content-Encoding")
    assert r.headers.get("Accept-Encoding") == "identity", r.headers


def test_a_request_without_a_body_needs_no_content_type(daemon, user):
    """POST /v1/api-keys takes an optional body: none at all, or an empty one
    of any type, is {}."""
    r = daemon.request("POST", "/v1/api-keys", key=user.key, headers={"Content-Type": None})
    assert r.status_code == 201, r.text
    r = daemon.post("/v1/api-keys", key=user.key, data=b"", headers={"Content-Type": "text/plain"})
    assert r.status_code == 201, r.text


def test_curl_json_works_and_curl_d_alone_is_415(daemon):
    """The README's examples with the real curl: --json sends the type the
    API wants; -d alone sends a form, which is refused and names the fix."""
    if not shutil.which("curl"):
        pytest.skip("curl is not installed")
    body = json.dumps({"email": unique_email("curl"), "password": DEFAULT_PASSWORD})

    def curl(*args):
        p = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", "-X", "POST", daemon.url("/v1/signup"), *args],
                           capture_output=True, text=True, timeout=30)
        text, _, status = p.stdout.rpartition("\n")
        return int(status), text

    before = daemon.dump()
    status, text = curl("-d", body)
    assert status == 415 and json.loads(text)["error"]["field"] == "Content-Type", text
    assert daemon.dump() == before
    status, text = curl("--json", body)
    assert status == 201, text
