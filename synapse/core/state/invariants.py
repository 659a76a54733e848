"""Checks of the state invariants of DESIGN.md on one ClusterState. Returns violations; never raises.

Used by the unit and property tests after every command, and by the chaos checkers on each
replica's final state.
"""

from __future__ import annotations

from collections.abc import Iterable

from synapse.core.model import Job, JobStatus, Resources, Task, TaskState
from synapse.core.schedule.elastic import least
from synapse.core.state.fsm import ClusterState
from synapse.core.steps import step_ids


def node_violations(state: ClusterState, node_ids: Iterable[str]) -> list[str]:
    """The per-node invariants for some nodes only (cheap enough to run after every command):
    use within capacity, recorded use equal to the live tasks' sum, no GPU index given twice."""
    out: list[str] = []
    for node_id in node_ids:
        node = state.nodes.get(node_id)
        if node is None:
            continue
        tasks = [state.jobs[j].tasks[i] for j, _a, i in state.live_tasks.get(node_id, ())]
        used = Resources()
        gpus: list[int] = []
        for task in tasks:
            if task.holder >= 0:  # a step's task: its allocation's task counts it (step_violations)
                continue
            used = used + task.resources
            gpus.extend(task.gpus)
        if used != node.used:
            out.append(f"node {node_id} records {node.used} used, its live tasks hold {used}")
        if not node.used.fits_in(node.capacity) or node.used.is_negative():
            out.append(f"node {node_id} is over-allocated: {node.used} of {node.capacity}")
        if len(gpus) != len(set(gpus)) or set(gpus) != node.gpus_in_use:
            out.append(f"node {node_id} gives a GPU index twice or records the wrong ones: {sorted(gpus)}")
        for job_id in sorted({t.job_id for t in tasks if t.holder >= 0 or state.jobs[t.job_id].spec.alloc}):
            out += step_violations(state, state.jobs[job_id])
    return out


def violations(state: ClusterState) -> list[str]:
    """Every broken invariant, as a sentence; empty when the state is sound."""
    out: list[str] = []
    used: dict[str, Resources] = {n: Resources() for n in state.nodes}
    gpus: dict[str, list[int]] = {n: [] for n in state.nodes}
    for job in state.jobs.values():
        live = [t for t in job.tasks if t.state.live]
        if job.status.has_gang:
            if not least(job.spec) <= len(job.tasks) <= job.spec.tasks:  # an elastic gang: any size in its bounds
                out.append(f"job {job.id} is {job.status.value} with {len(job.tasks)} of "
                           f"{job.spec.tasks} tasks: not a whole gang")
            if job.status is not JobStatus.STOPPING and len(live) + sum(
                    t.state is TaskState.EXITED and t.exit_code == 0 for t in job.tasks) != len(job.tasks):
                out.append(f"job {job.id} is {job.status.value} but some tasks are gone")
        elif live:
            out.append(f"job {job.id} is {job.status.value} yet holds {len(live)} live task(s)")
        if job.held_by and job.status.has_gang:
            out.append(f"job {job.id} is held by {job.held_by} yet was placed ({job.status.value})")
        if job.status is JobStatus.PENDING and (job.id not in {j for _, j in state.pending}):
            out.append(f"job {job.id} is PENDING but not queued")
        for task in live:
            if task.node_id not in state.nodes:
                out.append(f"task {task.key} is on unknown node {task.node_id}")
                continue
            if task.key not in state.live_tasks[task.node_id]:
                out.append(f"live task {task.key} missing from its node's index")
            if task.holder >= 0:
                continue  # a step's task: its allocation's task counts it (step_violations)
            used[task.node_id] = used[task.node_id] + task.resources
            gpus[task.node_id].extend(task.gpus)
        out += step_violations(state, job)
    for node_id, node in state.nodes.items():
        if used[node_id] != node.used:
            out.append(f"node {node_id} records {node.used} used, its live tasks hold {used[node_id]}")
        if not node.used.fits_in(node.capacity) or node.used.is_negative():
            out.append(f"node {node_id} is over-allocated: {node.used} of {node.capacity}")
        if len(gpus[node_id]) != len(set(gpus[node_id])):
            out.append(f"node {node_id} gives a GPU index twice: {sorted(gpus[node_id])}")
        if set(gpus[node_id]) != node.gpus_in_use:
            out.append(f"node {node_id} records GPUs {sorted(node.gpus_in_use)} in use, "
                       f"its tasks hold {sorted(gpus[node_id])}")
        if any(not 0 <= g < node.capacity.gpu for g in gpus[node_id]):
            out.append(f"node {node_id} gives out a GPU index it does not have")
    return out


def step_violations(state: ClusterState, job: Job) -> list[str]:
    """The invariants of an allocation and its steps (synapse.core.steps), for one job: a step's
    live task runs inside a live task of its allocation on the same node; the live step tasks
    inside one allocation task fit in its resources and hold its GPU indices, none twice. With
    the node's own check (which counts allocation tasks, not step tasks), no GPU is booked twice."""
    out: list[str] = []
    if job.alloc_id:
        alloc = state.jobs.get(job.alloc_id)
        for task in job.tasks:
            if not task.state.live:
                continue
            holder = alloc.tasks[task.holder] if alloc is not None and 0 <= task.holder < len(alloc.tasks) else None
            if holder is None or not holder.state.live or holder.node_id != task.node_id:
                out.append(f"step task {task.key} runs inside no live task of allocation {job.alloc_id} "
                           f"on {task.node_id}")
    elif any(t.holder >= 0 for t in job.tasks):
        out.append(f"job {job.id} is no step, yet its tasks name an allocation's task")
    if not job.spec.alloc:
        return out
    inside: dict[int, list[Task]] = {}
    placed: set[str] = set()
    for step_id in step_ids(job):
        step = state.jobs.get(step_id)
        if step is not None and step.status.has_gang:
            placed.add(step_id)
        for task in step.tasks if step is not None else ():
            if task.state.live:
                inside.setdefault(task.holder, []).append(task)
    if placed != job.live_step_ids:
        out.append(f"allocation {job.id} records steps {sorted(job.live_step_ids)} placed, its steps say "
                   f"{sorted(placed)}")
    for index, tasks in sorted(inside.items()):
        holder = job.tasks[index] if 0 <= index < len(job.tasks) else None
        if holder is None:
            continue  # reported above, by the step
        used = Resources()
        gpus: list[int] = []
        for task in tasks:
            used = used + task.resources
            gpus.extend(task.gpus)
        if not used.fits_in(holder.resources):
            out.append(f"steps use {used} inside task {index} of allocation {job.id}, which holds {holder.resources}")
        if len(gpus) != len(set(gpus)) or not set(gpus) <= set(holder.gpus):
            out.append(f"steps inside task {index} of allocation {job.id} hold GPUs {sorted(gpus)}: twice, or "
                       f"not among its {sorted(holder.gpus)}")
    return out
