"""Dependencies in the pure core: parsing, resolution against the state (and after retention), and
the exact commands the leader's brain proposes when one can never be met."""

from __future__ import annotations

import dataclasses

import pytest

from synapse.core import commands as c
from synapse.core.brain.leader_state import LeaderState
from synapse.core.jobs import dependencies as d
from synapse.core.jobs.dependencies import DependencyState
from synapse.core.jobs.jobspec import JobFileError, parse_job
from synapse.core.model import JobStatus, Queue, Resources
from synapse.core.state.fsm import ClusterState
from tests.support.core import finish, run_round, submit_array
from tests.support.helpers import checked, cluster, spec


def submit(state: ClusterState, job_id: str, *, after=(), singleton=False, on_unsatisfiable="", name="",
           at=1.0, user="ann") -> c.Result:
    s = dataclasses.replace(spec(name=name or job_id), after=tuple(after), singleton=singleton,
                            on_unsatisfiable=on_unsatisfiable)
    kind = c.SubmitWorkflowJob if s.has_workflow else c.SubmitJob
    return checked(state, kind(at=at, job_id=job_id, request_id=job_id, spec=s, by=user))


def test_the_after_field_and_flag_parse_into_kinds_and_ids():
    assert d.parse_after({"ok": ["a", "b"], "notok": "c"}) == (("ok", "a"), ("ok", "b"), ("notok", "c"))
    assert d.parse_after_flag("ok:a,afterany:b,c") == (("ok", "a"), ("any", "b"), ("ok", "c"))
    for bad in ({"soon": ["a"]}, {"ok": []}, ["a"]):
        with pytest.raises(ValueError):
            d.parse_after(bad)
    with pytest.raises(JobFileError) as err:
        parse_job({"name": "x", "command": ["true"], "after": {"ok": [1]}})
    assert err.value.field == "after"
    with pytest.raises(JobFileError) as err:
        parse_job({"name": "x", "command": ["true"], "on_unsatisfiable": "maybe"})
    assert err.value.field == "on_unsatisfiable"


@pytest.mark.parametrize(("kind", "status", "verdict"), [
    ("ok", "SUCCEEDED", "met"), ("ok", "FAILED", "never"), ("ok", "CANCELLED", "never"), ("ok", "RUNNING", "waiting"),
    ("notok", "FAILED", "met"), ("notok", "CANCELLED", "met"), ("notok", "SUCCEEDED", "never"),
    ("any", "FAILED", "met"), ("any", "SUCCEEDED", "met"), ("any", "PENDING", "waiting"), ("ok", "", "never"),
])
def test_each_kind_of_dependency_on_each_end(kind, status, verdict):
    assert d.resolve_one(kind, status) == DependencyState(verdict)


def test_a_dependency_on_an_unknown_job_or_on_itself_is_refused():
    state = ClusterState()
    refused = submit(state, "b", after=[("ok", "nope")])
    assert not refused.ok and "after: unknown job nope" in refused.error
    refused = submit(state, "b", after=[("ok", "b")])
    assert not refused.ok and "is this job itself" in refused.error
    assert not state.jobs


def test_afterok_starts_in_the_round_after_its_upstream_succeeds():
    state = cluster(racks=1, nodes_per_rack=2)
    brain = LeaderState()
    submit(state, "pre")
    submit(state, "train", after=[("ok", "pre")])
    assert [x.job_id for x in run_round(state, brain, 2.0)] == ["pre"]
    cmds = run_round(state, brain, 3.0)
    assert [(e.job_id, e.code, e.message) for x in cmds for e in x.entries] == [
        ("train", "Dependency", "waits for afterok pre (SCHEDULED)")]
    finish(state, "pre")
    assert [(type(x).__name__, x.job_id) for x in run_round(state, brain, 4.0)] == [("CommitPlan", "train")]


def test_a_dependency_that_can_never_be_met_fails_the_job_naming_the_upstream():
    state = cluster(racks=1, nodes_per_rack=2)
    brain = LeaderState()
    submit(state, "pre")
    submit(state, "cleanup", after=[("notok", "pre")])
    submit(state, "report", after=[("notok", "pre")], on_unsatisfiable="wait")
    run_round(state, brain, 2.0)
    finish(state, "pre")
    cmds = run_round(state, brain, 4.0)
    why = "afternotok pre: it ended SUCCEEDED, so this dependency can never be met"
    assert cmds == [
        c.FailAttempt(at=4.0, job_id="cleanup", attempt=1, reason=why, final=True, cause="DependencyNeverSatisfied"),
        c.PendingReasons(at=4.0, entries=(c.PendingReason("report", 1, "DependencyNeverSatisfied", why),))]
    job = state.jobs["cleanup"]
    assert job.status is JobStatus.FAILED and job.failure_cause == "DependencyNeverSatisfied" and "pre" in job.failure
    assert state.jobs["report"].status is JobStatus.PENDING  # it asked to wait
    assert run_round(state, brain, 5.0) == []  # nothing proposed twice
    brain.validate(state)


def test_a_dependency_holds_after_its_upstream_is_forgotten():
    state = cluster(racks=1, nodes_per_rack=2)
    brain = LeaderState()
    submit(state, "pre")
    submit(state, "train", after=[("ok", "pre")])
    run_round(state, brain, 2.0)
    finish(state, "pre")
    assert checked(state, c.ArchiveJobs(at=7200.0, job_ids=("pre",))).value == "1"
    assert "pre" not in state.jobs and state.finished == {"pre": "SUCCEEDED"}
    assert submit(state, "eval", after=[("ok", "pre")], at=7200.0).ok  # long after: still known
    restored = ClusterState.from_snapshot(state.to_snapshot())
    assert restored.finished == state.finished and restored.digest() == state.digest()
    assert [x.job_id for x in run_round(state, brain, 7201.0)] == ["train", "eval"]


def test_afterok_on_an_array_waits_for_every_element_and_fails_at_the_first_failure():
    state = cluster(racks=1, nodes_per_rack=2)
    brain = LeaderState()
    submit_array(state, "0-2", gpu=8)
    submit(state, "merge", after=[("ok", "A")])
    submit(state, "one", after=[("ok", "A_2")])
    run_round(state, brain, 2.0)  # A_0, A_1
    finish(state, "A_0")
    assert [x.job_id for x in run_round(state, brain, 3.0)] == ["A_2"]
    finish(state, "A_2")
    assert [x.job_id for x in run_round(state, brain, 4.0)] == ["one"]  # its element succeeded
    finish(state, "A_1", code=1)
    cmds = run_round(state, brain, 5.0)
    assert [(type(x).__name__, x.job_id, x.cause) for x in cmds] == [
        ("FailAttempt", "merge", "DependencyNeverSatisfied")]


def test_afterok_on_an_array_runs_once_all_its_elements_succeeded():
    state = cluster(racks=1, nodes_per_rack=2)
    brain = LeaderState()
    submit_array(state, "0-3", gpu=8)
    submit(state, "merge", after=[("ok", "A")])
    for at in (2.0, 3.0):
        for x in run_round(state, brain, at):
            if isinstance(x, c.CommitPlan):
                finish(state, x.job_id)
    assert state.arrays["A"].done and state.jobs["merge"].status is JobStatus.PENDING
    assert [x.job_id for x in run_round(state, brain, 4.0)] == ["merge"]


def test_a_singleton_waits_while_a_job_of_its_name_and_user_runs():
    state = cluster(racks=1, nodes_per_rack=4)
    brain = LeaderState()
    submit(state, "s1", name="nightly", singleton=True)
    submit(state, "s2", name="nightly", singleton=True)
    submit(state, "s3", name="nightly", singleton=True, user="bob")
    cmds = run_round(state, brain, 2.0)
    assert [x.job_id for x in cmds] == ["s1", "s3"]
    assert [(e.job_id, e.code) for x in run_round(state, brain, 3.0) for e in x.entries] == [("s2", "Singleton")]
    finish(state, "s1")
    assert [x.job_id for x in run_round(state, brain, 4.0)] == ["s2"]


def test_a_singleton_waits_for_a_job_of_its_name_planned_earlier_in_the_same_round():
    state = cluster(racks=1, nodes_per_rack=4)
    brain = LeaderState()
    submit(state, "n1", name="train")  # not a singleton itself, but it holds the name once placed
    submit(state, "s", name="train", singleton=True)
    assert [x.job_id for x in run_round(state, brain, 2.0)] == ["n1"]
    assert [(e.job_id, e.code) for x in run_round(state, brain, 3.0) for e in x.entries] == [("s", "Singleton")]


def test_a_job_held_by_its_dependency_plans_no_preemption():
    state = cluster(racks=1, nodes_per_rack=2)
    checked(state, c.ApplyQueues(at=0, queues=(Queue("a", guaranteed=Resources(0, 0, 16)), Queue("b"))))
    brain = LeaderState()
    for name in ("b1", "b2"):
        checked(state, c.SubmitJob(at=0, job_id=name, request_id=name, spec=spec(name=name, queue="b")))
    submit(state, "up")
    run_round(state, brain, 1.0)  # b1 and b2 hold both nodes; "up" waits
    s = dataclasses.replace(spec(name="a1", tasks=2, queue="a"), after=(("ok", "up"),))
    checked(state, c.SubmitWorkflowJob(at=5000, job_id="a1", request_id="a1", spec=s))
    cmds = run_round(state, brain, 5000.0)
    assert not [x for x in cmds if isinstance(x, c.Preempt)]
    assert ("a1", "Dependency") in [(e.job_id, e.code) for x in cmds for e in x.entries]


def test_a_dependency_never_met_ends_the_whole_array_at_once():
    """One FailAttempt fails the queued element, counts every other as failed and makes no more."""
    state = cluster(racks=1, nodes_per_rack=2)
    brain = LeaderState()
    submit(state, "P")
    run_round(state, brain, 2.0)
    finish(state, "P", code=1, at=3.0)
    s = dataclasses.replace(spec(name="sweep"), array="0-99", after=(("ok", "P"),))
    checked(state, c.SubmitWorkflowJob(at=4.0, job_id="A", request_id="rA", spec=s))
    cmds = run_round(state, brain, 5.0)
    assert [(type(x).__name__, x.job_id, x.cause) for x in cmds] == [("FailAttempt", "A_0", d.NEVER_SATISFIED)]
    array = state.arrays["A"]
    assert array.done and array.failed == 100 and array.status(False) is JobStatus.FAILED
    assert [j for j in state.jobs if j.startswith("A_")] == ["A_0"] and not state.pending
    assert run_round(state, brain, 6.0) == []
    assert d.upstream_status(state, "A_50") == "FAILED" and d.upstream_status(state, "A") == "FAILED"
    restored = ClusterState.from_snapshot(state.to_snapshot())
    assert d.upstream_status(restored, "A_50") == "FAILED" and restored.digest() == state.digest()


def test_an_element_cancelled_before_it_started_reads_cancelled_after_the_array_moved_past_it():
    state = cluster(racks=1, nodes_per_rack=2)
    brain = LeaderState()
    submit_array(state, "0-3", throttle=1)
    checked(state, c.CancelJob(at=2.0, job_id="A_2"))
    at = 3.0
    while not state.arrays["A"].done:
        for cmd in run_round(state, brain, at):
            if isinstance(cmd, c.CommitPlan):
                finish(state, cmd.job_id, at=at)
        at += 1
        assert at < 20
    array = state.arrays["A"]
    assert (array.succeeded, array.cancelled_count, array.remaining()) == (3, 1, 0)
    assert d.upstream_status(state, "A_2") == "CANCELLED"
    submit(state, "B", after=[("any", "A_2")], at=at)
    assert [x.job_id for x in run_round(state, brain, at + 1)] == ["B"]
