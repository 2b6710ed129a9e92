"""test_money_notices.py: the mail a renter gets when billing stops their
instances because the funds ran out, read from a real local SMTP server
(aiosmtpd): sent once, when the pass that stopped them commits, naming
every instance it stopped and the second the funds ran out; none for
instances the renter stopped, nor from later passes. `gpurentd ledger
verify` runs after the test."""
from mail_sink import Sink, mail_options, verification_code
from money_util import MICRO, User, accrue, iso, new_cluster  # noqa: F401  (new_cluster is a fixture)

import pytest


@pytest.fixture
def sink():
    s = Sink()
    yield s
    s.stop()


def signup_verified(c, sink, **fields):
    acct = c.d.signup(verify=False, **fields)
    r = c.d.post("/v1/verify-email", json={"token": verification_code(sink, acct.email)})
    assert r.status_code == 200, r.text
    return User(acct.id, acct.key, acct.email)


def test_the_renter_is_mailed_once_when_funds_run_out_and_their_instances_stop(new_cluster, sink):
    c = new_cluster(options=mail_options(sink))
    u = signup_verified(c, sink, invite_code="AMD6GW")  # 10.00
    t0 = c.d.now()
    named = c.launch(u, "MI450", 4)
    r = c.d.request("PATCH", f"/v1/instances/{named}", key=u.key, json={"name": "train-a"})
    assert r.status_code == 200, r.text
    other = c.launch(u, "MI450", 4)
    # One the renter stopped is not among those billing stops.
    mine = c.launch(u, "MI450", 1)
    c.stop(u, mine)
    # 8 cards at 1.20 run 10.00 out at second 3 750 exactly.
    assert accrue(1_200_000, 8, 3750) == 10 * MICRO
    c.d.set_clock(t0 + 4000)
    c.billing()
    for iid in (named, other):
        assert "funds ran out" in c.wait_state(u, iid, "stopped")["state_reason"]
    [_, (rcpt, sender, msg)] = sink.mail_to(u.email, 2)
    assert rcpt == [u.email] and sender == "noreply@gpurent.test"
    assert msg["Subject"] == "Funds ran out: 2 gpurent instances stopped"
    body = msg.get_content().replace("\r\n", "\n")
    assert f"funds ran out at {iso(t0 + 3750)}" in body, body
    assert f"  {named} (train-a)\n" in body and f"  {other}\n" in body, body
    assert mine not in body
    assert "https://api.gpurent.test/v1/instances/INSTANCE_ID/start" in body, body
    # Later passes stop nothing more and send nothing more.
    c.d.advance_clock(3600)
    c.billing()
    c.billing()
    assert c.d.sql("SELECT count(*) FROM outbox WHERE user_id = ?", (u.id,)) == [(2,)]
    assert len(sink.mail_to(u.email, 2)) == 2
