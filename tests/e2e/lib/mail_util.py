"""mail_util.py: a real local SMTP server (aiosmtpd) for the tests of mail
the daemon sends (verification and password reset codes, notices), and the
options that point a daemon at it; conftest.py's `sink` fixture is a Sink.

Sink(port=None)           an SMTP server on 127.0.0.1 keeping every message:
                          messages [(rcpt list, mail_from, EmailMessage)],
                          mail_to(addr, n=1, timeout=15) waits for the n-th
                          message to addr and returns them, count(addr),
                          stop()
mail_options(sink, **extra)   gpurentd options sending mail through sink
free_port()               a free TCP port on 127.0.0.1
VERIFICATION_CODE, RESET_CODE   what a sign-up's verification mail and a
                          password reset mail carry
codes(sink, addr, pattern, n)   waits for n codes mailed to addr, returns them
verification_code(sink, addr, n=1), reset_codes(sink, addr, n)   the same for
                          sign-up verification and password reset codes
post_from(d, source, path, body) -> (status, headers, json): a POST from a
                          given loopback source address (127.0.0.x), for
                          per-client limits
"""
import email
import email.policy
import http.client
import json
import re
import socket
import threading

from aiosmtpd.controller import Controller

from agent_util import poll

VERIFICATION_CODE = re.compile(r"verification code: (evc_[0-9a-z]{20})")
RESET_CODE = re.compile(r"password reset code: (prc_[0-9a-z]{20})")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sink:
    """A local SMTP server keeping every message it is given."""

    def __init__(self, port=None):
        self.port = port or free_port()
        self.messages = []  # (envelope rcpt list, envelope sender, email.message.EmailMessage)
        self.lock = threading.Lock()
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port)
        self.controller.start()

    async def handle_DATA(self, server, session, envelope):
        msg = email.message_from_bytes(envelope.original_content or envelope.content, policy=email.policy.default)
        with self.lock:
            self.messages.append((list(envelope.rcpt_tos), envelope.mail_from, msg))
        return "250 OK"

    def stop(self):
        self.controller.stop()

    def count(self, addr):
        with self.lock:
            return sum(1 for x in self.messages if addr in x[0])

    def mail_to(self, addr, n=1, timeout=15):
        """Waits for the n-th message to addr; returns the list of them."""
        def got():
            with self.lock:
                m = [x for x in self.messages if addr in x[0]]
            return m if len(m) >= n else None
        return poll(got, timeout, f"{n} mail(s) to {addr}")


def codes(sink, addr, pattern, n):
    """Waits until the mail to addr carries n codes matching pattern (its
    one group); returns them all, oldest first."""
    def got():
        with sink.lock:
            found = [pattern.search(msg.get_content()) for rcpt, _, msg in sink.messages if addr in rcpt]
        found = [m.group(1) for m in found if m]
        return found if len(found) >= n else None
    return poll(got, 30, f"{n} code(s) matching {pattern.pattern!r} mailed to {addr}")


def verification_code(sink, addr, n=1):
    """The n-th verification code mailed to addr."""
    return codes(sink, addr, VERIFICATION_CODE, n)[n - 1]


def reset_codes(sink, addr, n):
    """The first n password reset codes mailed to addr."""
    return codes(sink, addr, RESET_CODE, n)



def mail_options(sink, **extra):
    return {"smtp_url": f"smtp://127.0.0.1:{sink.port}", "smtp_tls": "none", "smtp_from": "noreply@gpurent.test",
            "public_url": "https://api.gpurent.test/", **extra}


def post_from(d, source, path, body):
    """POSTs JSON from a given loopback source address."""
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30, source_address=(source, 0))
    try:
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, dict(r.getheaders()), json.loads(r.read() or b"null")
    finally:
        c.close()
