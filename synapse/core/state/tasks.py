"""A worker's reports of its tasks: started, prepared (its image pulled), exited, and why a task
ended (`end_reason`). An exit frees what the task held and settles its gang's attempt once the
last task is gone (synapse.core.state.transitions).

State: the jobs' tasks. Commands: TaskStarted, TaskPrepared, TaskExited.
"""

from __future__ import annotations

from synapse.core import commands as c
from synapse.core.commands import Result
from synapse.core.model import (
    NEVER_RAN,
    NEVER_RAN_VERSION,
    WORKER_REASONS,
    EndReason,
    Job,
    JobStatus,
    TaskState,
    gang_unprepared,
)
from synapse.core.state.events import job_event
from synapse.core.state.node_faults import MAX_EXCLUDED_NODES, note_node_failures
from synapse.core.state.tables import ClusterTables
from synapse.core.state.transitions import end_task, find_task, maybe_end_attempt, stop_attempt


def task_started(state: ClusterTables, cmd: c.TaskStarted) -> Result:
    """A worker started a task; the job is RUNNING once every task of the attempt has started."""
    job, task, rejection = find_task(state, cmd.job_id, cmd.attempt, cmd.index, cmd.node_id)
    if rejection is not None:
        return rejection
    if job.spec.alloc:
        return _runs_nothing(job)
    if task.state is not TaskState.ASSIGNED:
        return Result(True, value=f"task already {task.state.value}")
    task.state, task.started_at = TaskState.RUNNING, cmd.at
    state.emit(cmd.at, "Normal", "job", "TaskStarted", job.id, f"task {task.index} (rank {task.rank}) of "
               f"attempt {job.attempt} started on {task.node_id}")
    if job.status is JobStatus.SCHEDULED and all(t.started_at for t in job.tasks):
        job.status, job.started_at = JobStatus.RUNNING, cmd.at
        array = state.arrays.get(job.array_id) if job.array_id else None
        if array is not None and not array.started_at and state.cluster_version >= NEVER_RAN_VERSION:
            array.started_at = cmd.at  # the array's first start, which `describe` of the array shows
        job_event(state, job, cmd.at, "Running", f"all {len(job.tasks)} task(s) of attempt "
                                                 f"{job.attempt} started")
    return Result(True)


def task_prepared(state: ClusterTables, cmd: c.TaskPrepared) -> Result:
    """A task's node holds its image; once every node of the attempt does, the gang may start
    (model.gang_unprepared)."""
    job, task, rejection = find_task(state, cmd.job_id, cmd.attempt, cmd.index, cmd.node_id)
    if rejection is not None:
        return rejection
    if task.prepared or task.state is not TaskState.ASSIGNED:
        return Result(True, value="already prepared or started")
    task.prepared = True
    if job.status is JobStatus.SCHEDULED and not gang_unprepared(job):
        job_event(state, job, cmd.at, "ImageReady", f"every node of attempt {job.attempt} holds image "
                                                    f"{job.spec.image}: its {len(job.tasks)} task(s) start")
    return Result(True)


def task_exited(state: ClusterTables, cmd: c.TaskExited) -> Result:
    """A task ended: free what it held and stop its gang on a failure (or requeue it, for a cause the
    task could not help); the last task's end settles the attempt."""
    job, task, rejection = find_task(state, cmd.job_id, cmd.attempt, cmd.index, cmd.node_id)
    if rejection is not None:
        return rejection
    if job.spec.alloc:
        return _runs_nothing(job)
    if not task.state.live:
        return Result(True, value=f"task already {task.state.value}")
    if not task.started_at:
        task.started_at = cmd.at
    reason, message = end_reason(job, cmd)
    # A task whose command never ran has no exit code (the worker's 127 stands in for one); an
    # older replica records it, so the change waits until every member applies version 6.
    never_ran = cmd.cause in NEVER_RAN and state.cluster_version >= NEVER_RAN_VERSION
    end_task(state, task, TaskState.EXITED, None if never_ran else cmd.exit_code, cmd.at, reason, message)
    ended = f"did not start on {task.node_id}" if never_ran else \
        f"exited with code {cmd.exit_code} on {task.node_id}"
    state.emit(cmd.at, "Normal" if cmd.exit_code == 0 else "Warning", "job", "TaskExited", job.id,
               f"task {task.index} of attempt {job.attempt} {ended}: {reason}" + (f" ({message})" if message else ""))
    if reason == EndReason.MASTER_PORT_IN_USE:
        # Rank 0 never started; the clash is its node's, so the attempt stops without failing
        # and the job is requeued with the next attempt's port (synapse.core.rendezvous).
        stop_attempt(state, job, message, cmd.at, cause=EndReason.MASTER_PORT_IN_USE)
    elif reason == EndReason.IMAGE_PULL_FAILED:
        # The task never ran. A node-side failure requeues the gang uncharged, without the
        # node; a failure of the reference would fail on every node: the job fails, not retried.
        # (A version-4 cause: an older replica never sees it, see synapse.master.api.workers.ReportTaskEvents.)
        failure = f"task {task.index} (rank {task.rank}) on {task.node_id}: {reason}: {message}"
        if cmd.node_side:
            job.excluded_nodes = (*(n for n in job.excluded_nodes if n != task.node_id),
                                  task.node_id)[-MAX_EXCLUDED_NODES:]
            stop_attempt(state, job, f"{reason} on {task.node_id}: {message}", cmd.at, cause=reason)
        else:
            job.final_failure = True
            stop_attempt(state, job, f"failed: {reason} on {task.node_id}: {message}", cmd.at, failure=failure)
    elif reason == EndReason.MOUNT_REFUSED:
        # The task never ran: the worker will not mount what the job asks. Every attempt would be
        # refused alike (the allowed prefixes are the cluster's), so the job fails now, not retried.
        job.final_failure = True
        stop_attempt(state, job, f"failed: {reason} on {task.node_id}: {message}", cmd.at,
                     failure=f"task {task.index} (rank {task.rank}) on {task.node_id}: {reason}: {message}")
    elif reason == EndReason.NODE_LOST:
        # Its machine restarted while its worker was away, before the node was declared lost (a
        # version-4 cause, synapse.worker.state.WorkerState.restore): the task died with the
        # machine. As for a lost node, the gang requeues uncharged, and the job excludes the node,
        # which counts the end against it (a node that keeps rebooting under gangs is a suspect).
        ending = job.status in (JobStatus.SCHEDULED, JobStatus.RUNNING)
        stop_attempt(state, job, f"task {task.index} lost ({message})", cmd.at, cause=EndReason.NODE_LOST)
        node = state.nodes.get(task.node_id)
        if ending and node is not None:
            note_node_failures(state, node, [job.id], EndReason.NODE_LOST.value, cmd.at)
    elif cmd.exit_code != 0:
        why = f"task {task.index} exited with code {cmd.exit_code}: {reason}" + (f" ({message})" if message else "")
        stop_attempt(state, job, f"failed: {why}", cmd.at,
                     failure=f"task {task.index} (rank {task.rank}) on {task.node_id}: {reason}"
                     + (f": {message}" if message else ""))
    maybe_end_attempt(state, job, cmd.at)
    return Result(True)


def _runs_nothing(job: Job) -> Result:
    """The refusal of a worker's report about an allocation's task: no worker runs one, so none may
    end one (it ends with the allocation, once no step task runs inside it)."""
    return Result.rejected(f"job {job.id} is an allocation: its tasks run no process, no worker reports them")


def end_reason(job: Job, cmd: c.TaskExited) -> tuple[str, str]:
    """Why a reported task ended, and the detail. An OOM kill is a fact and always wins; a task the
    cluster stopped (preemption, cancellation, time limit) ends for that reason; otherwise the
    worker's reading stands (derived from the exit code when an older worker sent none)."""
    code = cmd.exit_code
    if cmd.cause == EndReason.OOM_KILLED:
        return EndReason.OOM_KILLED, cmd.reason
    if job.status is JobStatus.STOPPING and job.stop_cause:
        return job.stop_cause, job.stop_reason
    if cmd.cause in NEVER_RAN or cmd.cause == EndReason.NODE_LOST:
        return cmd.cause, cmd.reason  # it never ran, or died with its machine: its exit code means nothing
    if cmd.cause in WORKER_REASONS:
        cause = cmd.cause
    else:
        cause = EndReason.COMPLETED if code == 0 else EndReason.SIGNAL if 128 < code <= 192 else EndReason.ERROR
    if cause == EndReason.SIGNAL:
        detail = f"signal {code - 128}" if 128 < code <= 192 else "killed"
    else:
        detail = f"exit code {code}"
    return cause, detail + (f"; {cmd.reason}" if cmd.reason else "")
