"""History numbering: finished jobs numbered for the history store, the cursor of what it holds, and
forgetting ended jobs (keeping their final status for dependencies).

State: `archive_seq`, `archived_upto`, `history_dropped`, `unarchived`, `finished` (and removals
from `jobs`, `arrays`, `job_by_request`). Commands: ForgetJobs, ArchiveJobs, HistoryExported,
HistoryOverflow.
"""

from __future__ import annotations

from synapse.core import commands as c
from synapse.core.commands import Result
from synapse.core.model import Job
from synapse.core.state.tables import ClusterTables

#: Final states of forgotten jobs kept for dependencies on them (the oldest beyond it are dropped).
MAX_FINISHED_RECORDS = 200_000


def forget_jobs(state: ClusterTables, cmd: c.ForgetJobs) -> Result:
    """Version 1, as every release applies it: drop ended jobs, keep nothing of them."""
    return Result(True, value=str(sum(1 for job_id in cmd.job_ids if drop_ended(state, job_id) is not None)))


def archive_jobs(state: ClusterTables, cmd: c.ArchiveJobs) -> Result:
    """Drop ended jobs and arrays, keeping each one's final status for dependencies on it."""
    forgotten = 0
    for job_id in cmd.job_ids:
        array = state.arrays.get(job_id)
        if array is not None and array.done:
            del state.arrays[job_id]
            state.array_live.pop(job_id, None)
            if array.request_id and state.job_by_request.get(array.request_id) == job_id:
                del state.job_by_request[array.request_id]
            record_final(state, job_id, array.status(False).value)
            forgotten += 1
            continue
        job = drop_ended(state, job_id)
        if job is not None:
            record_final(state, job_id, job.status.value)
            forgotten += 1
    return Result(True, value=str(forgotten))


def drop_ended(state: ClusterTables, job_id: str) -> Job | None:
    """Remove an ended job and free its request id; None (nothing changed) if it is not one."""
    job = state.jobs.get(job_id)
    if job is None or not job.status.terminal:
        return None
    drop_job(state, job)
    return job


def record_final(state: ClusterTables, job_id: str, status: str) -> None:
    """Keep a forgotten job's final status for dependencies on it (bounded, oldest dropped first)."""
    state.finished[job_id] = status
    while len(state.finished) > MAX_FINISHED_RECORDS:
        del state.finished[next(iter(state.finished))]


def drop_job(state: ClusterTables, job: Job) -> None:
    """Remove a job, its place among the unarchived (derived) and its request id."""
    del state.jobs[job.id]
    state.unarchived.pop(job.archive_seq, None)
    if job.request_id and state.job_by_request.get(job.request_id) == job.id:
        del state.job_by_request[job.request_id]


def history_exported(state: ClusterTables, cmd: c.HistoryExported) -> Result:
    """The store holds every finished job numbered up to `upto`: mark them archived (retention
    counts from now). A cursor at or below the known one changes nothing."""
    if cmd.upto > state.archive_seq:
        return Result.rejected(f"history cursor {cmd.upto} is beyond the last finished job ({state.archive_seq})")
    marked = 0
    while state.unarchived:
        seq = next(iter(state.unarchived))
        if seq > cmd.upto:
            break
        state.jobs[state.unarchived.pop(seq)].archived_at = cmd.at
        marked += 1
    state.archived_upto = max(state.archived_upto, cmd.upto)
    return Result(True, value=str(marked))


def history_overflow(state: ClusterTables, cmd: c.HistoryOverflow) -> Result:
    """Forget finished jobs the store does not hold (the unarchived cap was reached), loudly."""
    dropped = []
    for job_id in cmd.job_ids:
        job = state.jobs.get(job_id)
        if job is not None and job.status.terminal and job.archive_seq in state.unarchived:
            drop_job(state, job)
            dropped.append(job_id)
    if dropped:
        state.history_dropped += len(dropped)
        state.emit(cmd.at, "Warning", "history", "HistoryDropped", dropped[0],
                   f"{len(dropped)} finished job(s) forgotten before the history store held them "
                   f"({state.history_dropped} in all): {', '.join(dropped[:5])}" + (" …" if len(dropped) > 5 else ""))
    return Result(True, value=str(len(dropped)))
