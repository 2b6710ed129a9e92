"""test_ports.py: published ports with a real daemon and sim fleets. An
instance asks for container ports at create; placement gives each a host
port of its node from the range the node's agent reports; the instance
shows them per rank as host:port; the sim agent relays a connection there
only to a process of that workload listening on the container port (a
python http.server started inside rank 0 through the real `ssh` client),
and closes it otherwise, also when something outside the workload listens.
Two instances on one node get different host ports, a full or missing range
refuses placement clearly, and bad `ports` values change nothing.

The sim's containers share this machine's network, so the container ports
are free ports of this machine rather than fixed numbers like 8000, and
each fleet gets a host port range found free here."""
import socket
import subprocess
import time

import pytest
import requests

from agent_util import assert_error, poll
from ports import free_port, free_range
from instances_util import DEADLINE, cloud  # noqa: F401  (fixture)
from test_access_flow import SSH_SIM, Renter


def publishing(nodes_per_fleet, per_node=100):
    first, last = free_range(nodes_per_fleet * per_node)
    return {**SSH_SIM, "publish_port_range": f"{first}-{last}", "sim_publish_ports_per_node": str(per_node)}


def node_range(cloud, name):
    """The node's publish range as stored, checked against what the admin's
    node view shows (the range an operator opens in the firewall)."""
    stored = tuple(cloud.d.sql("SELECT id, publish_first, publish_last FROM nodes WHERE name = ?", [name])[0])
    shown = cloud.admin("GET", f"/v1/admin/nodes/{stored[0]}").json()["publish_range"]
    assert shown == (None if stored[1] is None else {"first": stored[1], "last": stored[2]}), (stored, shown)
    return stored[1:]


def web_servers(port):
    """Pids of this machine's `http.server <port>` processes."""
    out = subprocess.run(["pgrep", "-f", f"http.server {port} --bind"], capture_output=True, text=True)
    return out.stdout.split()


def refused(address):
    """The published port takes the connection and closes it, sending nothing."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as s:
        s.settimeout(20)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        try:
            return s.recv(100) == b""
        except ConnectionResetError:
            return True


def test_a_port_of_the_workload_is_reached_and_nothing_else(cloud, tmp_path):
    sim = publishing(2)
    f = cloud.fleet(2, sim=sim)
    me = Renter(cloud, tmp_path, "me")
    web, idle, outside = free_port(), free_port(), free_port()
    inst = cloud.create(me.acct, card_count=1, ports=[web, idle, outside])
    assert inst["ports"] == [web, idle, outside]
    ranks = me.ranks(inst["id"])
    me.known_hosts(ranks)
    [rank] = ranks
    first, last = node_range(cloud, rank["node_name"])
    published = rank["published"]
    assert [p["container_port"] for p in published] == [web, idle, outside], published
    host = rank["ssh"]["host"]
    for p in published:
        assert p["host"] == host and first <= p["host_port"] <= last, (p, first, last)
        assert p["address"] == f"{host}:{p['host_port']}"
    assert len({p["host_port"] for p in published}) == 3
    # Each node of the fleet publishes on its own slice of the range.
    ranges = sorted(node_range(cloud, name) for name in f.nodes)
    assert ranges[0][1] < ranges[1][0], ranges

    # A web server inside rank 0, started through the real ssh client.
    start = me.ssh(rank, f"echo hello-from-the-workload > hello.txt; "
                         f"setsid nohup python3 -m http.server {web} --bind 127.0.0.1 >/dev/null 2>&1 < /dev/null & "
                         f"echo started")
    assert start.returncode == 0 and start.stdout == "started\n", start
    address = published[0]["address"]

    def served():
        try:
            r = requests.get(f"http://{address}/hello.txt", timeout=10)
        except requests.ConnectionError:
            return None
        return r if r.status_code == 200 else None
    r = poll(served, DEADLINE, f"the workload's web server at {address}")
    assert r.text == "hello-from-the-workload\n"

    # A port nobody listens on, and one a process outside the workload
    # listens on: the connection is closed unanswered.
    assert refused(published[1]["address"])
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", outside))
        listener.listen(4)
        assert refused(published[2]["address"])
        listener.settimeout(0)
        with pytest.raises(BlockingIOError):
            listener.accept()

    # Another user sees nothing of it.
    other = cloud.user()
    assert_error(cloud.d.get(f"/v1/instances/{inst['id']}", key=other.key), 404, "not_found")

    # Stopped: nothing published any more, and the host ports are free again.
    cloud.action(me.acct, inst["id"], "stop")
    stopped = cloud.wait_state(me.acct, inst["id"], "stopped")
    assert stopped["ports"] == [web, idle, outside] and stopped["nodes"] == []
    assert cloud.d.sql("SELECT count(*) FROM node_ports")[0][0] == 0

    def closed():
        try:
            requests.get(f"http://{address}/hello.txt", timeout=5)
        except requests.ConnectionError:
            return True
        return None
    poll(closed, DEADLINE, "the published port to close after the stop")
    # The web server the session left behind (setsid, out of every group the
    # agent started) went with the container, as in a real one.
    poll(lambda: not web_servers(web), DEADLINE, "the workload's web server to end with its container")

    # Started again: placement gives it host ports anew.
    cloud.action(me.acct, inst["id"], "start")
    again = cloud.wait_state(me.acct, inst["id"], "running")
    assert [p["container_port"] for p in again["nodes"][0]["published"]] == [web, idle, outside]
    cloud.action(me.acct, inst["id"], "terminate")
    cloud.wait_state(me.acct, inst["id"], "terminated")

    # A 16-card instance: every rank publishes on its own node's range.
    big = cloud.create(me.acct, card_count=16, ports=[web])
    ranks = cloud.wait_state(me.acct, big["id"], "running")["nodes"]
    assert len(ranks) == 2
    for r in ranks:
        first, last = node_range(cloud, r["node_name"])
        [p] = r["published"]
        assert p["container_port"] == web and first <= p["host_port"] <= last, (p, first, last)


def test_two_instances_on_one_node_get_different_host_ports(cloud, tmp_path):
    f = cloud.fleet(1, sim=publishing(1))
    [name] = f.nodes
    acct = cloud.user()
    port = free_port()
    a = cloud.create(acct, card_count=1, ports=[port])
    b = cloud.create(acct, card_count=1, ports=[port])
    ra = cloud.wait_state(acct, a["id"], "running")["nodes"][0]
    rb = cloud.wait_state(acct, b["id"], "running")["nodes"][0]
    assert ra["node_name"] == rb["node_name"] == name
    ha, hb = ra["published"][0]["host_port"], rb["published"][0]["host_port"]
    first, last = node_range(cloud, name)
    assert ha != hb and first <= ha <= last and first <= hb <= last
    rows = cloud.d.sql("SELECT host_port, container_port FROM node_ports ORDER BY host_port")
    assert sorted([tuple(r) for r in rows]) == sorted([(ha, port), (hb, port)])
    # The spec each agent got carries its own host port.
    for inst, host_port in ((a, ha), (b, hb)):
        wl = [w for w in cloud.workloads(name) if w["id"] == cloud.d.sql(
            "SELECT workload_id FROM instance_nodes WHERE instance_id = ?", [inst["id"]])[0][0]][0]
        assert cloud.record(name, wl["id"])["spec"]["ports"] == [{"container": port, "host": host_port}]


def test_a_full_or_missing_range_refuses_placement(cloud, tmp_path):
    sim = publishing(1, per_node=2)
    f = cloud.fleet(1, sim=sim)
    [name] = f.nodes
    first = int(sim["publish_port_range"].split("-")[0])
    assert node_range(cloud, name) == (first, first + 1)
    acct = cloud.user()
    a = cloud.create(acct, card_count=1, ports=[free_port(), free_port()])
    r = cloud.d.post("/v1/instances", key=acct.key,
                     json={"gpu_type": "MI450", "image": "rocm/pytorch:2.3-rocm6.2", "card_count": 1,
                           "ports": [free_port()]})
    assert r.status_code == 409, r.text
    err = r.json()["error"]
    assert err["code"] == "insufficient_capacity" and err["field"] == "ports", err
    assert "publish" in err["message"], err
    # Without ports the same cards are there to take.
    plain = cloud.create(acct, card_count=1)
    assert plain["ports"] == []
    # Terminated, the first one gives its host ports back.
    cloud.action(acct, a["id"], "terminate")
    cloud.wait_state(acct, a["id"], "terminated")
    poll(lambda: cloud.d.sql("SELECT count(*) FROM node_ports")[0][0] == 0, DEADLINE, "host ports released")
    cloud.create(acct, card_count=1, ports=[free_port()])

    # A node that publishes no ports takes no instance that asks for some.
    g = cloud.fleet(1, model="MI300X", sim={**SSH_SIM, "publish_port_range": ""})
    [bare] = g.nodes
    assert node_range(cloud, bare) == (None, None)
    r = cloud.d.post("/v1/instances", key=acct.key,
                     json={"gpu_type": "MI300X", "image": "rocm/pytorch:2.3-rocm6.2", "card_count": 1,
                           "ports": [8888]})
    assert r.status_code == 409 and r.json()["error"]["field"] == "ports", r.text
    cloud.create(acct, gpu_type="MI300X", card_count=1)


@pytest.mark.parametrize("ports", [
    "8000", 8000, {"port": 8000}, ["8000"], [8000.5], [True], [None], [[8000]], [0], [-1], [65536],
    [8000, 8000], list(range(8000, 8009)),
], ids=repr)
def test_bad_ports_are_refused_and_change_nothing(cloud, ports):
    acct = cloud.user()
    before = cloud.d.sql("SELECT count(*) FROM instances")[0][0]
    r = cloud.d.post("/v1/instances", key=acct.key,
                     json={"gpu_type": "MI450", "image": "rocm/pytorch:2.3-rocm6.2", "card_count": 1,
                           "ports": ports})
    err = assert_error(r, 400, "invalid_field")
    assert err["field"] == "ports", err
    assert cloud.d.sql("SELECT count(*) FROM instances")[0][0] == before
