"""Steps inside an allocation (Slurm's job steps): where a step's tasks go, and what of an
allocation is free for them. Pure.

An allocation (`JobSpec.alloc`) is a gang placed like any other; its tasks, the *holders*, hold
their resources and GPUs on their nodes and run nothing. A step is a job of its own (`<alloc>.<k>`)
whose tasks run inside the holders: each takes a share of one holder's resources and GPU indices.
The accounting that keeps this from double-booking: a node counts its holders alone (`Node.used`,
`gpus_in_use`); a holder's live step tasks fit inside it, on its node, with GPU indices of its own
and none twice (synapse.core.state.invariants checks both). A holder ends, and gives its node back,
only once no step task runs inside it. A step is a job rather than a record of the allocation's
because everything a job has serves it unchanged: dispatch and the workers' watch, TaskStarted and
TaskExited, events, log tickets, `wait`, the history store.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from synapse.core.jobs.quantity import format_cpu, format_memory
from synapse.core.model import Job, Resources


@dataclass(frozen=True, slots=True)
class Room:
    """What one live holder of an allocation has left beside the live tasks of its steps."""

    index: int  #: the holder's task index in the allocation
    node_id: str
    free: Resources
    gpus: tuple[int, ...]  #: its GPU indices no step task holds, ascending


def step_id(alloc_id: str, k: int) -> str:
    """The job id of an allocation's step number `k` (Slurm's JOBID.STEPID)."""
    return f"{alloc_id}.{k}"


def step_ids(alloc: Job) -> list[str]:
    """The ids of every step an allocation started, oldest first."""
    return [step_id(alloc.id, k) for k in range(alloc.step_count)]


def rooms(alloc: Job, steps: Iterable[Job]) -> list[Room]:
    """What each live holder of `alloc` has left beside the live tasks of `steps` (its steps)."""
    used = {t.index: Resources() for t in alloc.tasks}
    taken: dict[int, set[int]] = {t.index: set() for t in alloc.tasks}
    for step in steps:
        for task in step.tasks:
            if task.state.live and task.holder in used:
                used[task.holder] = used[task.holder] + task.resources
                taken[task.holder].update(task.gpus)
    return [Room(t.index, t.node_id, t.resources - used[t.index],
                 tuple(g for g in sorted(t.gpus) if g not in taken[t.index]))
            for t in sorted(alloc.tasks, key=lambda t: t.rank) if t.state.live]


def fit_step(rooms_now: list[Room], tasks: int, per_task: Resources) -> list[tuple[Room, tuple[int, ...]]] | str:
    """Where each of a step's `tasks` tasks goes: (the holder's room, its GPU indices), by task
    index; or why the step does not fit now. Task i tries the holders from i (modulo their
    number) on, so a step of one task per holder spreads over the allocation's nodes as `srun`
    does, and a smaller one fills the first holders."""
    if tasks < 1:
        return f"a step needs at least one task, not {tasks}"
    if not rooms_now:
        return "the allocation holds no live task"
    free = {r.index: r.free for r in rooms_now}
    gpus = {r.index: list(r.gpus) for r in rooms_now}
    out: list[tuple[Room, tuple[int, ...]]] = []
    n = len(rooms_now)
    for i in range(tasks):
        for room in (rooms_now[(i + k) % n] for k in range(n)):
            if per_task.fits_in(free[room.index]) and per_task.gpu <= len(gpus[room.index]):
                free[room.index] = free[room.index] - per_task
                given, gpus[room.index] = tuple(gpus[room.index][:per_task.gpu]), gpus[room.index][per_task.gpu:]
                out.append((room, given))
                break
        else:
            return _refusal(rooms_now, tasks, per_task, len(out))
    return out


def _refusal(rooms_now: list[Room], tasks: int, per_task: Resources, placed: int) -> str:
    """Why a step of `tasks` tasks of `per_task` does not fit the rooms, naming what each holder has left."""
    left = "; ".join(f"task {r.index} on {r.node_id}: {describe(r.free)} free" for r in rooms_now)
    return (f"{tasks} task(s) of {describe(per_task)} each do not fit the allocation beside its running steps "
            f"(room for {placed} now; {left})")


def describe(r: Resources) -> str:
    """Resources as a person reads them: `8 gpu, 4 cpu, 16Gi`."""
    parts = [f"{r.gpu} gpu"] if r.gpu else []
    if r.cpu:
        parts.append(f"{format_cpu(r.cpu)} cpu")
    if r.memory:
        parts.append(format_memory(r.memory))
    return ", ".join(parts) or "nothing"
