"""Excluded nodes and suspect nodes: the state machine's record of the nodes that ended gangs, driven without Raft."""

from synapse.core import commands as c
from synapse.core.model import JobStatus, Placement
from synapse.core.schedule.scheduler import schedule_round
from synapse.core.state.fsm import MAX_EXCLUDED_NODES, SUSPECT_WINDOW_S, ClusterState
from tests.support.helpers import checked, cluster, spec


def submit(state, job_id, **kw):
    checked(state, c.SubmitJob(at=10, job_id=job_id, request_id=job_id, spec=spec(**kw)))


def place(state, job_id, *nodes, gpus=tuple(range(8)), at=20):
    job = state.jobs[job_id]
    placements = tuple(Placement(i, n, gpus, i) for i, n in enumerate(nodes))
    result = checked(state, c.CommitPlan(at=at, job_id=job_id, attempt=job.attempt, placements=placements))
    assert result.ok, result.error
    for t in job.tasks:
        checked(state, c.TaskStarted(at=at + 1, job_id=job_id, attempt=job.attempt, index=t.index, node_id=t.node_id))


def events(state, reason):
    return [(e.object_id, e.message) for e in state.events_after(0) if e.reason == reason]


def test_a_lost_node_is_excluded_from_the_jobs_later_attempts():
    state = cluster(racks=1, nodes_per_rack=2)
    submit(state, "j1", tasks=1)
    place(state, "j1", "r0-n0")
    checked(state, c.NodeLost(at=50, node_id="r0-n0"))
    checked(state, c.NodeUp(at=51, node_id="r0-n0"))
    job = state.jobs["j1"]
    assert (job.status, job.attempt, job.excluded_nodes) == (JobStatus.PENDING, 2, ("r0-n0",))
    assert not state.nodes["r0-n0"].suspect and state.nodes["r0-n0"].schedulable  # one job: no suspect yet
    # Both nodes are free; the tightest fit would be either: the round never picks the excluded one.
    plans = schedule_round(state, now=60).plans
    assert [(p.job_id, [q.node_id for q in p.placements]) for p in plans] == [("j1", ["r0-n1"])]
    # Apply re-checks it too: a plan on the excluded node is refused whole.
    refused = state.apply(c.CommitPlan(at=61, job_id="j1", attempt=2,
                                       placements=(Placement(0, "r0-n0", tuple(range(8)), 0),)))
    assert not refused.ok and "r0-n0 is excluded for job j1" in refused.error


def test_a_gang_that_needs_its_excluded_node_gets_it_back_once_repaired():
    """An exclusion yields where the other nodes could never hold the gang: on a small cluster a
    job must not wait for ever for the node that was repaired (model.excluded_for)."""
    state = cluster(racks=1, nodes_per_rack=2)
    submit(state, "j1", tasks=2)
    place(state, "j1", "r0-n0", "r0-n1")
    checked(state, c.NodeLost(at=50, node_id="r0-n0"))
    checked(state, c.TaskExited(at=52, job_id="j1", attempt=1, index=1, node_id="r0-n1", exit_code=-15))
    assert state.jobs["j1"].excluded_nodes == ("r0-n0",)
    waiting = schedule_round(state, now=52).waiting["j1"]  # r0-n0 is down: it waits for it, not never
    assert waiting.code == "NodesUnavailable", waiting
    checked(state, c.NodeUp(at=53, node_id="r0-n0"))
    [plan] = schedule_round(state, now=60).plans
    assert {p.node_id for p in plan.placements} == {"r0-n0", "r0-n1"}
    assert checked(state, c.CommitPlan(at=61, job_id="j1", attempt=2, placements=plan.placements)).ok


def test_a_job_excludes_at_most_its_latest_nodes():
    state = cluster(racks=1, nodes_per_rack=MAX_EXCLUDED_NODES + 2)
    submit(state, "j1", tasks=1, max_restarts=100)
    for i in range(MAX_EXCLUDED_NODES + 1):
        place(state, "j1", f"r0-n{i}", at=100 * i)
        checked(state, c.NodeLost(at=100 * i + 50, node_id=f"r0-n{i}"))
        checked(state, c.SetSchedulable(at=100 * i + 51, node_id=f"r0-n{i}", schedulable=True))  # no suspects here
    assert state.jobs["j1"].excluded_nodes == tuple(f"r0-n{i}" for i in range(1, MAX_EXCLUDED_NODES + 1))


def test_a_second_jobs_gang_lost_on_the_node_within_the_window_makes_it_a_suspect():
    state = cluster(racks=1, nodes_per_rack=2)
    submit(state, "a", tasks=1)
    submit(state, "b", tasks=1)
    place(state, "a", "r0-n0")
    checked(state, c.NodeLost(at=50, node_id="r0-n0"))
    checked(state, c.NodeUp(at=60, node_id="r0-n0"))
    place(state, "b", "r0-n0", at=70)
    checked(state, c.NodeLost(at=50 + SUSPECT_WINDOW_S - 1, node_id="r0-n0"))
    node = state.nodes["r0-n0"]
    reason = "suspect: tasks of jobs a, b ended NodeLost here within 24h"
    assert (node.suspect, node.schedulable, node.cordon_reason) == (True, False, reason)
    assert node.failures == ((50, "a", "NodeLost"), (50 + SUSPECT_WINDOW_S - 1, "b", "NodeLost"))
    assert events(state, "NodeSuspect") == [("r0-n0", reason)]
    # Back up, it stays cordoned: no restart lands on it.
    checked(state, c.NodeUp(at=SUSPECT_WINDOW_S + 100, node_id="r0-n0"))
    assert not state.nodes["r0-n0"].accepts_work
    # A passing health check lifts only its own cordon, never a suspect's.
    checked(state, c.SetNodeHealth(at=SUSPECT_WINDOW_S + 101, node_id="r0-n0", healthy=True))
    assert state.nodes["r0-n0"].suspect and not state.nodes["r0-n0"].schedulable


def test_two_gangs_lost_at_once_make_a_suspect():
    state = cluster(racks=1, nodes_per_rack=2)
    submit(state, "a", tasks=1, gpu=4)
    submit(state, "b", tasks=1, gpu=4)
    place(state, "a", "r0-n0", gpus=(0, 1, 2, 3))
    place(state, "b", "r0-n0", gpus=(4, 5, 6, 7))
    checked(state, c.NodeLost(at=50, node_id="r0-n0"))
    assert state.nodes["r0-n0"].cordon_reason == "suspect: tasks of jobs a, b ended NodeLost here within 24h"



def test_outside_the_window_a_second_loss_is_no_suspect():
    state = cluster(racks=1, nodes_per_rack=2)
    submit(state, "a", tasks=1)
    submit(state, "b", tasks=1)
    place(state, "a", "r0-n0")
    checked(state, c.NodeLost(at=50, node_id="r0-n0"))
    checked(state, c.NodeUp(at=60, node_id="r0-n0"))
    place(state, "b", "r0-n0", at=70)
    checked(state, c.NodeLost(at=50 + SUSPECT_WINDOW_S, node_id="r0-n0"))
    node = state.nodes["r0-n0"]
    assert (node.suspect, node.schedulable, node.cordon_reason) == (False, True, "")
    assert node.failures == ((50 + SUSPECT_WINDOW_S, "b", "NodeLost"),)  # the old end fell out of the window
    assert events(state, "NodeSuspect") == []


def test_an_older_leaders_node_down_and_an_admins_drain_keep_no_record():
    state = cluster(racks=1, nodes_per_rack=2)
    submit(state, "a", tasks=1, gpu=4)
    submit(state, "b", tasks=1, gpu=4)
    place(state, "a", "r0-n0", gpus=(0, 1, 2, 3))
    place(state, "b", "r0-n0", gpus=(4, 5, 6, 7))
    checked(state, c.DrainNode(at=40, by="admin", node_id="r0-n0"))
    checked(state, c.NodeDown(at=50, node_id="r0-n0"))
    node = state.nodes["r0-n0"]
    assert (node.suspect, node.failures, node.cordon_reason) == (False, (), "drained by admin")
    assert state.jobs["a"].excluded_nodes == () and state.jobs["b"].excluded_nodes == ()


def test_a_failing_health_checks_drain_counts_against_the_node():
    state = cluster(racks=1, nodes_per_rack=2)
    submit(state, "a", tasks=1, gpu=4)
    submit(state, "b", tasks=1, gpu=4)
    place(state, "a", "r0-n0", gpus=(0, 1, 2, 3))
    place(state, "b", "r0-n0", gpus=(4, 5, 6, 7))
    checked(state, c.SetNodeHealth(at=40, node_id="r0-n0", healthy=False, message="XID 79"))
    assert checked(state, c.DrainNode(at=41, node_id="r0-n0", cordon=False,
                                      reason="health check failed: XID 79")).value == "a,b"
    node = state.nodes["r0-n0"]
    reason = "suspect: tasks of jobs a, b ended HealthCheckFailed here within 24h"
    assert (node.suspect, node.health_cordon, node.cordon_reason) == (True, False, reason)
    assert state.jobs["a"].excluded_nodes == ("r0-n0",) and state.jobs["b"].excluded_nodes == ("r0-n0",)
    checked(state, c.SetNodeHealth(at=42, node_id="r0-n0", healthy=True))  # the check passes: still a suspect
    assert node.suspect and not node.schedulable


def test_an_admins_uncordon_clears_the_suspect_and_its_record():
    state = cluster(racks=1, nodes_per_rack=2)
    submit(state, "a", tasks=1, gpu=4)
    submit(state, "b", tasks=1, gpu=4)
    place(state, "a", "r0-n0", gpus=(0, 1, 2, 3))
    place(state, "b", "r0-n0", gpus=(4, 5, 6, 7))
    checked(state, c.NodeLost(at=50, node_id="r0-n0"))
    checked(state, c.NodeUp(at=60, node_id="r0-n0"))
    checked(state, c.SetSchedulable(at=70, by="admin", node_id="r0-n0", schedulable=True))
    node = state.nodes["r0-n0"]
    assert (node.suspect, node.failures, node.schedulable, node.cordon_reason) == (False, (), True, "")
    assert events(state, "NodeUncordoned") == [("r0-n0", "uncordoned by admin")]
    # The jobs still exclude it: the node failed them, whatever the admin decided for the others.
    assert state.jobs["a"].excluded_nodes == ("r0-n0",)


def test_the_records_survive_a_snapshot_as_version_3_and_their_absence_stays_version_2():
    state = cluster(racks=1, nodes_per_rack=2)
    submit(state, "a", tasks=1, gpu=4)
    submit(state, "b", tasks=1, gpu=4)
    before = state.to_snapshot()
    assert before["version"] == 2
    assert all("suspect" not in n and "failures" not in n for n in before["nodes"])
    assert all("excluded_nodes" not in j for j in before["jobs"])
    place(state, "a", "r0-n0", gpus=(0, 1, 2, 3))
    place(state, "b", "r0-n0", gpus=(4, 5, 6, 7))
    checked(state, c.NodeLost(at=50, node_id="r0-n0"))
    snap = state.to_snapshot()
    assert snap["version"] == 3
    again = ClusterState.from_snapshot(snap)
    assert again.digest() == state.digest()
    node = again.nodes["r0-n0"]
    assert node.suspect and node.failures == ((50, "a", "NodeLost"), (50, "b", "NodeLost"))
    assert again.jobs["a"].excluded_nodes == ("r0-n0",)


def test_a_gang_already_stopping_when_its_node_is_lost_does_not_count_against_the_node():
    state = cluster(racks=1, nodes_per_rack=2)
    submit(state, "a", tasks=1, gpu=4)
    submit(state, "b", tasks=1, gpu=4)
    place(state, "a", "r0-n0", gpus=(0, 1, 2, 3))
    place(state, "b", "r0-n0", gpus=(4, 5, 6, 7))
    checked(state, c.CancelJob(at=40, job_id="a"))
    checked(state, c.NodeLost(at=50, node_id="r0-n0"))
    node = state.nodes["r0-n0"]
    assert (node.suspect, node.failures) == (False, ((50, "b", "NodeLost"),))
    assert state.jobs["a"].excluded_nodes == () and state.jobs["b"].excluded_nodes == ("r0-n0",)


def died_with_machine(state, job_id, index, at):
    job = state.jobs[job_id]
    node = job.tasks[index].node_id
    checked(state, c.TaskExited(at=at, job_id=job_id, attempt=job.attempt, index=index, node_id=node, exit_code=-1,
                                reason="its machine restarted", cause="NodeLost", node_side=True))


def test_tasks_that_died_with_their_machine_requeue_the_gang_uncharged_without_the_node():
    """A worker back after its machine restarted, before the node was declared lost, reports its
    tasks NodeLost (synapse.worker.state): as for a lost node, the gang requeues uncharged, the
    job excludes the node and the node keeps the record; a second job so ended makes it a suspect."""
    state = cluster(racks=1, nodes_per_rack=3)
    submit(state, "a", tasks=2, max_restarts=0)
    submit(state, "b", tasks=1)
    place(state, "a", "r0-n0", "r0-n1")
    died_with_machine(state, "a", 0, at=50)
    job = state.jobs["a"]
    assert job.status is JobStatus.STOPPING and job.stop_cause == "NodeLost"
    checked(state, c.TaskExited(at=51, job_id="a", attempt=1, index=1, node_id="r0-n1", exit_code=143,
                                reason="", cause="Signal"))  # its peer, stopped by the cluster
    assert (job.status, job.attempt, job.restarts_used(), job.excluded_nodes) == (JobStatus.PENDING, 2, 0, ("r0-n0",))
    assert job.runs[-1].outcome == "NodeLost"
    assert state.nodes["r0-n0"].failures == ((50, "a", "NodeLost"),)
    place(state, "b", "r0-n0", at=60)
    died_with_machine(state, "b", 0, at=70)
    assert state.nodes["r0-n0"].suspect and not state.nodes["r0-n0"].schedulable


def test_without_a_machine_restart_a_task_without_exit_status_fails_its_job():
    state = cluster(racks=1, nodes_per_rack=2)
    submit(state, "a", tasks=1, max_restarts=0)
    place(state, "a", "r0-n0")
    checked(state, c.TaskExited(at=50, job_id="a", attempt=1, index=0, node_id="r0-n0", exit_code=-1,
                                reason="no exit status", cause="Signal"))
    assert state.jobs["a"].status is JobStatus.FAILED and not state.jobs["a"].excluded_nodes
