"""The HTTP layer end to end: unknown routes and methods, CORS for the
console's origin only, X-Request-Id and the access log, keep-alive, the path
cap, /healthz with the testing clock, and /readyz."""
import http.client
import re
import socket
import time

import pytest
import requests

from harness import REQUEST_ID, Daemon, assert_error, migration_versions, route_table, stop_all, unique_email

CONSOLE = "http://console.test"


@pytest.fixture(scope="module")
def cors_daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("cors"), options={"cors_origins": CONSOLE})
    yield d
    stop_all([d])


# ---------------------------------------------------------------- routing

@pytest.mark.parametrize("method, path", [
    ("GET", "/nope"), ("GET", "/v1"), ("GET", "/v1/"), ("GET", "/v1/nope"), ("POST", "/v1/nope"),
    ("GET", "/v1/me/"), ("GET", "/v1//me"), ("GET", "/V1/ME"), ("GET", "/v1/api-keys/x/y"),
    ("DELETE", "/v1/api-keys/"), ("GET", "/healthz/x"), ("OPTIONS", "/v1/nope"), ("BREW", "/v1/coffee"),
])
def test_unknown_route_is_404_json(daemon, method, path):
    r = daemon.request(method, path)
    assert_error(r, 404, "not_found")


def allowed_methods(path_pattern):
    methods = {m for m, p, _ in route_table() if p == path_pattern}
    return methods | {"HEAD"} if "GET" in methods else methods


@pytest.mark.parametrize("method, path, pattern", [
    ("PUT", "/v1/me", "/v1/me"),
    ("DELETE", "/v1/me", "/v1/me"),
    ("GET", "/v1/signup", "/v1/signup"),
    ("PATCH", "/v1/api-keys", "/v1/api-keys"),
    ("POST", "/v1/api-keys/key_00000000000000000000", "/v1/api-keys/{id}"),
    ("POST", "/healthz", "/healthz"),
    ("HEAD", "/v1/login", "/v1/login"),
])
def test_wrong_method_is_405_with_allow(daemon, user, method, path, pattern):
    before = daemon.dump()
    r = daemon.request(method, path, key=user.key, json={})
    assert r.status_code == 405, r.text
    assert {m.strip() for m in r.headers["Allow"].split(",")} == allowed_methods(pattern)
    if method != "HEAD":
        assert_error(r, 405, "method_not_allowed")
    assert daemon.dump() == before


def test_path_over_the_cap_is_414(daemon):
    r = daemon.get("/v1/" + "a" * 3000)
    assert_error(r, 414, "uri_too_long")
    assert daemon.get("/v1/" + "a" * 2000).status_code == 404


# ---------------------------------------------------------------- CORS

def cors_headers(r):
    return {k.lower(): v for k, v in r.headers.items() if k.lower().startswith("access-control-")}


def test_cors_preflight_for_the_console(cors_daemon):
    before = cors_daemon.dump()
    r = cors_daemon.request("OPTIONS", "/v1/api-keys", headers={
        "Origin": CONSOLE, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert r.status_code == 204, r.text
    assert r.content == b""
    assert REQUEST_ID.match(r.headers["X-Request-Id"])
    h = cors_headers(r)
    assert h["access-control-allow-origin"] == CONSOLE
    assert {m.strip() for m in h["access-control-allow-methods"].split(",")} == {"GET", "HEAD", "POST", "DELETE"}
    allowed = {x.strip().lower() for x in h["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "idempotency-key"} <= allowed
    assert int(h["access-control-max-age"]) > 0
    assert "Origin" in r.headers.get("Vary", "")
    # Nothing was run: a preflight is not the request.
    assert cors_daemon.dump() == before


def test_cors_on_real_requests_for_the_console(cors_daemon):
    u = cors_daemon.signup()
    for r in (cors_daemon.get("/v1/me", key=u.key, headers={"Origin": CONSOLE}),
              cors_daemon.get("/v1/me", headers={"Origin": CONSOLE}),
              cors_daemon.get("/v1/nope", headers={"Origin": CONSOLE})):
        h = cors_headers(r)
        assert h["access-control-allow-origin"] == CONSOLE, r.headers
        exposed = {x.strip().lower() for x in h["access-control-expose-headers"].split(",")}
        assert {"x-request-id", "retry-after"} <= exposed
        assert "Origin" in r.headers.get("Vary", "")


@pytest.mark.parametrize("origin", ["http://evil.test", "http://console.test.evil.test", "http://console.tes",
                                    "https://console.test", "http://console.test:8080", "null", ""])
def test_no_cors_for_other_origins(cors_daemon, origin):
    u = cors_daemon.signup()
    pre = cors_daemon.request("OPTIONS", "/v1/me", headers={"Origin": origin, "Access-Control-Request-Method": "GET"})
    assert pre.status_code == 204
    assert cors_headers(pre) == {}, pre.headers
    assert pre.headers["Allow"] == "GET, HEAD"
    real = cors_daemon.get("/v1/me", key=u.key, headers={"Origin": origin})
    assert real.status_code == 200 and cors_headers(real) == {}, real.headers


def test_no_cors_without_configured_origins(daemon, user):
    for r in (daemon.request("OPTIONS", "/v1/me", headers={"Origin": CONSOLE, "Access-Control-Request-Method": "GET"}),
              daemon.get("/v1/me", key=user.key, headers={"Origin": CONSOLE})):
        assert cors_headers(r) == {}, r.headers


def test_no_cors_without_origin(cors_daemon):
    r = cors_daemon.get("/healthz")
    assert r.status_code == 200 and cors_headers(r) == {}


@pytest.mark.parametrize("origin", ["http://evil.test", "null", "http://console.test.evil.test"])
def test_a_write_from_a_page_of_another_site_is_refused(cors_daemon, origin):
    """A page elsewhere can POST a JSON body as text/plain with no
    preflight (a sign-up from each visitor's address, say): a request that
    may change something and carries an Origin that is neither this
    server's nor an allowed one is refused, and nothing is made."""
    d = cors_daemon
    email = unique_email("xsite")
    body = f'{{"email":"{email}","password":"correct horse battery"}}'
    r = d.request("POST", "/v1/signup", data=body, headers={"Origin": origin, "Content-Type": "text/plain"})
    assert_error(r, 403, "forbidden")
    assert d.sql("SELECT count(*) FROM users WHERE email = ?", (email,)) == [(0,)]
    u = d.signup()
    assert_error(d.post("/v1/api-keys", key=u.key, json={}, headers={"Origin": origin}), 403, "forbidden")
    # Reads are not refused (CORS keeps their answers from the page).
    assert d.get("/v1/me", key=u.key, headers={"Origin": origin}).status_code == 200


def test_writes_from_this_server_s_pages_an_allowed_origin_or_no_browser_pass(cors_daemon):
    d = cors_daemon
    u = d.signup()
    own = f"http://127.0.0.1:{d.port}"
    # This host under any scheme and port (a proxy's $host has no port).
    for headers in ({"Origin": own}, {"Origin": own.replace("http:", "https:")}, {"Origin": "https://127.0.0.1"},
                    {"Origin": CONSOLE}, {}):
        r = d.post("/v1/api-keys", key=u.key, json={}, headers=headers)
        assert r.status_code == 201, (headers, r.text)
    # A script's curl (no Origin) passes the check: with --json it signs up;
    # with -d alone its form is refused for its type, not for where it is from.
    email = unique_email("curl")
    body = f'{{"email":"{email}","password":"correct horse battery"}}'
    r = d.request("POST", "/v1/signup", data=body, headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert_error(r, 415, "unsupported_media_type", "Content-Type")
    r = d.request("POST", "/v1/signup", data=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text


# ---------------------------------------------------------------- request ids and the access log

def test_every_response_has_a_unique_request_id(daemon, user):
    responses = [
        daemon.get("/healthz"), daemon.get("/readyz"), daemon.get("/v1/openapi.json"),
        daemon.get("/v1/me", key=user.key), daemon.post("/v1/api-keys", key=user.key, json={}),
        daemon.request("OPTIONS", "/v1/me"), daemon.post("/v1/signup", data=b"{"),
        daemon.get("/v1/me"), daemon.get("/v1/nope"), daemon.request("PUT", "/v1/me"),
        daemon.post("/v1/api-keys", key=user.key, data=b"x" * (2 << 20)), daemon.get("/v1/" + "a" * 3000),
        daemon.get("/v1/api-keys/key_00000000000000000000", key=user.key),
    ]
    ids = [r.headers.get("X-Request-Id", "") for r in responses]
    assert all(REQUEST_ID.match(i) for i in ids), list(zip([r.status_code for r in responses], ids))
    assert len(set(ids)) == len(ids)
    statuses = {r.status_code for r in responses}
    assert statuses == {200, 201, 204, 400, 401, 404, 405, 413, 414}


def test_each_request_is_logged_once_without_secrets(daemon):
    email = "logged-once@example.test"
    password = "very secret password 42"
    r = daemon.post("/v1/signup", json={"email": email, "password": password})
    token = r.json()["api_key"]["token"]
    me = daemon.get("/v1/me", key=token, params={"x": "1"})
    login = daemon.post("/v1/login", json={"email": email, "password": "wrong " + password})
    for resp, method, path in ((r, "POST", "/v1/signup"), (me, "GET", "/v1/me"), (login, "POST", "/v1/login")):
        rid = resp.headers["X-Request-Id"]
        m = daemon.wait_for_log(rf"^.*\b{rid}\b.*$")
        line = m.group(0)
        assert re.search(rf"\b{method} {re.escape(path)} {resp.status_code} \d+ms {rid}\b", line), line
        assert len(re.findall(rid, daemon.stderr_text())) == 1
    log = daemon.stderr_text()
    for secret in (password, token, token.rsplit("_", 1)[1]):
        assert secret not in log


# ---------------------------------------------------------------- keep-alive

def test_keep_alive_over_one_session(daemon, user):
    s = requests.Session()
    statuses = []
    for _ in range(3):
        for r in (daemon.get("/healthz", session=s), daemon.get("/v1/me", key=user.key, session=s),
                  daemon.post("/v1/api-keys", key=user.key, json={"name": "ka"}, session=s),
                  daemon.post("/v1/signup", data=b"{", session=s), daemon.get("/v1/me", session=s),
                  daemon.get("/v1/nope", session=s), daemon.request("PUT", "/v1/me", session=s),
                  daemon.request("OPTIONS", "/v1/me", session=s)):
            assert r.headers.get("Connection", "").lower() != "close", (r.status_code, r.headers)
            statuses.append(r.status_code)
    assert set(statuses) == {200, 201, 204, 400, 401, 404, 405}
    pool = s.get_adapter(daemon.base_url).poolmanager.connection_from_url(daemon.base_url)
    assert pool.num_connections == 1, f"{pool.num_connections} connections for {len(statuses)} requests"
    s.close()


def test_keep_alive_on_one_socket(daemon, user):
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=10)
    conn.connect()
    local = conn.sock.getsockname()
    for i in range(20):
        body = b'{"name": "k%d"}' % i if i % 2 else None
        conn.request("POST" if body else "GET", "/v1/api-keys" if body else "/v1/me", body=body,
                     headers={"Authorization": f"Bearer {user.key}", "Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        assert r.status == (201 if body else 200)
        assert not r.will_close
        assert conn.sock is not None and conn.sock.getsockname() == local
    conn.close()


def test_slow_client_is_answered(daemon, user):
    """Headers and body arriving in pieces still make one request."""
    body = b'{"name": "slow"}'
    head = (f"POST /v1/api-keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {user.key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        for piece in (head[:10], head[10:40], head[40:], body[:5], body[5:]):
            sock.sendall(piece)
            time.sleep(0.01)  # pacing only, not an assertion
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 201 ")


# ---------------------------------------------------------------- health

def test_healthz_reports_the_testing_clock(daemon):
    r = daemon.get("/healthz")
    assert r.status_code == 200
    h = r.json()
    assert h["status"] == "ok" and h["clock"] == "testing" and h["time"] == daemon.now()
    assert "TESTING CLOCK" in h["warning"]
    t = daemon.advance_clock(3600)
    assert daemon.get("/healthz").json()["time"] == t
    assert "TESTING CLOCK IN USE" in daemon.stderr_text()


def test_healthz_on_the_system_clock(new_daemon):
    d = new_daemon(clock=None)
    h = d.get("/healthz").json()
    assert h["clock"] == "system" and "warning" not in h
    assert abs(h["time"] - time.time()) < 60
    assert "TESTING CLOCK" not in d.stderr_text()


def test_bad_clock_file_refuses_to_start(tmp_path):
    from harness import run_gpurentd
    clock = tmp_path / "clock"
    clock.write_text("soon\n")
    p = run_gpurentd("serve", "--listen", "127.0.0.1:0", "--db", tmp_path / "x.db", "--clock-file", clock,
                     timeout=60)
    assert p.returncode != 0
    assert "clock" in p.stderr and str(clock) in p.stderr


def test_readyz(daemon):
    r = daemon.get("/readyz")
    assert r.status_code == 200
    assert r.json() == {"status": "ready", "schema_version": max(migration_versions()),
                        "checks": {"billing": {"status": "ok", "users_failing": 0, "users_failing_repeatedly": 0}}}


def test_pipelined_requests_are_answered_in_order(daemon, user):
    auth = f"Authorization: Bearer {user.key}\r\nContent-Type: application/json\r\n"
    body = b'{"name": "pipelined"}'
    batch = (f"POST /v1/api-keys HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {len(body)}\r\n\r\n").encode() + body
    batch += f"GET /v1/me HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode()
    batch += b"POST /v1/signup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1\r\n\r\n{"
    batch += b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(batch)
        statuses = [r.status for r in read_responses(sock, 4)]
    assert statuses == [201, 200, 400, 200]


def read_responses(sock, n):
    """Reads n responses from one socket through one buffered reader (a
    reader per response would lose what the first one buffered ahead)."""
    reader = sock.makefile("rb")

    class Shared:  # hands every HTTPResponse the same reader, never closed by it
        def makefile(self, *args, **kw):
            return self

        def __getattr__(self, name):
            return getattr(reader, name)

        def close(self):
            pass

    out = []
    for _ in range(n):
        r = http.client.HTTPResponse(Shared())
        r.begin()
        r.body = r.read()
        out.append(r)
    reader.close()
    return out


# ---------------------------------------------------------------- connection limits

def open_served_connection(d, deadline_s=10):
    """A connection that got a reply and stays open. Retries while the
    daemon has yet to notice that an earlier client connection (the
    harness's /readyz poll) closed and still counts it against the limit."""
    deadline = time.monotonic() + deadline_s
    while True:
        c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=10)
        try:
            c.request("GET", "/healthz")
            assert c.getresponse().read()
            return c
        except (ConnectionError, http.client.RemoteDisconnected):
            c.close()
            assert time.monotonic() < deadline, "no connection slot came free"
            time.sleep(0.02)


def test_connections_per_client_count_those_waiting_for_headers(new_daemon):
    """At its cap an address still gets a new connection: its longest-idle
    one (waiting for a next request's headers) makes room, so clients behind
    one NAT address are not refused while the others only wait."""
    d = new_daemon(options={"max_connections_per_client": "2"})
    first = open_served_connection(d)
    first.sock.settimeout(0.2)
    # Each new connection is answered though the cap is two; a connection
    # counts as waiting once its last reply is done, a moment after the
    # client reads it, so keep opening until the first one makes room.
    held = []
    while True:
        assert len(held) < 50, "the longest-idle connection was never closed to make room"
        held.append(open_served_connection(d))
        try:
            if first.sock.recv(1) == b"":
                break
        except TimeoutError:
            pass
    for c in held[-2:]:
        c.request("GET", "/healthz")
        assert c.getresponse().read()
    for c in held:
        c.close()


def test_idle_connections_time_out(new_daemon):
    d = new_daemon(options={"connection_timeout_s": 1})
    with socket.create_connection(("127.0.0.1", d.port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        r = http.client.HTTPResponse(sock)
        r.begin()
        assert r.status == 200 and r.read()
        started = time.monotonic()
        assert sock.recv(1) == b"", "the server sent more than its reply"
        # Closed by the server's idle timeout, well before the client's 30 s.
        assert time.monotonic() - started < 20
    with socket.create_connection(("127.0.0.1", d.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/signup HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        data = b""
        while True:  # a client that stops half-way through its body is cut off
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    assert not data.startswith(b"HTTP/1.1 2")


def test_ipv6_loopback(new_daemon):
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    d = new_daemon(listen="[::1]:0")
    assert d.base_url.startswith("http://[::1]:")
    assert d.get("/healthz").status_code == 200
