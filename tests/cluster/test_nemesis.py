"""Each nemesis really injects its fault (a chaos tool is only as good as its faults)."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Callable

import pytest

from chaos.history import History, read
from chaos.nemesis import NEMESES, Target
from synapse.client.master_client import ClientError, ClusterUnavailable
from synapse.core import codec
from synapse.local import cluster as local
from synapse.local import netns
from synapse.worker import fence
from tests.support.helpers import spec

pytestmark = pytest.mark.slow
NO_NETNS = netns.unavailable()


@pytest.fixture
def target(make_cluster, tmp_path):
    cluster = make_cluster(workers=2, racks=1)
    t = Target(cluster.data_dir, cluster.state, cluster.client, downtime=0.5, pause=1.5)
    t.wait_leader()
    return t, History(tmp_path / "h.jsonl"), tmp_path / "h.jsonl"


def converge(t: Target, timeout: float) -> None:
    """Wait (bounded) until every master applied the same commands to the same state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        digests = {(r.commands_applied, r.digest) for r in
                   (t.client.replica_status(m["api_address"], digest=True) for m in t.state["masters"])}
        if len(digests) == 1:
            return
        time.sleep(0.2)
    raise AssertionError(f"replicas did not converge: {digests}")


def pids(t: Target, kind: str) -> dict[str, int]:
    return {p["id"]: p["pid"] for p in t.state[kind]}


def watched(inject: Callable[[], dict], sample: Callable[[], None], every: float) -> dict:
    """Inject a fault while a thread calls `sample` every `every` seconds; the fault's record."""
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            sample()
            time.sleep(every)

    w = threading.Thread(target=watch)
    w.start()
    try:
        return inject()
    finally:
        stop.set()
        w.join()


def test_kill_leader_kills_it_and_a_new_leader_serves(target):
    t, history, path = target
    before = t.leader()
    old_pid = before["pid"]
    fault = NEMESES["kill-leader"](t, random.Random(1), history)
    assert fault["targets"] == [before["id"]]
    assert not local.is_alive(old_pid) and pids(t, "masters")[before["id"]] != old_pid  # killed, then restarted
    assert t.client.list_nodes() is not None  # served by a leader elected meanwhile
    history.close()
    assert [r["kind"] for r in read(path) if r["type"] == "fault"] == ["kill-leader"]


def test_kill_follower_and_minority_restart_new_processes(target):
    t, history, _ = target
    before = pids(t, "masters")
    f1 = NEMESES["kill-follower"](t, random.Random(2), history)
    middle = pids(t, "masters")
    f2 = NEMESES["kill-minority"](t, random.Random(3), history)
    after = pids(t, "masters")
    for victim, old, new in [(v, before, middle) for v in f1["targets"]] + [(v, middle, after) for v in f2["targets"]]:
        assert not local.is_alive(old[victim]) and new[victim] != old[victim]
    assert len(f2["targets"]) == 1  # a minority of 3


def test_pause_leader_stops_the_process_then_resumes_it(target):
    t, history, _ = target
    leader = t.leader()
    states = []

    def watch():
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            with open(f"/proc/{leader['pid']}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
            time.sleep(0.05)

    w = threading.Thread(target=watch)
    w.start()
    NEMESES["pause-leader"](t, random.Random(4), history)
    w.join()
    assert "T" in states  # stopped while paused
    with open(f"/proc/{leader['pid']}/stat") as f:
        assert f.read().rsplit(")", 1)[1].split()[0] != "T"  # resumed


def test_kill_worker_takes_its_tasks_down_and_restart_worker_keeps_them(target):
    t, history, path = target
    long_job = dataclasses.replace(spec(tasks=2, gpu=8, name="victim"), command=("sleep", "60"))
    job_id = t.client.submit(codec.job_spec_to_proto(long_job))
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not all(t.worker_tasks(w) for w in t.state["workers"]):
        time.sleep(0.05)
    running = {w["id"]: [pid for _, pid in t.worker_tasks(w)] for w in t.state["workers"]}
    # restart-worker: agent dies alone, tasks live on.
    fault = NEMESES["restart-worker"](t, random.Random(5), history)
    survivor = fault["targets"][0]
    assert all(local.is_alive(p) for p in running[survivor])
    # kill-worker: the machine dies, tasks included.
    fault = NEMESES["kill-worker"](t, random.Random(6), history)
    dead = fault["targets"][0]
    assert not any(local.is_alive(p) for p in running[dead])
    history.close()
    lost = [r for r in read(path) if r["type"] == "task" and r["event"] == "lost"]
    assert lost and {r["job"] for r in lost} == {job_id}


def test_restart_masters_replaces_every_process(target):
    t, history, _ = target
    before = pids(t, "masters")
    NEMESES["restart-masters"](t, random.Random(7), history)
    after = pids(t, "masters")
    assert all(after[m] != before[m] for m in before)
    assert t.wait_leader() is not None


@pytest.mark.skipif(bool(NO_NETNS), reason=f"partition-leader cannot run here: {NO_NETNS}")
def test_partition_leader_cuts_the_leader_off_from_its_peers_only(make_cluster, tmp_path):
    cluster = make_cluster(netns=True)
    t = Target(cluster.data_dir, cluster.state, cluster.client, partition=4.0)
    old = t.wait_leader()
    old_pid = old["pid"]
    net = netns.MasterNet.from_dict(t.state["netns"])
    seen: list[tuple[str, str, bool]] = []  # (replica, state, isolated) as a client saw them
    submitted_while_cut_off = []
    stop = threading.Event()

    def watch():
        writer = cluster.new_client(deadline=2)
        while not stop.is_set():
            try:
                job = writer.submit(codec.job_spec_to_proto(spec(tasks=1, gpu=0, name="during")))
                if net.isolated(old["id"]):
                    submitted_while_cut_off.append(job)
            except (ClientError, ClusterUnavailable):
                pass
            isolated = net.isolated(old["id"])
            for m in t.state["masters"]:
                try:
                    seen.append((m["id"], t.client.replica_status(m["api_address"], timeout=0.5).state, isolated))
                except Exception:  # noqa: BLE001 - a replica busy electing: try again
                    pass
            time.sleep(0.1)
        writer.close()

    w = threading.Thread(target=watch)
    w.start()
    try:
        fault = NEMESES["partition-leader"](t, random.Random(8), History(tmp_path / "p.jsonl"))
    finally:
        stop.set()
        w.join()
    assert fault["targets"] == [old["id"]]
    cut_off = [(r, s) for r, s, isolated in seen if isolated]
    assert any(r == old["id"] for r, _ in cut_off)  # the cut-off leader still answers clients
    assert any(r != old["id"] and s == "leader" for r, s in cut_off)  # the others elected a new leader
    assert submitted_while_cut_off  # and clients found it (the cut-off replica sends them away)
    assert pids(t, "masters")[old["id"]] == old_pid and local.is_alive(old_pid)  # not killed, only cut off
    assert not net.isolated(old["id"])
    job_id = t.client.submit(codec.job_spec_to_proto(spec(tasks=1, gpu=0, name="after")))
    converge(t, 20)  # healed: the old leader catches up with the new log
    assert t.client.get_job(job_id).id == job_id


@pytest.mark.skipif(bool(NO_NETNS), reason=f"partition-follower cannot run here: {NO_NETNS}")
def test_partition_follower_cuts_a_follower_off_and_its_return_keeps_the_leader(make_cluster, tmp_path):
    cluster = make_cluster(netns=True)
    t = Target(cluster.data_dir, cluster.state, cluster.client, partition=3.0)
    leader = t.wait_leader()
    term = t.term(leader)
    net = netns.MasterNet.from_dict(t.state["netns"])
    cut_off: list[str] = []
    fault = watched(lambda: NEMESES["partition-follower"](t, random.Random(9), History(tmp_path / "f.jsonl")),
                    lambda: cut_off.extend(m["id"] for m in t.state["masters"] if net.isolated(m["id"])), 0.2)
    victim = fault["targets"][0]
    assert victim != leader["id"] and set(cut_off) == {victim}  # a follower, and only it, was cut off
    assert fault["detail"] == {"seconds": 3.0, "victim_term_rose": False, "changed_during_cut": False,
                               "no_leader_at_heal": False, "leader_changed": False}
    assert t.wait_leader()["id"] == leader["id"] and t.term(t.master_by_id(victim)) == term


@pytest.mark.skipif(bool(NO_NETNS), reason=f"membership faults run on a netns cluster here: {NO_NETNS}")
def test_membership_faults_grow_shrink_and_replace_and_end_with_the_same_members(make_cluster, tmp_path):
    cluster = make_cluster(netns=True, spare_masters=2)
    t = Target(cluster.data_dir, cluster.state, cluster.client, downtime=0.5)
    t.wait_leader()
    members = t.members()
    history = History(tmp_path / "m.jsonl")
    grow = NEMESES["grow-shrink"](t, random.Random(10), history)
    assert grow["targets"] == ["m4", "m5"] and grow["detail"]["grown_to"] == 5
    assert grow["detail"]["members"] == members and [m["id"] for m in t.state["masters"]] == ["m1", "m2", "m3"]
    old = pids(t, "masters")
    replace = NEMESES["replace-follower"](t, random.Random(11), history)
    victim = replace["targets"][0]
    assert replace["detail"]["members"] == members
    assert not local.is_alive(old[victim]) and pids(t, "masters")[victim] != old[victim]
    job_id = t.client.submit(codec.job_spec_to_proto(spec(tasks=1, gpu=0, name="after")))
    converge(t, 30)  # the replaced replica, started empty, catches up with the others
    # A membership fault that failed half-way (a replica removed, never added back): the runner's
    # heal puts the members back as they started.
    initial = [dict(m) for m in t.state["masters"]]
    t.remove_master("m3")
    assert t.members() != members
    t.restore_members(initial)
    assert t.members() == members and sorted(m["id"] for m in t.state["masters"]) == ["m1", "m2", "m3"]
    assert t.client.get_job(job_id).id == job_id


def test_restart_database_stops_the_store_then_starts_it_again(postgres, tmp_path):
    import psycopg

    def answers() -> bool:
        try:
            with psycopg.connect(f"host=127.0.0.1 port={postgres.port} user=postgres dbname=postgres",
                                 connect_timeout=1):
                return True
        except psycopg.OperationalError:
            return False

    target = Target(tmp_path, {"masters": [], "workers": []}, None, database=postgres, db_downtime=1.0)
    history = History(tmp_path / "h.jsonl")
    assert answers()
    seen_down = []
    fault = threading.Thread(target=lambda: NEMESES["restart-database"](target, random.Random(1), history))
    fault.start()
    while fault.is_alive():
        seen_down.append(not answers())
        time.sleep(0.1)
    fault.join()
    history.close()
    assert any(seen_down) and answers()
    assert [r["kind"] for r in read(tmp_path / "h.jsonl") if r["type"] == "fault"] == ["restart-database"]


def test_masters_in_namespaces_are_refused_a_store_on_loopback(tmp_path):
    """A chaos run with database and partition faults gave its masters (each in a network namespace
    with a loopback of its own) a store on 127.0.0.1: no master ever reached it and no job was
    archived. `up` now refuses that before it builds anything."""
    import click

    url = "postgresql+psycopg://postgres@127.0.0.1:5432/history"
    with pytest.raises(click.ClickException, match="cannot reach a database on loopback"):
        local.up(tmp_path, 3, 1, 1, 1, 45000, netns=True, history=url)
    assert not (tmp_path / local.NETNS_LEDGER).exists() and not (tmp_path / "cluster.json").exists()


def test_the_store_socket_url_reaches_the_same_database(postgres):
    import sqlalchemy as sa

    from synapse.history.store import check_url

    postgres.create("by_socket")
    engine = sa.create_engine(check_url(postgres.socket_url("by_socket")))
    try:
        with engine.connect() as conn:
            over_socket, db = conn.execute(sa.text("select inet_server_addr() is null, current_database()")).one()
    finally:
        engine.dispose()
    assert over_socket and db == "by_socket"


def test_alive_during_sees_a_task_by_its_shim_or_any_process_of_its_group():
    import os
    import signal
    import subprocess
    from pathlib import Path

    from chaos.nemesis import alive_during, task_alive
    from synapse.worker.fence import process_start_ticks

    shim = subprocess.Popen(["sh", "-c", "sleep 30 & wait"], start_new_session=True)
    try:
        ticks = process_start_ticks(shim.pid)
        children = Path(f"/proc/{shim.pid}/task/{shim.pid}/children")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not children.read_text().strip():  # its sleep started
            time.sleep(0.02)
        assert task_alive(shim.pid, ticks)
        shim.kill()  # the shim alone: its child sleeps on in the group
        shim.wait()
        assert not local.is_alive(shim.pid) and task_alive(shim.pid, ticks)
        assert alive_during({"t": (shim.pid, ticks)}, 0.2) == ["t"]
        os.killpg(shim.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and task_alive(shim.pid, ticks):
            time.sleep(0.02)
        assert alive_during({"t": (shim.pid, ticks)}, 0.2) == []
    finally:
        try:
            os.killpg(shim.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_kill_agent_under_gang_kills_the_agent_alone_and_watches_the_old_attempt(make_cluster, tmp_path):
    """The fault kill -9s one node's agent under a running gang and nothing else: the task it left
    was seen alive after the agent was gone (the nemesis did not kill it; only the node's fence
    may), the agent stayed down until the gang ran on other nodes, and came back."""
    from pathlib import Path

    from chaos.nemesis import task_alive

    cluster = make_cluster(workers=3, racks=1)
    t = Target(cluster.data_dir, cluster.state, cluster.client, fence_watch=1.0)
    t.wait_leader()
    agents = pids(t, "workers")
    samples: list[tuple[set[str], set[str]]] = []  # (agents alive, NODE/TASK whose processes are alive)

    def sample():
        alive = set()
        for node in Path(t.data_dir, "workers").iterdir():
            for shim in fence.shims(node / "tasks"):
                if task_alive(shim.pid, shim.start_ticks):
                    alive.add(f"{node.name}/{shim.task}")
        samples.append(({w for w, pid in agents.items() if local.is_alive(pid)}, alive))

    fault = watched(lambda: NEMESES["kill-agent-under-gang"](t, random.Random(3), History(tmp_path / "a.jsonl")),
                    sample, 0.05)
    d = fault["detail"]
    assert "skipped" not in d, d
    [node] = fault["targets"]
    own = f"{node}/{d['job']}.{d['attempt']}."  # the task of the earlier attempt on the killed node
    assert any(node not in agents_alive and any(name.startswith(own) for name in alive)
               for agents_alive, alive in samples), "the nemesis killed the task with its agent"
    assert all(set(agents) - {node} <= agents_alive for agents_alive, _ in samples)  # the other agents untouched
    assert not local.is_alive(agents[node]) and pids(t, "workers")[node] != agents[node]  # killed, then restarted
    assert d["old_tasks"] == 2 and d["restarted"] and node not in d["restarted_nodes"] and d["repaired"], d
    assert all(n.startswith(f"{d['job']}.{d['attempt']}.") for n in d["old_alive"]), d
