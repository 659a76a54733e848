"""The gangs of jobs: a plan committed (re-checked against the state), an elastic gang resized, a
running attempt's checkpoint notice and progress.

State: the jobs' tasks and attempts, placements, progress; the nodes' `used`/`gpus_in_use`,
`live_tasks`, `index`. Commands: CommitPlan, ResizeGang, CheckpointNotice, RecordProgress, RecordExec (an
exec into a running task, a job event).
"""

from __future__ import annotations

import math

from synapse.core import commands as c
from synapse.core.commands import Result
from synapse.core.model import (
    DEFAULT_GRACE_S,
    NOTICED_CAUSES,
    EndReason,
    Job,
    JobStatus,
    NodeStatus,
    PackMode,
    Progress,
    Task,
    TaskState,
    excluded_for,
)
from synapse.core.schedule import elastic
from synapse.core.state.arrays import next_element
from synapse.core.state.events import job_event
from synapse.core.state.tables import ClusterTables
from synapse.core.state.transitions import give_notice, running_attempt, stop_attempt
from synapse.core.state.usage import count_usage, release_hold


def commit_plan(state: ClusterTables, cmd: c.CommitPlan) -> Result:
    """Place a pending gang whole, every task on its node and GPUs, once `plan_problem` has re-checked
    the plan against this state: all or nothing (the gang commit)."""
    job = state.jobs.get(cmd.job_id)
    if job is None:
        return Result.not_found(f"unknown job {cmd.job_id}")
    problem = plan_problem(state, job, cmd)
    if problem:
        return Result.rejected(f"plan for job {job.id} attempt {cmd.attempt} rejected: {problem}")
    per_task = job.spec.resources
    job.tasks = []
    for p in sorted(cmd.placements, key=lambda p: p.index):
        node = state.nodes[p.node_id]
        task = Task(job_id=job.id, attempt=job.attempt, index=p.index, node_id=node.id,
                    resources=per_task, gpus=tuple(p.gpus), rank=p.rank)
        job.tasks.append(task)
        node.used = node.used + per_task
        node.gpus_in_use.update(p.gpus)
        state.live_tasks[node.id].add(task.key)
    for node_id in {p.node_id for p in cmd.placements}:
        state.index.update(state.nodes[node_id])
    count_usage(state, job, per_task.scaled(len(job.tasks)), cmd.at)
    release_hold(state, job.id)
    job.pending_reason = ""
    state.pending.remove((job.queue_key(), job.id))
    job.status, job.placed_at = JobStatus.SCHEDULED, cmd.at
    job.placements[job.attempt] = tuple(t.node_id for t in job.tasks)
    nodes = sorted({p.node_id for p in cmd.placements})
    job_event(state, job, cmd.at, "Scheduled",
              f"attempt {job.attempt}: {len(cmd.placements)} task(s) on {len(nodes)} node(s): "
              + ", ".join(nodes[:8]) + (" …" if len(nodes) > 8 else ""))
    if job.spec.alloc:
        # An allocation's tasks run nothing (no worker is told of them, synapse.master.dispatch):
        # held is running. A node's loss or drain still ends them, as any task on it.
        for task in job.tasks:
            task.state, task.started_at = TaskState.RUNNING, cmd.at
        job.status, job.started_at, job.idle_since = JobStatus.RUNNING, cmd.at, cmd.at
        job_event(state, job, cmd.at, "Running", f"allocation of {len(job.tasks)} task(s) granted: steps may start")
    array = state.arrays.get(job.array_id) if job.array_id else None
    if array is not None and array.rep == job.id:
        array.rep = ""
        next_element(state, array, cmd.at)
    return Result(True)


def plan_problem(state: ClusterTables, job: Job, cmd: c.CommitPlan) -> str:
    """Everything that makes a gang plan invalid against the current state, or ''."""
    if job.status is not JobStatus.PENDING:
        return f"job is {job.status.value}, not PENDING"
    if job.held_by:
        return f"job is held by {job.held_by} (release it first)"
    for p in cmd.placements:
        holder = state.held_nodes.get(p.node_id)
        if holder is not None and holder != job.id:
            return f"node {p.node_id} is held for job {holder}, which preempted gangs to get it"
    if cmd.attempt != job.attempt:
        return f"plan is for attempt {cmd.attempt}, job is at attempt {job.attempt}"
    n = len(cmd.placements)
    if not elastic.least(job.spec) <= n <= job.spec.tasks:
        return (f"plan places {n} task(s), the gang has {job.spec.tasks}" if not elastic.is_elastic(job.spec) else
                f"plan places {n} task(s), the elastic gang takes {job.spec.tasks_min} to {job.spec.tasks}")
    if sorted(p.index for p in cmd.placements) != list(range(n)):
        return "task indices must be exactly 0..tasks-1"
    if sorted(p.rank for p in cmd.placements) != list(range(n)):
        return "ranks must be exactly 0..tasks-1"
    per_task = job.spec.resources
    demand: dict[str, int] = {}
    gpus: dict[str, set[int]] = {}
    for p in cmd.placements:
        node = state.nodes.get(p.node_id)
        if node is None:
            return f"unknown node {p.node_id}"
        if node.status is not NodeStatus.READY:
            return f"node {node.id} is {node.status.value}"
        if not node.schedulable:
            return f"node {node.id} is cordoned"
        if node.id in excluded_for(state.nodes, job):  # set by version-3 commands alone: no older replica has any
            return f"node {node.id} is excluded for job {job.id}: it ended an earlier attempt"
        if job.spec.gpu_model and node.label("gpu_model").lower() != job.spec.gpu_model.lower():
            return f"node {node.id} has GPU model {node.label('gpu_model') or 'none'}, not {job.spec.gpu_model}"
        if len(p.gpus) != per_task.gpu or len(set(p.gpus)) != len(p.gpus):
            return f"task {p.index} must get {per_task.gpu} distinct GPU index(es)"
        taken = gpus.setdefault(node.id, set())
        for g in p.gpus:
            if not 0 <= g < node.capacity.gpu:
                return f"node {node.id} has no GPU {g}"
            if g in node.gpus_in_use or g in taken:
                return f"GPU {g} of node {node.id} is already in use"
            taken.add(g)
        demand[node.id] = demand.get(node.id, 0) + 1
    for node_id, count in demand.items():
        node = state.nodes[node_id]
        need = per_task.scaled(count)
        if not need.fits_in(node.free):
            return (f"node {node_id} lacks {', '.join(need.short_of(node.free))} for "
                    f"{count} task(s)")
    topo = job.spec.topology
    if topo.mode is PackMode.REQUIRED and topo.pack:
        depth = len(state.levels) + 1 if topo.pack == "node" else state.levels.index(topo.pack) + 1
        domains = {(state.nodes[n].topology + (n,))[:depth] for n in demand}
        if len(domains) > 1:
            return f"topology {topo.pack} is required but the plan spans {len(domains)} of them"
    return ""


def resize_gang(state: ClusterTables, cmd: c.ResizeGang) -> Result:
    """Stop a running elastic gang with its grace so that it restarts at `size` (synapse.core.schedule.elastic)."""
    job = running_attempt(state, cmd.job_id, cmd.attempt)
    if isinstance(job, Result):
        return job
    if not elastic.is_elastic(job.spec) or cmd.size == len(job.tasks) \
            or not job.spec.tasks_min <= cmd.size <= job.spec.tasks:
        return Result.rejected(f"job {job.id} cannot resize from {len(job.tasks)} to {cmd.size} task(s) (it takes "
                               f"{elastic.least(job.spec)} to {job.spec.tasks})")
    job.stop_grace = job.spec.grace or DEFAULT_GRACE_S
    # `size` is what fitted when the leader asked; the next attempt is placed at the largest size
    # that fits then (synapse.core.schedule.elastic), which may be larger still: say so, not a promise.
    stop_attempt(state, job, f"resizing from {len(job.tasks)} task(s) (room for {cmd.size} when asked)"
                 + (f": {cmd.reason}" if cmd.reason else ""), cmd.at, cause=EndReason.RESIZED)
    way = "larger" if cmd.size > len(job.tasks) else "smaller"
    job_event(state, job, cmd.at, "Resizing", f"attempt {job.attempt} stops at {len(job.tasks)} task(s) to restart "
                                              f"{way} (room for {cmd.size} now; the next attempt takes as many as "
                                              f"fit, up to {job.spec.tasks}); grace {job.stop_grace:g}s")
    return Result(True)


def checkpoint_notice(state: ClusterTables, cmd: c.CheckpointNotice) -> Result:
    """Give a running attempt's tasks their checkpoint notice ahead of the stop planned for
    `stop_at` (the leader's time-limit monitor proposes it). An attempt is noticed once."""
    job = running_attempt(state, cmd.job_id, cmd.attempt)
    if isinstance(job, Result):
        return job
    if not job.spec.has_checkpoint:
        return Result.rejected(f"job {job.id} asks for no checkpoint notice")
    if cmd.cause not in NOTICED_CAUSES or cmd.stop_at < cmd.at:
        return Result.rejected(f"a notice is for a planned stop ahead ({', '.join(sorted(NOTICED_CAUSES))}), "
                               f"not {cmd.cause or 'none'} at {cmd.stop_at:.0f}")
    if job.notice_at:
        return Result(True, value="already noticed")
    give_notice(state, job, cmd.at, cmd.stop_at, cmd.cause)
    return Result(True)


def record_progress(state: ClusterTables, cmd: c.RecordProgress) -> Result:
    """Record an attempt's last checkpoint (and step) as its tasks reported it, while its gang
    exists (a stopping one too: it may save on its checkpoint notice); a checkpoint never goes
    back in time. A progress file's garbage becomes a Warning event, once per report."""
    job = state.jobs.get(cmd.job_id)
    if job is None:
        return Result.not_found(f"unknown job {cmd.job_id}")
    if not job.status.has_gang or job.attempt != cmd.attempt:
        return Result.rejected(f"job {job.id} is {job.status.value} at attempt {job.attempt}, not holding "
                               f"attempt {cmd.attempt}")
    if cmd.checkpoint_at < 0 or not math.isfinite(cmd.checkpoint_at):
        return Result.rejected(f"checkpoint_at must be a time, not {cmd.checkpoint_at}")
    old = job.progress if job.progress is not None and job.progress.attempt == job.attempt else None
    checkpoint_at, checkpoint_step = cmd.checkpoint_at, cmd.checkpoint_step
    if old is not None and old.checkpoint_at > checkpoint_at:
        checkpoint_at, checkpoint_step = old.checkpoint_at, old.checkpoint_step
    step = cmd.step if cmd.step >= 0 or old is None else old.step
    job.progress = Progress(job.attempt, checkpoint_at, checkpoint_step, step, cmd.at)
    if cmd.problem:
        job_event(state, job, cmd.at, "ProgressIgnored", cmd.problem[:300])
    return Result(True)


#: The longest command an exec event shows (its words joined); longer ones end with "…".
MAX_EXEC_SHOWN = 300


def record_exec(state: ClusterTables, cmd: c.RecordExec) -> Result:
    """Record an exec into a task of a job's running attempt as the job's event (`Exec`), who ran
    what: the API asks for this before it lets the process start, so no exec goes unrecorded."""
    job = state.jobs.get(cmd.job_id)
    if job is None:
        return Result.not_found(f"unknown job {cmd.job_id}")
    if job.status is not JobStatus.RUNNING or job.attempt != cmd.attempt:
        return Result.rejected(f"job {job.id} is {job.status.value} at attempt {job.attempt}, not running "
                               f"attempt {cmd.attempt}")
    if not 0 <= cmd.index < len(job.tasks) or not cmd.command:
        return Result.rejected(f"job {job.id} has tasks 0..{len(job.tasks) - 1} and an exec needs a command")
    shown = " ".join(cmd.command)
    shown = shown if len(shown) <= MAX_EXEC_SHOWN else shown[:MAX_EXEC_SHOWN - 1] + "…"
    job_event(state, job, cmd.at, "Exec", f"{cmd.by or 'someone'} ran in task {cmd.index}: {shown}")
    return Result(True)
