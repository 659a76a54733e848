"""Why tasks ended, and node health in the state machine (issue 16): driven without Raft."""

from __future__ import annotations

import pytest

from synapse.core import commands as c
from synapse.core.brain.heartbeat import health_change
from synapse.core.model import JobStatus, Placement, Resources
from synapse.core.state.fsm import ClusterState
from tests.support.helpers import checked, cluster, spec

N0, N1 = "r0-n0", "r0-n1"


def running_gang(state: ClusterState, job_id: str = "j1", nodes=(N0, N1), **kw) -> None:
    checked(state, c.SubmitJob(at=10, job_id=job_id, request_id=job_id, spec=spec(tasks=len(nodes), **kw)))
    checked(state, c.CommitPlan(at=20, job_id=job_id, attempt=1, placements=tuple(
        Placement(i, n, tuple(range(8)), i) for i, n in enumerate(nodes))))
    for i, n in enumerate(nodes):
        checked(state, c.TaskStarted(at=30, job_id=job_id, attempt=1, index=i, node_id=n))


def exited(state: ClusterState, index: int, code: int, cause: str = "", reason: str = "", job_id: str = "j1",
           at: float = 40) -> None:
    task = state.jobs[job_id].tasks[index]
    checked(state, c.TaskExited(at=at, job_id=job_id, attempt=state.jobs[job_id].attempt, index=index,
                                node_id=task.node_id, exit_code=code, cause=cause, reason=reason))


def reasons(state: ClusterState, job_id: str = "j1") -> list[str]:
    return [t.reason for t in state.jobs[job_id].tasks]


def test_oom_kill_fails_the_gang_and_the_job_says_which_task_first():
    state = cluster()
    running_gang(state)
    exited(state, 1, 137, "OOMKilled", "64Mi memory limit reached")
    job = state.jobs["j1"]
    assert job.status is JobStatus.STOPPING
    assert job.failure == "task 1 (rank 1) on r0-n1: OOMKilled: 64Mi memory limit reached"
    exited(state, 0, 143, "Signal")  # the sibling, stopped by SIGTERM
    assert job.status is JobStatus.FAILED and reasons(state) == ["Signal", "OOMKilled"]
    assert "OOMKilled" in job.events[-1].message and job.tasks[0].reason_message.startswith("signal 15")


def test_completed_and_error_with_the_exit_code():
    state = cluster()
    running_gang(state)
    exited(state, 0, 0, "Completed")
    exited(state, 1, 3, "Error")
    job = state.jobs["j1"]
    assert reasons(state) == ["Completed", "Error"] and job.tasks[1].reason_message == "exit code 3"
    assert job.failure.startswith("task 1 (rank 1) on r0-n1: Error: exit code 3")


def test_reports_from_an_older_worker_are_read_from_the_exit_code():
    state = cluster()
    running_gang(state)
    exited(state, 0, 0)
    exited(state, 1, 137)
    assert reasons(state) == ["Completed", "Signal"] and state.jobs["j1"].tasks[1].reason_message == "signal 9"


@pytest.mark.parametrize("stop,expected", [
    (lambda s: c.CancelJob(at=35, by="alice", job_id="j1"), "Cancelled"),
    (lambda s: c.FailAttempt(at=35, term=1, job_id="j1", attempt=1, reason="time limit of 60s exceeded",
                             final=True, cause="TimeLimit"), "TimeLimit"),
])
def test_tasks_the_cluster_stops_end_for_its_reason(stop, expected):
    state = cluster()
    running_gang(state)
    checked(state, stop(state))
    exited(state, 0, 143, "Signal")
    exited(state, 1, 0, "Completed")  # a task that handled SIGTERM and exited 0 was still stopped
    assert reasons(state) == [expected, expected]
    assert state.jobs["j1"].status in (JobStatus.CANCELLED, JobStatus.FAILED)


def test_an_oom_kill_stays_an_oom_kill_while_the_gang_stops():
    state = cluster()
    running_gang(state)
    checked(state, c.CancelJob(at=35, job_id="j1"))
    exited(state, 0, 137, "OOMKilled", "limit")
    assert reasons(state)[0] == "OOMKilled"


def test_preempted_tasks_say_so():
    state = cluster()
    running_gang(state, "victim", nodes=(N0,), gpu=8)
    checked(state, c.SubmitJob(at=50, job_id="big", request_id="big", spec=spec(tasks=1, gpu=8)))
    checked(state, c.Preempt(at=60, term=1, job_id="big", attempt=1, rule="priority",
                             victims=(c.Victim("victim", 1, 5.0),), nodes=(N0,)))
    exited(state, 0, 143, "Signal", job_id="victim", at=61)
    victim = state.jobs["victim"]
    # The attempt is gone (requeued, not failed); its end reason was recorded before it went.
    assert victim.status is JobStatus.PENDING and victim.attempt == 2 and not victim.failure
    assert any("Preempted" in e.message for e in state.cluster_events if e.reason == "TaskExited")


def test_a_lost_node_ends_its_tasks_as_node_lost():
    state = cluster()
    running_gang(state)
    checked(state, c.NodeDown(at=50, term=1, node_id=N1, reason="no heartbeat for 10.0s"))
    job = state.jobs["j1"]
    assert reasons(state)[1] == "NodeLost" and "no heartbeat" in job.tasks[1].reason_message
    assert job.failure == "task 1 (rank 1) on r0-n1: NodeLost: no heartbeat for 10.0s"


def test_a_taken_master_port_requeues_the_gang_with_no_restart_used():
    """Rank 0's worker found its MASTER_PORT taken and never started it: the attempt stops without
    failing, and the job (max_restarts 0) is requeued at attempt 2, i.e. with another port."""
    state = cluster()
    checked(state, c.SubmitJob(at=10, job_id="j1", request_id="j1", spec=spec(tasks=2)))
    checked(state, c.CommitPlan(at=20, job_id="j1", attempt=1, placements=tuple(
        Placement(i, n, tuple(range(8)), i) for i, n in enumerate((N0, N1)))))
    checked(state, c.TaskStarted(at=30, job_id="j1", attempt=1, index=1, node_id=N1))
    exited(state, 0, 127, "MasterPortInUse", "MASTER_PORT 23456 in use on node r0-n0")
    job = state.jobs["j1"]
    assert job.status is JobStatus.STOPPING and job.failure == ""
    assert reasons(state)[0] == "MasterPortInUse"
    assert job.tasks[0].reason_message == "MASTER_PORT 23456 in use on node r0-n0"  # no exit code: it never ran
    exited(state, 1, 143, "Signal")  # rank 1, stopped with the attempt
    assert job.status is JobStatus.PENDING and job.attempt == 2
    assert job.requeues == 1 and job.restarts_used() == 0
    assert job.runs[-1].outcome == "MasterPortInUse"
    assert job.events[-1].message == ("attempt 2 after MASTER_PORT 23456 in use on node r0-n0; "
                                      "not charged to max_restarts")
    again = ClusterState.from_snapshot(state.to_snapshot())
    assert again.digest() == state.digest() and again.jobs["j1"].requeues == 1
    # A real failure of the next attempt still ends a job that has no restarts.
    checked(state, c.CommitPlan(at=50, job_id="j1", attempt=2, placements=tuple(
        Placement(i, n, tuple(range(8)), i) for i, n in enumerate((N0, N1)))))
    exited(state, 0, 1, "Error", at=60)
    exited(state, 1, 143, "Signal", at=60)
    assert job.status is JobStatus.FAILED


def test_reasons_survive_a_snapshot():
    state = cluster()
    running_gang(state)
    exited(state, 1, 137, "OOMKilled", "limit")
    checked(state, c.SetNodeHealth(at=41, term=1, node_id=N0, healthy=False, message="ecc errors"))
    again = ClusterState.from_snapshot(state.to_snapshot())
    assert again.digest() == state.digest()
    assert again.jobs["j1"].tasks[1].reason == "OOMKilled" and again.jobs["j1"].failure
    assert again.nodes[N0].cordon_reason == "health check failed: ecc errors"


# ---- node health ---------------------------------------------------------------------------------

def test_failing_health_cordons_and_passing_lifts_only_its_own_cordon():
    state = cluster()
    checked(state, c.SetNodeHealth(at=1, term=1, node_id=N0, healthy=False, message="GPU 3 fell off the bus"))
    node = state.nodes[N0]
    assert not node.schedulable and node.health_cordon
    assert node.cordon_reason == "health check failed: GPU 3 fell off the bus"
    checked(state, c.SetNodeHealth(at=2, term=1, node_id=N0, healthy=True))
    assert node.schedulable and not node.cordon_reason and not node.health
    # An admin's cordon: a failing then passing check leaves it cordoned, with the admin's reason.
    checked(state, c.SetSchedulable(at=3, by="admin", node_id=N0, schedulable=False, reason="maintenance"))
    checked(state, c.SetNodeHealth(at=4, term=1, node_id=N0, healthy=False, message="disk full"))
    assert node.cordon_reason == "maintenance (by admin)" and node.health == "disk full"
    checked(state, c.SetNodeHealth(at=5, term=1, node_id=N0, healthy=True))
    assert not node.schedulable and node.cordon_reason == "maintenance (by admin)"
    # An admin cordoning a health-cordoned node makes it the admin's.
    checked(state, c.SetSchedulable(at=6, by="admin", node_id=N1, schedulable=True))
    checked(state, c.SetNodeHealth(at=7, term=1, node_id=N1, healthy=False, message="x"))
    checked(state, c.SetSchedulable(at=8, by="admin", node_id=N1, schedulable=False))
    checked(state, c.SetNodeHealth(at=9, term=1, node_id=N1, healthy=True))
    assert not state.nodes[N1].schedulable and state.nodes[N1].cordon_reason == "cordoned (by admin)"


def test_a_cordoned_node_takes_no_new_gang_but_running_gangs_stay_unless_drain():
    state = cluster(racks=1, nodes_per_rack=2)
    running_gang(state, nodes=(N0,))
    checked(state, c.SetNodeHealth(at=50, term=1, node_id=N0, healthy=False, message="hot"))
    assert state.jobs["j1"].status is JobStatus.RUNNING
    checked(state, c.SubmitJob(at=51, job_id="j2", request_id="j2", spec=spec(tasks=1, gpu=0, cpu=1000)))
    bad = state.apply(c.CommitPlan(at=52, job_id="j2", attempt=1, placements=(Placement(0, N0, (), 0),)))
    assert not bad.ok and "cordoned" in bad.error
    checked(state, c.SetNodeHealth(at=53, term=1, node_id=N0, healthy=False, message="hotter", drain=True))
    job = state.jobs["j1"]
    assert job.status is JobStatus.STOPPING and job.failure == "node r0-n0 of task 0 unhealthy: hotter"


def test_health_change_proposes_only_what_the_state_lacks():
    state = cluster()
    node = state.nodes[N0]
    assert health_change(node, False, "", False, 1) is None
    cmd = health_change(node, True, "bad", True, 1)
    assert (cmd.healthy, cmd.message, cmd.drain, cmd.term) == (False, "bad", True, 0)
    checked(state, cmd)
    assert health_change(node, True, "bad", True, 2) is None
    assert health_change(node, True, "worse", False, 2).message == "worse"
    assert health_change(node, False, "", False, 3).healthy
    assert health_change(None, True, "x", False, 3) is None


def test_gpu_model_jobs_only_go_to_nodes_of_that_model():
    state = ClusterState()
    for node_id, model in (("a", "H100"), ("b", "A100")):
        checked(state, c.RegisterNode(at=1, node_id=node_id, address=f"{node_id}:1", topology=("r",),
                                      capacity=Resources(8000, 1 << 36, 8), labels=(("gpu_model", model),)))
    checked(state, c.SubmitJob(at=2, job_id="j", request_id="j",
                               spec=spec(tasks=1, gpu=8).__class__(**{**_fields(spec(tasks=1, gpu=8)),
                                                                       "gpu_model": "h100"})))
    bad = state.apply(c.CommitPlan(at=3, job_id="j", attempt=1, placements=(Placement(0, "b", tuple(range(8)), 0),)))
    assert not bad.ok and "has GPU model A100, not h100" in bad.error
    checked(state, c.CommitPlan(at=3, job_id="j", attempt=1, placements=(Placement(0, "a", tuple(range(8)), 0),)))
    assert state.nodes["a"].label("gpu_model") == "H100"


def _fields(s) -> dict:
    return {f: getattr(s, f) for f in s.__slots__}
