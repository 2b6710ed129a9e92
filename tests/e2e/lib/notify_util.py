"""notify_util.py: a stand-in for systemd's notification socket, for the
tests that check what gpurentd and gpurent-agent tell systemd (READY=1,
RELOADING=1, STOPPING=1, WATCHDOG=1)."""
import socket
import time
import uuid


class NotifySocket:
    """An abstract unix datagram socket that records every message sent
    to it, with the time it was read."""

    def __init__(self):
        name = f"gpurent-test-notify-{uuid.uuid4().hex}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + name)
        self.addr = "@" + name
        self.messages = []

    def next(self, timeout):
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data = self.sock.recv(4096)
        except socket.timeout:
            raise AssertionError(f"no notification within {timeout}s; so far {[m for _, m in self.messages]}") \
                from None
        msg = (time.monotonic(), data.decode())
        self.messages.append(msg)
        return msg

    def wait_for(self, pred, timeout=20, what="a notification"):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {what}; got {[m for _, m in self.messages]}"
            t, text = self.next(left)
            if pred(text):
                return t, text

    def drain(self):
        """Reads what is already queued, without waiting (after the sender
        exited, every datagram it sent is queued)."""
        self.sock.setblocking(False)
        try:
            while True:
                try:
                    data = self.sock.recv(4096)
                except BlockingIOError:
                    return
                self.messages.append((time.monotonic(), data.decode()))
        finally:
            self.sock.setblocking(True)

    def close(self):
        self.sock.close()


def notify_fields(message):
    """A notification's KEY=VALUE lines as a dict."""
    out = {}
    for line in message.split("\n"):
        if line:
            k, sep, v = line.partition("=")
            assert sep, f"notification line without '=': {line!r} in {message!r}"
            out[k] = v
    return out
