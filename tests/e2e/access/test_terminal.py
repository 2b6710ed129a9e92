"""test_terminal.py: the web terminal end to end with a real WebSocket client
(Debian's python3-websocket) against a real daemon and a sim fleet: a token
from POST /v1/instances/{id}/terminal-tokens opens the WebSocket, typed bytes
reach the workload's shell and its output comes back, a resize reaches the
PTY (`stty size`), `exit 3` closes with 1000 "exit 3"; the token is single
use, expires on the testing clock, is bound to its instance, user and rank,
and dies with the API key that asked for it, as does the terminal it opened;
bad bodies are 400s, another user's instance 404, a stopped one 409; a
cross-site Origin is 403, a rebound DNS name too, and a console on a name
opens when public_url or cors_origins names its origin; ping is answered, a client that pings and reads
nothing is read no more, an oversize message closes with
1009 and each malformed frame with 1002 (1007 for text not in UTF-8), and a close the browser cannot take
(it reads nothing while `yes` floods it) drops it within the grace, freeing its slot; more terminals than
HTTP pool threads stay open while /healthz answers (none holds a thread); the daemon stops
cleanly on SIGTERM with terminals open. The agent's terminal route: signed
only, unknown workload 404."""
import json
import re
import secrets
import socket
import struct
import time

import pytest
import requests
import websocket

from agent_util import poll, sign
from harness import assert_error, kernel_buffer_max
from instances_util import DEADLINE, cloud, cloud_with  # noqa: F401  (fixtures)

IMAGE = "rocm/pytorch:2.3-rocm6.2"
cloud_small_pool = cloud_with(threads="2", max_terminals_per_user="100")
cloud_two_terminals = cloud_with(max_terminals="2", max_terminals_per_user="1")
cloud_console_named = cloud_with(public_url="https://console.test/", cors_origins="https://app.example")
cloud_fast_ping = cloud_with(terminal_ping_s="1", max_terminals_per_user="1")


def running(c, cards=8, nodes=1, user=None):
    if not c.fleets:
        c.fleet(nodes)
    u = user or c.user()
    inst = c.create(u, card_count=cards, image=IMAGE)
    c.wait_state(u, inst["id"], "running")
    return u, inst


def token(c, u, inst_id, rank=0, expect=201):
    r = c.d.post(f"/v1/instances/{inst_id}/terminal-tokens", key=u.key, json={"rank": rank})
    assert r.status_code == expect, r.text
    return r.json()


def ws_url(c, path):
    return "ws://" + c.d.base_url[len("http://"):] + path


def connect(c, tok, **kw):
    ws = websocket.create_connection(ws_url(c, tok["url"]), timeout=DEADLINE, **kw)
    return ws


class Screen:
    """What a terminal printed, read until a pattern shows."""

    def __init__(self, ws):
        self.ws = ws
        self.text = ""
        self.close = None  # (code, reason) once the server closed

    def read_until(self, pattern, timeout=DEADLINE):
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.text):
            if self.close is not None or time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not seen; screen:\n{self.text[-2000:]}\nclose: {self.close}")
            self.ws.settimeout(max(0.1, deadline - time.monotonic()))
            op, data = self.ws.recv_data(control_frame=True)
            if op == websocket.ABNF.OPCODE_BINARY:
                self.text += data.decode("utf-8", "replace")
            elif op == websocket.ABNF.OPCODE_CLOSE:
                self.close = (struct.unpack("!H", data[:2])[0] if len(data) >= 2 else None,
                              data[2:].decode("utf-8", "replace"))
        return re.search(pattern, self.text)

    def wait_close(self, timeout=DEADLINE):
        deadline = time.monotonic() + timeout
        while self.close is None:
            assert time.monotonic() < deadline, f"no close; screen:\n{self.text[-2000:]}"
            self.ws.settimeout(max(0.1, deadline - time.monotonic()))
            op, data = self.ws.recv_data(control_frame=True)
            if op == websocket.ABNF.OPCODE_BINARY:
                self.text += data.decode("utf-8", "replace")
            elif op == websocket.ABNF.OPCODE_CLOSE:
                self.close = (struct.unpack("!H", data[:2])[0] if len(data) >= 2 else None,
                              data[2:].decode("utf-8", "replace"))
        return self.close


def type_(ws, text):
    ws.send_binary(text.encode())


def test_echo_resize_and_exit_status(cloud):
    c = cloud
    u, inst = running(c)
    tok = token(c, u, inst["id"])
    assert tok["rank"] == 0 and tok["url"] == f"/v1/instances/{inst['id']}/terminal?token={tok['token']}", tok
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", tok["expires_at"]), tok
    ws = connect(c, tok)
    s = Screen(ws)
    word = f"hello-{secrets.randbelow(10**9)}"
    type_(ws, f"echo {word}\n")
    s.read_until(re.escape(word) + r"\r?\n")  # the output, not only the echo of the typing
    ws.send(json.dumps({"type": "resize", "cols": 123, "rows": 45}))
    type_(ws, "stty size\n")
    s.read_until(r"45 123")
    ws.ping(b"are-you-there")
    ws.settimeout(DEADLINE)
    while True:
        op, data = ws.recv_data(control_frame=True)
        if op == websocket.ABNF.OPCODE_PONG:
            assert data == b"are-you-there"
            break
    type_(ws, "exit 3\n")
    assert s.wait_close() == (1000, "exit 3")
    ws.close()


def test_token_single_use_and_bound(cloud):
    c = cloud
    u, inst = running(c)
    tok = token(c, u, inst["id"])
    ws = connect(c, tok)
    type_(ws, "exit 0\n")
    assert Screen(ws).wait_close() == (1000, "exit 0")
    ws.close()
    # Used: refused before the upgrade.
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        connect(c, tok)
    assert e.value.status_code == 401
    # Another rank than issued for.
    tok = token(c, u, inst["id"])
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        connect(c, {"url": tok["url"] + "&rank=1"})
    assert e.value.status_code == 403
    # Another instance's path with this instance's token.
    tok = token(c, u, inst["id"])
    other = tok["url"].replace(inst["id"], "ins_" + "0" * 20)
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        connect(c, {"url": other})
    assert e.value.status_code == 403
    # A made-up token.
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        connect(c, {"url": f"/v1/instances/{inst['id']}/terminal?token=trm_" + "a" * 64})
    assert e.value.status_code == 401
    # No token at all.
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        connect(c, {"url": f"/v1/instances/{inst['id']}/terminal"})
    assert e.value.status_code == 401


def test_token_expires_on_the_clock(cloud):
    c = cloud
    u, inst = running(c)
    tok = token(c, u, inst["id"])
    c.d.advance_clock(61)  # terminal_token_ttl_s is 60 by default
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        connect(c, tok)
    assert e.value.status_code == 401


def test_a_token_dies_with_the_key_that_asked_for_it(cloud):
    """A token is a minute of its API key's authority: one asked for with a
    key revoked since (a leaked key, a logout, a password change) opened a
    terminal anyway, as the token was bound to the user alone. Now it is
    401, and a token of another key of the same user still opens."""
    c = cloud
    u, inst = running(c)
    r = c.d.post("/v1/api-keys", key=u.key, json={"name": "leaked"})
    assert r.status_code == 201, r.text
    leaked = r.json()
    tok = token(c, type("K", (), {"key": leaked["token"]}), inst["id"])
    kept = token(c, u, inst["id"])
    r = c.d.delete(f"/v1/api-keys/{leaked['id']}", key=u.key)
    assert r.status_code == 200, r.text
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        connect(c, tok)
    assert e.value.status_code == 401
    ws = connect(c, kept)
    type_(ws, "exit 0\n")
    assert Screen(ws).wait_close() == (1000, "exit 0")
    ws.close()


def test_an_open_terminal_ends_with_the_key_that_opened_it(cloud):
    """An open terminal outlived the revocation of the key whose token opened
    it: a leaked key revoked left its shells running. Now each closes with
    1008 as its key is revoked, the shell hung up at the node, and a terminal
    opened through another key of the same user goes on."""
    c = cloud
    u, inst = running(c)
    r = c.d.post("/v1/api-keys", key=u.key, json={"name": "leaked"})
    assert r.status_code == 201, r.text
    leaked = r.json()
    doomed = connect(c, token(c, type("K", (), {"key": leaked["token"]}), inst["id"]))
    kept = connect(c, token(c, u, inst["id"]))
    doomed_screen, kept_screen = Screen(doomed), Screen(kept)
    type_(doomed, "echo before-$((6*7))\n")
    doomed_screen.read_until(r"before-42")
    r = c.d.delete(f"/v1/api-keys/{leaked['id']}", key=u.key)
    assert r.status_code == 200, r.text
    assert doomed_screen.wait_close() == (1008, "the API key that opened this terminal is revoked or expired")
    doomed.close()
    type_(kept, "echo still-$((6*7))\n")
    kept_screen.read_until(r"still-42")
    type_(kept, "exit 0\n")
    assert kept_screen.wait_close() == (1000, "exit 0")
    kept.close()


def test_bad_bodies_other_users_and_stopped(cloud):
    c = cloud
    u, inst = running(c)
    path = f"/v1/instances/{inst['id']}/terminal-tokens"
    for body, code in [("{", "malformed_json"), ('{"rank": "0"}', "invalid_field"), ("{}", "missing_field"),
                       ('{"rank": 0, "shell": "/bin/zsh"}', "unknown_field"), ('{"rank": 1}', "invalid_field"),
                       ('{"rank": -1}', "invalid_field"), ('{"rank": 99999999999}', "invalid_field"),
                       ('[0]', "not_an_object"), ('{"rank": 0.5}', "invalid_field")]:
        r = c.d.post(path, key=u.key, data=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["code"] == code, (body, r.text)
    r = c.d.post(path, key=u.key, data='{"rank": 0, "pad": "' + "x" * (2 << 20) + '"}',
                 headers={"Content-Type": "application/json"})
    assert r.status_code == 413, r.text
    r = c.d.post(path, json={"rank": 0})
    assert r.status_code == 401, r.text
    other = c.user()
    assert_error(c.d.post(path, key=other.key, json={"rank": 0}), 404, "not_found")
    assert_error(c.d.post("/v1/instances/ins_nope/terminal-tokens", key=u.key, json={"rank": 0}), 404, "not_found")
    # A token of u's is no use for another user either (the instance is u's).
    tok = token(c, u, inst["id"])
    r = c.d.post(f"/v1/instances/{inst['id']}/stop", key=u.key)
    assert r.status_code in (200, 202), r.text
    c.wait_state(u, inst["id"], "stopped")
    r = c.d.post(path, key=u.key, json={"rank": 0})
    assert r.status_code == 409 and r.json()["error"]["code"] == "invalid_state", r.text
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        connect(c, tok)
    assert e.value.status_code == 409


def test_cross_site_origin_and_bad_handshakes(cloud):
    c = cloud
    u, inst = running(c)
    tok = token(c, u, inst["id"])
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        connect(c, tok, origin="https://evil.example")
    assert e.value.status_code == 403
    # A page on a name the attacker's DNS points at this server (rebinding):
    # its origin matches the Host it sends, and it is still another site.
    hostport = c.d.base_url[len("http://"):]
    port = hostport.rsplit(":", 1)[1]
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        connect(c, tok, origin=f"http://rebind.example:{port}", host=f"rebind.example:{port}")
    assert e.value.status_code == 403
    # The token was not spent by the refusals: the server's own page, by
    # address or as localhost, opens it.
    opens(c, tok, origin=c.d.base_url)
    opens(c, token(c, u, inst["id"]), origin=f"http://localhost:{port}", host=f"localhost:{port}")
    # Not a WebSocket request at all: 400, whatever the token.
    r = requests.get(c.d.url(tok["url"]), timeout=DEADLINE)
    assert r.status_code == 400, r.text
    r = requests.head(c.d.url(tok["url"]), timeout=DEADLINE)
    assert r.status_code == 400
    r = requests.options(c.d.url(tok["url"]), timeout=DEADLINE)
    assert r.status_code == 204 and "GET" in r.headers["Allow"], r.headers
    r = requests.get(c.d.url(tok["url"] + "&frob=1"), timeout=DEADLINE)
    assert r.status_code == 400, r.text


def client_frame(opcode, payload, fin=True):
    """A masked frame as a client sends it, the length in its shortest form."""
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    head += bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack("!H", n)
    mask = secrets.token_bytes(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


MALFORMED = [
    (bytes([0x80 | 0x40 | 0x2, 3]) + b"abc", (1002, "")),  # a reserved bit, no mask
    (client_frame(0x3, b"abc"), (1002, "")),  # an opcode RFC 6455 reserves
    (client_frame(0x0, b"abc"), (1002, "")),  # a continuation of nothing
    (client_frame(0x1, b"\xff\xfe"), (1007, "")),  # text that is not UTF-8
    (client_frame(0x8, struct.pack("!H", 1005)), (1002, "")),  # a close code no one may send
    (client_frame(0x9, b"x" * 126), (1002, "a control frame over 125 bytes")),
    (client_frame(0x9, b"x", fin=False), (1002, "a fragmented control frame")),
    (client_frame(0x8, b"\x03"), (1002, "a close frame with half a status code")),
    (bytes([0x82, 0x80 | 126]) + struct.pack("!H", 3) + b"\0\0\0\0abc", (1002, "a length not in its shortest form")),
    (bytes([0x82, 0x80 | 127]) + struct.pack("!Q", 1 << 63) + b"\0\0\0\0", (1002, "a length with its top bit set")),
]


def opens(c, tok, **kw):
    ws = connect(c, tok, **kw)
    type_(ws, "exit 0\n")
    assert Screen(ws).wait_close() == (1000, "exit 0")
    ws.close()


def test_the_console_on_a_name_is_named_in_the_configuration(cloud_console_named):
    c = cloud_console_named
    u, inst = running(c)
    port = c.d.base_url.rsplit(":", 1)[1]
    # public_url's origin (its default port and path dropped, as a browser
    # writes an Origin) and a listed console origin open; a name that only
    # matches Host does not.
    opens(c, token(c, u, inst["id"]), origin="https://console.test", host="console.test")
    opens(c, token(c, u, inst["id"]), origin="https://app.example")
    tok = token(c, u, inst["id"])
    for origin, host in ((f"http://console.test:{port}", f"console.test:{port}"),
                         ("https://app.example.evil", None), ("null", None)):
        with pytest.raises(websocket.WebSocketBadStatusException) as e:
            connect(c, tok, origin=origin, **({"host": host} if host else {}))
        assert e.value.status_code == 403, origin
    opens(c, tok, origin=c.d.base_url)


def test_oversize_and_malformed_frames(cloud):
    c = cloud
    u, inst = running(c)
    ws = connect(c, token(c, u, inst["id"]))
    ws.send_binary(b"x" * (65536 + 1))
    assert Screen(ws).wait_close()[0] == 1009
    ws.close()
    # Each frame RFC 6455 forbids from a client closes with its status code
    # (and, for those found before wslay reads them, the reason).
    for data, close in MALFORMED:
        ws = connect(c, token(c, u, inst["id"]))
        ws.sock.sendall(data)
        assert Screen(ws).wait_close() == close, data[:16]
        ws.close()
    ws = connect(c, token(c, u, inst["id"]))
    ws.send(json.dumps({"type": "resize", "cols": 0, "rows": 10}))
    assert Screen(ws).wait_close()[0] == 1003
    ws.close()


def test_a_browser_that_pings_and_reads_nothing_is_read_no_more(cloud):
    """wslay answers every ping with a pong queued in memory: a client that
    sent pings and read nothing grew the daemon by 1.7 GB in 15 s, from one
    terminal. The browser is now read only while what waits for it is
    bounded (in bytes, and in messages, as an empty ping's pong adds none),
    so the flood stops in the kernel's buffers; the daemon serves on."""
    c = cloud
    u, inst = running(c)
    limit = 2 * kernel_buffer_max() + (8 << 20)
    for payload in (b"p" * 125, b""):
        ws = connect(c, token(c, u, inst["id"]), sockopt=((socket.SOL_SOCKET, socket.SO_RCVBUF, 4096),))
        burst = client_frame(0x9, payload) * 1000
        sent = 0
        ws.sock.settimeout(5)  # no progress for that long: the daemon reads no more
        try:
            while sent < limit:
                ws.sock.sendall(burst)
                sent += len(burst)
        except socket.timeout:
            pass
        assert sent < limit, f"{sent} bytes of pings ({len(payload)} bytes each) taken from a client that reads nothing"
        ws.sock.close()
    assert requests.get(c.d.url("/healthz"), timeout=DEADLINE).status_code == 200
    ws = connect(c, token(c, u, inst["id"]))
    type_(ws, "echo alive-$((6*7))\n")
    Screen(ws).read_until(r"alive-42")
    ws.close()


def test_more_terminals_than_pool_threads(cloud_small_pool):
    c = cloud_small_pool
    u, inst = running(c)
    socks = []
    for _ in range(6):  # three times the pool
        ws = connect(c, token(c, u, inst["id"]))
        socks.append((ws, Screen(ws)))
    r = requests.get(c.d.url("/healthz"), timeout=10)
    assert r.status_code == 200, r.text
    r = c.d.get("/metrics", key=c.d.admin_key)
    assert re.search(r"^gpurent_terminals_open 6$", r.text, re.M), r.text
    for i, (ws, s) in enumerate(socks):
        type_(ws, f"echo term-{i}-$((6*7))\n")
        s.read_until(f"term-{i}-42")
    # SIGTERM with the terminals open: a clean exit, no sanitizer report.
    fleets = list(c.fleets)
    c.d.stop()
    for ws, s in socks:
        code, _ = s.wait_close()
        assert code == 1001
        ws.close()
    assert fleets


def test_terminal_limits(cloud_two_terminals):
    c = cloud_two_terminals
    c.fleet(3)
    u, inst = running(c)
    ws1 = connect(c, token(c, u, inst["id"]))
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        connect(c, token(c, u, inst["id"]))
    assert e.value.status_code == 429
    v, inst2 = running(c)
    ws2 = connect(c, token(c, v, inst2["id"]))
    w, inst3 = running(c)
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        connect(c, token(c, w, inst3["id"]))
    assert e.value.status_code == 503
    for ws in (ws1, ws2):
        type_(ws, "exit 0\n")
        assert Screen(ws).wait_close() == (1000, "exit 0")
        ws.close()
    # Closed terminals give their slots back.
    poll(lambda: _opens(c, w, inst3["id"]), DEADLINE, "a terminal slot free again")


def test_a_silent_browser_is_pinged_and_one_that_never_answers_is_let_go(cloud_fast_ping):
    """An idle terminal sent nothing, so a reverse proxy's read timeout
    (nginx's 60 s in OPERATIONS.md's example) cut it, and a browser whose
    network dropped without a FIN held its terminal and a slot of
    max_terminals_per_user for ever. A silent browser is now pinged every
    terminal_ping_s; one that answers stays, one silent three times that
    long is let go and its slot freed."""
    c = cloud_fast_ping
    u, inst = running(c)
    ws = connect(c, token(c, u, inst["id"]))
    # websocket-client answers each ping as it reads it: four pings span
    # more than the three seconds a silent browser is given.
    ws.settimeout(DEADLINE)
    pings = 0
    while pings < 4:
        op, _ = ws.recv_data(control_frame=True)
        pings += op == websocket.ABNF.OPCODE_PING
    type_(ws, "echo still-here-$((6*7))\n")
    Screen(ws).read_until(r"still-here-42")
    type_(ws, "exit 0\n")
    ws.close()
    poll(lambda: _opens(c, u, inst["id"]), DEADLINE, "the first terminal's slot free again")
    # A browser that reads nothing and answers nothing: the pings pile up
    # unread, and then the daemon lets the connection go.
    ws = connect(c, token(c, u, inst["id"]))
    ws.sock.settimeout(DEADLINE)
    while ws.sock.recv(65536):
        pass
    assert "the browser answered no ping" in c.d.stderr_text()
    ws.close()
    poll(lambda: _opens(c, u, inst["id"]), DEADLINE, "the silent terminal's slot free again")


def _unsent(server_port, client_port):
    """Bytes the daemon's end of a loopback connection holds that the
    client has not taken (tx_queue in /proc/net/tcp), None if not found."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                cols = row.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == server_port and \
                        int(cols[2].rsplit(":", 1)[1], 16) == client_port:
                    return int(cols[4].split(":")[0], 16)
    return None


def _flooded_browser(c, tok):
    """A terminal running `yes` whose browser reads nothing, once the
    daemon's kernel buffer for the browser is full: what it holds unsent
    has not moved over five looks half a second apart (the kernel takes a
    little more while its window probes back off). The WebSocket, and a
    function that says what the daemon holds unsent now."""
    ws = connect(c, tok, sockopt=((socket.SOL_SOCKET, socket.SO_RCVBUF, 4096),))
    type_(ws, "yes\n")
    server, client = int(c.d.base_url.rsplit(":", 1)[1]), ws.sock.getsockname()[1]
    seen, deadline = [], time.monotonic() + DEADLINE
    while not (len(seen) >= 5 and seen[-1] and len(set(seen[-5:])) == 1):
        assert time.monotonic() < deadline, f"the daemon's send queue never filled: {seen[-5:]}"
        time.sleep(0.5)
        seen.append(_unsent(server, client))
    return ws, lambda: _unsent(server, client)


def _close_stuck(c, u, inst_id, opened, close, what):
    """Floods a terminal of opened(), has the relay close it (close(ws),
    which returns once the close is queued) and returns the WebSocket when
    that close could not be written: the daemon's unsent bytes stay as they
    were. Whether the kernel takes a close frame behind a full buffer is
    its own affair (the frame in progress may end in a gap, a little room
    may open), so a terminal whose close went is let go and another tried."""
    for _ in range(5):
        ws, unsent = _flooded_browser(c, opened())
        before = unsent()
        close(ws)
        stayed = True
        for look in range(5):
            time.sleep(0.2)
            stayed = stayed and unsent() == before
        if stayed:
            return ws
        ws.sock.close()
        poll(lambda: _opens(c, u, inst_id), DEADLINE, f"the slot of a terminal closed for {what}")
    raise AssertionError(f"the kernel took the close ({what}) every time")


def test_a_close_the_browser_cannot_take_ends_its_terminal_within_the_grace(cloud_two_terminals):
    """Once the relay had queued its own close (the key revoked, a bad
    frame, the shell's exit) it stopped checking whether the browser was
    there, and waited for the close to be written: a browser that read
    nothing while its workload flooded the terminal, its kernel buffers
    full, held the terminal and a slot of max_terminals_per_user for ever.
    A close not sent within TERM_CLOSE_GRACE_MS now drops the connection
    and frees the slot. The same for the close wslay queues by itself on a
    frame it refuses, which the relay did not know of: that terminal was
    let go only once three pings had gone unanswered."""
    c = cloud_two_terminals
    u, inst = running(c)
    revoked = []

    def leaked_token():
        r = c.d.post("/v1/api-keys", key=u.key, json={"name": "leaked"})
        assert r.status_code == 201, r.text
        revoked.append(r.json())
        return token(c, type("K", (), {"key": revoked[-1]["token"]}), inst["id"])

    def revoke(ws):
        assert _opens(c, u, inst["id"]) is None  # the user's one terminal is taken
        closes = c.d.stderr_text().count("closed, the API key that opened this terminal is revoked")
        r = c.d.delete(f"/v1/api-keys/{revoked[-1]['id']}", key=u.key)
        assert r.status_code == 200, r.text
        poll(lambda: c.d.stderr_text().count("closed, the API key that opened this terminal is revoked") > closes,
             DEADLINE, "the relay closing the revoked key's terminal")

    ws = _close_stuck(c, u, inst["id"], leaked_token, revoke, "a revoked key")
    poll(lambda: _opens(c, u, inst["id"]), DEADLINE, "the slot of a terminal whose close could not be sent")
    assert "the close could not be sent in 2000 ms, the browser reads nothing: dropped" in c.d.stderr_text()
    ws.sock.close()
    # A frame wslay refuses (a reserved bit): it closes by itself.
    ws = _close_stuck(c, u, inst["id"], lambda: token(c, u, inst["id"]), lambda w: w.sock.sendall(MALFORMED[0][0]),
                      "a bad frame")
    poll(lambda: _opens(c, u, inst["id"]), DEADLINE, "the slot of a terminal closed for a bad frame")
    ws.sock.close()
    assert requests.get(c.d.url("/healthz"), timeout=DEADLINE).status_code == 200


def test_a_slow_browser_gets_the_end_of_the_output_before_the_exit_status(cloud):
    """A shell that prints a lot and exits leaves its output queued in the
    relay for a browser that reads it slowly. The close saying "exit N" was
    queued at once, and wslay sends a close ahead of the messages queued
    and none after it: the browser got the exit status and lost the last
    few hundred KB of output. The close now waits for the output."""
    c = cloud
    u, inst = running(c)
    # A small receive buffer read at about 1 MB/s: the shell writes faster,
    # so its output waits in the relay when it exits.
    ws = connect(c, token(c, u, inst["id"]), sockopt=((socket.SOL_SOCKET, socket.SO_RCVBUF, 4096),))
    type_(ws, "head -c 4000000 /dev/zero | tr '\\0' x; echo; echo END-OF-OUTPUT; exit 7\n")
    s = Screen(ws)
    ws.settimeout(DEADLINE)
    while s.close is None:
        op, data = ws.recv_data(control_frame=True)
        if op == websocket.ABNF.OPCODE_BINARY:
            s.text = s.text[-100:] + data.decode("utf-8", "replace")
            time.sleep(len(data) / 1_000_000)
        elif op == websocket.ABNF.OPCODE_CLOSE:
            s.close = (struct.unpack("!H", data[:2])[0], data[2:].decode())
    assert "END-OF-OUTPUT" in s.text and s.close == (1000, "exit 7"), (s.text[-200:], s.close)
    ws.close()


def _opens(c, u, inst_id):
    try:
        ws = connect(c, token(c, u, inst_id))
    except websocket.WebSocketBadStatusException:
        return None
    ws.close()
    return True


def test_agent_route_signed_only(cloud):
    c = cloud
    u, inst = running(c)
    (agent_url, secret), = c.d.sql("SELECT agent_url, secret FROM nodes WHERE id = ?", (inst["nodes"][0]["node_id"],))
    (wl,), = c.d.sql("SELECT workload_id FROM instance_nodes WHERE instance_id = ? AND rank = 0", (inst["id"],))
    base_path = agent_url.split("://", 1)[1].partition("/")[2]
    base_path = "/" + base_path.rstrip("/") if base_path else ""
    up = {"Upgrade": "gpurent-terminal", "Connection": "Upgrade"}
    # Unsigned: refused before anything starts.
    r = requests.get(f"{agent_url}/v1/workloads/{wl}/terminal", headers=up, timeout=10)
    assert r.status_code == 401, r.text
    # Signed, for a workload the node does not have: 404.
    path = "/v1/workloads/wl_unknown/terminal"
    r = requests.get(agent_url + path, headers={**up, **sign(secret, "GET", base_path + path)}, timeout=10)
    assert r.status_code == 404, r.text
    # Signed, but the query is not the signed one: refused.
    path = f"/v1/workloads/{wl}/terminal?cols=80&rows=24"
    h = {**up, **sign(secret, "GET", base_path + path)}
    r = requests.get(agent_url + path.replace("cols=80", "cols=81"), headers=h, timeout=10)
    assert r.status_code == 401, r.text
    # Signed without the Upgrade header, or without Connection: Upgrade
    # (RFC 9110 7.8): 400, no shell started.
    r = requests.get(agent_url + path, headers=sign(secret, "GET", base_path + path), timeout=10)
    assert r.status_code == 400, r.text
    r = requests.get(agent_url + path, headers={"Upgrade": "gpurent-terminal", "Connection": "keep-alive",
                                                **sign(secret, "GET", base_path + path)}, timeout=10)
    assert r.status_code == 400, r.text


def test_rank_one_of_two_nodes_and_hangup(cloud):
    c = cloud
    u, inst = running(c, cards=16, nodes=2)
    (wl1,), = c.d.sql("SELECT workload_id FROM instance_nodes WHERE instance_id = ? AND rank = 1", (inst["id"],))
    tok = token(c, u, inst["id"], rank=1)
    assert tok["rank"] == 1
    ws = connect(c, tok)
    s = Screen(ws)
    type_(ws, 'echo "rank=$NODE_RANK wl=$GPURENT_WORKLOAD pid=$$"\n')
    m = s.read_until(r"rank=(\d+) wl=(\S+) pid=(\d+)\r?\n")
    assert m.group(1) == "1" and m.group(2) == wl1, s.text
    pid = int(m.group(3))
    # The browser leaves: the agent hangs the shell up.
    ws.close()
    poll(lambda: not _alive(pid), DEADLINE, f"shell {pid} hung up")
    # Rank 2 is none of this instance's.
    r = c.d.post(f"/v1/instances/{inst['id']}/terminal-tokens", key=u.key, json={"rank": 2})
    assert r.status_code == 400 and r.json()["error"]["field"] == "rank", r.text


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_agent_stops_cleanly_with_a_terminal_open(cloud):
    c = cloud
    u, inst = running(c)
    ws = connect(c, token(c, u, inst["id"]))
    s = Screen(ws)
    type_(ws, 'echo "pid=$$"\n')
    pid = int(s.read_until(r"pid=(\d+)\r?\n").group(1))
    # SIGTERM to the agent: its shells are hung up and reaped, it exits 0
    # with no sanitizer report, and the browser hears why (1011, the node).
    c.fleets[0].stop()
    code, reason = s.wait_close()
    assert code == 1011 and "node" in reason, (code, reason)
    ws.close()
    assert not _alive(pid)

