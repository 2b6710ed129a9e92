"""ports.py: free TCP ports for the tests, always below the kernel's
ephemeral range (net.ipv4.ip_local_port_range). A port taken by bind(0)
comes from that range, so once released the kernel may hand it to any
outgoing connection of the daemon, an agent or a client, and a server the
test then starts on it (or a published-port listener of an agent) cannot
bind: the test waits in vain. Below the range nothing is given out
unasked. make check runs two test files at once (pytest-xdist); a pick is
checked bindable, so two clash only if both land on the same port between
a pick and its bind."""
import random
import select
import socket
import time

LOWEST = 10000


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def bindable(port):
    """Whether port can be bound now on every address and on loopback."""
    for host in ("0.0.0.0", "127.0.0.1"):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def free_range(count):
    """A run of `count` ports that nothing listens on or uses now:
    (first, last)."""
    top = _ephemeral_low()
    rng = random.Random()
    for _ in range(500):
        first = rng.randrange(LOWEST, top - count)
        if all(bindable(p) for p in range(first, first + count)):
            return first, first + count - 1
    raise AssertionError(f"no {count} free ports in {LOWEST}-{top - 1}")


def free_port():
    return free_range(1)[0]


def exchange(port, data, timeout=10):
    """Sends bytes as is on a fresh connection to 127.0.0.1:port (what no
    client library would send) and returns every byte the server answers
    until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        reply = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return reply
            reply += chunk


def cut_off_while_trickling(port, head, byte, within_s=20):
    """Sends head on a fresh connection to 127.0.0.1:port, then byte once a
    second; whether the server closed the connection within within_s."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head)
        started = time.monotonic()
        while time.monotonic() - started < within_s:
            try:
                s.sendall(byte)
            except OSError:
                return True
            r, _, _ = select.select([s], [], [], 1)
            if r and s.recv(4096) == b"":
                return True
        return False
