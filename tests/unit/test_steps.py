"""Allocations and their steps in the pure core: where a step's tasks go (fit_step), the accounting
that never books a GPU twice, the ends of steps and allocations, the idle timeout, and the encodings."""

from __future__ import annotations

import dataclasses

import pytest

from synapse.core import codec
from synapse.core import commands as c
from synapse.core.brain.inflight import InFlight
from synapse.core.brain.monitors import idle_timeout
from synapse.core.model import DEFAULT_IDLE_TIMEOUT_S, JobSpec, JobStatus, Placement, Resources, TaskState
from synapse.core.state import snapshot
from synapse.core.state.fsm import ClusterState
from synapse.core.state.invariants import node_violations, violations
from synapse.core.steps import Room, fit_step
from synapse.master.dispatch import assignments_for_node
from tests.support.helpers import GI, checked, cluster

NODES = ("r0-n0", "r0-n1")


def alloc_spec(tasks: int = 2, gpu: int = 8, idle: float = 0.0) -> JobSpec:
    return JobSpec(name="session", tasks=tasks, resources=Resources(8000, 64 * GI, gpu), command=(), alloc=True,
                   idle_timeout=idle)


def step_spec(tasks: int = 2, gpu: int = 8, cpu: int = 1000, command: tuple[str, ...] = ("hostname",)) -> JobSpec:
    return JobSpec(name="step", tasks=tasks, resources=Resources(cpu, GI, gpu), command=command)


def granted(idle: float = 0.0) -> ClusterState:
    """A cluster with a running allocation `a` of two 8-GPU tasks, one on each of NODES."""
    state = cluster()
    assert checked(state, c.SubmitAllocJob(at=1.0, job_id="a", request_id="ra", spec=alloc_spec(idle=idle),
                                           by="alice")).ok
    result = checked(state, c.CommitPlan(at=2.0, job_id="a", attempt=1, placements=(
        Placement(0, NODES[0], tuple(range(8)), 0), Placement(1, NODES[1], tuple(range(8)), 1))))
    assert result.ok, result
    return state


def start(state: ClusterState, spec: JobSpec, at: float = 3.0, rid: str = "") -> c.Result:
    return checked(state, c.StartStep(at=at, alloc_id="a", request_id=rid, spec=spec, by="alice"))


def exit_all(state: ClusterState, job_id: str, at: float, code: int = 0) -> None:
    job = state.jobs[job_id]
    for t in job.tasks:
        if t.state is TaskState.ASSIGNED:
            assert checked(state, c.TaskStarted(at=at, job_id=job_id, attempt=1, index=t.index, node_id=t.node_id)).ok
        assert checked(state, c.TaskExited(at=at, job_id=job_id, attempt=1, index=t.index, node_id=t.node_id,
                                           exit_code=code)).ok


def test_fit_spreads_one_task_per_holder_then_fills_and_refuses_with_what_is_left():
    rooms = [Room(i, f"n{i}", Resources(8000, 0, 8), tuple(range(8))) for i in range(2)]
    fit = fit_step(rooms, 2, Resources(1000, 0, 4))
    assert [(r.index, g) for r, g in fit] == [(0, (0, 1, 2, 3)), (1, (0, 1, 2, 3))]
    fit = fit_step(rooms, 4, Resources(1000, 0, 4))
    assert [(r.index, g) for r, g in fit] == [(0, (0, 1, 2, 3)), (1, (0, 1, 2, 3)),
                                              (0, (4, 5, 6, 7)), (1, (4, 5, 6, 7))]
    refused = fit_step(rooms, 5, Resources(1000, 0, 4))
    assert isinstance(refused, str) and "room for 4 now" in refused and "task 0 on n0: 8 gpu, 8 cpu free" in refused
    assert isinstance(fit_step(rooms, 1, Resources(0, 0, 16)), str)
    assert isinstance(fit_step(rooms, 1, Resources(9000, 0, 0)), str)
    assert isinstance(fit_step([], 1, Resources(1000, 0, 0)), str)


def test_an_allocation_runs_at_once_and_its_tasks_are_listed_to_no_worker():
    state = granted()
    a = state.jobs["a"]
    assert a.status is JobStatus.RUNNING and a.idle_since == 2.0
    assert state.nodes[NODES[0]].used.gpu == 8
    assert assignments_for_node(state, NODES[0]) == []
    refused = state.apply(c.TaskExited(at=3.0, job_id="a", attempt=1, index=0, node_id=NODES[0], exit_code=0))
    assert not refused.ok and "run no process" in refused.error
    assert state.jobs["a"].tasks[0].state is TaskState.RUNNING


def test_steps_one_after_another_and_side_by_side_never_book_a_gpu_twice():
    state = granted()
    used = {n: state.nodes[n].used for n in NODES}
    first = start(state, step_spec())
    assert first.ok and first.value == "a.0"
    step = state.jobs["a.0"]
    assert step.status is JobStatus.SCHEDULED and step.user == "alice" and step.alloc_id == "a"
    assert [(t.node_id, t.holder, t.gpus) for t in step.tasks] == [(NODES[0], 0, tuple(range(8))),
                                                                   (NODES[1], 1, tuple(range(8)))]
    assert {n: state.nodes[n].used for n in NODES} == used  # counted once: by the allocation's tasks
    listed = assignments_for_node(state, NODES[1])
    assert [(x.job_id, x.rank, x.world_size, x.gpus) for x in listed] == [("a.0", 1, 2, tuple(range(8)))]
    refused = start(state, step_spec(tasks=1, gpu=1))
    assert not refused.ok and "room for 0 now" in refused.error and "a.1" not in state.jobs
    exit_all(state, "a.0", 4.0)
    assert state.jobs["a.0"].status is JobStatus.SUCCEEDED and state.jobs["a"].idle_since == 4.0
    assert state.jobs["a.0"].runs[-1].gpu_seconds == 0  # the allocation's run counts these GPUs
    # side by side: two halves fit, a third step does not, and nothing is queued
    assert start(state, step_spec(gpu=4), at=5.0).value == "a.1"
    assert start(state, step_spec(gpu=4), at=5.0).value == "a.2"
    assert state.jobs["a.1"].tasks[0].gpus == (0, 1, 2, 3) and state.jobs["a.2"].tasks[0].gpus == (4, 5, 6, 7)
    assert state.jobs["a"].idle_since == 0.0
    assert not start(state, step_spec(tasks=1, gpu=1), at=5.0).ok
    assert not state.pending
    exit_all(state, "a.1", 6.0, code=3)
    assert state.jobs["a.1"].status is JobStatus.FAILED and state.jobs["a.1"].attempt == 1  # never restarts
    assert state.jobs["a"].idle_since == 0.0  # a.2 still runs
    assert start(state, step_spec(tasks=1, gpu=4), at=7.0).value == "a.3"  # a.1's GPUs are free again
    assert {n: state.nodes[n].used for n in NODES} == used
    assert [e.kind for e in state.jobs["a"].events].count("StepStarted") == 4


def test_a_retried_step_request_gets_the_same_step_and_another_spec_is_a_conflict():
    state = granted()
    assert start(state, step_spec(gpu=2), rid="r1").value == "a.0"
    assert start(state, step_spec(gpu=2), rid="r1").value == "a.0"
    conflict = start(state, step_spec(gpu=3), rid="r1")
    assert not conflict.ok and conflict.code is c.Rejection.CONFLICT
    assert state.jobs["a"].step_count == 1


def test_refusals_name_the_reason():
    state = granted()
    missing = state.apply(c.StartStep(at=3.0, alloc_id="nope", request_id="", spec=step_spec()))
    assert missing.code is c.Rejection.NOT_FOUND and "unknown allocation nope" in missing.error
    assert checked(state, c.SubmitJob(at=3.0, job_id="plain", request_id="", spec=step_spec())).ok
    assert "not an allocation" in state.apply(c.StartStep(at=3.0, alloc_id="plain", request_id="",
                                                          spec=step_spec())).error
    assert "command must not be empty" in start(state, step_spec(command=())).error
    assert not state.apply(c.SubmitJob(at=3.0, job_id="x", request_id="", spec=alloc_spec())).ok  # its own kind


def test_cancelling_the_allocation_stops_its_steps_and_frees_nodes_only_once_they_are_gone():
    state = granted()
    start(state, step_spec(gpu=4))
    assert checked(state, c.TaskStarted(at=3.5, job_id="a.0", attempt=1, index=0, node_id=NODES[0])).ok
    assert checked(state, c.CancelJob(at=4.0, job_id="a", by="alice")).ok
    a, step = state.jobs["a"], state.jobs["a.0"]
    assert a.status is JobStatus.STOPPING and step.status is JobStatus.STOPPING and step.cancel_requested
    assert all(t.state.live for t in a.tasks)  # a step task runs inside each: the nodes stay booked
    assert state.nodes[NODES[0]].used.gpu == 8
    assert [x.stop for x in assignments_for_node(state, NODES[0])] == [True]
    assert not state.apply(c.StartStep(at=4.0, alloc_id="a", request_id="", spec=step_spec(gpu=1))).ok
    assert checked(state, c.TaskExited(at=5.0, job_id="a.0", attempt=1, index=0, node_id=NODES[0],
                                       exit_code=143)).ok
    assert a.tasks[0].state is TaskState.EXITED and a.tasks[1].state.live
    assert state.nodes[NODES[0]].used == Resources() and state.nodes[NODES[1]].used.gpu == 8
    assert checked(state, c.TaskExited(at=5.0, job_id="a.0", attempt=1, index=1, node_id=NODES[1],
                                       exit_code=143)).ok
    assert a.status is JobStatus.CANCELLED and step.status is JobStatus.CANCELLED
    assert all(state.nodes[n].used == Resources() for n in NODES)


def test_an_idle_allocation_with_no_step_ends_at_once_when_cancelled():
    state = granted()
    assert checked(state, c.CancelJob(at=4.0, job_id="a", reason="its command exited")).ok
    assert state.jobs["a"].status is JobStatus.CANCELLED and state.nodes[NODES[0]].used == Resources()


def test_a_lost_node_ends_the_allocation_and_its_steps_without_requeueing():
    state = granted()
    start(state, step_spec(gpu=4))
    assert checked(state, c.NodeLost(at=4.0, node_id=NODES[0], reason="silent")).ok
    a, step = state.jobs["a"], state.jobs["a.0"]
    assert a.status is JobStatus.STOPPING and step.status is JobStatus.STOPPING
    assert state.nodes[NODES[0]].used == Resources() and state.nodes[NODES[1]].used.gpu == 8
    assert checked(state, c.TaskExited(at=5.0, job_id="a.0", attempt=1, index=1, node_id=NODES[1],
                                       exit_code=143)).ok
    assert a.status is JobStatus.FAILED and step.status is JobStatus.FAILED and not state.pending
    assert all(state.nodes[n].used == Resources() for n in NODES)


def test_a_drain_ends_the_allocation_once_the_steps_on_the_node_are_gone():
    state = granted()
    start(state, step_spec(tasks=1, gpu=8))
    assert checked(state, c.DrainNode(at=4.0, node_id=NODES[0])).ok
    assert state.jobs["a"].tasks[1].state is TaskState.EXITED  # nothing ran inside it
    assert state.nodes[NODES[0]].used.gpu == 8
    exit_all(state, "a.0", 5.0, code=143)
    assert state.jobs["a"].status is JobStatus.FAILED and not state.pending
    assert all(state.nodes[n].used == Resources() for n in NODES)


def test_invariants_catch_a_step_that_books_what_its_allocation_does_not_hold():
    state = granted()
    start(state, step_spec(tasks=1, gpu=4))
    task = state.jobs["a.0"].tasks[0]
    task.gpus = (6, 7, 8, 9)
    assert any("not among its" in v for v in violations(state))
    assert any("not among its" in v for v in node_violations(state, [NODES[0]]))  # what chaos checks per command
    task.gpus, task.resources = (0, 1, 2, 3), Resources(1000, GI, 16)
    assert any("steps use" in v for v in violations(state))
    task.resources = Resources(1000, GI, 4)
    state.jobs["a"].live_step_ids.clear()
    assert any("records steps [] placed" in v for v in violations(state))
    state.jobs["a"].live_step_ids.add("a.0")
    state.jobs["a"].tasks[0].state = TaskState.EXITED
    assert any("runs inside no live task" in v for v in violations(state))


def test_idle_timeout_cancels_an_allocation_with_no_step_running_once():
    state = granted(idle=60.0)
    a = state.jobs["a"]
    inflight = InFlight()
    assert idle_timeout(a, 61.0, inflight) == []
    [propose] = idle_timeout(a, 63.0, inflight)
    assert isinstance(propose.cmd, c.CancelJob) and propose.cmd.job_id == "a" and not propose.cmd.by
    assert idle_timeout(a, 64.0, inflight) == []  # on its way already
    start(state, step_spec(), at=10.0)
    assert a.idle_since == 0.0
    default = dataclasses.replace(a, spec=alloc_spec(), idle_since=2.0)
    assert idle_timeout(default, 2.0 + DEFAULT_IDLE_TIMEOUT_S - 1, InFlight()) == []


def test_allocations_and_steps_survive_the_codec_and_a_snapshot():
    spec = alloc_spec(idle=90.0)
    sub = c.SubmitAllocJob(at=1.0, job_id="a", request_id="ra", spec=spec, by="alice")
    assert codec.decode_command(codec.encode_command(sub)) == sub
    step = c.StartStep(at=2.0, alloc_id="a", request_id="r", spec=step_spec(), by="alice")
    assert codec.decode_command(codec.encode_command(step)) == step
    assert c.submit_kind(spec) is c.SubmitAllocJob
    state = granted()
    start(state, step_spec(gpu=4))
    data = snapshot.encode(state)
    assert data["version"] == snapshot.SNAPSHOT_VERSION_6
    again = snapshot.decode(data, ClusterState)
    assert snapshot.encode(again) == data and not violations(again)
    assert again.jobs["a.0"].tasks[0].holder == 0 and again.queue_usage == state.queue_usage
    assert again.jobs["a"].live_step_ids == {"a.0"}


def test_two_allocation_tasks_on_one_node_each_hold_their_own_steps():
    state = cluster()
    assert checked(state, c.SubmitAllocJob(at=1.0, job_id="a", request_id="", spec=alloc_spec(gpu=4), by="alice")).ok
    assert checked(state, c.CommitPlan(at=2.0, job_id="a", attempt=1, placements=(
        Placement(0, NODES[0], (0, 1, 2, 3), 0), Placement(1, NODES[0], (4, 5, 6, 7), 1)))).ok
    assert start(state, step_spec(gpu=2)).ok
    assert [(t.holder, t.gpus) for t in state.jobs["a.0"].tasks] == [(0, (0, 1)), (1, (4, 5))]
    assert start(state, step_spec(tasks=1, gpu=2)).ok and state.jobs["a.1"].tasks[0].gpus == (2, 3)
    assert state.nodes[NODES[0]].used.gpu == 8


def test_an_allocation_travels_only_as_its_own_kind():
    with pytest.raises(codec.CodecError, match="SubmitAllocJob"):
        codec.encode_command(c.SubmitSecretJob(at=1.0, job_id="a", request_id="", spec=alloc_spec()))
    plain = c.SubmitJob(at=1.0, job_id="j", request_id="", spec=step_spec())
    assert codec.decode_command(codec.encode_command(plain)) == plain


def test_a_preempted_allocation_gives_its_steps_its_grace_and_ends_without_requeueing():
    state = granted()
    start(state, step_spec(tasks=1, gpu=8))
    assert checked(state, c.SubmitJob(at=3.0, job_id="p", request_id="", spec=step_spec(tasks=1, gpu=8))).ok
    assert checked(state, c.Preempt(at=4.0, job_id="p", attempt=1, rule="priority",
                                    victims=(c.Victim("a", 1, 30.0),), nodes=(NODES[0],))).ok
    a, step = state.jobs["a"], state.jobs["a.0"]
    assert a.status is JobStatus.STOPPING and step.status is JobStatus.STOPPING and step.stop_grace == 30.0
    assert [(x.stop, x.grace) for x in assignments_for_node(state, NODES[0])] == [(True, 30.0)]
    exit_all(state, "a.0", 5.0, code=143)
    assert a.status is JobStatus.FAILED and step.status is JobStatus.FAILED and a.attempt == 1
    assert [j for _, j in state.pending] == ["p"] and all(state.nodes[n].used == Resources() for n in NODES)
