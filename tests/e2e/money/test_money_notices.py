"""test_money_notices.py: the mail a renter gets about their funds, read
from a real local SMTP server (aiosmtpd). When billing stops their
instances because the funds ran out: sent once, when the pass that
stopped them commits, naming every instance it stopped and the second the
funds ran out; none for instances the renter stopped, nor from later
passes. When a pass leaves the funds lasting under low_balance_minutes:
once, with what is left and the rate, and again only after money came in.
`gpurentd ledger verify` runs after each test."""
from mail_util import mail_options, verification_code
from money_util import MICRO, PRICE, User, accrue, iso, new_cluster, yuan  # noqa: F401  (new_cluster is a fixture)




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
    # A label with line breaks in it does not forge lines of the mail.
    r = c.d.request("PATCH", f"/v1/instances/{named}", key=u.key, json={"name": "train-a\r\n.\r\nQUIT\rx"})
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
    assert f"  {named} (train-a??.??QUIT?x)\n" in body and f"  {other}\n" in body, body
    assert "\r" not in body.replace("\r\n", ""), repr(body)
    assert mine not in body
    assert "https://api.gpurent.test/v1/instances/INSTANCE_ID/start" in body, body
    # Later passes stop nothing more and send nothing more.
    c.d.advance_clock(3600)
    c.billing()
    c.billing()
    assert c.d.sql("SELECT count(*) FROM outbox WHERE user_id = ?", (u.id,)) == [(2,)]
    assert len(sink.mail_to(u.email, 2)) == 2


def test_a_low_balance_is_mailed_once_until_money_comes_in_again(new_cluster, sink):
    c = new_cluster(options=mail_options(sink))
    u = signup_verified(c, sink, invite_code="AMD6GW")  # 10.00
    t0 = c.d.now()
    iid = c.launch(u, "MI450", 8)  # 9.60 an hour: 62 minutes, above the 60-minute mark
    burn = 8 * PRICE["MI450"]

    def outbox():
        return [s for (s,) in c.d.sql("SELECT subject FROM outbox WHERE user_id = ? ORDER BY id", (u.id,))]

    def minutes(available):
        return available * 60 // burn

    c.d.set_clock(t0 + 60)
    c.billing()
    assert len(outbox()) == 1  # the verification mail alone: 61 minutes left
    # Ten minutes in, 52 are left: one notice, with what is left and the rate.
    c.d.set_clock(t0 + 600)
    c.billing()
    left = 10 * MICRO - accrue(PRICE["MI450"], 8, 600)
    assert c.balance(u)["available"] == left
    subject = f"Low balance: your gpurent funds last about {minutes(left)} minutes"
    assert outbox()[1:] == [subject]
    [_, (rcpt, _, msg)] = sink.mail_to(u.email, 2)
    body = msg.get_content().replace("\r\n", "\n")
    assert msg["Subject"] == subject and "(9.60 CNY an hour)" in body and f"({yuan(left)} CNY)" in body, body
    assert "https://api.gpurent.test/v1/balance" in body, body
    # Later passes, lower still, send nothing more.
    c.d.set_clock(t0 + 1200)
    c.billing()
    c.billing()
    assert len(outbox()) == 2
    # Money comes in: the funds last long again, and the next time they run
    # low is worth a notice.
    c.topup(u, 20 * MICRO)
    c.d.set_clock(t0 + 1800)
    c.billing()
    assert len(outbox()) == 2
    spent = accrue(PRICE["MI450"], 8, 7700)
    c.d.set_clock(t0 + 7700)
    c.billing()
    left = 30 * MICRO - spent
    assert minutes(left) < 60
    assert outbox()[2:] == [f"Low balance: your gpurent funds last about {minutes(left)} minutes"]
    # Then they run out: the stop has its own mail, and no other.
    c.d.set_clock(t0 + 20000)
    c.billing()
    assert "funds ran out" in c.wait_state(u, iid, "stopped")["state_reason"]
    assert outbox()[3:] == ["Funds ran out: 1 gpurent instance stopped"]
    c.d.advance_clock(3600)
    c.billing()
    assert len(outbox()) == 4
    assert len(sink.mail_to(u.email, 4)) == 4
