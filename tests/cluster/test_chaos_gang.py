"""kill-worker-under-gang really kills a machine under a running gang (with a failover during its
restart), the gang restarts whole off the failed node, and the nemesis repairs what it brought back."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from chaos import checkers
from chaos.history import History, read
from chaos.nemesis import NEMESES, Target, repair
from synapse.local import cluster as local
from synapse.proto import api_pb2

pytestmark = pytest.mark.slow


class Failover(random.Random):
    """A schedule that always kills the leader during the restart."""

    def random(self) -> float:
        return 0.0


def test_a_gang_a_machine_died_under_restarts_whole_off_it_through_a_failover(make_cluster, tmp_path):
    cluster = make_cluster(workers=3, racks=1)
    t = Target(cluster.data_dir, cluster.state, cluster.client, downtime=0.5)
    t.wait_leader()
    history = History(tmp_path / "h.jsonl")
    workers = {w["id"]: w["pid"] for w in t.state["workers"]}
    fault = NEMESES["kill-worker-under-gang"](t, Failover(3), history)
    d = fault["detail"]
    assert "skipped" not in d, d
    [node] = fault["targets"]
    assert not local.is_alive(workers[node]) and d["killed_tasks"] == 1  # killed, then restarted
    assert d["failover"] and d["restarted"] and d["repaired"], d
    assert node not in d["restarted_nodes"] and len(d["restarted_nodes"]) == d["tasks"]
    info = cluster.client.get_job(d["job"])
    assert info.status in ("STOPPING", "CANCELLED")  # cancelled once the fault is over
    history.close()
    records = list(read(tmp_path / "h.jsonl"))
    assert {r["job"] for r in records if r["type"] == "task" and r["event"] == "lost"} == {d["job"]}
    final = {d["job"]: SimpleNamespace(placements={a.attempt: tuple(a.nodes) for a in info.attempts})}
    assert checkers.gangs_under_fault([r for r in records if r["type"] == "fault"], final) == []


def test_repair_uncordons_a_node_it_brought_back(make_cluster):
    cluster = make_cluster(workers=1, racks=1)
    t = Target(cluster.data_dir, cluster.state, cluster.client)
    node = t.state["workers"][0]["id"]
    t.client.call("SetSchedulable", api_pb2.SetSchedulableRequest(node_id=node, schedulable=False,
                                                                  reason="suspect (as a NodeLost leaves it)"))
    assert repair(t, node)
    assert [n.schedulable for n in t.client.list_nodes() if n.id == node] == [True]


def test_no_process_of_the_earlier_attempt_outlives_its_agent_once_the_next_attempt_runs(make_cluster, tmp_path):
    """kill -9 of a worker agent under a running 2-task gang: the node's fence kills the task the
    agent left once the worker's lease runs out, before the leader declares the node DOWN and
    starts the gang's next attempt on other nodes; sampled for 10 s from then, no process of the
    earlier attempt is alive, and the task journals show no rank alive in two attempts at once."""
    import time

    from chaos.run import worker_task_records

    cluster = make_cluster(workers=3, racks=1)
    t = Target(cluster.data_dir, cluster.state, cluster.client, fence_watch=10.0)
    t.wait_leader()
    fault = NEMESES["kill-agent-under-gang"](t, random.Random(5), History(tmp_path / "h.jsonl"))
    d = fault["detail"]
    assert "skipped" not in d, d
    [node] = fault["targets"]
    assert d["old_tasks"] == 2 and d["restarted"] and node not in d["restarted_nodes"], d
    assert d["old_alive"] == [], d
    records = worker_task_records(cluster.data_dir, t.state["workers"])
    assert [(r["job"], r["attempt"]) for r in records if r["node"] == node and r["event"] == "fenced"] == [
        (d["job"], d["attempt"])], records
    assert checkers.ranks_twice(records, time.time()) == []
    assert checkers.old_attempts_alive([fault]) == []
