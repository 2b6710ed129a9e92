"""HTTP as the RFCs and proxies expect, through raw sockets where a client
library would hide the fault: HEAD on every GET route, one framing per
request (Content-Length and Transfer-Encoding together refused and the
connection closed, codings other than chunked 501), Host required in
HTTP/1.1, NUL bytes refused in the path and the query, an encoded
slash never a separator, oversized headers answered with the API's JSON
error, the faults libmicrohttpd would answer itself (a raw NUL, a bad
chunk, headers beyond its memory) refused by the guard in front of it with
the API's error, and the headers every 401, 429 and 503 must carry."""
import json
import re
import socket
import ssl

import pytest

from harness import assert_error, route_table, stop_all
from ops_util import TlsDaemon, make_ca, make_cert
from ports import exchange


def raw(d, data, timeout=10, tls=None):
    """Sends bytes on a fresh connection (through the ssl.SSLContext tls if
    given); returns (status, headers, body, closed) of the first reply,
    closed saying the server ended the connection after it."""
    plain = socket.create_connection(("127.0.0.1", d.port), timeout=timeout)
    with tls.wrap_socket(plain, server_hostname="127.0.0.1") if tls else plain as sock:
        sock.sendall(data)
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
        head, _, body = reply.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        sock.settimeout(3)
        try:
            closed = sock.recv(1) == b""
        except (socket.timeout, ConnectionResetError):
            closed = False
        return status, headers, body, closed


def json_error(status, headers, body, code):
    assert headers["content-type"] == "application/json", headers
    assert headers.get("x-request-id", "").startswith("req_"), headers  # refused unread or not
    # what every answer carries (ARCHITECTURE.md, "The life of a request"),
    # the guard's refusals too: an error quoting nothing of the client is
    # still never stored or sniffed as a page
    assert headers.get("cache-control") == "no-store", headers
    assert headers.get("x-content-type-options") == "nosniff", headers
    assert "strict-transport-security" not in headers, headers  # HSTS only over TLS
    err = json.loads(body)["error"]
    assert err["code"] == code, err
    return err


# ---------------------------------------------------------------- HEAD

def get_routes_without_params():
    return sorted({p for m, p, _ in route_table() if m == "GET" and "{" not in p})


@pytest.mark.parametrize("path", get_routes_without_params())
def test_head_answers_every_get_route_without_a_body(daemon, user, path):
    key = daemon.admin_key if path.startswith("/v1/admin") else user.key
    g = daemon.get(path, key=key)
    status, headers, body, _ = raw(daemon, f"HEAD {path} HTTP/1.1\r\nHost: x\r\n"
                                           f"Authorization: Bearer {key}\r\nConnection: close\r\n\r\n".encode())
    assert status == g.status_code, (path, status, g.status_code)
    assert body == b"", body[:200]
    assert headers.get("content-type") == g.headers.get("Content-Type").lower() or \
        headers.get("content-type") == g.headers.get("Content-Type"), headers


def test_head_on_a_route_with_an_id_and_allow_lists_head(daemon, user):
    r = daemon.request("HEAD", "/v1/api-keys/key_00000000000000000000", key=user.key)
    assert r.status_code == 404 and r.content == b""
    r = daemon.request("DELETE", "/v1/me", key=user.key)
    allow = {m.strip() for m in r.headers["Allow"].split(",")}
    assert allow == {"GET", "HEAD"}, allow
    r = daemon.request("HEAD", "/v1/signup")
    assert r.status_code == 405 and "HEAD" not in r.headers["Allow"], r.headers


# ---------------------------------------------------------------- framing

def test_content_length_with_transfer_encoding_is_refused_and_closed(daemon, user):
    body = b'{"name": "smuggled"}'
    before = daemon.dump()
    req = (f"POST /v1/api-keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {user.key}\r\n"
           f"Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    req += b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    req += b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    status, headers, rbody, closed = raw(daemon, req)
    assert status == 400, (status, rbody)
    json_error(status, headers, rbody, "bad_request")
    assert closed, "the connection must close after a request with two framings"
    assert daemon.dump() == before


def chunked_http_1_0(d, key, tls=None):
    """HTTP/1.0 has no transfer codings (RFC 9112 6.1): a 1.0 proxy in front
    reads the chunks as a second request, so the framing is refused."""
    body = b'{"name": "smuggled10"}'
    before = d.dump()
    req = (f"POST /v1/api-keys HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
           "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    req += b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    status, headers, rbody, closed = raw(d, req, tls=tls)
    json_error(status, headers, rbody, "bad_request")
    assert closed
    assert d.dump() == before


def test_a_chunked_http_1_0_request_is_refused_and_closed(daemon, user):
    chunked_http_1_0(daemon, user.key)


def test_a_chunked_http_1_0_request_is_refused_over_tls_too(tmp_path):
    """Over TLS too (the guard reads the plaintext: test_http_tls_guard.py
    tries every shape it refuses)."""
    ca = make_ca(tmp_path, "ca")
    key, cert = make_cert(tmp_path, "server", ca)
    d = TlsDaemon(tmp_path / "d", ca=ca[1], cert=cert, key=key)
    try:
        chunked_http_1_0(d, d.signup().key, tls=ssl.create_default_context(cafile=ca[1]))
    finally:
        stop_all([d])


@pytest.mark.parametrize("coding", ["gzip", "gzip, chunked", "identity", "x-custom"])
def test_transfer_codings_other_than_chunked_are_501(daemon, user, coding):
    before = daemon.dump()
    req = (f"POST /v1/api-keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {user.key}\r\n"
           f"Transfer-Encoding: {coding}\r\n\r\n0\r\n\r\n").encode()
    status, headers, body, closed = raw(daemon, req)
    assert status == 501, (status, body)
    json_error(status, headers, body, "not_implemented")
    assert closed
    assert daemon.dump() == before


def test_chunked_bodies_still_work(daemon, user):
    body = b'{"name": "chunked"}'
    req = (f"POST /v1/api-keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {user.key}\r\n"
           f"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode()
    req += b"5\r\n" + body[:5] + b"\r\n" + b"%x\r\n" % (len(body) - 5) + body[5:] + b"\r\n0\r\n\r\n"
    status, headers, rbody, _ = raw(daemon, req)
    assert status == 201, rbody
    assert headers["location"].startswith("/v1/api-keys/key_"), headers


def test_http11_without_host_is_400_but_http10_is_served(daemon):
    status, headers, body, _ = raw(daemon, b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert status == 400
    assert "Host" in json_error(status, headers, body, "bad_request")["message"]
    status, _, body, _ = raw(daemon, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert status == 200, body


# ---------------------------------------------------------------- NUL bytes and slashes

@pytest.mark.parametrize("target", [
    "/v1/me%00admin", "/v1/me%00", "/v1/api-keys/key_x%00y", "/v1/me?x=%00", "/v1/me?a%00b=1",
    "/v1/instances?state=running%00stopped",
])
def test_nul_bytes_in_the_target_are_400(daemon, user, target):
    status, headers, body, _ = raw(daemon, f"GET {target} HTTP/1.1\r\nHost: x\r\n"
                                           f"Authorization: Bearer {user.key}\r\nConnection: close\r\n\r\n".encode())
    assert status == 400, (target, status, body)
    json_error(status, headers, body, "bad_request")


@pytest.mark.parametrize("target", ["/v1%2Fme", "/v1/api-keys%2fkey_00000000000000000000",
                                    "/v1/instances/ins_00000000000000000000%2Fstop"])
def test_an_encoded_slash_is_not_a_separator(daemon, user, target):
    status, headers, body, _ = raw(daemon, f"GET {target} HTTP/1.1\r\nHost: x\r\n"
                                           f"Authorization: Bearer {user.key}\r\nConnection: close\r\n\r\n".encode())
    assert status == 404, (target, status, body)
    json_error(status, headers, body, "not_found")


def test_an_encoded_slash_in_the_query_is_data(daemon):
    r = daemon.get("/v1/estimate", params={"gpu_type": "MI450/x", "card_count": 1, "hours": 1})
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["code"] != "bad_request", r.text


# ---------------------------------------------------------------- the library's own errors

def test_oversized_headers_get_the_api_error_body(daemon):
    big = "X-Big: " + "a" * 20000 + "\r\n"
    status, headers, body, closed = raw(daemon, f"GET /healthz HTTP/1.1\r\nHost: x\r\n{big}\r\n".encode())
    assert status == 431, (status, body[:200])
    json_error(status, headers, body, "headers_too_large")


# ---------------------------------------------------------------- faults the library would answer itself

def api_key_names(daemon, user):
    return sorted(k["name"] for k in daemon.get("/v1/api-keys", key=user.key).json()["data"])


@pytest.mark.parametrize("head", [
    b"GET /v1/me\x00admin HTTP/1.1\r\nHost: x\r\n",
    b"GET /v1/me?x=a\x00b HTTP/1.1\r\nHost: x\r\n",
    b"GET /v1/me HTTP/1.1\r\nHost: x\r\nX-Note: a\x00b\r\n",
    b"GET /v1/me HTTP/1.1\r\nHost: x\r\nX-No\x00te: ab\r\n",
])
def test_a_raw_nul_in_the_request_line_or_a_header_is_400(daemon, user, head):
    """libmicrohttpd cuts a line at a raw NUL byte, so /v1/me\\0admin would
    be served as /v1/me: the guard in front of it refuses the request with
    the API's error and closes the connection."""
    status, headers, body, closed = raw(daemon, head + f"Authorization: Bearer {user.key}\r\n\r\n".encode())
    assert status == 400 and closed, (status, body)
    assert "NUL" in json_error(status, headers, body, "bad_request")["message"]


def test_a_raw_nul_in_a_header_changes_nothing(daemon, user):
    before = api_key_names(daemon, user)
    body = b'{"name": "smuggled"}'
    status, headers, reply, _ = raw(daemon, b"POST /v1/api-keys HTTP/1.1\r\nHost: x\r\n"
                                    b"Authorization: Bearer " + user.key.encode() + b"\r\nX-Forwarded-For: 1\x002\r\n"
                                    b"Content-Type: application/json\r\nContent-Length: " +
                                    str(len(body)).encode() + b"\r\n\r\n" + body)
    json_error(status, headers, reply, "bad_request")
    assert api_key_names(daemon, user) == before


@pytest.mark.parametrize("chunks", [b"zz\r\n{}\r\n0\r\n\r\n", b"2 junk\r\n{}\r\n0\r\n\r\n",
                                    b"-2\r\n{}\r\n0\r\n\r\n", b"1\r\n{}\r\n0\r\n\r\n",
                                    b"fffffffffffffffffff\r\n{}\r\n0\r\n\r\n"])
def test_a_malformed_chunk_gets_the_api_error_body(daemon, user, chunks):
    """A bad chunk size (or a chunk longer than its size) got libmicrohttpd's
    HTML page; now the API's JSON 400, and no key is made."""
    before = api_key_names(daemon, user)
    status, headers, body, closed = raw(daemon, b"POST /v1/api-keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                                        user.key.encode() + b"\r\nContent-Type: application/json\r\n"
                                        b"Transfer-Encoding: chunked\r\n\r\n" + chunks)
    assert status == 400 and closed, (status, body)
    assert "chunk" in json_error(status, headers, body, "bad_request")["message"]
    assert api_key_names(daemon, user) == before


def test_chunk_extensions_and_trailers_still_work(daemon, user):
    body = b'{"name": "extended"}'
    status, _, reply, _ = raw(daemon, b"POST /v1/api-keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                              user.key.encode() + b"\r\nContent-Type: application/json\r\n"
                              b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" +
                              b"5;part=1\r\n" + body[:5] + b"\r\n" + f"{len(body) - 5:x}".encode() + b"\r\n" +
                              body[5:] + b"\r\n0\r\nX-Checksum: none\r\n\r\n")
    assert status == 201, reply
    assert "extended" in api_key_names(daemon, user)


def test_a_hundred_header_fields_pass_and_more_get_the_api_error_body(daemon):
    """Many short fields ran libmicrohttpd's connection memory out (each
    field's record lives there beside the head) long before 16 KiB, and got
    its bare 431 page; the guard counts them as they come."""
    fields = "".join(f"X-F{i}: b\r\n" for i in range(99))  # and Host: 100
    status, headers, body, closed = raw(daemon, f"GET /healthz HTTP/1.1\r\nHost: x\r\n{fields}\r\n".encode())
    assert status == 200, (status, body[:200])
    for many in (101, 3000):
        fields = "".join(f"X-F{i}: b\r\n" for i in range(many))
        status, headers, body, closed = raw(daemon, f"GET /healthz HTTP/1.1\r\nHost: x\r\n{fields}\r\n".encode())
        assert status == 431 and closed, (many, status, body[:200])
        json_error(status, headers, body, "headers_too_large")
        assert "more than 100 header fields" in json.loads(body)["error"]["message"], body


def test_a_hundred_query_parameters_pass_and_more_get_the_api_error_body(daemon):
    """libmicrohttpd keeps a record of each query parameter in the
    connection's memory too: some 690 ran it out, and the request got no
    answer until the connection timed out. A hundred pass, with a hundred
    header fields beside them; more are 414 at once."""
    fields = "".join(f"X-F{i}: b\r\n" for i in range(99))  # and Host: 100
    query = "&".join(f"p{i}=1" for i in range(100))
    status, headers, body, closed = raw(daemon, f"GET /healthz?{query} HTTP/1.1\r\nHost: x\r\n{fields}\r\n".encode())
    assert status == 200, (status, body[:200])
    for many in (101, 2000):
        query = "&".join(f"p{i}=1" for i in range(many))
        status, headers, body, closed = raw(daemon, f"GET /healthz?{query} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert status == 414 and closed, (many, status, body[:200])
        assert "more than 100 parameters" in json_error(status, headers, body, "uri_too_long")["message"], body


def test_a_request_line_past_the_cap_is_414(daemon):
    status, headers, body, closed = raw(daemon, b"GET /v1/admin/nodes?x=" + b"a" * 40000 + b" HTTP/1.1\r\n\r\n")
    assert status == 414 and closed, (status, body[:200])
    json_error(status, headers, body, "uri_too_long")


def test_garbage_that_never_ends_its_head_gets_the_api_error_body(daemon):
    """Random bytes: the guard judged the request line only once the head
    ended, which garbage need never do, and libmicrohttpd answered the line
    with its HTML page first."""
    garbage = bytes((i * 7919 + 13) % 251 for i in range(3000)).replace(b"\n\n", b"\n.").replace(b"\r\n\r", b"\r\n.")
    assert b"\n" in garbage
    status, headers, body, closed = raw(daemon, garbage)
    assert status == 400 and closed, (status, body[:200])
    json_error(status, headers, body, "bad_request")


def test_headers_beyond_the_librarys_memory_get_the_api_error_body(daemon):
    """Far past the handler's 16 KiB cap, where libmicrohttpd's connection
    memory ran out and it sent a bare 431."""
    big = "".join(f"X-Big-{i}: " + "a" * 1000 + "\r\n" for i in range(200))
    status, headers, body, closed = raw(daemon, f"GET /healthz HTTP/1.1\r\nHost: x\r\n{big}\r\n".encode())
    assert status == 431 and closed, (status, body[:200])
    json_error(status, headers, body, "headers_too_large")


@pytest.mark.parametrize("request_bytes,status,code", [
    (b"GARBAGE\r\n\r\n", 400, "bad_request"),  # the library closed without a word
    (b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad_request"),  # was served as /a b
    (b"GET / HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n", 400, "bad_request"),  # its HTML 400
    (b"GET / HTTP/1.1\r\nBad Name: x\r\nHost: x\r\n\r\n", 400, "bad_request"),  # was served
    (b"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\n\r\n", 400, "bad_request"),
    (b"GET / HTTP/1.1\rHost: x\r\n\r\n", 400, "bad_request"),  # its HTML 400
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400, "bad_request"),  # a bare 400
    (b"POST /v1/login HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400,
     "bad_request"),  # was served, by one of the two lengths
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n", 413, "body_too_large"),
    (b"GET / HTTP/9.9\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"),  # its HTML 505
])
def test_malformed_request_and_header_lines_get_the_api_error_body(daemon, request_bytes, status, code):
    got, headers, body, closed = raw(daemon, request_bytes)
    assert (got, closed) == (status, True), (got, body[:200])
    json_error(got, headers, body, code)
    # Refused before the library read it, still dated (RFC 9110 6.6.1).
    assert re.fullmatch(r"(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT", headers["date"]), headers


@pytest.mark.parametrize("host", ["u@a", "a/b", "a:80x", "[::1", "a b"])
def test_a_host_that_is_no_host_is_400(daemon, host):
    """Host is a name or address and an optional port (RFC 9112 3.2): user
    information, a path or garbage is refused."""
    status, headers, body, closed = raw(daemon, f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    assert (status, closed) == (400, True), body
    assert "Host" in json_error(status, headers, body, "bad_request")["message"]


def test_a_target_in_absolute_form_is_served_as_its_path(daemon, user):
    """A server must take "http://host/path" as it takes "/path" (RFC 9112
    3.2.2): proxies send it so."""
    for target in (f"http://127.0.0.1:{daemon.port}/healthz", "HTTP://any.example/healthz"):
        status, _, body, _ = raw(daemon, f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert status == 200 and json.loads(body)["status"] == "ok", body
    status, _, body, _ = raw(daemon, f"GET http://x/v1/me HTTP/1.1\r\nHost: x\r\n"
                                     f"Authorization: Bearer {user.key}\r\n\r\n".encode())
    assert status == 200 and json.loads(body)["id"] == user.id, body


def test_a_pipelined_request_after_a_good_one_is_refused_alone(daemon):
    """The requests before the refused one are answered; then the refusal,
    then the end of the connection."""
    reply = exchange(daemon.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz\x00 HTTP/1.1\r\nHost: x\r\n\r\n")
    first, second = reply.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200 "), reply
    assert second.startswith(b"400 ") and b'"code":"bad_request"' in second, reply
    metrics = daemon.get("/metrics", key=daemon.admin_key).text
    refused = [line for line in metrics.splitlines() if line.startswith("gpurent_http_requests_refused_unread_total ")]
    assert refused and int(refused[0].split()[1]) >= 1, refused


def test_a_request_after_an_upgrade_the_server_refused_is_checked_as_ever(daemon):
    """An Upgrade header on a route that switches nothing leaves the
    connection speaking HTTP: the request after it is still checked (a
    repeated Host refused), not passed unread to the library."""
    reply = exchange(daemon.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
                                  b"GET /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n")
    first, second = reply.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200 "), reply
    assert second.startswith(b"400 ") and b"repeats its host header" in second.lower(), reply


# ---------------------------------------------------------------- headers every error class carries

def test_every_401_names_its_challenge(daemon):
    r = daemon.get("/v1/me")
    assert_error(r, 401, "unauthorized")
    assert r.headers["WWW-Authenticate"] == "Bearer"
    r = daemon.post("/v1/login", json={"email": "nobody@example.com", "password": "wrong password!"})
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", r.headers
    r = daemon.post("/v1/payments/webhook", data=b'{"payment_id": "p1"}',
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 401 and r.headers.get("WWW-Authenticate"), (r.status_code, r.headers)


def test_every_201_says_where_the_new_resource_is(daemon, user):
    r = daemon.post("/v1/signup", json={"email": "located@example.test", "password": "correct horse battery"})
    assert r.status_code == 201 and r.headers["Location"] == "/v1/me", r.headers
    r = daemon.post("/v1/api-keys", key=user.key, json={"name": "located"})
    assert r.status_code == 201 and r.headers["Location"] == f"/v1/api-keys/{r.json()['id']}", r.headers
    assert daemon.get(r.headers["Location"], key=user.key).status_code == 200
    r = daemon.post("/v1/volumes", key=user.key, json={"name": "located"})
    assert r.status_code == 201 and r.headers["Location"] == f"/v1/volumes/{r.json()['id']}", r.headers
    assert daemon.get(r.headers["Location"], key=user.key).status_code == 200
    r = daemon.post("/v1/admin/images", key=daemon.admin_key, json={"ref": "example/located:1", "stack": "ROCm"})
    assert r.status_code == 201 and r.headers["Location"] == "/v1/images", (r.text, r.headers)
    r = daemon.post("/v1/admin/nodes", key=daemon.admin_key,
                    json={"name": "located-node", "agent_url": "http://127.0.0.1:9", "gpu_model": "MI450",
                          "card_count": 8, "fabric": "fabric-a", "region": "local"})
    assert r.status_code == 201, r.text
    assert r.headers["Location"] == f"/v1/admin/nodes/{r.json()['node']['id']}", r.headers
    assert daemon.get(r.headers["Location"], key=daemon.admin_key).status_code == 200


def test_deleting_a_gpu_type_with_history_is_409_saying_why(daemon):
    before = daemon.dump()
    r = daemon.delete("/v1/admin/gpu-types/RTX4090", key=daemon.admin_key)
    err = assert_error(r, 409, "conflict")
    assert err["prices"] >= 1 and err["nodes"] == 0 and err["instances"] == 0, err
    assert "prices" in err["message"], err
    assert daemon.dump() == before


def test_an_invite_code_made_is_at_its_location(daemon):
    r = daemon.post("/v1/admin/invite-codes", key=daemon.admin_key, json={"code": "loc-ated", "amount": "5.00",
                                                                         "max_uses": 3})
    assert r.status_code == 201, r.text
    assert r.headers["Location"] == "/v1/admin/invite-codes/LOC-ATED", r.headers
    got = daemon.get(r.headers["Location"], key=daemon.admin_key)
    assert got.status_code == 200, got.text
    body = got.json()
    assert (body["code"], body["amount"], body["max_uses"], body["uses"]) == ("LOC-ATED", "5.00", 3, 0), body
    assert_error(daemon.get("/v1/admin/invite-codes/NOPE", key=daemon.admin_key), 404, "not_found")
    user = daemon.signup()
    assert_error(daemon.get("/v1/admin/invite-codes/LOC-ATED", key=user.key), 403, "forbidden")


def test_a_grant_and_a_topup_made_are_at_their_locations(daemon):
    user, other = daemon.signup(), daemon.signup()
    r = daemon.post(f"/v1/admin/users/{user.id}/grants", key=daemon.admin_key,
                    json={"amount": "3.50", "expires_at": "2099-01-01T00:00:00Z", "reason": "located"})
    assert r.status_code == 201, r.text
    grant = r.json()["grant_id"]
    assert r.headers["Location"] == f"/v1/admin/users/{user.id}/grants/{grant}", r.headers
    got = daemon.get(r.headers["Location"], key=daemon.admin_key)
    assert got.status_code == 200, got.text
    body = got.json()
    assert (body["grant_id"], body["user_id"], body["source"], body["amount"], body["remaining"], body["expires_at"],
            body["voided_at"], body["expired"]) == (grant, user.id, "admin", "3.50", "3.50", "2099-01-01T00:00:00Z",
                                                    None, False), body

    r = daemon.post(f"/v1/admin/users/{user.id}/topups", key=daemon.admin_key,
                    json={"amount": "12.34", "payment_id": "pay-located"})
    assert r.status_code == 201, r.text
    topup = r.json()["topup_id"]
    assert r.headers["Location"] == f"/v1/admin/users/{user.id}/topups/{topup}", r.headers
    got = daemon.get(r.headers["Location"], key=daemon.admin_key)
    assert got.status_code == 200, got.text
    body = got.json()
    assert (body["topup_id"], body["user_id"], body["payment_id"], body["amount"], body["source"]) == (
        topup, user.id, "pay-located", "12.34", "admin"), body
    # The same payment again is no new resource: 200, and no Location.
    r = daemon.post(f"/v1/admin/users/{user.id}/topups", key=daemon.admin_key,
                    json={"amount": "12.34", "payment_id": "pay-located"})
    assert r.status_code == 200 and r.json()["duplicate"] is True and "Location" not in r.headers, r.headers

    # Under another user, malformed, or asked by a non-admin: nothing shown.
    for path in (f"/v1/admin/users/{other.id}/grants/{grant}", f"/v1/admin/users/{other.id}/topups/{topup}",
                 f"/v1/admin/users/{user.id}/grants/{topup}", f"/v1/admin/users/{user.id}/topups/grt_x",
                 f"/v1/admin/users/nobody/grants/{grant}"):
        assert_error(daemon.get(path, key=daemon.admin_key), 404, "not_found")
    assert_error(daemon.get(f"/v1/admin/users/{user.id}/grants/{grant}", key=user.key), 403, "forbidden")
    assert_error(daemon.get(f"/v1/admin/users/{user.id}/topups/{topup}", key=user.key), 403, "forbidden")


def test_options_star_is_about_the_whole_server(daemon):
    """RFC 9110 9.3.7: "OPTIONS *" is answered with every method the
    server takes; "*" is not a target for another method."""
    status, headers, body, _ = raw(daemon, b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 204 and not body, (status, body)
    methods = {m for m, _, _ in route_table()} | {"HEAD"}
    assert {m.strip() for m in headers["allow"].split(",")} == methods, headers
    status, headers, body, _ = raw(daemon, b"GET * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    json_error(status, headers, body, "bad_request")
