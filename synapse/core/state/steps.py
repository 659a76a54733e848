"""Steps: a job started inside a running allocation without queueing (synapse.core.steps).

State: `jobs` (the step, and its allocation's `step_count` and `idle_since`), `job_by_request`,
`live_tasks`. Command: StartStep. A step's end, and an allocation's stop that stops its steps,
are job transitions (synapse.core.state.transitions: `end_task`, `stop_steps`, `finish`).
"""

from __future__ import annotations

from synapse.core import commands as c
from synapse.core.commands import Result
from synapse.core.model import Job, JobSpec, JobStatus, Task
from synapse.core.state.events import job_event
from synapse.core.state.jobs import validate_spec
from synapse.core.state.tables import ClusterTables
from synapse.core.state.transitions import live_steps
from synapse.core.steps import describe, fit_step, rooms, step_id


def step_problem(state: ClusterTables, alloc: Job | None, alloc_id: str, spec: JobSpec) -> str:
    """Why a step of `spec` cannot start in allocation `alloc_id` now, or '' (what StartStep's apply
    and the endpoint that proposes it both ask; the fit itself is `fit_step`'s)."""
    if alloc is None:
        return f"unknown allocation {alloc_id}"
    if not alloc.spec.alloc:
        return f"job {alloc.id} is not an allocation (`synctl alloc` makes one)"
    if alloc.status is not JobStatus.RUNNING:
        return f"allocation {alloc.id} is {alloc.status.value}: steps start only while it runs"
    problem = validate_spec(state, spec)
    if problem:
        return problem
    if spec.alloc or spec.idle_timeout or spec.has_workflow or spec.has_secrets or spec.has_checkpoint:
        return "a step is a plain command: no allocation, array, dependency, secret or checkpoint fields"
    return ""


def start_step(state: ClusterTables, cmd: c.StartStep) -> Result:
    """Start a step inside a running allocation, all its tasks or none, where they fit beside the
    allocation's running steps; its node resources are the allocation's, counted once."""
    if cmd.request_id and cmd.request_id in state.job_by_request:
        made_id = state.job_by_request[cmd.request_id]
        made = state.jobs.get(made_id)
        if made is None or made.alloc_id != cmd.alloc_id or made.spec != cmd.spec:
            return Result.rejected(f"request id {cmd.request_id} already made job {made_id}, from another step: a new "
                                   "step needs a new request id", c.Rejection.CONFLICT)
        return Result(True, value=made.id)
    alloc = state.jobs.get(cmd.alloc_id)
    problem = step_problem(state, alloc, cmd.alloc_id, cmd.spec)
    if problem:
        return Result.not_found(problem) if alloc is None else Result.rejected(f"step refused: {problem}")
    assert alloc is not None
    fit = fit_step(rooms(alloc, live_steps(state, alloc)), cmd.spec.tasks, cmd.spec.resources)
    if isinstance(fit, str):
        return Result.rejected(f"step refused: {fit}")
    state.job_seq += 1
    step = Job(id=step_id(alloc.id, alloc.step_count), spec=cmd.spec, request_id=cmd.request_id,
               submitted_at=cmd.at, seq=state.job_seq, user=alloc.user, alloc_id=alloc.id,
               status=JobStatus.SCHEDULED, placed_at=cmd.at, pending_since=cmd.at)
    for index, (room, gpus) in enumerate(fit):
        task = Task(job_id=step.id, attempt=step.attempt, index=index, node_id=room.node_id,
                    resources=cmd.spec.resources, gpus=gpus, rank=index, holder=room.index)
        step.tasks.append(task)
        state.live_tasks[room.node_id].add(task.key)
    step.placements[step.attempt] = tuple(t.node_id for t in step.tasks)
    state.jobs[step.id] = step
    if cmd.request_id:
        state.job_by_request[cmd.request_id] = step.id
    alloc.step_count += 1
    alloc.live_step_ids.add(step.id)
    alloc.idle_since = 0.0
    nodes = sorted({t.node_id for t in step.tasks})
    where = f"{len(step.tasks)} task(s) of {describe(cmd.spec.resources)} on {', '.join(nodes)}"
    job_event(state, step, cmd.at, "Scheduled", f"step of allocation {alloc.id}" + (f" by {cmd.by}" if cmd.by else "")
              + f": {where}")
    job_event(state, alloc, cmd.at, "StepStarted", f"step {step.id}: {where}: {' '.join(cmd.spec.command)[:200]}")
    return Result(True, value=step.id)
