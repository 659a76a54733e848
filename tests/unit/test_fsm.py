"""Exact state transitions of the replicated state machine, driven without Raft."""

import dataclasses

import pytest

from synapse.core import codec
from synapse.core import commands as c
from synapse.core.model import JobStatus, NodeStatus, Placement, Resources, Role, TaskState
from synapse.core.state.fsm import MAX_EVENTS_PER_JOB, ClusterState
from tests.support.helpers import GI, NODE, checked, cluster, spec


def submit(state, job_id="j1", request_id=None, **kw):
    return checked(state, c.SubmitJob(at=10, job_id=job_id, request_id=request_id or job_id,
                                      spec=spec(**kw)))


def commit(state, job_id, placements, attempt=1, term=0):
    return checked(state, c.CommitPlan(at=20, term=term, job_id=job_id, attempt=attempt,
                                       placements=tuple(placements)))


def whole_nodes(*node_ids):
    return [Placement(i, n, tuple(range(8)), i) for i, n in enumerate(node_ids)]


def start_all(state, job_id, at=30):
    job = state.jobs[job_id]
    for t in job.tasks:
        checked(state, c.TaskStarted(at=at, job_id=job_id, attempt=job.attempt, index=t.index,
                                     node_id=t.node_id))


def exit_task(state, job_id, index, code=0, at=40):
    job = state.jobs[job_id]
    t = job.tasks[index]
    return checked(state, c.TaskExited(at=at, job_id=job_id, attempt=job.attempt, index=index,
                                       node_id=t.node_id, exit_code=code))


def test_register_pads_topology_and_reregister_updates():
    state = ClusterState()
    assert checked(state, c.RegisterNode(at=1, node_id="a", address="h:1", topology=("r1",),
                                         capacity=NODE)).value == "registered"
    assert state.nodes["a"].topology == ("default", "default", "r1")
    checked(state, c.NodeDown(at=2, term=1, node_id="a"))
    res = checked(state, c.RegisterNode(at=3, node_id="a", address="h:2", topology=("z", "b", "r2"),
                                        capacity=NODE))
    assert res.value == "re-registered"
    node = state.nodes["a"]
    assert (node.address, node.topology, node.status) == ("h:2", ("z", "b", "r2"), NodeStatus.READY)


@pytest.mark.parametrize("cmd,error", [
    (c.RegisterNode(at=1, node_id="", address="", topology=(), capacity=NODE), "must not be empty"),
    (c.RegisterNode(at=1, node_id="x", address="", topology=("a", "b", "c", "d"), capacity=NODE),
     "more levels"),
    (c.RegisterNode(at=1, node_id="x", address="", topology=(), capacity=Resources(-1, 0, 0)),
     "negative"),
    (c.NodeDown(at=1, node_id="ghost"), "unknown node ghost"),
    (c.SetSchedulable(at=1, node_id="ghost", schedulable=False), "unknown node ghost"),
])
def test_bad_node_commands_change_nothing(cmd, error):
    state = cluster()
    before = state.to_snapshot()
    result = state.apply(cmd)
    assert not result.ok and error in result.error
    after = state.to_snapshot()
    assert after.pop("applied") == before.pop("applied") + 1 and after == before


def test_submit_is_idempotent_per_request_id():
    state = cluster()
    assert submit(state, "j1", request_id="req").value == "j1"
    assert submit(state, "j2", request_id="req").value == "j1"  # a retry after an ambiguous failover
    assert list(state.jobs) == ["j1"] and len(state.pending) == 1
    assert state.jobs["j1"].status is JobStatus.PENDING


def test_a_request_id_reused_for_another_spec_is_refused_naming_its_job_and_changes_nothing():
    state = cluster()
    submit(state, "j1", request_id="req", gpu=8)
    array = dataclasses.replace(spec(gpu=1), array="0-3")
    assert checked(state, c.SubmitWorkflowJob(at=10, job_id="A", request_id="req-a", spec=array)).ok
    before = state.to_snapshot()
    for job_id, request_id, other in (("j2", "req", spec(gpu=4)), ("B", "req-a", spec(gpu=1))):
        refused = state.apply(c.SubmitJob(at=11, job_id=job_id, request_id=request_id, spec=other))
        assert (refused.ok, refused.code) == (False, c.Rejection.CONFLICT)
        assert refused.error == (f"request id {request_id} already made job {'j1' if job_id == 'j2' else 'A'}, "
                                 "from another spec: a new job needs a new request id")
    after = state.to_snapshot()
    assert after.pop("applied") == before.pop("applied") + 2 and after == before  # decided before any change
    assert state.request_conflict("req", spec(gpu=8)) == "" and state.request_conflict("new", spec(gpu=4)) == ""
    same = state.apply(c.SubmitWorkflowJob(at=12, job_id="C", request_id="req-a", spec=array))
    assert (same.ok, same.value) == (True, "A")  # the same spec again is a retry: the same job


@pytest.mark.parametrize("kw,error", [
    ({"tasks": 0}, "tasks must be at least 1"), ({"gpu": -1}, "negative"),
    ({"gpu": 0, "cpu": 0, "memory": 0}, "some cpu, memory or gpu"),
    ({"pack": "row"}, "topology.pack must be one of"), ({"max_restarts": -1}, "max_restarts"),
])
def test_invalid_specs_are_rejected(kw, error):
    state = cluster()
    result = state.apply(c.SubmitJob(at=1, job_id="j", request_id="r", spec=spec(**kw)))
    assert not result.ok and error in result.error and not state.jobs and not state.job_by_request


def test_gang_commits_whole_and_frees_only_when_gone():
    state = cluster()
    submit(state, tasks=2)
    assert commit(state, "j1", whole_nodes("r0-n0", "r0-n1")).ok
    job = state.jobs["j1"]
    assert job.status is JobStatus.SCHEDULED and [t.node_id for t in job.tasks] == ["r0-n0", "r0-n1"]
    assert state.nodes["r0-n0"].gpus_in_use == set(range(8)) and not state.pending
    start_all(state, "j1")
    assert job.status is JobStatus.RUNNING and job.started_at == 30
    exit_task(state, "j1", 0)
    assert job.status is JobStatus.RUNNING and state.nodes["r0-n0"].used == Resources()
    assert state.nodes["r0-n1"].used == Resources(1000, GI, 8)
    exit_task(state, "j1", 1, at=50)
    assert job.status is JobStatus.SUCCEEDED and job.finished_at == 50
    assert [e.kind for e in job.events] == ["Submitted", "Scheduled", "Running", "Succeeded"]


@pytest.mark.parametrize("mutate,error", [
    (lambda s: None, ""),
    (lambda s: s.apply(c.SetSchedulable(at=1, node_id="r0-n1", schedulable=False)), "cordoned"),
    (lambda s: s.apply(c.NodeDown(at=1, node_id="r0-n1")), "is DOWN"),
])
def test_commit_rechecks_nodes(mutate, error):
    state = cluster()
    submit(state, tasks=2)
    mutate(state)
    result = state.apply(c.CommitPlan(at=2, job_id="j1", attempt=1,
                                      placements=tuple(whole_nodes("r0-n0", "r0-n1"))))
    assert result.ok == (error == "") and error in result.error


@pytest.mark.parametrize("placements,attempt,error", [
    (whole_nodes("r0-n0"), 1, "places 1 task(s), the gang has 2"),
    (whole_nodes("r0-n0", "nope"), 1, "unknown node nope"),
    (whole_nodes("r0-n0", "r0-n1"), 2, "attempt 2, job is at attempt 1"),
    (whole_nodes("r0-n0", "r0-n0"), 1, "already in use"),
    ([Placement(0, "r0-n0", (0, 1, 2, 3, 4, 5, 6, 7), 0), Placement(0, "r0-n1", tuple(range(8)), 1)], 1,
     "indices must be exactly"),
    ([Placement(0, "r0-n0", (0, 1, 2, 3, 4, 5, 6, 9), 0), Placement(1, "r0-n1", tuple(range(8)), 1)], 1,
     "has no GPU 9"),
    ([Placement(0, "r0-n0", (0, 1), 0), Placement(1, "r0-n1", tuple(range(8)), 1)], 1,
     "must get 8 distinct"),
])
def test_bad_plans_change_nothing_and_say_why(placements, attempt, error):
    state = cluster()
    submit(state, tasks=2)
    before = state.to_snapshot()
    result = state.apply(c.CommitPlan(at=2, job_id="j1", attempt=attempt, placements=tuple(placements)))
    assert not result.ok and error in result.error, result.error
    after = state.to_snapshot()
    after.pop("applied"), before.pop("applied")
    assert after == before


def test_stale_plan_loses_to_the_first_commit():
    """Two plans computed from the same snapshot: only the first one to be applied wins."""
    state = cluster(racks=1, nodes_per_rack=1)
    submit(state, "a", tasks=1)
    submit(state, "b", tasks=1)
    assert commit(state, "a", whole_nodes("r0-n0")).ok
    result = state.apply(c.CommitPlan(at=2, job_id="b", attempt=1,
                                      placements=tuple(whole_nodes("r0-n0"))))
    assert not result.ok and "already in use" in result.error
    assert state.jobs["b"].status is JobStatus.PENDING


def test_over_capacity_on_cpu_is_rejected():
    state = cluster(racks=1, nodes_per_rack=1)
    submit(state, tasks=2, gpu=0, cpu=40_000)
    result = state.apply(c.CommitPlan(at=2, job_id="j1", attempt=1, placements=(
        Placement(0, "r0-n0", (), 0), Placement(1, "r0-n0", (), 1))))
    assert not result.ok and "lacks cpu for 2 task(s)" in result.error


def test_required_topology_is_enforced_in_apply():
    state = cluster()
    submit(state, tasks=2, pack="rack", required=True)
    result = state.apply(c.CommitPlan(at=2, job_id="j1", attempt=1,
                                      placements=tuple(whole_nodes("r0-n0", "r1-n0"))))
    assert not result.ok and "spans 2" in result.error


def test_failure_stops_gang_then_requeues_then_fails():
    state = cluster()
    submit(state, tasks=2, max_restarts=1)
    commit(state, "j1", whole_nodes("r0-n0", "r0-n1"))
    start_all(state, "j1")
    exit_task(state, "j1", 0, code=3)
    job = state.jobs["j1"]
    assert job.status is JobStatus.STOPPING and "exited with code 3" in job.stop_reason
    # The other task still holds its node until its worker says it is gone.
    assert state.nodes["r0-n1"].gpus_in_use == set(range(8))
    assert state.tasks_on_node("r0-n1") == [(job.tasks[1], False)]
    exit_task(state, "j1", 1, code=-15)
    assert job.status is JobStatus.PENDING and job.attempt == 2 and job.tasks == []
    assert state.nodes["r0-n1"].used == Resources()
    # A late report for attempt 1 is stale and changes nothing.
    late = state.apply(c.TaskExited(at=41, job_id="j1", attempt=1, index=1, node_id="r0-n1", exit_code=0))
    assert not late.ok and "stale report" in late.error
    commit(state, "j1", whole_nodes("r1-n0", "r1-n1"), attempt=2)
    start_all(state, "j1")
    exit_task(state, "j1", 1, code=1)
    exit_task(state, "j1", 0, code=-15)
    assert job.status is JobStatus.FAILED and "no restarts left (max_restarts 1, all used)" in job.events[-1].message


def test_node_down_loses_its_tasks_and_requeues():
    state = cluster()
    submit(state, tasks=2, max_restarts=2)
    commit(state, "j1", whole_nodes("r0-n0", "r0-n1"))
    start_all(state, "j1")
    checked(state, c.NodeDown(at=50, term=2, node_id="r0-n0", reason="no heartbeat for 10s"))
    job = state.jobs["j1"]
    assert job.tasks[0].state is TaskState.LOST and job.status is JobStatus.STOPPING
    assert state.nodes["r0-n0"].used == Resources() and state.nodes["r0-n0"].status is NodeStatus.DOWN
    exit_task(state, "j1", 1, code=-15)
    assert job.status is JobStatus.PENDING and job.attempt == 2


def test_a_lost_node_requeues_its_gangs_at_their_place_uncharged():
    """NodeLost (version 3): not the job's fault, so even max_restarts 0 comes back, ahead of what
    arrived since, and the event says why; the older NodeDown still charges (old logs replay alike)."""
    state = cluster()
    submit(state, "j1", tasks=2, max_restarts=0)
    submit(state, "later", tasks=1)
    commit(state, "j1", whole_nodes("r0-n0", "r0-n1"))
    start_all(state, "j1")
    checked(state, c.NodeLost(at=50, term=2, node_id="r0-n0", reason="no heartbeat for 10s"))
    job = state.jobs["j1"]
    assert job.status is JobStatus.STOPPING and job.tasks[1].state.live  # the survivor stops first
    exit_task(state, "j1", 1, code=-15)
    assert (job.status, job.attempt, job.restarts_used(), job.requeues) == (JobStatus.PENDING, 2, 0, 1)
    assert [j for _, j in sorted(state.pending)][0] == "j1"  # its place, before "later"
    assert [e.kind for e in job.events].count("Requeued") == 1
    assert "not charged to max_restarts" in job.events[-1].message and "r0-n0" in job.events[-1].message
    assert job.runs[-1].outcome == "NodeLost"

    old = cluster()
    submit(old, "j1", tasks=1, max_restarts=0)
    commit(old, "j1", whole_nodes("r0-n0"))
    checked(old, c.NodeDown(at=50, term=2, node_id="r0-n0"))
    assert old.jobs["j1"].status is JobStatus.FAILED


def test_a_drain_is_one_command_that_stops_every_gang_on_the_node_uncharged():
    state = cluster()
    submit(state, "a", tasks=2, max_restarts=0)
    commit(state, "a", whole_nodes("r0-n0", "r0-n1"))
    start_all(state, "a")
    result = checked(state, c.DrainNode(at=60, by="admin", node_id="r0-n1"))
    assert result.value == "a"
    node = state.nodes["r0-n1"]
    assert not node.schedulable and node.cordon_reason == "drained by admin"
    job = state.jobs["a"]
    assert job.status is JobStatus.STOPPING and job.stop_cause == "Drained" and job.stop_grace > 0
    exit_task(state, "a", 0, code=-15)
    exit_task(state, "a", 1, code=-15)
    assert (job.status, job.attempt, job.restarts_used()) == (JobStatus.PENDING, 2, 0)
    assert job.tasks == [] and job.runs[-1].outcome == "Drained"
    assert checked(state, c.DrainNode(at=61, node_id="r0-n1")).value == ""  # nothing left to stop
    assert not state.apply(c.DrainNode(at=62, node_id="nope")).ok


def test_cancel_pending_and_running():
    state = cluster()
    submit(state, "p")
    submit(state, "r", tasks=1)
    checked(state, c.CancelJob(at=5, job_id="p"))
    assert state.jobs["p"].status is JobStatus.CANCELLED and ("p" not in {j for _, j in state.pending})
    commit(state, "r", whole_nodes("r0-n0"))
    checked(state, c.CancelJob(at=6, job_id="r", reason="user"))
    assert state.jobs["r"].status is JobStatus.STOPPING
    assert state.nodes["r0-n0"].gpus_in_use == set(range(8))  # not freed by the request alone
    exit_task(state, "r", 0, code=-15)
    assert state.jobs["r"].status is JobStatus.CANCELLED and state.nodes["r0-n0"].used == Resources()
    assert checked(state, c.CancelJob(at=7, job_id="r")).value == "already CANCELLED"


def test_fail_attempt_final_skips_restarts():
    state = cluster()
    submit(state, tasks=1, max_restarts=5)
    commit(state, "j1", whole_nodes("r0-n0"))
    checked(state, c.FailAttempt(at=3, term=1, job_id="j1", attempt=1, reason="time limit", final=True))
    exit_task(state, "j1", 0, code=-9)
    assert state.jobs["j1"].status is JobStatus.FAILED


def test_stale_leader_term_is_fenced():
    state = cluster()
    submit(state, tasks=1)
    checked(state, c.NodeUp(at=1, term=5, node_id="r0-n0"))
    result = state.apply(c.CommitPlan(at=2, term=4, job_id="j1", attempt=1,
                                      placements=tuple(whole_nodes("r0-n0"))))
    assert not result.ok and "stale leader" in result.error and result.code is c.Rejection.STALE
    assert state.jobs["j1"].status is JobStatus.PENDING


@pytest.mark.parametrize("cmd, code", [
    (c.CancelJob(at=1, job_id="nope"), c.Rejection.NOT_FOUND),
    (c.SetSchedulable(at=1, node_id="nope", schedulable=False), c.Rejection.NOT_FOUND),
    (c.TaskStarted(at=1, job_id="nope", attempt=1, index=0, node_id="r0-n0"), c.Rejection.NOT_FOUND),
    (c.TaskStarted(at=1, job_id="j1", attempt=1, index=7, node_id="r0-n0"), c.Rejection.NOT_FOUND),
    (c.TaskStarted(at=1, job_id="j1", attempt=2, index=0, node_id="r0-n0"), c.Rejection.REFUSED),
    (c.RemoveUser(at=1, name="nope"), c.Rejection.NOT_FOUND),
    (c.DeleteQueue(at=1, name="nope"), c.Rejection.NOT_FOUND),
])
def test_rejections_carry_a_code_that_code_can_act_on(cmd, code):
    state = cluster()
    submit(state, tasks=1)
    checked(state, c.CommitPlan(at=1, job_id="j1", attempt=1, placements=tuple(whole_nodes("r0-n0"))))
    result = state.apply(cmd)
    assert not result.ok and result.code is code, result


def test_garbage_bytes_change_nothing_and_raise_codec_error():
    """An entry this code cannot read is not a rejection: the replica must stop before it."""
    state = cluster()
    before = state.digest()
    with pytest.raises(codec.CodecError):
        state.apply_bytes(b"\x08\x99\x99\x99\x99\x0f")
    assert state.applied == 8 and state.digest() == before


def test_snapshot_round_trip_keeps_digest_and_indexes():
    state = cluster()
    submit(state, "a", tasks=2)
    commit(state, "a", whole_nodes("r0-n0", "r0-n1"))
    submit(state, "b", tasks=1, priority=3)
    restored = ClusterState.from_snapshot(state.to_snapshot())
    assert restored.digest() == state.digest()
    assert list(restored.pending) == list(state.pending)
    assert restored.index.domains.keys() == state.index.domains.keys()
    assert restored.index.root().free_gpu == state.index.root().free_gpu == 6 * 8
    assert restored.live_tasks == state.live_tasks


def test_priority_then_submission_order():
    state = cluster()
    for job_id, prio, at in [("low", 0, 1), ("high", 9, 5), ("low2", 0, 2), ("high2", 9, 6)]:
        checked(state, c.SubmitJob(at=at, job_id=job_id, request_id=job_id, spec=spec(priority=prio)))
    assert [j.id for j in state.pending_jobs()] == ["high", "high2", "low", "low2"]


def test_digest_changes_with_state():
    a, b = cluster(), cluster()
    assert a.digest() == b.digest()
    submit(a)
    assert a.digest() != b.digest()
    assert dataclasses.replace(spec(), name="x") != spec()


def test_forget_jobs_drops_only_finished_jobs_and_frees_their_request_ids():
    state = cluster()
    submit(state, "done", request_id="r-done")
    checked(state, c.CancelJob(at=5, job_id="done"))
    submit(state, "waiting", request_id="r-waiting")
    result = checked(state, c.ForgetJobs(at=9, term=1, job_ids=("done", "waiting", "ghost")))
    assert result.value == "1" and list(state.jobs) == ["waiting"]
    assert "r-done" not in state.job_by_request and state.job_by_request["r-waiting"] == "waiting"
    assert submit(state, "again", request_id="r-done").value == "again"  # the request id is free again


# ---- users ----------------------------------------------------------------------------------------

def add(state, name="alice", token_hash="h1", role=Role.USER, groups=("team-a",), by="admin"):
    return state.apply(c.AddUser(at=50, by=by, name=name, role=role, groups=groups, token_hash=token_hash))


def test_users_are_added_rotated_and_removed_with_their_token_index():
    state = cluster(racks=1, nodes_per_rack=1)
    assert add(state).ok
    assert state.user_by_token == {"h1": "alice"} and state.users["alice"].created_by == "admin"
    assert state.apply(c.SetUserToken(at=60, by="alice", name="alice", token_hash="h2")).ok
    assert state.user_by_token == {"h2": "alice"} and state.users["alice"].token_set_at == 60
    assert state.apply(c.RemoveUser(at=70, by="admin", name="alice")).ok
    assert state.users == {} and state.user_by_token == {}


@pytest.mark.parametrize("kw, error", [
    ({"name": "Alice"}, "user name"), ({"name": "admin"}, "reserved"), ({"name": ""}, "user name"),
    ({"groups": ("ok", "Bad Group")}, "group name"), ({"groups": ("a", "a")}, "each at most once"),
    ({"token_hash": ""}, "token hash"),
])
def test_bad_users_change_nothing(kw, error):
    state = cluster(racks=1, nodes_per_rack=1)
    before = state.digest()
    result = add(state, **kw)
    assert not result.ok and error in result.error
    state.applied -= 1  # the rejection is counted; everything else is as it was
    assert state.digest() == before


def test_duplicate_names_and_tokens_are_refused():
    state = cluster(racks=1, nodes_per_rack=1)
    assert add(state).ok
    assert "already exists" in add(state, token_hash="h9").error
    assert "already in use" in add(state, name="bob").error
    assert "unknown user" in state.apply(c.RemoveUser(at=70, name="bob")).error
    assert "already in use" in state.apply(c.SetUserToken(at=70, name="alice", token_hash="h1")).error


def test_jobs_record_who_submitted_and_who_cancelled_and_snapshots_keep_users():
    state = cluster(racks=1, nodes_per_rack=1)
    assert add(state).ok
    checked(state, c.SubmitJob(at=10, by="alice", job_id="j1", request_id="r1", spec=spec()))
    checked(state, c.CancelJob(at=11, by="admin", job_id="j1"))
    job = state.jobs["j1"]
    assert (job.user, job.cancelled_by) == ("alice", "admin")
    assert job.events[0].message.startswith("by alice:")
    assert any("cancelled by admin" in e.message for e in job.events)
    restored = ClusterState.from_snapshot(state.to_snapshot())
    assert restored.digest() == state.digest()
    assert restored.user_by_token == {"h1": "alice"} and restored.jobs["j1"].user == "alice"


def test_a_snapshot_from_before_users_still_loads():
    state = cluster(racks=1, nodes_per_rack=1)
    checked(state, c.SubmitJob(at=10, job_id="j1", request_id="r1", spec=spec()))
    old = state.to_snapshot()
    del old["users"]
    for job in old["jobs"]:
        del job["user"], job["cancelled_by"]
    restored = ClusterState.from_snapshot(old)
    assert restored.users == {} and restored.jobs["j1"].user == ""


def test_snapshots_are_version_2_and_a_version_1_snapshot_still_loads():
    """Version 2 added arrays, final states and the workflow fields: an older release, which reads
    version 1 only, refuses such a snapshot rather than dropping them; this one reads both."""
    state = cluster(racks=1, nodes_per_rack=1)
    checked(state, c.SubmitJob(at=10, job_id="j1", request_id="r1", spec=spec()))
    checked(state, c.CancelJob(at=11, job_id="j1"))
    new = state.to_snapshot()
    assert new["version"] == 2 and ClusterState.from_snapshot(new).digest() == state.digest()
    old = state.to_snapshot()  # as version 1 wrote it: none of version 2's records
    old["version"] = 1
    del old["arrays"], old["finished"]
    for job in old["jobs"]:
        for key in ("array_id", "array_index", "failure_cause", "resizes"):
            del job[key]
        for key in ("array", "array_throttle", "after", "singleton", "on_unsatisfiable", "tasks_min",
                    "resize_interval"):
            del job["spec"][key]
    assert ClusterState.from_snapshot(old).digest() == state.digest()
    for version in (0, 7, None):
        with pytest.raises(ValueError, match="unsupported snapshot version"):
            ClusterState.from_snapshot({**new, "version": version})


def test_version_3_records_make_a_version_3_snapshot_and_only_then():
    """A cluster version or a job's uncharged requeues are what version 2 cannot read: their
    snapshot is version 3 (a version-2 release refuses it); without them it is version 2, byte for
    byte as version 2 wrote it, so replicas of both releases digest alike during an upgrade."""
    state = cluster(racks=1, nodes_per_rack=2)
    submit(state, "j1", tasks=1, max_restarts=0)
    assert state.to_snapshot()["version"] == 2 and "requeues" not in state.to_snapshot()["jobs"][0]
    commit(state, "j1", whole_nodes("r0-n0"))
    checked(state, c.NodeLost(at=20, node_id="r0-n0"))
    snap = state.to_snapshot()
    assert snap["version"] == 3 and snap["jobs"][0]["requeues"] == 1
    again = ClusterState.from_snapshot(snap)
    assert again.jobs["j1"].requeues == 1 and again.digest() == state.digest()
    other = cluster(racks=1, nodes_per_rack=1)
    assert checked(other, c.SetClusterVersion(at=1, version=3)).value == "3"
    assert checked(other, c.SetClusterVersion(at=2, version=2)).value == "already at version 3"  # only rises
    snap = other.to_snapshot()
    assert snap["version"] == 3 and ClusterState.from_snapshot(snap).cluster_version == 3


def test_a_lost_node_walks_no_job_round_the_cluster_for_ever():
    """Lost nodes requeue uncharged up to MAX_UNCHARGED_REQUEUES times; then they count."""
    from synapse.core.state.fsm import MAX_UNCHARGED_REQUEUES

    state = cluster(racks=1, nodes_per_rack=8)
    submit(state, "j1", tasks=1, max_restarts=0)
    for attempt in range(1, MAX_UNCHARGED_REQUEUES + 2):
        node = f"r0-n{attempt - 1}"
        commit(state, "j1", whole_nodes(node), attempt=attempt)
        checked(state, c.NodeLost(at=20 + attempt, node_id=node))
    job = state.jobs["j1"]
    assert job.status is JobStatus.FAILED and job.requeues == MAX_UNCHARGED_REQUEUES, [e.message for e in job.events]


def test_a_drain_releases_a_preemptors_hold_on_the_node():
    state = cluster(racks=1, nodes_per_rack=2)
    submit(state, "v", tasks=2, max_restarts=0)
    commit(state, "v", whole_nodes("r0-n0", "r0-n1"))
    submit(state, "p", tasks=2, priority=10)
    checked(state, c.Preempt(at=30, job_id="p", attempt=1, rule="priority", nodes=("r0-n0", "r0-n1"),
                             victims=(c.Victim("v", 1, 5.0),)))
    assert state.held_nodes == {"r0-n0": "p", "r0-n1": "p"}
    checked(state, c.DrainNode(at=31, node_id="r0-n0"))
    assert state.held_nodes == {} and "p" not in state.holds


def test_cluster_events_are_typed_ordered_and_survive_a_snapshot():
    state = cluster(racks=1, nodes_per_rack=2)
    checked(state, c.SubmitJob(at=10, by="alice", job_id="j1", request_id="r1", spec=spec(tasks=1)))
    commit(state, "j1", whole_nodes("r0-n0"))
    start_all(state, "j1")
    exit_task(state, "j1", 0, code=0)
    checked(state, c.NodeDown(at=50, node_id="r0-n1", reason="silent"))
    reasons = [(e.reason, e.object_id) for e in state.events_after(0)]
    assert reasons == [("NodeRegistered", "r0-n0"), ("NodeRegistered", "r0-n1"),
                       ("JobSubmitted", "j1"), ("GangPlaced", "j1"), ("TaskStarted", "j1"), ("GangRunning", "j1"),
                       ("TaskExited", "j1"), ("JobSucceeded", "j1"), ("NodeDown", "r0-n1")]
    assert [e.seq for e in state.events_after(0)] == list(range(1, 10))
    assert [e.reason for e in state.events_after(7)] == ["JobSucceeded", "NodeDown"]
    assert state.events_after(9) == []
    assert state.events_after(0)[-1].type == "Warning"
    restored = ClusterState.from_snapshot(state.to_snapshot())
    assert restored.events_after(3) == state.events_after(3) and restored.digest() == state.digest()


def test_a_cursor_older_than_the_events_kept_is_refused():
    from synapse.core.state import fsm

    state = cluster(racks=1, nodes_per_rack=1)
    for i in range(fsm.MAX_CLUSTER_EVENTS + 10):
        state.emit(i, "Normal", "job", "JobSubmitted", f"j{i}", "")
    first = state.cluster_events[0].seq
    assert first > 10 and state.events_after(first - 2) is None  # dropped: an explicit error, not a gap
    kept = state.events_after(first - 1)
    assert kept[0].seq == first and len(kept) == fsm.MAX_CLUSTER_EVENTS


def test_pending_reasons_are_recorded_once_per_change():
    state = cluster(racks=1, nodes_per_rack=1)
    submit(state, "j1", tasks=4)
    record = c.PendingReasons(at=20, term=1, entries=(c.PendingReason("j1", 1, "Resources", "0/4 tasks fit"),))
    assert state.apply(record).value == "1"
    assert state.apply(dataclasses.replace(record, at=21)).value == "0"  # unchanged: nothing recorded
    changed = c.PendingReasons(at=22, term=1, entries=(c.PendingReason("j1", 1, "QueueAtMax", "at max"),
                                                         c.PendingReason("gone", 1, "Resources", "")))
    assert state.apply(changed).value == "1"
    job = state.jobs["j1"]
    assert job.pending_reason == "QueueAtMax" and [e.kind for e in job.events].count("Waiting") == 2
    assert [e.reason for e in state.events_after(0)].count("JobPending") == 2


def test_when_a_job_became_pending_and_was_placed_are_fields_that_outlive_its_events():
    """Preemption's backfill rule reads these; the job's event list is trimmed and must not decide."""
    state = cluster()
    submit(state, tasks=1, max_restarts=1)
    commit(state, "j1", whole_nodes("r0-n0"))
    job = state.jobs["j1"]
    assert (job.pending_since, job.placed_at) == (10, 20)
    start_all(state, "j1")
    exit_task(state, "j1", 0, code=3)  # requeued at 40
    assert job.status is JobStatus.PENDING and job.pending_since == 40
    # A snapshot from before the fields existed: they are read back from the events it kept.
    old = state.to_snapshot()
    for j in old["jobs"]:
        del j["pending_since"], j["placed_at"]
    restored = ClusterState.from_snapshot(old).jobs["j1"]
    assert (restored.pending_since, restored.placed_at) == (40, 20)
    for i in range(MAX_EVENTS_PER_JOB + 10):  # reasons flapping push the Requeued event out
        checked(state, c.PendingReasons(at=50 + i, entries=(c.PendingReason("j1", 2, "AB"[i % 2], "why"),)))
    assert "Requeued" not in {e.kind for e in job.events}
    assert (job.pending_since, job.placed_at) == (40, 20)
