"""gpurentd serving the web console (issue 14): GET / sends a browser to
/console; the console's files come from console_dir with their types, a
strict Content-Security-Policy, nosniff and no framing; ETag and
If-None-Match give 304; HEAD answers the headers alone; nothing outside the
directory is reachable (.., encoded .., hidden files, symbolic links out,
unknown types)."""
import http.client
import os

import pytest
import requests

from harness import REPO, assert_error

CONSOLE = os.path.join(REPO, "console")


def raw_get(d, path, method="GET", headers=None):
    """Sends path exactly as written (no client-side normalisation)."""
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_root_redirects_to_the_console(daemon):
    r = daemon.get("/")
    assert r.status_code == 302, r.text
    assert r.headers["Location"] == "/console"
    r = daemon.request("HEAD", "/")
    assert r.status_code == 302 and r.headers["Location"] == "/console" and r.content == b""


def test_a_browser_asking_with_a_trailing_slash_is_sent_to_the_path_without_it(daemon):
    page = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}  # a browser's navigation
    for method in ("GET", "HEAD"):
        status, headers, _ = raw_get(daemon, "/console/", method, page)
        assert status == 308 and headers["location"] == "/console", (method, status, headers)
    r = requests.get(f"http://127.0.0.1:{daemon.port}/console/", headers=page, timeout=10)  # followed
    assert r.status_code == 200 and r.headers["Content-Type"] == "text/html; charset=utf-8"
    assert r.history and r.history[0].status_code == 308
    # Not for an API client (no HTML accepted), which keeps the strict
    # 404; not for a write, whose body a redirect would make the client
    # send again; not with a query, which it would have to carry; not for
    # a path no route serves; and a decoded CR LF never reaches Location.
    for method, path, headers in (("GET", "/console/", {}), ("GET", "/v1/gpu-types/", {"Accept": "application/json"}),
                                  ("POST", "/v1/instances/", page), ("GET", "/console/?lang=en", page),
                                  ("GET", "/nothing/", page), ("GET", "/console/%0d%0aSet-Cookie:%20x=1/", page)):
        status, got, body = raw_get(daemon, path, method, headers)
        assert status in (400, 404, 405), (method, path, status, body[:200])
        assert got["content-type"] == "application/json" and "set-cookie" not in got, path


def test_index_and_files_have_their_types_and_security_headers(daemon):
    cases = {"/console": "text/html; charset=utf-8", "/console/js/app.js": "text/javascript; charset=utf-8",
             "/console/js/pages/instances.js": "text/javascript; charset=utf-8",
             "/console/css/console.css": "text/css; charset=utf-8", "/console/i18n/zh.json": "application/json",
             "/console/favicon.svg": "image/svg+xml"}
    for path, ctype in cases.items():
        r = daemon.get(path, headers={"Host": "console.test:8080"})
        assert r.status_code == 200, (path, r.text)
        assert r.headers["Content-Type"] == ctype, path
        rel = "index.html" if path == "/console" else path[len("/console/"):]
        with open(os.path.join(CONSOLE, rel), "rb") as f:
            assert r.content == f.read(), path
        csp = r.headers["Content-Security-Policy"]
        for directive in ("default-src 'self'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'",
                          "object-src 'none'", "base-uri 'none'",
                          "connect-src 'self' ws://console.test:8080 wss://console.test:8080"):
            assert directive in csp, (directive, csp)
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp, csp
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers["X-Frame-Options"] == "DENY"
        assert r.headers["Cache-Control"] == "no-cache"
        assert r.headers["ETag"].startswith('"')


def test_a_strange_host_header_stays_out_of_the_policy(daemon):
    # No host name: refused before any page or policy is made from it.
    r = daemon.get("/console", headers={"Host": "evil.test; script-src *"})
    assert r.status_code == 400 and "Content-Security-Policy" not in r.headers, r.headers
    # A host name and port is named only where the terminal's WebSocket
    # needs it, never as a source of scripts.
    r = daemon.get("/console", headers={"Host": "other.test:8080"})
    csp = r.headers["Content-Security-Policy"]
    assert "script-src 'self';" in csp and "connect-src 'self' ws://other.test:8080 wss://other.test:8080;" in csp, csp


def test_a_long_host_name_still_gets_a_whole_policy(daemon):
    host = "a" * 60 + ".test"
    csp = daemon.get("/console", headers={"Host": host}).headers["Content-Security-Policy"]
    assert csp.endswith("object-src 'none'") and "connect-src 'self';" in csp, csp


def test_etag_revalidation_answers_304_without_a_body(daemon):
    r = daemon.get("/console/js/app.js")
    etag = r.headers["ETag"]
    for inm in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        again = daemon.get("/console/js/app.js", headers={"If-None-Match": inm})
        assert again.status_code == 304, inm
        assert again.content == b"" and again.headers["ETag"] == etag
    assert daemon.get("/console/js/app.js", headers={"If-None-Match": '"stale"'}).status_code == 200
    # Another file, another validator.
    assert daemon.get("/console/js/api.js").headers["ETag"] != etag


def test_a_304_states_the_length_of_the_200_and_keeps_the_connection(daemon):
    """RFC 9110 8.6: a 304 may carry Content-Length only as the 200's own;
    and no byte may follow it that the next reply would be read from."""
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=10)
    try:
        conn.request("GET", "/console/js/app.js")
        full = conn.getresponse()
        body, etag = full.read(), full.getheader("ETag")
        for _ in range(2):
            conn.request("GET", "/console/js/app.js", headers={"If-None-Match": etag})
            r = conn.getresponse()
            assert r.status == 304 and r.read() == b""
            assert r.getheader("Content-Length") == str(len(body)), r.getheaders()
            assert r.getheader("Transfer-Encoding") is None
        conn.request("GET", "/console/js/app.js")
        again = conn.getresponse()
        assert again.status == 200 and again.read() == body
    finally:
        conn.close()


def test_head_gives_the_headers_of_get_and_no_body(daemon):
    g = daemon.get("/console/css/console.css")
    status, headers, body = raw_get(daemon, "/console/css/console.css", "HEAD")
    assert status == 200 and body == b""
    assert headers["content-type"] == g.headers["Content-Type"] and headers["etag"] == g.headers["ETag"]
    assert int(headers["content-length"]) == len(g.content)


def test_options_and_other_methods(daemon):
    r = daemon.request("OPTIONS", "/console/js/app.js")
    assert r.status_code == 204 and {m.strip() for m in r.headers["Allow"].split(",")} == {"GET", "HEAD"}
    assert_error(daemon.request("POST", "/console/js/app.js"), 405, "method_not_allowed")
    assert_error(daemon.request("DELETE", "/console"), 405, "method_not_allowed")


@pytest.mark.parametrize("path", [
    "/console/../README.md", "/console/js/../../README.md", "/console/%2e%2e/README.md", "/console/js/%2E%2E/%2e%2e/Makefile",
    "/console/..%2fREADME.md", "/console/.hidden.js", "/console/js/.app.js", "/console/nothing.js",
    "/console/js/app.js.bak", "/console/vendor", "/console/js", "/console/a/b/c/d.js", "/console//",
    "/console/js%00.js", "/console/%5c..%5cREADME.md",
])
def test_nothing_outside_the_console_is_served(daemon, path):
    status, headers, body = raw_get(daemon, path)
    assert status in (400, 404), (path, status, body[:200])
    assert headers["content-type"] == "application/json", path
    assert b"gpurent" not in body.lower() or b"error" in body, path


def test_symbolic_links_out_of_the_directory_are_not_followed(new_daemon, tmp_path):
    root = tmp_path / "console"
    (root / "js").mkdir(parents=True)
    (root / "index.html").write_text("<!doctype html><title>t</title>")
    (root / "js" / "inside.js").write_text("export const x = 1;\n")
    secret = tmp_path / "secret.js"
    secret.write_text("export const secret = 'do not serve';\n")
    os.symlink(secret, root / "js" / "out.js")
    os.symlink(tmp_path, root / "up")
    os.symlink(root / "js" / "inside.js", root / "js" / "alias.js")  # a link that stays inside is fine
    d = new_daemon(options={"console_dir": str(root)})
    assert d.get("/console/js/inside.js").status_code == 200
    assert d.get("/console/js/alias.js").text == "export const x = 1;\n"
    for path in ("/console/js/out.js", "/console/up/secret.js"):
        r = d.get(path)
        assert_error(r, 404, "not_found")
        assert "do not serve" not in r.text
    # A link that loops back into the console resolves inside it: served.
    assert d.get("/console/up/console/index.html").status_code == 200


def test_a_missing_console_directory_is_404_not_a_crash(new_daemon, tmp_path):
    d = new_daemon(options={"console_dir": str(tmp_path / "none")})
    assert_error(d.get("/console"), 404, "not_found")
    assert_error(d.get("/console/js/app.js"), 404, "not_found")
    assert d.get("/").status_code == 302
    # The API itself is untouched and keeps its no-store policy.
    r = d.get("/healthz")
    assert r.status_code == 200 and r.headers["Cache-Control"] == "no-store"
