"""Checks of the state invariants of DESIGN.md on one ClusterState. Returns violations; never raises.

Used by the unit and property tests after every command, and by the chaos checkers on each
replica's final state.
"""

from __future__ import annotations

from collections.abc import Iterable

from synapse.core.model import JobStatus, Resources, TaskState
from synapse.core.schedule.elastic import least
from synapse.core.state.fsm import ClusterState


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
            used = used + task.resources
            gpus.extend(task.gpus)
        if used != node.used:
            out.append(f"node {node_id} records {node.used} used, its live tasks hold {used}")
        if not node.used.fits_in(node.capacity) or node.used.is_negative():
            out.append(f"node {node_id} is over-allocated: {node.used} of {node.capacity}")
        if len(gpus) != len(set(gpus)) or set(gpus) != node.gpus_in_use:
            out.append(f"node {node_id} gives a GPU index twice or records the wrong ones: {sorted(gpus)}")
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
        if job.status is JobStatus.PENDING and (job.id not in {j for _, j in state.pending}):
            out.append(f"job {job.id} is PENDING but not queued")
        for task in live:
            if task.node_id not in state.nodes:
                out.append(f"task {task.key} is on unknown node {task.node_id}")
                continue
            used[task.node_id] = used[task.node_id] + task.resources
            gpus[task.node_id].extend(task.gpus)
            if task.key not in state.live_tasks[task.node_id]:
                out.append(f"live task {task.key} missing from its node's index")
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
