"""Hold, release, update and requeue; per-user limits of a queue; interactive jobs: the rules as apply
and a scheduling round enforce them, on the pure core."""

from __future__ import annotations

import dataclasses

import pytest

from synapse.core import codec, submission
from synapse.core import commands as c
from synapse.core.model import UNLIMITED, Hold, JobStatus, Placement, Queue, Resources, Role
from synapse.core.queues import QueueFileError, parse_queue
from synapse.core.schedule import preemption
from synapse.core.schedule.scheduler import schedule_round
from synapse.core.state.fsm import ClusterState
from synapse.core.state.invariants import violations
from tests.support.helpers import checked, cluster, spec

HOUR = 3600.0


def users(state: ClusterState) -> ClusterState:
    """alice and bob are users, root an admin."""
    for name, role in (("alice", Role.USER), ("bob", Role.USER), ("root", Role.ADMIN)):
        checked(state, c.AddUser(at=1, name=name, role=role, groups=(), token_hash=f"h-{name}"))
    return state


def submit(state, job_id, by="alice", held=False, **kw):
    kind = c.submit_kind(spec(**kw), held)
    extra = {"held": held} if kind is c.SubmitInteractiveJob else {}
    return state.apply(kind(at=10, by=by, job_id=job_id, request_id=job_id, spec=spec(**kw), **extra))


def place(state, job_id, at=20):
    """Commit the job's gang where the next round puts it, and start every task."""
    plan = next(p for p in schedule_round(state, at).plans if p.job_id == job_id)
    checked(state, c.CommitPlan(at=at, job_id=job_id, attempt=plan.attempt, placements=plan.placements))
    job = state.jobs[job_id]
    for t in job.tasks:
        checked(state, c.TaskStarted(at=at, job_id=job_id, attempt=job.attempt, index=t.index, node_id=t.node_id))


def unchanged(state, cmd):
    """Apply `cmd`, which must be refused, and check that it changed nothing; its error."""
    before = state.to_snapshot()
    result = state.apply(cmd)
    assert not result.ok
    after = state.to_snapshot()
    assert after.pop("applied") == before.pop("applied") + 1 and after == before
    return result.error


# ---- hold and release ----------------------------------------------------------------------------

def test_a_job_submitted_held_is_never_placed_until_released():
    state = users(cluster())
    assert submit(state, "j1", held=True).ok
    job = state.jobs["j1"]
    assert job.status is JobStatus.PENDING and job.held_by == "alice"
    waiting = schedule_round(state, 20).waiting["j1"]
    assert (waiting.code, waiting.message) == ("Held", "held by alice")
    assert not schedule_round(state, 20).plans
    # apply refuses a plan for it whoever proposes one (a leader that planned before the hold)
    error = unchanged(state, c.CommitPlan(at=20, job_id="j1", attempt=1, placements=(
        Placement(0, "r0-n0", tuple(range(8)), 0),)))
    assert "held by alice" in error
    assert checked(state, c.ReleaseJob(at=30, by="alice", job_id="j1")).value == "released"
    assert [p.job_id for p in schedule_round(state, 40).plans] == ["j1"]
    assert [e.kind for e in job.events] == ["Submitted", "Released"]


def test_hold_is_for_pending_jobs_of_their_owner_or_an_admin():
    state = users(cluster())
    submit(state, "j1")
    assert "only its owner or an admin" in unchanged(state, c.HoldJob(at=11, by="bob", job_id="j1"))
    assert checked(state, c.HoldJob(at=11, by="root", job_id="j1")).value == "held by root"
    assert state.jobs["j1"].held_by == "root" and not schedule_round(state, 12).plans
    assert state.cluster_events[-1][3:] == ("job", "JobHeld", "j1", "by root: it stays queued and is not placed until "
                                                                    "released")
    checked(state, c.ReleaseJob(at=13, by="alice", job_id="j1"))
    place(state, "j1")
    assert "only a pending job can be held" in unchanged(state, c.HoldJob(at=21, by="alice", job_id="j1"))
    assert "unknown job" in unchanged(state, c.HoldJob(at=21, by="alice", job_id="nope"))


def test_a_held_job_that_preempted_lets_its_nodes_go_and_preempts_no_more():
    state = users(cluster())
    submit(state, "j1")
    state.holds["j1"] = Hold("j1", 1, ("r0-n0",), ("x",), "priority", 10.0)  # as a committed Preempt leaves it
    state.held_nodes["r0-n0"] = "j1"
    checked(state, c.HoldJob(at=11, by="alice", job_id="j1"))
    assert "j1" not in state.holds and "r0-n0" not in state.held_nodes
    error = unchanged(state, c.Preempt(at=12, job_id="j1", attempt=1, rule="priority",
                                       victims=(c.Victim("x", 1, 0.0),), nodes=("r0-n1",)))
    assert "held by alice" in error


def test_the_invariant_checker_catches_a_held_job_that_was_placed():
    state = users(cluster())
    submit(state, "j1")
    place(state, "j1")
    state.jobs["j1"].held_by = "alice"  # what apply must never let happen
    assert any("held by alice yet was placed" in v for v in violations(state))


# ---- update ----------------------------------------------------------------------------------------

def test_an_owner_lowers_priority_and_shortens_the_limit_only_an_admin_raises_them():
    state = users(cluster(racks=1, nodes_per_rack=1))
    submit(state, "j1", priority=5, time_limit=2 * HOUR)
    submit(state, "j2", by="bob", priority=3)
    assert schedule_round(state, 20).plans[0].job_id == "j1"
    assert checked(state, c.UpdateJob(at=21, by="alice", job_id="j1", priority=1)).value == "priority 5 -> 1"
    assert schedule_round(state, 22).plans[0].job_id == "j2"  # its place in the queue follows
    assert "only an admin may raise it" in unchanged(state, c.UpdateJob(at=23, by="alice", job_id="j1", priority=4))
    assert "only an admin may lengthen" in unchanged(
        state, c.UpdateJob(at=23, by="alice", job_id="j1", time_limit=3 * HOUR))
    assert "only an admin may lengthen or lift" in unchanged(
        state, c.UpdateJob(at=23, by="alice", job_id="j1", time_limit=0))
    assert "only its owner or an admin" in unchanged(state, c.UpdateJob(at=23, by="bob", job_id="j1", priority=0))
    checked(state, c.UpdateJob(at=24, by="alice", job_id="j1", time_limit=HOUR))
    checked(state, c.UpdateJob(at=25, by="root", job_id="j1", priority=9, time_limit=0))
    job = state.jobs["j1"]
    assert (job.spec.priority, job.spec.time_limit, job.updates) == (9, 0.0, 3)
    assert job.events[-1].message == "by root: priority 1 -> 9, time_limit 1h00m -> none"
    # a retry of the original submission still gets the job, though its spec changed since
    assert submit(state, "j1", priority=5, time_limit=2 * HOUR).value == "j1"


def test_moving_queue_re_checks_the_new_queues_rules():
    state = users(cluster())
    checked(state, c.ApplyQueuesWithLimits(at=2, queues=(
        Queue("open"), Queue("closed", users=("bob",)), Queue("small", user_jobs=1))))
    submit(state, "j1", queue="open")
    submit(state, "j2", queue="small")
    assert "unknown queue gone" in unchanged(state, c.UpdateJob(at=11, by="alice", job_id="j1", queue="gone"))
    assert "may not submit to queue closed" in unchanged(
        state, c.UpdateJob(at=11, by="root", job_id="j1", queue="closed"))  # the owner's rights, not the admin's
    assert "max_per_user.jobs is 1" in unchanged(state, c.UpdateJob(at=11, by="alice", job_id="j1", queue="small"))
    checked(state, c.UpdateJob(at=12, by="alice", job_id="j2", queue="small"))  # itself does not count twice
    checked(state, c.UpdateJob(at=13, by="alice", job_id="j1", queue="default"))
    assert state.jobs["j1"].spec.queue == "default"
    place(state, "j1")
    assert "only a pending job moves" in unchanged(state, c.UpdateJob(at=21, by="alice", job_id="j1", queue="open"))


# ---- requeue -------------------------------------------------------------------------------------

def test_requeue_stops_the_gang_and_queues_a_new_attempt_uncharged():
    state = users(cluster())
    submit(state, "j1", tasks=2, max_restarts=0)
    place(state, "j1")
    assert "only a scheduled or running" in unchanged(
        state, c.RequeueJob(at=30, by="alice", job_id="j1", attempt=2))
    assert "only its owner" in unchanged(state, c.RequeueJob(at=30, by="bob", job_id="j1", attempt=1))
    checked(state, c.RequeueJob(at=30, by="alice", job_id="j1", attempt=1, reason="bad node"))
    job = state.jobs["j1"]
    assert job.status is JobStatus.STOPPING and job.stop_cause == "Requeued"
    for t in list(job.tasks):
        checked(state, c.TaskExited(at=31, job_id="j1", attempt=1, index=t.index, node_id=t.node_id, exit_code=143,
                                    cause="Signal"))
    assert (job.status, job.attempt, job.restarts_used(), job.manual_requeues) == (JobStatus.PENDING, 2, 0, 1)
    assert job.runs[-1].outcome == "Requeued"
    assert job.events[-1].message == "attempt 2 requeued by alice: bad node; not charged to max_restarts"
    assert "only a scheduled or running" in unchanged(state, c.RequeueJob(at=32, by="alice", job_id="j1", attempt=2))


# ---- per-user limits -----------------------------------------------------------------------------

def test_jobs_per_user_are_refused_at_submission_and_apply():
    state = users(cluster())
    checked(state, c.ApplyQueuesWithLimits(at=2, queues=(Queue("research", user_jobs=2),)))
    assert submit(state, "j1", queue="research").ok and submit(state, "j2", queue="research").ok
    result = submit(state, "j3", queue="research")
    assert not result.ok and ("queue research: user alice has 2 pending or running job(s) there and its "
                              "max_per_user.jobs is 2") in result.error
    assert submit(state, "j3", by="bob", queue="research").ok  # per user
    refusal = submission.refusal(state, spec(queue="research"), submission.Submitter("alice"))
    assert refusal is not None and refusal.kind is submission.Refused.LIMIT
    checked(state, c.CancelJob(at=20, by="alice", job_id="j1"))
    assert submit(state, "j4", queue="research").ok  # an ended job counts no more


def test_gpus_per_user_wait_with_a_reason_naming_the_limit():
    state = users(cluster())
    checked(state, c.ApplyQueuesWithLimits(at=2, queues=(Queue("research", user_gpu=16),)))
    for job_id, by in (("a1", "alice"), ("a2", "alice"), ("a3", "alice"), ("b1", "bob")):
        assert submit(state, job_id, by=by, queue="research").ok  # 8 GPUs each
    result = schedule_round(state, 20)
    assert sorted(p.job_id for p in result.plans) == ["a1", "a2", "b1"]
    waiting = result.waiting["a3"]
    assert waiting.code == "UserLimit"
    assert waiting.message.startswith("user limit: 16 GPUs in queue research")
    place(state, "a1")
    place(state, "a2")
    assert state.user_usage[("research", "alice")].gpu == 16
    assert schedule_round(state, 30).waiting["a3"].code == "UserLimit"


def test_no_limits_no_change_to_submission_or_rounds():
    state = cluster()
    checked(state, c.ApplyQueues(at=2, queues=(Queue("research"),)))
    for i in range(5):
        assert submit(state, f"j{i}", by="alice", queue="research").ok
    assert len(schedule_round(state, 20).plans) == 5


# ---- interactive jobs ----------------------------------------------------------------------------

def interactive(**kw):
    return dataclasses.replace(spec(**{k: v for k, v in kw.items() if k != "interactive"}), interactive=True)


def test_an_interactive_job_is_bounded_by_its_queues_max_duration():
    state = users(cluster())
    checked(state, c.ApplyQueuesWithLimits(at=2, queues=(Queue("dev", interactive_max=2 * HOUR),)))

    def sub(job_id, **kw):
        return state.apply(c.SubmitInteractiveJob(at=10, by="alice", job_id=job_id, request_id=job_id,
                                                  spec=interactive(**kw)))
    assert "needs one (at most 8h00m in queue default)" in sub("i0").error
    assert "may run at most 8h00m in queue default (its interactive max_duration), not 9h00m" in sub(
        "i1", time_limit=9 * HOUR).error
    assert sub("i2", time_limit=8 * HOUR).ok
    assert "at most 2h00m in queue dev" in sub("i3", queue="dev", time_limit=3 * HOUR).error
    assert sub("i4", queue="dev", time_limit=2 * HOUR).ok
    assert "only an admin may lengthen" in unchanged(
        state, c.UpdateJob(at=11, by="alice", job_id="i4", time_limit=3 * HOUR))
    assert "at most 2h00m in queue dev" in unchanged(
        state, c.UpdateJob(at=11, by="root", job_id="i4", time_limit=3 * HOUR))  # not even an admin
    assert "at most 2h00m in queue dev" in unchanged(state, c.UpdateJob(at=11, by="alice", job_id="i2", queue="dev"))


def test_an_interactive_job_is_not_preempted_while_its_queue_is_within_its_guarantee():
    gpu = Resources(0, 0, 16)
    state = users(cluster(racks=1, nodes_per_rack=2))
    checked(state, c.ApplyQueues(at=2, queues=(Queue("a", guaranteed=gpu), Queue("b", guaranteed=gpu))))
    state.apply(c.SubmitInteractiveJob(at=10, by="alice", job_id="session", request_id="s",
                                       spec=interactive(queue="a", time_limit=HOUR, priority=0)))
    place(state, "session", at=20)
    submit(state, "batch", queue="a", priority=0)
    place(state, "batch", at=20)
    submit(state, "urgent", queue="a", priority=10, tasks=2)  # wants both nodes; rule: priority
    found = preemption.plan(state, state.jobs["urgent"], 5000)
    assert isinstance(found, str)  # the batch gang alone does not make room, and the session is kept
    submit(state, "one", queue="a", priority=10)
    found = preemption.plan(state, state.jobs["one"], 5000)
    assert [v.job_id for v in found.command.victims] == ["batch"]
    # apply refuses a plan that takes the session (a leader that planned otherwise)
    session = c.Victim("session", 1, 5.0)
    error = unchanged(state, c.Preempt(at=5000, job_id="one", attempt=1, rule="priority", victims=(session,),
                                       nodes=(state.jobs["session"].tasks[0].node_id,)))
    assert "interactive and its queue a is within its guarantee" in error


# ---- the queue file, the codec, snapshots ----------------------------------------------------------

def test_the_queue_file_reads_per_user_limits_and_the_interactive_maximum():
    q = parse_queue({"name": "research", "max_per_user": {"gpu": 64, "jobs": 200},
                     "interactive": {"max_duration": "4h"}})
    assert (q.user_gpu, q.user_jobs, q.interactive_max, q.has_limits) == (64, 200, 4 * HOUR, True)
    assert parse_queue({"name": "x", "max_per_user": {"jobs": 5}}).user_gpu == UNLIMITED
    assert parse_queue({"name": "x"}).interactive_max_duration == 8 * HOUR
    for bad, where in (({"gpu": 0}, "max_per_user.gpu"), ({"cpu": 1}, "max_per_user.cpu"),
                       ({"jobs": "many"}, "max_per_user.jobs")):
        with pytest.raises(QueueFileError, match=where):
            parse_queue({"name": "x", "max_per_user": bad})


def test_the_new_kinds_round_trip_and_older_kinds_refuse_what_they_cannot_carry():
    cmds = [c.HoldJob(at=1.0, by="a", job_id="j"), c.ReleaseJob(at=1.0, by="a", job_id="j"),
            c.UpdateJob(at=1.0, by="a", job_id="j", priority=0), c.UpdateJob(at=1.0, job_id="j", time_limit=0.0),
            c.UpdateJob(at=1.0, job_id="j", queue="q", priority=-3, time_limit=60.0),
            c.RequeueJob(at=1.0, by="a", job_id="j", attempt=2, reason="r"),
            c.SubmitInteractiveJob(at=1.0, job_id="j", request_id="r", spec=interactive(time_limit=60.0), held=True),
            c.ApplyQueuesWithLimits(at=1.0, queues=(Queue("q", user_gpu=8, user_jobs=2, interactive_max=60.0),))]
    for cmd in cmds:
        assert codec.identical(codec.decode_command(codec.encode_command(cmd)), cmd), cmd
    with pytest.raises(codec.CodecError, match="travels as SubmitInteractiveJob"):
        codec.encode_command(c.SubmitSecretJob(at=1, job_id="j", request_id="r", spec=interactive()))
    with pytest.raises(codec.CodecError, match="ApplyQueuesWithLimits"):
        codec.encode_command(c.ApplyQueues(at=1, queues=(Queue("q", user_gpu=8),)))
    assert c.submit_kind(spec()) is c.SubmitJob and c.submit_kind(spec(), held=True) is c.SubmitInteractiveJob
    assert c.queues_kind((Queue("q"),)) is c.ApplyQueues


def test_a_snapshot_keeps_holds_limits_and_sessions():
    state = users(cluster())
    checked(state, c.ApplyQueuesWithLimits(at=2, queues=(Queue("q", user_gpu=8, user_jobs=5, interactive_max=HOUR),)))
    submit(state, "j1", held=True, queue="q")
    state.apply(c.SubmitInteractiveJob(at=10, by="alice", job_id="i1", request_id="i1",
                                       spec=interactive(queue="q", time_limit=HOUR)))
    snap = state.to_snapshot()
    assert snap["version"] == 6
    again = ClusterState.from_snapshot(snap)
    assert again.digest() == state.digest()
    assert again.jobs["j1"].held_by == "alice" and again.jobs["i1"].spec.interactive
    assert again.queues["q"] == state.queues["q"]
    plain = cluster()
    assert plain.to_snapshot()["version"] < 6


def test_synctl_alloc_makes_an_interactive_job_that_travels_with_its_allocation():
    from synapse.client.cli.alloc import _alloc_spec

    flags = {"name": "alloc", "tasks": 2, "cpu": "1", "memory": "1Gi", "gpu": 8, "pack": "", "required": False,
             "priority": 0, "queue": "", "time_limit": None, "idle_timeout": None}
    made = _alloc_spec(flags)
    assert made.interactive and made.alloc and made.time_limit == 0.0  # the API sets its queue's maximum
    assert c.submit_kind(made) is c.SubmitInteractiveJob and issubclass(c.SubmitInteractiveJob, c.SubmitAllocJob)
    cmd = c.SubmitInteractiveJob(at=1.0, job_id="a", request_id="a", spec=dataclasses.replace(made, time_limit=60.0))
    assert codec.identical(codec.decode_command(codec.encode_command(cmd)), cmd)
