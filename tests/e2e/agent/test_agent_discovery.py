"""test_agent_discovery.py: GPU facts from the real discovery path: the agent
runs stand-in amd-smi / rocm-smi / nvidia-smi executables (first on PATH)
that print the recorded outputs in tests/data/discovery/, so facts show what
the parsers make of real tool output, with the driver and ROCm/CUDA versions
(nvidia-smi -q's header, $ROCM_PATH/.info/version for rocm-smi), a failed
card is reported unhealthy, a tool that starts failing later turns every card
unhealthy, and a node whose discovery never worked answers 503 rather than
invent cards. With discovery = config the versions are options."""
import os
import shutil
import stat
import textwrap

import pytest

from agent_util import REPO, Agent, assert_error, poll

DATA = os.path.join(REPO, "tests", "data", "discovery")

TOOL = textwrap.dedent(r"""
    #!/bin/sh
    # Stand-in GPU tool: prints the recorded output named in $STANDIN_OUTPUT
    # for the main query, fails the optional amd-smi version/metric ones, and
    # answers nvidia-smi -q with $STANDIN_QUERY if set.
    case "$(basename "$0") $1" in
    "amd-smi version"|"amd-smi metric") exit 1 ;;
    "nvidia-smi -q") [ -n "$STANDIN_QUERY" ] && exec cat "$STANDIN_QUERY"; exit 1 ;;
    esac
    [ -f "$STANDIN_OUTPUT.fail" ] && { cat "$STANDIN_OUTPUT"; exit 9; }
    cat "$STANDIN_OUTPUT"
""").lstrip()


@pytest.fixture
def tool_agent(tmp_path):
    made = []

    def make(tool, recorded, query=None, rocm_version=None, **options):
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        path = bin_dir / tool
        path.write_text(TOOL)
        path.chmod(stat.S_IRWXU)
        output = tmp_path / "output"
        shutil.copy(os.path.join(DATA, recorded), output)
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               "STANDIN_OUTPUT": str(output), "ROCM_PATH": str(tmp_path / "rocm")}
        if query:
            env["STANDIN_QUERY"] = os.path.join(DATA, query)
        if rocm_version:
            (tmp_path / "rocm" / ".info").mkdir(parents=True, exist_ok=True)
            (tmp_path / "rocm" / ".info" / "version").write_text(rocm_version)
        a = Agent(tmp_path / f"agent{len(made)}", env=env,
                  options={"discovery": tool, "discovery_interval_s": "1", **options})
        a.output = output
        made.append(a)
        return a
    yield make
    for a in made:
        a.stop()


def test_amd_smi_facts(tool_agent):
    a = tool_agent("amd-smi", "amd-smi-mi450-x8.txt")
    f = a.get("/v1/facts").json()
    assert (f["vendor"], f["stack"]) == ("AMD", "ROCm")
    assert (f["driver_version"], f["stack_version"]) == ("6.16.6", "7.2.0")
    assert [c["index"] for c in f["cards"]] == list(range(8))
    assert {c["model"] for c in f["cards"]} == {"MI450"}
    assert all(c["healthy"] for c in f["cards"])
    # PUT checks cards against what discovery found.
    assert a.put("/v1/workloads/wl_1", json={"image": "busybox", "gpus": [7]}).status_code == 201
    assert a.put("/v1/workloads/wl_2", json={"image": "busybox", "gpus": [8]}).status_code == 400


def test_nvidia_smi_lost_card_and_later_failure(tool_agent):
    a = tool_agent("nvidia-smi", "nvidia-smi-h100-x8-lost-card.csv", query="nvidia-smi-h100-x8-q-compute.txt")
    f = a.get("/v1/facts").json()
    assert (f["vendor"], f["stack"]) == ("NVIDIA", "CUDA")
    assert (f["driver_version"], f["stack_version"]) == ("550.90.07", "12.4")
    assert len(f["cards"]) == 8
    bad = [c for c in f["cards"] if not c["healthy"]]
    assert len(bad) == 1 and bad[0]["health_reason"]
    assert {c["model"] for c in f["cards"] if c["healthy"]} == {"H100-SXM"}

    etag = a.get("/v1/facts").headers["ETag"]
    # The driver falls over: every card the node had is now reported unhealthy.
    shutil.copy(os.path.join(DATA, "nvidia-smi-driver-down.txt"), a.output)
    open(str(a.output) + ".fail", "w").close()

    def all_down():
        cards = a.get("/v1/facts").json()["cards"]
        return len(cards) == 8 and not any(c["healthy"] for c in cards) and cards
    cards = poll(all_down, 20, "every card to turn unhealthy")
    assert all(c["health_reason"].startswith("discovery failed:") for c in cards)
    # The reply the heartbeat recorded is no longer confirmed: its ETag gets
    # the new facts.
    r = a.get("/v1/facts", headers={"If-None-Match": etag})
    assert r.status_code == 200 and r.headers["ETag"] != etag and not any(c["healthy"] for c in r.json()["cards"])

    # It comes back.
    os.unlink(str(a.output) + ".fail")
    shutil.copy(os.path.join(DATA, "nvidia-smi-h100-x8.csv"), a.output)
    poll(lambda: all(c["healthy"] for c in a.get("/v1/facts").json()["cards"]), 20, "the cards to recover")


def test_no_facts_until_discovery_works(tool_agent):
    a = tool_agent("amd-smi", "garbage.bin")
    err = assert_error(a.get("/v1/facts"), 503, "unavailable")
    assert "discovery" in err["message"]
    assert_error(a.put("/v1/workloads/wl_x", json={"image": "busybox", "gpus": [0]}), 503, "unavailable")
    assert a.get("/healthz", sign=False).status_code == 200
    shutil.copy(os.path.join(DATA, "amd-smi-mi300x-x8.txt"), a.output)
    f = poll(lambda: a.get("/v1/facts").status_code == 200 and a.get("/v1/facts").json(), 20, "facts")
    assert {c["model"] for c in f["cards"]} == {"MI300X"}


def test_rocm_smi_failed_card_and_versions(tool_agent):
    a = tool_agent("rocm-smi", "rocm-smi-mi250-x8-vram-na.json", rocm_version="6.0.2-115\n")
    f = a.get("/v1/facts").json()
    assert (f["vendor"], f["stack"]) == ("AMD", "ROCm")
    assert (f["driver_version"], f["stack_version"]) == ("6.3.6", "6.0.2")
    assert [c["index"] for c in f["cards"]] == list(range(8))
    bad = [c for c in f["cards"] if not c["healthy"]]
    assert [c["index"] for c in bad] == [5], f["cards"]
    assert bad[0]["health_reason"] == "rocm-smi cannot read the VRAM size"
    assert bad[0]["memory_gb"] == 0
    assert {c["model"] for c in f["cards"]} == {"MI250"}


def test_nvidia_smi_without_query_output_has_no_cuda_version(tool_agent):
    # -q fails (it is optional): the cards and the driver are still there.
    a = tool_agent("nvidia-smi", "nvidia-smi-h100-x8.csv")
    f = a.get("/v1/facts").json()
    assert (f["driver_version"], f["stack_version"]) == ("550.90.07", "")
    assert len(f["cards"]) == 8 and all(c["healthy"] for c in f["cards"])
    assert "skipping `nvidia-smi -q -d COMPUTE`" in a.stderr_text()


@pytest.mark.parametrize("model,options,versions", [
    ("MI450", {}, ("6.8.5", "6.2.0")),
    ("H100-SXM", {}, ("550.54.15", "12.4")),
    ("MI300X", {"inventory_driver_version": "6.10.5", "inventory_stack_version": "7.0.2"}, ("6.10.5", "7.0.2")),
    ("RTX4090", {"inventory_driver_version": "570.86.15", "inventory_stack_version": "12.8"}, ("570.86.15", "12.8")),
])
def test_configured_inventory_reports_configured_versions(tmp_path, model, options, versions):
    a = Agent(tmp_path / "a", options={"inventory_model": model, **options})
    try:
        f = a.get("/v1/facts").json()
        assert (f["driver_version"], f["stack_version"]) == versions
    finally:
        a.stop()
