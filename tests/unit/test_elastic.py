"""Elastic gangs in the pure core: the largest size that fits, growing with notice, bad input."""

from __future__ import annotations

import dataclasses

import pytest

from synapse.core import codec
from synapse.core import commands as c
from synapse.core.brain.leader_state import LeaderState
from synapse.core.jobs.jobspec import JobFileError, parse_job
from synapse.core.model import JobStatus, Placement, Queue
from synapse.core.schedule.elastic import required_domain_problem
from synapse.core.schedule.placement import ClusterView
from synapse.master.dispatch import assignments_for_node
from tests.support.core import finish, run_round
from tests.support.helpers import checked, cluster, spec


def elastic(name: str, low: int, high: int, **kw) -> object:
    return dataclasses.replace(spec(name=name, tasks=high, **kw), tasks_min=low, resize_interval=60.0)


def submit(state, job_id: str, s, at: float = 1.0) -> None:
    kind = c.SubmitWorkflowJob if s.has_workflow else c.SubmitJob
    assert checked(state, kind(at=at, job_id=job_id, request_id=job_id, spec=s)).ok


def occupy(state, job_id: str, nodes: list[str]) -> None:
    """A plain job holding these whole nodes."""
    submit(state, job_id, spec(name=job_id, tasks=len(nodes)))
    checked(state, c.CommitPlan(at=1.0, job_id=job_id, attempt=1, placements=tuple(
        Placement(i, n, tuple(range(8)), i) for i, n in enumerate(nodes))))


def test_the_job_file_takes_min_and_max_and_refuses_bad_bounds():
    doc = {"name": "e", "command": ["true"], "resources": {"gpu": 8}, "tasks": {"min": 2, "max": 4},
           "resize_interval": "5m"}
    parsed = parse_job(doc)
    assert (parsed.tasks, parsed.tasks_min, parsed.resize_interval) == (4, 2, 300.0) and parsed.has_workflow
    for tasks, field in (({"min": 5, "max": 4}, "tasks.min"), ({"min": 0, "max": 4}, "tasks.min"),
                         ({"max": 4}, "tasks"), ({"min": 1, "max": 0}, "tasks.max")):
        with pytest.raises(JobFileError) as bad:
            parse_job({**doc, "tasks": tasks})
        assert bad.value.field == field, tasks
    assert parse_job({**doc, "tasks": {"min": 3, "max": 3}}).tasks_min == 0  # not elastic: a fixed gang


def test_an_elastic_gang_starts_at_the_largest_size_that_fits():
    state = cluster(racks=1, nodes_per_rack=4)
    occupy(state, "busy", ["r0-n0", "r0-n1"])
    submit(state, "e", elastic("e", 2, 4))
    [plan] = run_round(state, LeaderState(), 2.0)
    assert len(plan.placements) == 2 and {p.node_id for p in plan.placements} == {"r0-n2", "r0-n3"}
    envs = [dict(a.env) for a in assignments_for_node(state, "r0-n2") if a.job_id == "e"]
    assert [(e["SYNAPSE_TASKS_MIN"], e["SYNAPSE_TASKS_MAX"], e["SYNAPSE_RDZV_ID"]) for e in envs] == [("2", "4", "e")]
    assert [a.world_size for a in assignments_for_node(state, "r0-n2") if a.job_id == "e"] == [2]


def test_an_elastic_gang_waits_for_its_min_and_holds_nothing():
    state = cluster(racks=1, nodes_per_rack=4)
    occupy(state, "busy", ["r0-n0", "r0-n1", "r0-n2"])
    submit(state, "e", elastic("e", 2, 4))
    cmds = run_round(state, LeaderState(), 2.0)
    assert [(e.job_id, e.code) for x in cmds for e in x.entries] == [("e", "Resources")]


def running_at_two_with_room_for_four() -> tuple:
    """An elastic {2..4} gang started at 2 beside a gang on the other two nodes, which then ends."""
    state = cluster(racks=1, nodes_per_rack=4)
    brain = LeaderState()
    occupy(state, "busy", ["r0-n0", "r0-n1"])
    submit(state, "e", elastic("e", 2, 4))
    run_round(state, brain, 2.0)
    for t in state.jobs["e"].tasks:
        checked(state, c.TaskStarted(at=2.0, job_id="e", attempt=1, index=t.index, node_id=t.node_id))
    finish(state, "busy", at=3.0)
    return state, brain


def test_a_running_elastic_gang_grows_when_room_appears_after_its_interval():
    state, brain = running_at_two_with_room_for_four()
    job = state.jobs["e"]
    assert run_round(state, brain, 10.0) == []  # room, but it ran only 8 s of its 60 s interval
    cmds = run_round(state, brain, 63.0)
    assert cmds == [c.ResizeGang(at=63.0, job_id="e", attempt=1, size=4, reason="room for more tasks")]
    assert job.status is JobStatus.STOPPING and all(t.reason == "" for t in job.tasks)
    for t in list(job.tasks):
        checked(state, c.TaskExited(at=64.0, job_id="e", attempt=1, index=t.index, node_id=t.node_id, exit_code=143))
    assert (job.status, job.attempt, job.resizes, job.restarts_used()) == (JobStatus.PENDING, 2, 1, 0)
    assert [e.kind for e in job.events][-3:] == ["Stopping", "Resizing", "Requeued"]
    [plan] = run_round(state, brain, 65.0)
    assert (plan.job_id, plan.attempt, len(plan.placements)) == ("e", 2, 4)
    brain.validate(state)


def test_an_elastic_gang_does_not_grow_past_a_gang_waiting_ahead_of_it():
    state, brain = running_at_two_with_room_for_four()
    submit(state, "big", dataclasses.replace(spec(name="big", tasks=3), priority=10), at=4.0)
    cmds = run_round(state, brain, 100.0)
    assert not [x for x in cmds if isinstance(x, c.ResizeGang)]


def test_apply_refuses_plans_outside_the_bounds_and_resizes_that_do_not_grow():
    state = cluster(racks=1, nodes_per_rack=4)
    submit(state, "e", elastic("e", 2, 3))
    one = c.CommitPlan(at=2.0, job_id="e", attempt=1, placements=(Placement(0, "r0-n0", tuple(range(8)), 0),))
    assert "takes 2 to 3" in state.apply(one).error
    checked(state, c.CommitPlan(at=2.0, job_id="e", attempt=1, placements=tuple(
        Placement(i, f"r0-n{i}", tuple(range(8)), i) for i in range(2))))
    for i in range(2):
        checked(state, c.TaskStarted(at=2.0, job_id="e", attempt=1, index=i, node_id=f"r0-n{i}"))
    assert not state.apply(c.ResizeGang(at=3.0, job_id="e", attempt=1, size=2)).ok
    assert not state.apply(c.ResizeGang(at=3.0, job_id="e", attempt=1, size=4)).ok
    cmd = c.ResizeGang(at=3.0, job_id="e", attempt=1, size=3, reason="r")
    assert codec.decode_command(codec.encode_command(cmd)) == cmd


def test_an_elastic_gang_whose_required_domain_cannot_hold_its_min_is_refused():
    state = cluster(racks=2, nodes_per_rack=2)
    view = ClusterView(state.nodes, state.index, state.levels)
    s = dataclasses.replace(elastic("e", 3, 4), topology=dataclasses.replace(spec(pack="rack", required=True).topology))
    assert "no rack holds its min of 3 task(s)" in required_domain_problem(view, s)
    assert required_domain_problem(view, dataclasses.replace(s, tasks_min=2)) == ""


def test_a_preemptor_shrinks_an_elastic_gang_to_the_nodes_it_does_not_need():
    state = cluster(racks=1, nodes_per_rack=4)
    checked(state, c.ApplyQueues(at=0, queues=(Queue("q", preemption_rules=("priority",)),)))
    brain = LeaderState()
    submit(state, "e", dataclasses.replace(elastic("e", 2, 4), queue="q"))
    run_round(state, brain, 1.0)
    job = state.jobs["e"]
    for t in job.tasks:
        checked(state, c.TaskStarted(at=1.0, job_id="e", attempt=1, index=t.index, node_id=t.node_id))
    submit(state, "urgent", spec(name="urgent", tasks=2, queue="q", priority=10), at=2.0)
    [preempt, _reasons] = run_round(state, brain, 2.0)
    assert isinstance(preempt, c.Preempt) and [v.job_id for v in preempt.victims] == ["e"]
    assert job.status is JobStatus.STOPPING and job.stop_cause == "Resized"
    for t in list(job.tasks):
        checked(state, c.TaskExited(at=3.0, job_id="e", attempt=1, index=t.index, node_id=t.node_id, exit_code=143))
    assert (job.status, job.resizes, job.preemptions) == (JobStatus.PENDING, 1, 0)
    plans = {x.job_id: x for x in run_round(state, brain, 4.0)}
    assert set(plans) == {"urgent", "e"} and len(plans["e"].placements) == 2
    assert {p.node_id for p in plans["urgent"].placements} == set(preempt.nodes)
    assert not {p.node_id for p in plans["e"].placements} & set(preempt.nodes)
    assert "Shrinking" in [e.kind for e in job.events]
