"""What a job's owner (or an admin) may do to a job after submitting it: hold it back from the queue,
release it, change its priority, time limit or queue, and requeue a placed attempt.

State: the jobs' `held_by`, `spec` (priority, time_limit, queue), `manual_requeues`, `updates`, and
`pending` (a job's queue key holds its priority). Commands (command-set version 7): HoldJob,
ReleaseJob, UpdateJob, RequeueJob. Each is re-checked here against the state, whoever proposed it:
the endpoint checked the caller first, but the caller's role or the job may have changed since.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from synapse.core import commands as c
from synapse.core.commands import Result
from synapse.core.jobs.quantity import format_duration
from synapse.core.model import DEFAULT_QUEUE, EndReason, Job, JobSpec, JobStatus
from synapse.core.state.events import job_event
from synapse.core.state.tables import ClusterTables
from synapse.core.state.transitions import maybe_end_attempt, stop_attempt
from synapse.core.state.usage import release_hold
from synapse.core.submission import queue_refusal, submitter_of


def _owned(state: ClusterTables, job_id: str, by: str, verb: str) -> Job | Result:
    """The job if `by` may act on it (its owner or an admin), else the refusal."""
    job = state.jobs.get(job_id)
    if job is None:
        if job_id in state.arrays:
            return Result.rejected(f"job {job_id} is an array: {verb} its elements (ID_INDEX) one by one")
        return Result.not_found(f"unknown job {job_id}")
    if by != job.user and not submitter_of(state, by).is_admin:
        return Result.rejected(f"user {by or '-'} may not {verb} job {job_id}: it belongs to {job.user or 'no user'}; "
                               "only its owner or an admin may")
    return job


def hold_job(state: ClusterTables, cmd: c.HoldJob) -> Result:
    """Hold a pending job: it keeps its place in the queue and is never placed until released. Nodes
    held for it by a preemption are let go (its victims were stopped for nothing: it will wait)."""
    job = _owned(state, cmd.job_id, cmd.by, "hold")
    if isinstance(job, Result):
        return job
    if job.status is not JobStatus.PENDING:
        return Result.rejected(f"job {job.id} is {job.status.value}: only a pending job can be held")
    if job.held_by:
        return Result(True, value=f"already held by {job.held_by}")
    job.held_by = cmd.by or "-"
    release_hold(state, job.id)
    job_event(state, job, cmd.at, "Held", f"by {job.held_by}: it stays queued and is not placed until released")
    return Result(True, value=f"held by {job.held_by}")


def release_job(state: ClusterTables, cmd: c.ReleaseJob) -> Result:
    """Release a held job: it takes part in the next round, at its place."""
    job = _owned(state, cmd.job_id, cmd.by, "release")
    if isinstance(job, Result):
        return job
    if not job.held_by:
        return Result(True, value="not held")
    held_by, job.held_by = job.held_by, ""
    job_event(state, job, cmd.at, "Released", f"by {cmd.by or '-'} (held by {held_by})")
    return Result(True, value="released")


def update_denial(state: ClusterTables, job: Job, cmd: c.UpdateJob) -> str:
    """Why `cmd.by` may not make this change for lack of the admin role, or ''. Its owner may lower
    the priority and shorten the time limit; raising the priority, lengthening the limit or lifting
    it takes an admin."""
    if submitter_of(state, cmd.by).is_admin:
        return ""
    spec = job.spec
    if cmd.priority is not None and cmd.priority > spec.priority:
        return (f"priority: only an admin may raise it (from {spec.priority} to {cmd.priority}); its owner may "
                "lower it")
    if cmd.time_limit is not None and spec.time_limit > 0 and (cmd.time_limit == 0 or cmd.time_limit > spec.time_limit):
        asked = format_duration(cmd.time_limit) if cmd.time_limit else "none"
        return (f"time_limit: only an admin may lengthen or lift it (from {format_duration(spec.time_limit)} to "
                f"{asked}); its owner may shorten it")
    return ""


def update_problem(state: ClusterTables, job: Job, cmd: c.UpdateJob) -> str:
    """Why `cmd` may not change `job`, or '': `update_denial`, and the change itself. A new queue is
    for a pending job, and must take it by the submission rules (synapse.core.submission), as the
    job's owner submitting it there; an interactive job's limit stays within its queue's maximum."""
    if job.status.terminal:
        return f"job {job.id} has ended ({job.status.value})"
    if cmd.priority is None and cmd.time_limit is None and cmd.queue is None:
        return "nothing to change: give a priority, a time limit or a queue"
    if cmd.time_limit is not None and cmd.time_limit < 0:
        return "time_limit: must not be negative"
    denied = update_denial(state, job, cmd)
    if denied:
        return denied
    if cmd.queue is not None:
        if job.status is not JobStatus.PENDING:
            return f"queue: job {job.id} is {job.status.value}; only a pending job moves to another queue"
        if job.array_id:
            return f"queue: job {job.id} is an element of array {job.array_id}; its elements share one queue"
    new = _updated(job.spec, cmd)
    if new.interactive or cmd.queue is not None:
        refused = queue_refusal(state, new, submitter_of(state, job.user), moving=job.id)
        if refused is not None:
            return refused.reason
    return ""


def _updated(spec: JobSpec, cmd: c.UpdateJob) -> JobSpec:
    """`spec` with what `cmd` changes."""
    changes: dict[str, Any] = {}
    if cmd.priority is not None:
        changes["priority"] = cmd.priority
    if cmd.time_limit is not None:
        changes["time_limit"] = cmd.time_limit
    if cmd.queue is not None:
        changes["queue"] = cmd.queue or DEFAULT_QUEUE
    return dataclasses.replace(spec, **changes)


def update_job(state: ClusterTables, cmd: c.UpdateJob) -> Result:
    """Change a job's priority, time limit or queue, re-checked (`update_problem`). A pending job's
    place in the queue follows its new priority; a running gang's new time limit counts from when it
    started, as the old one did."""
    job = _owned(state, cmd.job_id, cmd.by, "update")
    if isinstance(job, Result):
        return job
    problem = update_problem(state, job, cmd)
    if problem:
        return Result.rejected(f"job {job.id}: {problem}")
    old = job.spec
    pending = job.status is JobStatus.PENDING
    if pending:
        state.pending.remove((job.queue_key(), job.id))
    job.spec = _updated(old, cmd)
    if pending:
        state.pending.add((job.queue_key(), job.id))
    job.updates += 1
    changed = [f"{name} {before} -> {after}" for name, before, after in (
        ("priority", old.priority, job.spec.priority),
        ("time_limit", format_duration(old.time_limit) if old.time_limit else "none",
         format_duration(job.spec.time_limit) if job.spec.time_limit else "none"),
        ("queue", old.queue or DEFAULT_QUEUE, job.spec.queue or DEFAULT_QUEUE)) if before != after]
    message = ", ".join(changed) or "no change"
    job_event(state, job, cmd.at, "Updated", f"by {cmd.by or '-'}: {message}")
    return Result(True, value=message)


def requeue_job(state: ClusterTables, cmd: c.RequeueJob) -> Result:
    """Stop a placed attempt as a cancel does (its tasks end Requeued) and queue the job again once
    they are gone: a new attempt at its place in the queue, not charged to max_restarts."""
    job = _owned(state, cmd.job_id, cmd.by, "requeue")
    if isinstance(job, Result):
        return job
    if job.status not in (JobStatus.SCHEDULED, JobStatus.RUNNING) or job.attempt != cmd.attempt:
        return Result.rejected(f"job {job.id} is {job.status.value} at attempt {job.attempt}: only a scheduled or "
                               f"running attempt ({cmd.attempt}) can be requeued")
    reason = "requeued" + (f" by {cmd.by}" if cmd.by else "") + (f": {cmd.reason}" if cmd.reason else "")
    stop_attempt(state, job, reason, cmd.at, cause=EndReason.REQUEUED)
    maybe_end_attempt(state, job, cmd.at)
    return Result(True, value=f"attempt {cmd.attempt} stopping; the job queues again")
