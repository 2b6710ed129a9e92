"""test_setup.py: what an operator does before and around serving: checking a
configuration with `gpurentd -n` (bad CORS origins and trusted proxies are
refused naming the file and line or the option), `make install` into a
DESTDIR (files, modes, units rewritten to the PREFIX, configurations that
still parse), and `make run`'s script, scripts/run-local.sh, end to end on a
temporary state directory: banner, admin key, simulated fleet, an instance
that runs, Ctrl-C, and a second run on the same state."""
import os

import pytest

from harness import REPO, run_gpurentd

# ---------------------------------------------------------------------------
# gpurentd -n: the list options are checked like every other option
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("option, value, message", [
    ("trusted_proxies", "banana", "trusted_proxies: 'banana' is not an IP address"),
    ("trusted_proxies", "127.0.0.1 10.0.0.0/8", "trusted_proxies: '10.0.0.0/8' is a range"),
    ("trusted_proxies", "0:0::1", "trusted_proxies: '0:0::1' would never match a client; write it as '::1'"),
    ("cors_origins", "console.example.com/ x", "cors_origins: 'console.example.com/' is not an origin"),
    ("cors_origins", "https://console.example.com/",
     "cors_origins: 'https://console.example.com/' has a path or a trailing slash"),
    ("cors_origins", "https://Console.example.com", "has upper-case letters"),
    ("cors_origins", "https://console.example.com:443", "names the default port"),
])
def test_check_refuses_bad_lists(tmp_path, option, value, message):
    # On the command line: the message names the option, there is no line.
    p = run_gpurentd("-n", "-o", f"{option}={value}")
    assert p.returncode != 0 and p.stdout == "", (p.stdout, p.stderr)
    assert p.stderr.startswith(f"gpurentd: command line: {option}: ") and message in p.stderr, p.stderr
    # In a file: FILE:LINE in front of the same message.
    conf = tmp_path / "gpurentd.conf"
    conf.write_text(f"# a comment\nthreads = 2\n{option} = {value}\n")
    p = run_gpurentd("-n", "-c", conf)
    assert p.returncode != 0 and p.stdout == "", (p.stdout, p.stderr)
    assert p.stderr.startswith(f"gpurentd: {conf}:3: {option}: ") and message in p.stderr, p.stderr


def test_check_accepts_good_lists(tmp_path):
    conf = tmp_path / "gpurentd.conf"
    conf.write_text("cors_origins = https://console.example.com http://localhost:5173,https://[::1]:8443\n"
                    "trusted_proxies = 10.9.9.9 127.0.0.1,::1\n")
    for args in (["-n", "-c", conf], ["-n", "-o", "cors_origins=*", "-o", "trusted_proxies="]):
        p = run_gpurentd(*args)
        assert p.returncode == 0 and p.stdout == "configuration OK\n", (args, p.stderr)
