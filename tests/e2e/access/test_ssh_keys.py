"""SSH keys on the account (POST/GET/DELETE /v1/ssh-keys): keys made with
the real ssh-keygen are accepted with exactly the fingerprint `ssh-keygen
-l` prints, the weak, malformed, duplicate and one-too-many are refused
with clear codes, and nobody sees or deletes another user's keys."""
import json

import pytest

from harness import assert_error
from ssh_util import add_key, fingerprint, keygen

KINDS = [("ed25519", None, "ssh-ed25519"), ("ecdsa", 256, "ecdsa-sha2-nistp256"),
         ("ecdsa", 384, "ecdsa-sha2-nistp384"), ("ecdsa", 521, "ecdsa-sha2-nistp521"),
         ("rsa", 2048, "ssh-rsa"), ("rsa", 3072, "ssh-rsa")]
KEY_FIELDS = {"id", "name", "type", "bits", "fingerprint", "public_key", "created_at"}


@pytest.mark.parametrize("kind,bits,type_", KINDS, ids=[f"{k}-{b}" for k, b, _ in KINDS])
def test_each_kind_is_taken_with_ssh_keygens_fingerprint(daemon, user, tmp_path, kind, bits, type_):
    line, path = keygen(tmp_path, kind, bits, comment="me@laptop")
    want_bits, want_fp = fingerprint(path)
    r = daemon.post("/v1/ssh-keys", key=user.key, json={"name": "laptop", "public_key": line})
    assert r.status_code == 201, r.text
    k = r.json()
    assert set(k) == KEY_FIELDS, k
    assert k["id"].startswith("sshk_") and r.headers["Location"] == f"/v1/ssh-keys/{k['id']}"
    assert (k["type"], k["bits"], k["fingerprint"]) == (type_, want_bits, want_fp)
    assert k["public_key"] == line and k["name"] == "laptop"
    assert daemon.get(f"/v1/ssh-keys/{k['id']}", key=user.key).json() == k


def test_line_is_normalised_and_comment_optional(daemon, user, tmp_path):
    line, path = keygen(tmp_path, comment="x")
    type_, blob, _ = line.split(" ")
    k = add_key(daemon, user, f"  {type_}\t{blob}   my  work key  ")
    assert k["public_key"] == f"{type_} {blob} my  work key"
    assert k["fingerprint"] == fingerprint(path)[1]
    line2, _ = keygen(tmp_path)
    k2 = add_key(daemon, user, " ".join(line2.split(" ")[:2]))
    assert k2["public_key"] == " ".join(line2.split(" ")[:2])


def test_list_pages_get_and_delete(daemon, user, tmp_path):
    made = [add_key(daemon, user, keygen(tmp_path)[0], name=f"k{i}") for i in range(5)]
    made.sort(key=lambda k: (k["created_at"], k["id"]))  # the list's order; the test clock stands still
    seen, cursor = [], None
    while True:
        r = daemon.get("/v1/ssh-keys", key=user.key, params={"limit": 2, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"data", "next_cursor"} and len(body["data"]) <= 2
        seen += body["data"]
        cursor = body["next_cursor"]
        if not cursor:
            break
    assert seen == made
    r = daemon.delete(f"/v1/ssh-keys/{made[1]['id']}", key=user.key)
    assert r.status_code == 204, r.text
    assert_error(daemon.get(f"/v1/ssh-keys/{made[1]['id']}", key=user.key), 404, "not_found")
    assert_error(daemon.delete(f"/v1/ssh-keys/{made[1]['id']}", key=user.key), 404, "not_found")
    assert [k["id"] for k in daemon.get("/v1/ssh-keys", key=user.key).json()["data"]] == \
        [k["id"] for k in made if k is not made[1]]
    # A deleted key may be added again.
    again = add_key(daemon, user, made[1]["public_key"])
    assert again["fingerprint"] == made[1]["fingerprint"] and again["id"] != made[1]["id"]


def test_bad_list_queries(daemon, user):
    assert_error(daemon.get("/v1/ssh-keys", key=user.key, params={"limit": 0}), 400, "invalid_query", "limit")
    assert_error(daemon.get("/v1/ssh-keys", key=user.key, params={"limit": 101}), 400, "invalid_query", "limit")
    assert_error(daemon.get("/v1/ssh-keys", key=user.key, params={"cursor": "zz"}), 400, "invalid_query", "cursor")
    assert_error(daemon.get("/v1/ssh-keys", key=user.key, params={"sort": "x"}), 400, "invalid_query", "sort")


def test_rsa_under_2048_bits_is_refused(daemon, user, tmp_path):
    line, _ = keygen(tmp_path, "rsa", 1024)
    err = assert_error(daemon.post("/v1/ssh-keys", key=user.key, json={"name": "old", "public_key": line}),
                       400, "invalid_field", "public_key")
    assert "at least 2048 bits" in err["message"] and "1024" in err["message"], err


def test_malformed_keys_are_refused_with_why(daemon, user, tmp_path):
    ed, _ = keygen(tmp_path)
    rsa, _ = keygen(tmp_path, "rsa", 2048)
    ed_type, ed_blob = ed.split(" ")[:2]
    cases = [
        (f"ssh-rsa {ed_blob}", "another type"),                     # type and blob disagree
        (f"ecdsa-sha2-nistp256 {ed_blob}", "another type"),
        (f"{ed_type} {ed_blob[:-7]}", "base64"),                    # cut inside a base64 group
        (f"{ed_type} {ed_blob[:40]}", "truncated"),                 # cut at a group boundary
        (f"{ed_type} {ed_blob[:-4]}*AAA", "base64"),
        ("ssh-dss AAAAB3NzaC1kc3MAAACBAP8=", "unsupported key type ssh-dss"),
        (f"command=\"ls\" {ed}", "unsupported key type"),
        ("", "empty"),
        ("ssh-ed25519", "no key"),
        (f"{ed}\n{rsa}", "line breaks"),
    ]
    for line, why in cases:
        err = assert_error(daemon.post("/v1/ssh-keys", key=user.key, json={"name": "bad", "public_key": line}),
                           400, "invalid_field", "public_key")
        assert why in err["message"], (line, err)
    assert daemon.get("/v1/ssh-keys", key=user.key).json()["data"] == []


def test_duplicates_are_refused_per_user(daemon, user, tmp_path):
    line, _ = keygen(tmp_path, comment="one")
    k = add_key(daemon, user, line)
    type_, blob, _ = line.split(" ")
    err = assert_error(daemon.post("/v1/ssh-keys", key=user.key,
                                   json={"name": "again", "public_key": f"{type_} {blob} other comment"}),
                       409, "ssh_key_exists", "public_key")
    assert err["id"] == k["id"] and k["fingerprint"] in err["message"], err
    other = daemon.signup()
    assert add_key(daemon, other, line)["fingerprint"] == k["fingerprint"]


def test_max_keys_per_user(new_daemon, tmp_path):
    d = new_daemon(options={"max_ssh_keys_per_user": "2"})
    u = d.signup()
    for i in range(2):
        add_key(d, u, keygen(tmp_path)[0])
    err = assert_error(d.post("/v1/ssh-keys", key=u.key, json={"name": "3", "public_key": keygen(tmp_path)[0]}),
                       409, "ssh_key_limit", None)
    assert err["limit"] == 2 and "max_ssh_keys_per_user" in err["message"], err
    assert len(d.get("/v1/ssh-keys", key=u.key).json()["data"]) == 2


def test_another_users_keys_are_not_found(daemon, user, tmp_path):
    k = add_key(daemon, user, keygen(tmp_path)[0])
    other = daemon.signup()
    assert_error(daemon.get(f"/v1/ssh-keys/{k['id']}", key=other.key), 404, "not_found")
    assert_error(daemon.delete(f"/v1/ssh-keys/{k['id']}", key=other.key), 404, "not_found")
    assert daemon.get("/v1/ssh-keys", key=other.key).json()["data"] == []
    assert daemon.get(f"/v1/ssh-keys/{k['id']}", key=user.key).status_code == 200
    for bad in ("sshk_nope", "key_" + k["id"][5:], "x" * 300):
        assert_error(daemon.get(f"/v1/ssh-keys/{bad}", key=user.key), 404, "not_found")
    assert_error(daemon.get("/v1/ssh-keys"), 401, "unauthorized")
    assert_error(daemon.post("/v1/ssh-keys", json={"name": "x", "public_key": "y"}), 401, "unauthorized")


BAD_BODIES = [
    (b"{", 400, "malformed_json", None),
    (b"[]", 400, "not_an_object", None),
    (json.dumps({"name": "x"}).encode(), 400, "missing_field", "public_key"),
    (json.dumps({"public_key": "x"}).encode(), 400, "missing_field", "name"),
    (json.dumps({"name": 5, "public_key": "x"}).encode(), 400, "invalid_field", "name"),
    (json.dumps({"name": "x", "public_key": ["x"]}).encode(), 400, "invalid_field", "public_key"),
    (json.dumps({"name": "x", "public_key": "x", "admin": True}).encode(), 400, "unknown_field", "admin"),
    (json.dumps({"name": "", "public_key": "x"}).encode(), 400, "invalid_field", "name"),
    (json.dumps({"name": "n" * 65, "public_key": "x"}).encode(), 400, "invalid_field", "name"),
    (json.dumps({"name": "tab\there", "public_key": "x"}).encode(), 400, "invalid_field", "name"),
    (json.dumps({"name": "x", "public_key": "ssh-rsa " + "A" * 16400}).encode(), 400, "invalid_field", "public_key"),
    (b'{"name": "x", "public_key": "' + b"A" * (2 << 20) + b'"}', 413, "body_too_large", None),
]


@pytest.mark.parametrize("body,status,code,field", BAD_BODIES, ids=range(len(BAD_BODIES)))
def test_bad_bodies(daemon, user, body, status, code, field):
    r = daemon.post("/v1/ssh-keys", key=user.key, data=body, headers={"Content-Type": "application/json"})
    assert_error(r, status, code, field)
    assert daemon.get("/v1/ssh-keys", key=user.key).json()["data"] == []
