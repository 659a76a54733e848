"""Each nemesis really injects its fault (a chaos tool is only as good as its faults)."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

from chaos.history import History, read
from chaos.nemesis import NEMESES, Target
from synapse import codec, local
from tests.helpers import spec

pytestmark = pytest.mark.slow


@pytest.fixture
def target(make_cluster, tmp_path):
    cluster = make_cluster(workers=2, racks=1)
    t = Target(cluster.data_dir, cluster.state, cluster.client, downtime=0.5, pause=1.5)
    t.wait_leader()
    return t, History(tmp_path / "h.jsonl"), tmp_path / "h.jsonl"


def pids(t: Target, kind: str) -> dict[str, int]:
    return {p["id"]: p["pid"] for p in t.state[kind]}


def test_kill_leader_kills_it_and_a_new_leader_serves(target):
    t, history, path = target
    before = t.leader()
    old_pid = before["pid"]
    fault = NEMESES["kill-leader"](t, random.Random(1), history)
    assert fault["targets"] == [before["id"]]
    assert not local._alive(old_pid) and pids(t, "masters")[before["id"]] != old_pid  # killed, then restarted
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
        assert not local._alive(old[victim]) and new[victim] != old[victim]
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

    import threading
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
    assert all(local._alive(p) for p in running[survivor])
    # kill-worker: the machine dies, tasks included.
    fault = NEMESES["kill-worker"](t, random.Random(6), history)
    dead = fault["targets"][0]
    assert not any(local._alive(p) for p in running[dead])
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
