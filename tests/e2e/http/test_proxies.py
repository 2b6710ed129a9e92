"""test_proxies.py: gpurentd behind a reverse proxy. X-Forwarded-For names
the client only when the request comes from a trusted proxy; the per-client
failed-login lockout then applies to each client, not to the proxy."""
from harness import assert_error, unique_email

WRONG = "not-the-password-1"


def fail_login(d, email, forwarded=None):
    headers = {"X-Forwarded-For": forwarded} if forwarded else None
    return d.request("POST", "/v1/login", json={"email": email, "password": WRONG}, headers=headers)


def lock_out_client(d, forwarded):
    # login_max_failures=1: a client is locked after 4 failures (any accounts).
    for _ in range(4):
        assert fail_login(d, unique_email("victim"), forwarded).status_code == 401


def test_trusted_proxy_forwards_the_client(new_daemon):
    d = new_daemon(options={"login_max_failures": "1", "trusted_proxies": "10.9.9.9 127.0.0.1"})
    lock_out_client(d, "198.51.100.7, 203.0.113.5")
    # The client 203.0.113.5 (rightmost, not a proxy) is locked out ...
    r = fail_login(d, unique_email("next"), "203.0.113.5")
    assert_error(r, 429, "too_many_requests")
    # ... whatever it claims further left, and through a second trusted hop.
    assert_error(fail_login(d, unique_email("next"), "1.2.3.4, 203.0.113.5, 10.9.9.9"), 429, "too_many_requests")
    # Another client behind the same proxy is not.
    assert fail_login(d, unique_email("other"), "203.0.113.6").status_code == 401
    # The access log names the forwarded client.
    d.wait_for_log(r"POST /v1/login 401 \d+ms req_\w+ 203\.0\.113\.6")


def test_untrusted_peer_cannot_choose_its_address(new_daemon):
    d = new_daemon(options={"login_max_failures": "1"})
    lock_out_client(d, "203.0.113.5")
    # The header is ignored: the peer (127.0.0.1) itself is locked out.
    assert_error(fail_login(d, unique_email("next"), "203.0.113.6"), 429, "too_many_requests")


def test_malformed_forwarded_for_keeps_the_proxy(new_daemon):
    d = new_daemon(options={"login_max_failures": "1", "trusted_proxies": "127.0.0.1"})
    lock_out_client(d, "not-an-address")
    # Garbage named no client, so the proxy's own address took the failures.
    assert_error(fail_login(d, unique_email("next")), 429, "too_many_requests")
    assert fail_login(d, unique_email("other"), "203.0.113.9").status_code == 401
