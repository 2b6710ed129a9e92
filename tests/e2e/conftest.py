"""conftest.py: pytest fixtures over harness.Daemon.

daemon      one gpurentd per test module (tests in a module share it, so they
            make their own accounts with unique emails rather than assume an
            empty database)
user        a fresh signed-up Account on that module's daemon
new_daemon  factory for a test that needs its own daemon (its own options,
            configuration, clock or database): new_daemon(**Daemon kwargs);
            the directory defaults to a fresh one under tmp_path
sink        a local SMTP server keeping the mail it is sent (mail_util.Sink;
            mail_util.mail_options points a daemon at it)
Every daemon a fixture started is stopped with SIGTERM at the end and must
exit 0 without a sanitizer report, so each test is also a clean-shutdown and
memory-safety test.
"""
import os
import sys

import pytest

# The harness and helpers live in lib/; the suites, by area, beside it.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))

from harness import GPURENTD, Daemon, stop_all  # noqa: E402


def pytest_configure(config):
    if not os.access(GPURENTD, os.X_OK):
        raise pytest.UsageError(f"{GPURENTD} is not an executable: run `make` first or set GPURENTD")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("daemon"))
    yield d
    stop_all([d])


@pytest.fixture
def sink():
    # aiosmtpd is imported only by the tests that send mail.
    from mail_util import Sink
    s = Sink()
    yield s
    s.stop()


@pytest.fixture
def user(daemon):
    return daemon.signup()


@pytest.fixture
def new_daemon(tmp_path):
    made = []

    def make(directory=None, start=True, **kw):
        d = Daemon(directory or tmp_path / f"d{len(made)}", start=False, **kw)
        made.append(d)
        if start:
            d.start()
        return d

    yield make
    stop_all(made)
