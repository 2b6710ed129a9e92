"""What an instance runs, against a real daemon and sim agents: a job's
`command` and `env` really run (the sim starts the command as a process in
its container directory) and its output comes back through GET
/v1/instances/{id}/logs; an env entry marked secret reaches the process but
never any API reply (create, get, list, PATCH, events), the daemon's or the
agent's log, or the agent's GET /v1/workloads (which shows "***"); PATCH
changes what the next start runs and only while the instance is stopped,
and its name at any time before it is terminated;
every bad field is a 400 naming it; and the image policy: catalog only by
default, or any valid reference of an allowed registry."""
import os

import jsonschema
import pytest

from agent_util import poll
from harness import assert_error
from instances_util import DEADLINE, Cloud, cloud, cloud_with  # noqa: F401  (fixtures)
from openapi_check import Spec

IMAGE = "example/job:1"
SECRET = "s3cr3t-Xq9-do-not-leak"


def logs_text(c, u, inst_id):
    r = c.d.get(f"/v1/instances/{inst_id}/logs", key=u.key, params={"tail": 200})
    if r.status_code != 200:
        return ""
    return "\n".join(line["text"] for line in r.json()["data"])


def wait_log(c, u, inst_id, text):
    return poll(lambda: text in logs_text(c, u, inst_id) and logs_text(c, u, inst_id), DEADLINE,
                f"{text!r} in the logs of {inst_id}")


def job_env():
    return [{"name": "GREETING", "value": "world"},
            {"name": "HF_TOKEN", "value": SECRET, "secret": True},
            {"name": "EMPTY", "value": "", "secret": False}]


def test_a_job_runs_its_command_with_its_env_and_secrets_stay_secret(cloud):
    c = cloud
    fleet = c.fleet(1)
    c.add_image(IMAGE)
    u = c.user()
    # The command proves the secret arrived without holding it (or printing it).
    cmd = ["sh", "-c", 'echo "hello $GREETING"; case "$HF_TOKEN" in s3cr3t-*-do-not-leak) echo secret-arrived;;'
           ' esac; echo "cwd=$(pwd)"; ls /; echo oops >&2; sleep 60']
    body = {"gpu_type": "MI450", "card_count": 1, "image": IMAGE, "command": cmd, "env": job_env(),
            "working_dir": "/work/dir"}
    created = c.create(u, headers={"Idempotency-Key": "job-1"}, **body)
    replay = c.d.post("/v1/instances", key=u.key, json=body, headers={"Idempotency-Key": "job-1"})
    assert replay.status_code == 201 and replay.json()["id"] == created["id"], replay.text
    assert SECRET not in replay.text
    assert created["command"] == cmd
    assert created["working_dir"] == "/work/dir"
    assert created["env"] == [{"name": "GREETING", "value": "world", "secret": False},
                              {"name": "HF_TOKEN", "secret": True},
                              {"name": "EMPTY", "value": "", "secret": False}]
    inst = c.wait_state(u, created["id"], "running")
    text = wait_log(c, u, inst["id"], "secret-arrived")
    assert "hello world" in text
    assert "oops" in text  # stderr too
    # The working directory is mapped under the simulated container's.
    wl = c.get(u, inst["id"])["nodes"][0]
    cwd_line = [t for t in text.splitlines() if t.startswith("cwd=")][0]
    assert cwd_line.endswith("/containers/" + c.d.sql("SELECT workload_id FROM instance_nodes WHERE instance_id = ?",
                                                       (inst["id"],))[0][0] + "/work/dir"), cwd_line
    assert "usr" in text.split()  # `ls /` ran
    # The agent shows the spec's env with the secret masked.
    node = wl["node_name"]
    [w] = c.workloads(node)
    assert w["command"] == cmd
    assert w["env"]["GREETING"] == "world" and w["env"]["HF_TOKEN"] == "***"
    # Nowhere in what the API says.
    replies = [created, c.get(u, inst["id"]),
               c.d.get("/v1/instances", key=u.key).json(),
               c.d.get(f"/v1/instances/{inst['id']}/events", key=u.key).json(),
               c.agent(node, "GET", "/v1/workloads").json(),
               c.agent(node, "GET", f"/v1/workloads/{w['id']}").json()]
    for r in replies:
        assert SECRET not in str(r)
    # Stop: the process group goes; nothing is left running.
    c.action(u, inst["id"], "stop")
    c.wait_state(u, inst["id"], "stopped")
    stopped = c.get(u, inst["id"])
    assert SECRET not in str(stopped)
    # ... nor in any log line of the daemon and the agent.
    assert SECRET not in c.d.stderr_text()
    assert SECRET not in fleet.stderr_text() and SECRET not in fleet.stdout_text()
    # The idempotency record stores the reply, not the request.
    stored = c.d.sql("SELECT response FROM idempotency_keys")
    assert stored and all(SECRET not in text for (text,) in stored)


def test_patch_changes_what_the_next_start_runs_only_while_stopped(cloud):
    c = cloud
    c.fleet(1)
    c.add_image(IMAGE)
    u = c.user()
    inst = c.create(u, card_count=1, image=IMAGE, command=["sh", "-c", "echo first-run; sleep 60"])
    c.wait_state(u, inst["id"], "running")
    wait_log(c, u, inst["id"], "first-run")
    r = c.d.request("PATCH", f"/v1/instances/{inst['id']}", key=u.key, json={"command": ["true"]})
    assert_error(r, 409, "invalid_state")
    assert r.json()["error"].get("state") == "running" or "running" in r.text
    c.action(u, inst["id"], "stop")
    c.wait_state(u, inst["id"], "stopped")
    r = c.d.request("PATCH", f"/v1/instances/{inst['id']}", key=u.key,
                    json={"command": ["sh", "-c", 'echo "second-run $MODE"; sleep 60'],
                          "env": [{"name": "MODE", "value": "patched"},
                                  {"name": "TOKEN", "value": SECRET, "secret": True}],
                          "working_dir": "/shared/proj"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["command"][2].startswith("echo \"second-run")
    assert body["env"] == [{"name": "MODE", "value": "patched", "secret": False}, {"name": "TOKEN", "secret": True}]
    assert body["working_dir"] == "/shared/proj"
    assert SECRET not in r.text
    events = c.d.get(f"/v1/instances/{inst['id']}/events", key=u.key).json()["data"]
    assert any(e["reason"] == "changed by the user: command, env, working_dir" for e in events), events
    assert SECRET not in str(events)
    c.action(u, inst["id"], "start")
    c.wait_state(u, inst["id"], "running")
    text = wait_log(c, u, inst["id"], "second-run patched")
    assert "first-run" not in text
    # [] gives the image its own command back.
    c.action(u, inst["id"], "stop")
    c.wait_state(u, inst["id"], "stopped")
    r = c.d.request("PATCH", f"/v1/instances/{inst['id']}", key=u.key, json={"command": [], "env": []})
    assert r.status_code == 200, r.text
    assert r.json()["command"] is None and r.json()["env"] == []
    c.action(u, inst["id"], "start")
    c.wait_state(u, inst["id"], "running")
    wait_log(c, u, inst["id"], "sim: container started")
    # Another user's instance is not found, and nothing changed.
    other = c.user()
    c.action(u, inst["id"], "stop")
    c.wait_state(u, inst["id"], "stopped")
    r = c.d.request("PATCH", f"/v1/instances/{inst['id']}", key=other.key, json={"command": ["x"]})
    assert_error(r, 404, "not_found")
    assert c.get(u, inst["id"])["command"] is None
    # The job fields change the same way, each keeping the other.
    r = c.d.request("PATCH", f"/v1/instances/{inst['id']}", key=u.key,
                    json={"restart_policy": "on_failure", "max_runtime_minutes": 90})
    assert r.status_code == 200, r.text
    assert (r.json()["restart_policy"], r.json()["max_runtime_minutes"]) == ("on_failure", 90)
    r = c.d.request("PATCH", f"/v1/instances/{inst['id']}", key=u.key, json={"max_runtime_minutes": 0})
    assert (r.json()["restart_policy"], r.json()["max_runtime_minutes"]) == ("on_failure", None), r.text
    for field, bad in (("restart_policy", "sometimes"), ("restart_policy", 3), ("max_runtime_minutes", -1),
                       ("max_runtime_minutes", 43201), ("max_runtime_minutes", "10")):
        r = c.d.request("PATCH", f"/v1/instances/{inst['id']}", key=u.key, json={field: bad})
        assert_error(r, 400, "invalid_field", field)
    assert c.get(u, inst["id"])["restart_policy"] == "on_failure"



def test_an_instance_is_renamed_while_it_runs_and_not_once_terminated(cloud):
    c = cloud
    c.fleet(1)
    u = c.user()
    inst = c.create(u, card_count=1, name="first-try")
    c.wait_state(u, inst["id"], "running")
    r = c.d.request("PATCH", f"/v1/instances/{inst['id']}", key=u.key, json={"name": "llama-70b 微调 v2"})
    assert r.status_code == 200, r.text
    assert r.json()["name"] == "llama-70b 微调 v2" and r.json()["state"] == "running"
    assert c.get(u, inst["id"])["name"] == "llama-70b 微调 v2"
    listed = c.d.get("/v1/instances", key=u.key).json()["data"]
    assert [i["name"] for i in listed if i["id"] == inst["id"]] == ["llama-70b 微调 v2"]
    events = c.d.get(f"/v1/instances/{inst['id']}/events", key=u.key).json()["data"]
    assert any(e["reason"] == "changed by the user: name" and e["state"] == "running" for e in events), events
    # A rename leaves what runs alone: the workload is the same one.
    assert c.get(u, inst["id"])["state"] == "running"
    # A name with another field still needs the instance stopped, and
    # changes nothing while it runs.
    r = c.d.request("PATCH", f"/v1/instances/{inst['id']}", key=u.key, json={"name": "x", "command": ["true"]})
    assert_error(r, 409, "invalid_state")
    assert "command" in r.json()["error"]["message"]
    assert c.get(u, inst["id"])["name"] == "llama-70b 微调 v2"
    # Each bad name is a 400 naming it, and changes nothing.
    for bad in ("n" * 64, "名" * 22, 7, ["a"], {"a": 1}, True):
        r = c.d.request("PATCH", f"/v1/instances/{inst['id']}", key=u.key, json={"name": bad})
        assert_error(r, 400, "invalid_field", "name")
    other = c.user()
    r = c.d.request("PATCH", f"/v1/instances/{inst['id']}", key=other.key, json={"name": "mine now"})
    assert_error(r, 404, "not_found")
    assert c.get(u, inst["id"])["name"] == "llama-70b 微调 v2"
    # "" takes the label away, as at create.
    r = c.d.request("PATCH", f"/v1/instances/{inst['id']}", key=u.key, json={"name": ""})
    assert r.status_code == 200 and r.json()["name"] == "", r.text
    c.action(u, inst["id"], "terminate")
    c.wait_state(u, inst["id"], "terminated")
    r = c.d.request("PATCH", f"/v1/instances/{inst['id']}", key=u.key, json={"name": "after"})
    assert_error(r, 409, "invalid_state")
    assert c.get(u, inst["id"])["name"] == ""

@pytest.fixture
def local_volumes(new_daemon, tmp_path):
    """A Cloud whose volumes are directories of this test (the sim uses an
    absolute source as the volume's directory itself)."""
    c = Cloud(new_daemon, tmp_path, {"volume_source_template": str(tmp_path / "volumes" / "{volume_id}")})
    yield c
    c.close()


def test_a_command_exit_status_is_reported_and_shared_working_dir_maps_to_the_volume(local_volumes):
    c = local_volumes
    c.fleet(1)
    c.add_image(IMAGE)
    u = c.user()
    inst = c.create(u, card_count=1, image=IMAGE, working_dir="/shared/out",
                    command=["sh", "-c", "echo data > result.txt; pwd; exit 3"])
    # The agent's word on the exit (its status, from the real process)
    # reaches the instance when the control plane ends the run.
    ended = c.wait_state(u, inst["id"], ("stopped", "failed", "succeeded"))
    events = c.events(u, inst["id"])
    assert any("the command exited with status 3" in e["reason"] for e in events) or \
        "status 3" in ended["state_reason"], (ended, events)
    # The file is in the volume's directory, which other ranks and later
    # starts see at /shared.
    path = os.path.join(c.tmp, "volumes", inst["volume_id"], "out", "result.txt")
    assert open(path).read() == "data\n"


def test_a_command_that_cannot_start_fails_the_start(cloud):
    c = cloud
    c.fleet(1)
    c.add_image(IMAGE)
    u = c.user()
    inst = c.create(u, card_count=1, image=IMAGE, command=["no-such-program-xyz"])
    # The failed workload is deleted as soon as the reconciler sees it (the
    # attempt is retried elsewhere), so its phase is read from the event
    # that attempt left, not from the agent.
    def failed_attempt():
        return [e["reason"] for e in c.events(u, inst["id"]) if "attempt 1 failed" in (e["reason"] or "")]
    [reason] = poll(failed_attempt, DEADLINE, "the start to fail")
    assert "workload failed: run: no-such-program-xyz: executable file not found" in reason, reason


def test_a_failure_message_is_cut_between_characters(cloud):
    # The agent's message quotes the program ("run: PROGRAM: executable file
    # not found"); the daemon keeps 160 bytes of it in the reason, and 160
    # bytes of this one end inside a character. A reason cut there is not
    # UTF-8: the events held it and could not be listed, the instance could
    # not be shown.
    c = cloud
    c.fleet(1)
    c.add_image(IMAGE)
    u = c.user()
    program = "a" + "\u4ef7" * 66
    inst = c.create(u, card_count=1, image=IMAGE, command=[program])

    def failed_attempt():
        r = c.d.get(f"/v1/instances/{inst['id']}/events", key=u.key)
        assert r.status_code == 200, r.text
        return [e["reason"] for e in r.json()["data"] if "attempt 1 failed" in (e["reason"] or "")]
    [reason] = poll(failed_attempt, DEADLINE, "the start to fail")
    assert "workload failed: run: a\u4ef7" in reason, reason
    # Cut before the character that did not fit, not inside it.
    assert "\ufffd" not in reason and program not in reason, reason
    r = c.d.get(f"/v1/instances/{inst['id']}", key=u.key)
    assert r.status_code == 200, r.text


BAD_CREATE = [
    ({"command": "echo hi"}, "command"),
    ({"command": [1, 2]}, "command"),
    ({"command": [""]}, "command"),
    ({"command": ["x"] * 65}, "command"),
    ({"command": ["a" * 4097]}, "command"),
    ({"command": ["a" * 4000] * 9}, "command"),  # 36000 bytes in all
    ({"env": {"A": "b"}}, "env"),
    ({"env": ["A=b"]}, "env"),
    ({"env": [{"name": "A"}]}, "env"),
    ({"env": [{"name": "A", "value": 1}]}, "env"),
    ({"env": [{"name": "A", "value": "b", "secret": "yes"}]}, "env"),
    ({"env": [{"name": "A", "value": "b", "extra": 1}]}, "env"),
    ({"env": [{"name": "1A", "value": "b"}]}, "env"),
    ({"env": [{"name": "A-B", "value": "b"}]}, "env"),
    ({"env": [{"name": "A" * 128, "value": "b"}]}, "env"),
    ({"env": [{"name": "A", "value": "x" * 4097}]}, "env"),
    ({"env": [{"name": "A", "value": "two\nlines"}]}, "env"),
    ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "env"),
    ({"env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]}, "env"),
    ({"env": [{"name": "MASTER_ADDR", "value": "x"}]}, "env"),
    ({"env": [{"name": "GPURENT_ANYTHING", "value": "x"}]}, "env"),
    ({"env": [{"name": f"V{i}", "value": "x"} for i in range(65)]}, "env"),
    ({"working_dir": 5}, "working_dir"),
    ({"working_dir": "relative/dir"}, "working_dir"),
    ({"working_dir": "/a/../b"}, "working_dir"),
    ({"working_dir": "/" + "a" * 255}, "working_dir"),
    # A good env checked (and normalised) before a bad working_dir: the
    # copy was leaked (LeakSanitizer, at the daemon's exit).
    ({"env": [{"name": "A", "value": "b"}], "working_dir": "relative"}, "working_dir"),
]


def test_bad_fields_are_refused_naming_them_and_nothing_is_created(cloud):
    c = cloud
    c.fleet(1)
    c.add_image(IMAGE)
    u = c.user()
    for extra, field in BAD_CREATE:
        r = c.d.post("/v1/instances", key=u.key, json={"gpu_type": "MI450", "card_count": 1, "image": IMAGE, **extra})
        assert r.status_code == 400, (extra, r.text)
        assert r.json()["error"]["field"] == field, (extra, r.text)
        assert SECRET not in r.text
    # A NUL never gets past the JSON parser.
    r = c.d.post("/v1/instances", key=u.key, json={"gpu_type": "MI450", "card_count": 1, "image": IMAGE,
                                                   "command": ["a\u0000b"]})
    assert_error(r, 400, "malformed_json")
    assert c.d.get("/v1/instances", key=u.key).json()["data"] == []
    # The largest allowed values pass.
    big = c.create(u, card_count=1, image=IMAGE, command=["a" * 4096] * 8,
                   env=[{"name": f"V{i}", "value": "x" * 4096, "secret": i % 2 == 0} for i in range(64)],
                   working_dir="/" + "a" * 254)
    assert len(big["env"]) == 64 and big["working_dir"] == "/" + "a" * 254
    c.action(u, big["id"], "terminate")
    c.wait_state(u, big["id"], "terminated")
    # PATCH: the same checks, unknown fields, an empty body.
    inst = c.create(u, card_count=1, image=IMAGE)
    c.wait_state(u, inst["id"], "running")
    c.action(u, inst["id"], "stop")
    c.wait_state(u, inst["id"], "stopped")
    path = f"/v1/instances/{inst['id']}"
    for extra, field in BAD_CREATE:
        r = c.d.request("PATCH", path, key=u.key, json=extra)
        assert r.status_code == 400, (extra, r.text)
        assert r.json()["error"]["field"] == field, (extra, r.text)
    assert_error(c.d.request("PATCH", path, key=u.key, json={"card_count": 2}), 400, "unknown_field", "card_count")
    assert c.d.request("PATCH", path, key=u.key, json={}).status_code == 400
    assert_error(c.d.request("PATCH", path, key=u.key, json={"image": "nope:1"}), 400, "invalid_field", "image")
    assert_error(c.d.request("PATCH", "/v1/instances/ins_nosuchinstance0000000", key=u.key, json={"command": ["x"]}),
                 404, "not_found")
    after = c.get(u, inst["id"])
    assert after["command"] is None and after["env"] == [] and after["working_dir"] == "" and after["image"] == IMAGE


def test_the_catalog_policy_refuses_other_images(cloud):
    c = cloud
    c.fleet(1)
    u = c.user()
    r = c.d.post("/v1/instances", key=u.key, json={"gpu_type": "MI450", "card_count": 1, "image": "alpine:3.19"})
    assert_error(r, 400, "invalid_field", "image")
    body = c.d.get("/v1/images").json()
    assert body["image_policy"] == "catalog" and body["image_registries"] == []


registry_cloud = cloud_with(image_policy="registries", image_registries="docker.io, registry.example.com:5000")


def test_the_registries_policy_takes_any_valid_image_of_an_allowed_registry(registry_cloud):
    c = registry_cloud
    c.fleet(1)
    c.add_image(IMAGE)
    u = c.user()
    images = c.d.get("/v1/images").json()
    assert images["image_policy"] == "registries"
    assert images["image_registries"] == ["docker.io", "registry.example.com:5000"]
    assert images["data"][0]["ref"]  # the catalog's images are still listed
    for ref in ("alpine:3.19", "library/ubuntu", "docker.io/pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime",
                "registry.example.com:5000/team/train@sha256:" + "a" * 64):
        inst = c.create(u, card_count=1, image=ref)
        assert inst["image"] == ref
        c.action(u, inst["id"], "terminate")
    for ref, why in (("ghcr.io/org/img:1", "not allowed"), ("Alpine:3", "lowercase"),
                     ("alpine:-bad", "tag"), ("alpine@sha256:abc", "digest"), ("registry.example.com:99999/x", "registry"),
                     ("a//b", "name")):
        r = c.d.post("/v1/instances", key=u.key, json={"gpu_type": "MI450", "card_count": 1, "image": ref})
        assert_error(r, 400, "invalid_field", "image")
        assert why in r.json()["error"]["message"], (ref, r.text)
    # A user's own image may come in by PATCH too, while stopped.
    inst = c.create(u, card_count=1, image=IMAGE)
    c.wait_state(u, inst["id"], "running")
    c.action(u, inst["id"], "stop")
    c.wait_state(u, inst["id"], "stopped")
    r = c.d.request("PATCH", f"/v1/instances/{inst['id']}", key=u.key, json={"image": "team/own:2"})
    assert r.status_code == 200 and r.json()["image"] == "team/own:2", r.text
    r = c.d.request("PATCH", f"/v1/instances/{inst['id']}", key=u.key, json={"image": "ghcr.io/x/y:1"})
    assert_error(r, 400, "invalid_field", "image")
    assert c.get(u, inst["id"])["image"] == "team/own:2"


def test_a_job_lost_with_its_node_can_be_changed_and_started_again(cloud):
    """A node of a running 2-node job dies: the instance is lost and holds
    nothing, so, like a stopped one, its command can be changed (to resume
    from a checkpoint, say) and it can be started again on other nodes;
    it cannot be stopped first, so a PATCH must not ask for that."""
    c = cloud
    c.fleet(1, prefix="a-")
    b = c.fleet(1, prefix="b-")
    c.add_image(IMAGE)
    u = c.user()
    iid = c.create(u, card_count=16, image=IMAGE, command=["sh", "-c", "echo epoch-1; sleep 600"])["id"]
    c.wait_state(u, iid, "running")
    b.proc.kill()
    b.proc.wait()
    assert c.wait_state(u, iid, "lost")["nodes"] == []
    r = c.d.request("POST", f"/v1/instances/{iid}/stop", key=u.key)
    assert_error(r, 409, "invalid_state")
    r = c.d.request("PATCH", f"/v1/instances/{iid}", key=u.key,
                    json={"command": ["sh", "-c", "echo resumed-from-checkpoint; sleep 600"]})
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "lost" and r.json()["command"][2].startswith("echo resumed"), r.text
    c.fleet(1, prefix="c-")
    c.action(u, iid, "start")
    inst = c.wait_state(u, iid, "running")
    assert sorted(p["node_name"] for p in inst["nodes"]) == ["a-01", "c-01"], inst
    wait_log(c, u, iid, "resumed-from-checkpoint")
    c.action(u, iid, "terminate")
    c.wait_state(u, iid, "terminated")


@pytest.mark.parametrize("field, value", [
    ("working_dir", "/shared/run 1/ckpt"), ("working_dir", "/"), ("working_dir", "/a/./b/"), ("working_dir", "/..x"),
    ("working_dir", "/x../y"), ("working_dir", "/d\u00e9j\u00e0"), ("working_dir", ""),
    ("working_dir", "rel/dir"), ("working_dir", "/a/../b"), ("working_dir", "/.."), ("working_dir", "/a:b"),
    ("working_dir", "/a,b"), ("working_dir", "/a\tb"), ("working_dir", "/a\x7fb"),
    ("value", "a=b; $(x) 'q' \"q\" \\"), ("value", ""), ("value", " \t "), ("value", "line\nbreak"),
    ("value", "cr\rhere"), ("value", "nul\x00here"),
    ("word", "--flag=a b"), ("word", "nul\x00here"),
])
def test_the_documents_patterns_accept_what_the_api_accepts(cloud, field, value):
    """What a validator reads in docs/openapi.json about working_dir, an
    env value and a command word agrees with what PATCH (the same checks as
    create) accepts: a value the schema allows is taken, one it refuses is
    refused with 400 naming the field."""
    schemas = Spec().raw["components"]["schemas"]
    patch = schemas["InstancePatchRequest"]["properties"]
    body, schema = {
        "working_dir": ({"working_dir": value}, patch["working_dir"]),
        "value": ({"env": [{"name": "V", "value": value}]}, schemas["EnvVar"]["properties"]["value"]),
        "word": ({"command": ["sh", value]}, patch["command"]["items"]),
    }[field]
    allowed = jsonschema.Draft4Validator(schema).is_valid(value)
    cloud.fleet(1)
    cloud.add_image(IMAGE)
    u = cloud.user()
    iid = cloud.create(u, card_count=1, image=IMAGE)["id"]
    cloud.action(u, iid, "stop")
    cloud.wait_state(u, iid, "stopped")
    r = cloud.d.request("PATCH", f"/v1/instances/{iid}", key=u.key, json=body)
    if allowed:
        assert r.status_code == 200, (value, r.text)
    elif "\x00" in value:
        assert_error(r, 400, "malformed_json")  # the JSON reader refuses it before any field is looked at
    else:
        assert_error(r, 400, "invalid_field", "command" if field == "word" else "env" if field == "value" else field)
