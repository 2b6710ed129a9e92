"""test_agent_discovery.py: GPU facts from the real discovery path: the agent
runs stand-in amd-smi / nvidia-smi executables (first on PATH) that print the
recorded outputs in tests/data/discovery/, so facts show what the parsers
make of real tool output, a failed card is reported unhealthy, a tool that
starts failing later turns every card unhealthy, and a node whose discovery
never worked answers 503 rather than invent cards."""
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
    # for the main query, and fails the optional amd-smi version/metric ones.
    case "$(basename "$0") $1" in
    "amd-smi version"|"amd-smi metric") exit 1 ;;
    esac
    [ -f "$STANDIN_OUTPUT.fail" ] && { cat "$STANDIN_OUTPUT"; exit 9; }
    cat "$STANDIN_OUTPUT"
""").lstrip()


@pytest.fixture
def tool_agent(tmp_path):
    made = []

    def make(tool, recorded, **options):
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        path = bin_dir / tool
        path.write_text(TOOL)
        path.chmod(stat.S_IRWXU)
        output = tmp_path / "output"
        shutil.copy(os.path.join(DATA, recorded), output)
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               "STANDIN_OUTPUT": str(output)}
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
    assert [c["index"] for c in f["cards"]] == list(range(8))
    assert {c["model"] for c in f["cards"]} == {"MI450"}
    assert all(c["healthy"] for c in f["cards"])
    # PUT checks cards against what discovery found.
    assert a.put("/v1/workloads/wl_1", json={"image": "busybox", "gpus": [7]}).status_code == 201
    assert a.put("/v1/workloads/wl_2", json={"image": "busybox", "gpus": [8]}).status_code == 400


def test_nvidia_smi_lost_card_and_later_failure(tool_agent):
    a = tool_agent("nvidia-smi", "nvidia-smi-h100-x8-lost-card.csv")
    f = a.get("/v1/facts").json()
    assert (f["vendor"], f["stack"]) == ("NVIDIA", "CUDA")
    assert len(f["cards"]) == 8
    bad = [c for c in f["cards"] if not c["healthy"]]
    assert len(bad) == 1 and bad[0]["health_reason"]
    assert {c["model"] for c in f["cards"] if c["healthy"]} == {"H100-SXM"}

    # The driver falls over: every card the node had is now reported unhealthy.
    shutil.copy(os.path.join(DATA, "nvidia-smi-driver-down.txt"), a.output)
    open(str(a.output) + ".fail", "w").close()

    def all_down():
        cards = a.get("/v1/facts").json()["cards"]
        return len(cards) == 8 and not any(c["healthy"] for c in cards) and cards
    cards = poll(all_down, 20, "every card to turn unhealthy")
    assert all(c["health_reason"].startswith("discovery failed:") for c in cards)

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
