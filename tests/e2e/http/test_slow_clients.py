"""Slow clients cannot starve a fresh one: hundreds of connections from
several loopback addresses (127.0.0.x) trickle a header line at a time,
which resets libmicrohttpd's idle timeout, while a fresh client keeps
asking; every one of its requests is answered, the tricklers are cut off
after header_timeout_s, and a body that crawls is cut off too."""
import select
import socket
import threading
import time

import requests

from ports import cut_off_while_trickling

TRICKLE_ADDRS = [f"127.0.0.{i}" for i in range(2, 12)]  # ten addresses
PER_ADDR = 40                                            # 400 connections, 4x the limit
OPTIONS = {"max_connections": "100", "max_connections_per_client": "16", "header_timeout_s": "2",
           "body_min_rate": "1000", "max_body_bytes": "2048", "connection_timeout_s": "60"}


class Trickler(threading.Thread):
    """Keeps PER_ADDR connections per address open, each sending one header
    line every 300 ms and never the blank line; reconnects what closes."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.opened = 0
        self.closed_by_server = 0
        self.longest_s = 0.0

    def connect(self, addr):
        s = socket.socket()
        s.setblocking(False)
        s.bind((addr, 0))
        try:
            s.connect(("127.0.0.1", self.port))
        except BlockingIOError:
            pass
        self.opened += 1
        return {"sock": s, "addr": addr, "since": time.monotonic(), "started": False}

    def run(self):
        conns = [self.connect(a) for a in TRICKLE_ADDRS for _ in range(PER_ADDR)]
        while not self.stop.is_set():
            for c in conns:
                try:
                    c["sock"].send(b"X-Slow: 1\r\n" if c["started"] else b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                    c["started"] = True
                except OSError:
                    pass  # not connected yet, or already closed: the select sees it
            readable, _, _ = select.select([c["sock"] for c in conns], [], [], 0.3)
            for i, c in enumerate(conns):
                if c["sock"] not in readable:
                    continue
                try:
                    data = c["sock"].recv(4096)
                except OSError:
                    data = b""
                if data:
                    continue  # an error reply before the close
                self.closed_by_server += 1
                self.longest_s = max(self.longest_s, time.monotonic() - c["since"])
                c["sock"].close()
                conns[i] = self.connect(c["addr"])
        for c in conns:
            c["sock"].close()


def test_trickling_headers_cannot_starve_a_fresh_client(new_daemon):
    d = new_daemon(options=OPTIONS)
    t = Trickler(d.port)
    t.start()
    try:
        # Let the tricklers take every slot they can.
        deadline = time.monotonic() + 30
        while t.opened < len(TRICKLE_ADDRS) * PER_ADDR and time.monotonic() < deadline:
            time.sleep(0.1)
        latencies = []
        end = time.monotonic() + 8  # four header timeouts of trickling
        while time.monotonic() < end:
            start = time.monotonic()
            r = requests.get(d.url("/v1/gpu-types"), timeout=10, headers={"Connection": "close"})
            latencies.append(time.monotonic() - start)
            assert r.status_code == 200, r.text
        assert len(latencies) >= 10
        # The tricklers were cut off for taking too long, not left to hold on.
        assert t.closed_by_server >= len(TRICKLE_ADDRS) * 16, t.closed_by_server
        latencies.sort()
        print(f"fresh client: {len(latencies)} requests, p50 {latencies[len(latencies) // 2] * 1000:.1f} ms, "
              f"max {latencies[-1] * 1000:.1f} ms, tricklers cut off {t.closed_by_server}")
    finally:
        t.stop.set()
        t.join(30)


def test_a_crawling_body_is_cut_off(new_daemon):
    d = new_daemon(options=OPTIONS)
    # 2048 bytes at 1000 B/s may take 2 + 2 s; this one sends a byte a second.
    assert cut_off_while_trickling(d.port, b"POST /v1/signup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                   b"Content-Length: 2000\r\n\r\n{", b" "), \
        "a body arriving at a byte a second was never cut off"
