"""test_gateway_metrics.py: gpurent-gateway's Prometheus metrics, on their
own listener (--metrics-listen): each call to /apps/... is counted once, at
its end, by the status it was answered with (the gateway's own refusals
too) and in the duration histogram; the gauges say what is in flight and
pending; the exposition passes Prometheus's own linter; the consumers'
port does not serve it."""
import os
import subprocess

import requests

from agent_util import poll
from apps_util import DEADLINE, GATEWAY, assert_ledger_ok, free_port
from ops_util import parse_prometheus

MSG = {"messages": [{"role": "user", "content": "hello"}]}


def scrape(port):
    """{(sample name, ((label, value), ...)): value} of one scrape, after
    promtool found nothing wrong with it."""
    r = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8", r.headers
    lint = subprocess.run(["promtool", "check", "metrics"], input=r.text, capture_output=True, text=True, timeout=60)
    assert (lint.returncode, lint.stdout, lint.stderr) == (0, "", ""), (lint, r.text)
    return {(name, tuple(sorted(labels.items()))): value
            for family in parse_prometheus(r.text).values() for name, labels, value in family.samples}


def test_calls_are_counted_by_status_and_duration(market):
    m = market
    app, con = m.running_app(token_ms=0)
    port = free_port()
    gw = m.gateway(extra=("--metrics-listen", f"127.0.0.1:{port}"))
    s = scrape(port)
    assert s[("gpurent_gateway_copy_loaded", ())] == 1 and s[("gpurent_gateway_calls_in_flight", ())] == 0, s
    assert s[("gpurent_gateway_syncs_total", ())] >= 1 and s[("gpurent_gateway_copy_age_seconds", ())] >= 0, s
    assert not [k for k in s if k[0] == "gpurent_gateway_calls_total"], s
    assert s[("gpurent_gateway_call_duration_seconds_count", ())] == 0, s

    assert gw.call(app["slug"], "/v1/chat/completions", con.key, json=MSG).status_code == 200
    assert gw.call(app["slug"], "/v1/chat/completions", "gpk_nonsense", json=MSG).status_code == 401
    assert gw.call("no-such-app", "/v1/chat/completions", con.key, json=MSG).status_code == 404
    # Not on the consumers' port; and that request, like /healthz, is no call.
    assert requests.get(gw.url + "/metrics", timeout=10).status_code == 404
    requests.get(gw.url + "/healthz", timeout=10)

    # A call is counted when libmicrohttpd reports it complete, which may
    # come after its client has the answer.
    s = poll(lambda: (lambda s: s if s[("gpurent_gateway_call_duration_seconds_count", ())] == 3 else None)(
        scrape(port)), DEADLINE, "the three calls counted")
    calls = {dict(k[1])["code"]: v for k, v in s.items() if k[0] == "gpurent_gateway_calls_total"}
    assert calls == {"200": 1, "401": 1, "404": 1}, calls
    buckets = sorted((float(dict(k[1])["le"]), v) for k, v in s.items()
                     if k[0] == "gpurent_gateway_call_duration_seconds_bucket")
    assert buckets[-1] == (float("inf"), 3) and [v for _, v in buckets] == sorted(v for _, v in buckets), buckets
    # Bounds in their shortest form, as PromQL selectors match them as text.
    les = [dict(k[1])["le"] for k in s if k[0] == "gpurent_gateway_call_duration_seconds_bucket"]
    assert {"0.005", "0.01", "0.25", "1", "2.5", "300", "+Inf"} <= set(les), les
    assert s[("gpurent_gateway_calls_in_flight", ())] == 0 and s[("gpurent_gateway_upstreams_paused", ())] == 0, s
    # The 200's usage record reaches gpurentd, which answers for it.
    m.wait_calls(app["id"], 1)
    poll(lambda: scrape(port)[("gpurent_gateway_usage_records_pending", ())] == 0, DEADLINE, "no record pending")

    # The metrics listener serves /metrics alone, to GET and HEAD.
    assert requests.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 404
    assert requests.post(f"http://127.0.0.1:{port}/metrics", data=b"x", timeout=10).status_code == 405
    assert requests.head(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 200
    assert_ledger_ok(m)


def test_a_metrics_address_that_cannot_be_had_stops_the_gateway(market):
    """A --metrics-listen port already taken: the gateway says so and exits
    rather than run without the metrics it was asked for."""
    m = market
    taken = requests.compat.urlparse(m.d.base_url).port  # gpurentd's
    proc = subprocess.run([GATEWAY, "--listen", f"127.0.0.1:{free_port()}", "--control-url", m.d.base_url,
                           "--secret-file", m.secret_file, "--state-dir", os.path.join(m.tmp, "gw-taken"),
                           "--metrics-listen", f"127.0.0.1:{taken}"], capture_output=True, text=True, timeout=DEADLINE)
    assert proc.returncode == 1 and f"cannot listen on 127.0.0.1:{taken} for metrics" in proc.stderr, proc
