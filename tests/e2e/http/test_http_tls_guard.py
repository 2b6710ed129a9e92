"""The request guard over TLS: every shape it refuses on plain HTTP (a
repeated Host, Authorization, Content-Type, Idempotency-Key or Origin, a
flood of empty lines before the request line, a Content-Length that is not
one number, a raw NUL, a bad chunk, too many fields or parameters, a
malformed line, an unsupported version or coding) is refused the same way
over HTTPS, sent through an ssl-wrapped raw socket: the same JSON error, a
Date and a request id of its own, and the end of the connection (a TLS
close_notify). Normal HTTPS traffic still works: keep-alive, pipelined
requests (the ones before a refused request answered first), chunked bodies
with extensions and trailers, a body spread over many TLS records
followed by another request on the same connection, and the web
terminal's WebSocket (the guard reads nothing after the upgrade). The node
agent, on the same HTTP layer, refuses them over TLS too. Only TLS 1.2 and
1.3 with AEAD ciphers and forward secrecy are spoken, in the server's order,
and a client's renegotiation is refused with an alert."""
import http.client
import json
import re
import socket
import ssl
import subprocess
import threading
import warnings

import pytest
import websocket

from agent_util import Agent, Fleet
from harness import stop_all
from instances_util import DEADLINE, SIM_DELAYS, Cloud
from ops_util import TlsDaemon, make_ca, make_cert

CLOSE = b"Connection: close\r\n"
HOST = b"Host: x\r\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A throwaway CA, a server certificate it signed for 127.0.0.1, and
    the client context that trusts it: (CA file, key, cert, context)."""
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory, "ca")
    key, cert = make_cert(directory, "server", ca)
    return ca[1], key, cert, ssl.create_default_context(cafile=ca[1])


@pytest.fixture(scope="module")
def tls(tmp_path_factory, pki):
    """A daemon serving HTTPS; d.context trusts its certificate."""
    ca, key, cert, context = pki
    d = TlsDaemon(tmp_path_factory.mktemp("tls-daemon"), ca=ca, cert=cert, key=key)
    d.context = context
    yield d
    stop_all([d])


def connect(d, context=None):
    """A fresh connection to d, wrapped in TLS when context is given."""
    plain = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    return context.wrap_socket(plain, server_hostname="127.0.0.1") if context else plain


def read_reply(sock, buffered=b""):
    """One reply from sock (after the bytes already read, buffered): (status,
    headers, body, the bytes read past it)."""
    data = buffered
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection ended before a whole reply: {data[:300]!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection ended inside a reply's body"
        rest += chunk
    return status, headers, rest[:length], rest[length:]


def ended(sock, leftover=b""):
    """Whether the server ended the connection after what was read: nothing
    more comes but the end (over TLS its close_notify)."""
    if leftover:
        return False
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, ssl.SSLEOFError):
        return True
    except socket.timeout:
        return False


def refusal(d, data, context=None):
    """Sends data on a fresh connection; (status, error, headers, closed) of
    the one reply, asserting it is the API's JSON error."""
    with connect(d, context) as sock:
        sock.sendall(data)
        status, headers, body, leftover = read_reply(sock)
        closed = ended(sock, leftover)
    assert headers["content-type"] == "application/json", (headers, body[:300])
    assert headers["x-request-id"].startswith("req_"), headers
    assert re.fullmatch(r"(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT", headers["date"]), headers
    return status, json.loads(body)["error"], closed


def refused_unread(d):
    metrics = d.get("/metrics", key=d.admin_key).text
    [line] = [x for x in metrics.splitlines() if x.startswith("gpurent_http_requests_refused_unread_total ")]
    return int(line.split()[1])


def get(path=b"/healthz", extra=b""):
    return b"GET " + path + b" HTTP/1.1\r\n" + HOST + extra + b"\r\n"


# (request bytes, status, code): each is refused by the guard before
# libmicrohttpd reads it, which over TLS let the first ones through (the
# library read the first of two fields, a proxy in front may read the other).
REFUSED = {
    "repeated Host": (b"GET /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400, "bad_request"),
    "repeated Authorization": (get(extra=b"Authorization: Bearer a\r\nAuthorization: Bearer b\r\n"), 400,
                               "bad_request"),
    "repeated Content-Type": (get(extra=b"Content-Type: application/json\r\nContent-Type: text/plain\r\n"), 400,
                              "bad_request"),
    "repeated Idempotency-Key": (get(extra=b"Idempotency-Key: a\r\nIdempotency-Key: b\r\n"), 400, "bad_request"),
    "repeated Origin": (get(extra=b"Origin: http://a.test\r\nOrigin: http://b.test\r\n"), 400, "bad_request"),
    "17 empty lines first": (b"\r\n" * 17 + get(), 400, "bad_request"),
    "Content-Length not a number": (get(extra=b"Content-Length: abc\r\n"), 400, "bad_request"),
    "Content-Length two numbers": (b"POST /v1/login HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
                                   b"Content-Length: 2\r\n\r\nab", 400, "bad_request"),
    "Content-Length with a sign": (get(extra=b"Content-Length: +1\r\n") + b"x", 400, "bad_request"),
    "Content-Length far too large": (get(extra=b"Content-Length: 99999999999999999999\r\n"), 413, "body_too_large"),
    "raw NUL in the target": (b"GET /v1/me\x00admin HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad_request"),
    "raw NUL in a header": (get(extra=b"X-Note: a\x00b\r\n"), 400, "bad_request"),
    "malformed chunk size": (b"POST /v1/login HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                             b"zz\r\n{}\r\n0\r\n\r\n", 400, "bad_request"),
    "chunk longer than its size": (b"POST /v1/login HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                   b"1\r\n{}\r\n0\r\n\r\n", 400, "bad_request"),
    "101 header fields": (get(extra=b"".join(b"X-F%d: b\r\n" % i for i in range(101))), 431, "headers_too_large"),
    "101 query parameters": (get(b"/healthz?" + b"&".join(b"p%d=1" % i for i in range(101))), 414,
                             "uri_too_long"),
    "request line past 32 KiB": (get(b"/healthz?x=" + b"a" * 40000), 414, "uri_too_long"),
    "not a request line": (b"GARBAGE\r\n\r\n", 400, "bad_request"),
    "space in the target": (b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad_request"),
    "header without a colon": (get(extra=b"NoColonHere\r\n"), 400, "bad_request"),
    "folded header": (get(extra=b"X-A: 1\r\n folded\r\n"), 400, "bad_request"),
    "bare CR": (b"GET / HTTP/1.1\rHost: x\r\n\r\n", 400, "bad_request"),
    "Host with user information": (b"GET /healthz HTTP/1.1\r\nHost: u@a\r\n\r\n", 400, "bad_request"),
    "HTTP/1.1 without Host": (b"GET /healthz HTTP/1.1\r\n\r\n", 400, "bad_request"),
    "HTTP/9.9": (b"GET / HTTP/9.9\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"),
    "gzip coding": (b"POST /v1/login HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501,
                    "not_implemented"),
    "Content-Length and Transfer-Encoding": (b"POST /v1/login HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                                             b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "bad_request"),
}


@pytest.mark.parametrize("shape", list(REFUSED))
def test_the_guard_refuses_over_tls_as_over_plain_http(daemon, tls, shape):
    data, status, code = REFUSED[shape]
    before = refused_unread(tls)
    plain = refusal(daemon, data)
    over_tls = refusal(tls, data, tls.context)
    assert over_tls[0] == status and over_tls[1]["code"] == code, over_tls
    assert over_tls == plain, (over_tls, plain)
    assert over_tls[2], "the connection must end after the refusal"
    # The guard answered, before the library read the request.
    assert refused_unread(tls) == before + 1


def test_a_repeated_host_changes_nothing_over_tls(tls):
    """The second Authorization of a write was read by nobody here, but by
    whatever sat in front: nothing is made."""
    u = tls.signup()
    names = lambda: sorted(k["name"] for k in tls.get("/v1/api-keys", key=u.key).json()["data"])  # noqa: E731
    before = names()
    body = b'{"name": "twice"}'
    status, err, closed = refusal(tls, b"POST /v1/api-keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                                  u.key.encode() + b"\r\nAuthorization: Bearer gpk_other\r\n"
                                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
                                  tls.context)
    assert (status, err["code"], closed) == (400, "bad_request", True), err
    assert "authorization" in err["message"], err
    assert names() == before


# ---------------------------------------------------------------- what still works over TLS

def handshake(d, pki, lowest, highest, ciphers=None):
    """(protocol, cipher) of a TLS handshake with d offering only lowest
    to highest (and ciphers), or None when d refuses it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(pki[0])
    with warnings.catch_warnings():  # Python calls TLS 1.0 and 1.1 deprecated: what is asked here
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version, context.maximum_version = lowest, highest
    if ciphers:
        context.set_ciphers(ciphers)  # SECLEVEL=0: the client would offer what is old
    try:
        with connect(d, context) as s:
            return s.version(), s.cipher()[0]
    except (ssl.SSLError, ConnectionResetError):
        return None


def test_only_tls_1_2_and_1_3_with_aead_ciphers_are_spoken(tls, pki):
    """GnuTLS's NORMAL priorities, libmicrohttpd's default, offered TLS 1.0
    and 1.1 and CBC ciphers with SHA-1 MACs, which TLS scanners fail."""
    v = ssl.TLSVersion
    for old in (v.TLSv1, v.TLSv1_1):
        assert handshake(tls, pki, old, old, "ALL:@SECLEVEL=0") is None, old
    assert handshake(tls, pki, v.TLSv1_2, v.TLSv1_2, "ECDHE+AES+SHA1:ECDHE+AES+SHA256:ECDHE+AES+SHA384:-AESGCM:"
                     "-AESCCM:@SECLEVEL=0") is None
    assert handshake(tls, pki, v.TLSv1_2, v.TLSv1_2, "kRSA:@SECLEVEL=0") is None  # no forward secrecy
    version, cipher = handshake(tls, pki, v.TLSv1_2, v.TLSv1_2)
    assert version == "TLSv1.2" and ("GCM" in cipher or "CHACHA20" in cipher), cipher
    assert handshake(tls, pki, v.TLSv1_3, v.TLSv1_3)[0] == "TLSv1.3"


def test_a_client_asking_to_renegotiate_is_told_no(tls, pki):
    """A TLS 1.2 client may ask for a new handshake at any time, which costs
    the server one each time (a denial of service TLS scanners flag). The
    server answers the no_renegotiation alert, and OpenSSL's client fails
    on it; before, the connection was closed without a word, which the
    client could not tell from a renegotiation that went through."""
    p = subprocess.run(["openssl", "s_client", "-tls1_2", "-CAfile", pki[0], "-connect", f"127.0.0.1:{tls.port}"],
                       input=b"R\n", capture_output=True, timeout=30)  # R: s_client's renegotiate command
    out = (p.stdout + p.stderr).decode(errors="replace")
    assert "RENEGOTIATING" in out and "no renegotiation" in out and p.returncode == 1, out
    # The server goes on serving.
    assert handshake(tls, pki, ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_2)[0] == "TLSv1.2"


def test_keep_alive_over_tls(tls):
    u = tls.signup()
    conn = http.client.HTTPSConnection("127.0.0.1", tls.port, context=tls.context, timeout=10)
    try:
        conn.request("GET", "/healthz")
        r = conn.getresponse()
        assert r.status == 200, r.read()
        assert r.getheader("Strict-Transport-Security") == "max-age=31536000"  # HSTS, over TLS only
        r.read()
        sock = conn.sock
        for _ in range(5):
            conn.request("GET", "/v1/me", headers={"Authorization": f"Bearer {u.key}"})
            r = conn.getresponse()
            assert r.status == 200 and json.loads(r.read())["id"] == u.id
            assert conn.sock is sock, "a new connection was opened"
    finally:
        conn.close()


def test_pipelined_requests_over_tls_are_answered_in_order(tls):
    u = tls.signup()
    auth = b"Authorization: Bearer " + u.key.encode() + b"\r\n"
    with connect(tls, tls.context) as sock:
        sock.sendall(get() + get(b"/v1/me", auth) + get(b"/nope") + get(b"/v1/me", auth + CLOSE))
        replies, buffered = [], b""
        for _ in range(4):
            status, _, body, buffered = read_reply(sock, buffered)
            replies.append((status, body))
        assert ended(sock, buffered)
    assert [s for s, _ in replies] == [200, 200, 404, 200], replies
    assert json.loads(replies[1][1])["id"] == u.id and json.loads(replies[3][1])["id"] == u.id


def test_a_pipelined_request_after_good_ones_is_refused_alone_over_tls(tls):
    """The requests before the refused one are answered; then the refusal,
    then the end of the connection."""
    with connect(tls, tls.context) as sock:
        sock.sendall(get() + get() + b"GET /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n" + get())
        first, _, _, buffered = read_reply(sock)
        second, _, _, buffered = read_reply(sock, buffered)
        third, headers, body, buffered = read_reply(sock, buffered)
        assert ended(sock, buffered)
    assert (first, second, third) == (200, 200, 400), body
    assert json.loads(body)["error"]["message"] == "the request repeats its host header", body


def test_chunked_bodies_with_extensions_and_trailers_work_over_tls(tls):
    u = tls.signup()
    body = b'{"name": "chunked-tls"}'
    with connect(tls, tls.context) as sock:
        sock.sendall(b"POST /v1/api-keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + u.key.encode() +
                     b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
                     b"5;part=1\r\n" + body[:5] + b"\r\n" + b"%x\r\n" % (len(body) - 5) + body[5:] +
                     b"\r\n0\r\nX-Checksum: none\r\n\r\n" + get(b"/healthz", CLOSE))
        status, _, reply, buffered = read_reply(sock)
        assert status == 201, reply
        status, _, _, buffered = read_reply(sock, buffered)
        assert status == 200
    assert "chunked-tls" in [k["name"] for k in tls.get("/v1/api-keys", key=u.key).json()["data"]]


def test_a_body_over_many_tls_records_then_another_request(tls):
    """A body of 200 KiB arrives in some thirteen TLS records (16 KiB of
    plaintext each): the guard follows it across them to the next request
    on the connection, which it must not take for part of the body."""
    u = tls.signup()
    body = b'{"name": "long-body"' + b" " * (200 * 1024) + b"}"
    with connect(tls, tls.context) as sock:
        sock.sendall(b"POST /v1/api-keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + u.key.encode() +
                     b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body +
                     get(b"/v1/me", b"Authorization: Bearer " + u.key.encode() + b"\r\n" + CLOSE))
        status, _, reply, buffered = read_reply(sock)
        assert status == 201, reply
        status, _, reply, buffered = read_reply(sock, buffered)
        assert status == 200 and json.loads(reply)["id"] == u.id, reply
        assert ended(sock, buffered)


@pytest.mark.parametrize("shape", ["repeated Host", "17 empty lines first", "Content-Length not a number",
                                   "raw NUL in the target", "malformed chunk size"])
def test_the_agent_refuses_over_tls_too(tmp_path, pki, shape):
    """The agent serves its API on the same HTTP layer, with tls_cert and
    tls_key: the guard answers there before the signature is even looked at."""
    _, key, cert, context = pki
    agent = Agent(tmp_path / "agent", options={"tls_cert": cert, "tls_key": key})
    try:
        data, status, code = REFUSED[shape]
        got, err, closed = refusal(agent, data, context)
        assert (got, err["code"], closed) == (status, code, True), err
    finally:
        agent.stop()


class PlainToTls:
    """A plain-HTTP front for an HTTPS server: the simulated fleet's
    libcurl trusts only the system's CAs, so it registers its nodes through
    this. Each connection is carried both ways by a thread."""

    def __init__(self, port, context):
        self.port, self.context = port, context
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = self.context.wrap_socket(socket.create_connection(("127.0.0.1", self.port)),
                                              server_hostname="127.0.0.1")
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client), daemon=True).start()

    @staticmethod
    def _pipe(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.listener.close()


def test_the_terminal_websocket_works_over_tls(tmp_path, pki):
    """After the upgrade the guard reads nothing: a WebSocket's frames are
    not HTTP. Typed bytes reach the shell and its output comes back over
    wss://, and the shell's exit closes the terminal with 1000."""
    ca, key, cert, context = pki
    c = Cloud(lambda options: TlsDaemon(tmp_path / "d", ca=ca, cert=cert, key=key, options=options), tmp_path)
    front = PlainToTls(c.d.port, context)
    try:
        f = Fleet(tmp_path / "fleet", front.url, nodes=1, admin_key=c.d.admin_key,
                  extra=("--fabric", "fabric-a", "--name-prefix", "tls-ws-"),
                  options={**SIM_DELAYS, "mount_root": str(c.network_store)})
        c.fleets.append(f)
        c.wait_nodes_up(list(f.nodes))
        u = c.user()
        inst = c.create(u, card_count=8)
        c.wait_state(u, inst["id"], "running")
        r = c.d.post(f"/v1/instances/{inst['id']}/terminal-tokens", key=u.key, json={"rank": 0})
        assert r.status_code == 201, r.text
        ws = websocket.create_connection(f"wss://127.0.0.1:{c.d.port}{r.json()['url']}", timeout=DEADLINE,
                                         sslopt={"ca_certs": ca})
        ws.send_binary(b"echo over-tls-$((6 * 7))\n")
        screen = b""
        while b"over-tls-42" not in screen:  # the output, not the echo of the typing
            op, data = ws.recv_data(control_frame=True)
            assert op == websocket.ABNF.OPCODE_BINARY, (op, data, screen)
            screen += data
        ws.send_binary(b"exit 3\n")
        while True:
            op, data = ws.recv_data(control_frame=True)
            if op == websocket.ABNF.OPCODE_CLOSE:
                assert data[:2] == b"\x03\xe8" and data[2:] == b"exit 3", data
                break
        ws.close()
    finally:
        c.close()
        front.close()
        stop_all([c.d])
