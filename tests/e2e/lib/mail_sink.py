"""mail_sink.py: a real local SMTP server (aiosmtpd) for tests of the mail
gpurentd sends, and the daemon options that point its mailer there."""
import email
import email.policy
import re
import socket
import threading

from aiosmtpd.controller import Controller

from agent_util import poll

# What a sign-up's verification mail carries.
VERIFICATION_CODE = re.compile(r"verification code: (evc_[0-9a-z]{20})")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sink:
    """A local SMTP server keeping every message it is given."""

    def __init__(self, port=None):
        self.port = port or free_port()
        self.messages = []  # (envelope rcpt list, email.message.EmailMessage)
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

    def mail_to(self, addr, n=1, timeout=15):
        """Waits for the n-th message to addr; returns the list of them."""
        def got():
            with self.lock:
                m = [x for x in self.messages if addr in x[0]]
            return m if len(m) >= n else None
        return poll(got, timeout, f"{n} mail(s) to {addr}")


def mail_options(sink, **extra):
    return {"smtp_url": f"smtp://127.0.0.1:{sink.port}", "smtp_tls": "none", "smtp_from": "noreply@gpurent.test",
            "public_url": "https://api.gpurent.test/", **extra}


def verification_code(sink, addr, n=1):
    """The verification code of the n-th mail to addr."""
    rcpt, sender, msg = sink.mail_to(addr, n, timeout=30)[n - 1]
    return VERIFICATION_CODE.search(msg.get_content()).group(1)
