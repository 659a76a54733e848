"""The job transitions every table's handlers share: a gang asked to stop, an attempt ended (succeed,
fail, cancel, requeue), a task gone, a job finished, its checkpoint notice.

They validate nothing: the handler that calls one has decided already (apply is a transaction:
validate, then mutate; see synapse.core.state.fsm). `find_task` and `running_attempt` are the shared
look-ups a handler refuses with.
"""

from __future__ import annotations

from synapse.core.commands import Result
from synapse.core.model import (
    NODE_FAULTS,
    NOTICED_CAUSES,
    REQUEUED_CAUSES,
    EndReason,
    Job,
    JobStatus,
    Resources,
    Run,
    Task,
    TaskState,
)
from synapse.core.state.arrays import element_ended
from synapse.core.state.events import job_event
from synapse.core.state.tables import ClusterTables
from synapse.core.state.usage import count_usage, queue_of, release_hold
from synapse.core.versions import PREDICT_VERSION

#: How a Notice event names the planned stop it announces.
_PLANNED_STOPS: dict[str, str] = {EndReason.TIME_LIMIT: "its time limit", EndReason.PREEMPTED: "the preemption",
                  EndReason.DRAINED: "the drain", EndReason.RESIZED: "the resize"}
#: Ended attempts kept per job (the first and the latest ones; a gang preempted without end would
#: otherwise grow without bound).
MAX_RUNS_PER_JOB = 100
#: Lost nodes requeue a gang uncharged this many times; after that a lost node counts against its
#: max_restarts, so a job that takes its nodes down cannot walk the cluster for ever (Slurm's
#: MaxBatchRequeue is 5 too). Drains, preemption and resizes stay uncharged: they are the cluster's.
MAX_UNCHARGED_REQUEUES = 5
#: The ends of an attempt that tell how long its job runs (synapse.core.schedule.predict): it ran until it
#: exited, or until its time limit; a stop the cluster chose, or a task that never ran, says nothing.
LEARNED_OUTCOMES = frozenset({EndReason.COMPLETED, EndReason.ERROR, EndReason.SIGNAL, EndReason.OOM_KILLED,
                              EndReason.TIME_LIMIT})


def find_task(state: ClusterTables, job_id: str, attempt: int, index: int,
              node_id: str) -> tuple[Job, Task, Result | None]:
    """The job and task a worker's report names, or the rejection of the report.

    A rejection comes with what was found (None for the rest: the ignores below), and callers read
    the job and task only when there is none."""
    job = state.jobs.get(job_id)
    if job is None:
        return None, None, Result.not_found(f"unknown job {job_id}")  # type: ignore[return-value]
    if attempt != job.attempt or not job.tasks:
        return job, None, Result.rejected(  # type: ignore[return-value]
            f"stale report: job {job_id} is at attempt {job.attempt} ({job.status.value}), report is for "
            f"attempt {attempt}")
    if not 0 <= index < len(job.tasks):
        return job, None, Result.not_found(f"job {job_id} has no task {index}")  # type: ignore[return-value]
    task = job.tasks[index]
    if task.node_id != node_id:
        return job, task, Result.rejected(f"task {index} of job {job_id} runs on {task.node_id}, not {node_id}")
    return job, task, None


def running_attempt(state: ClusterTables, job_id: str, attempt: int) -> Job | Result:
    """The job if `attempt` is the one it runs now, else the refusal to return."""
    job = state.jobs.get(job_id)
    if job is None:
        return Result.not_found(f"unknown job {job_id}")
    if job.status is not JobStatus.RUNNING or job.attempt != attempt:
        return Result.rejected(f"job {job.id} is {job.status.value} at attempt {job.attempt}, not running "
                               f"attempt {attempt}")
    return job


def end_task(state: ClusterTables, task: Task, ended: TaskState, exit_code: int | None, at: float, reason: str,
             message: str) -> None:
    """The task is gone: give its resources back, and record why it ended. A step's task gives
    them back to its allocation's task, which its node and queue count (synapse.core.steps); if
    that task's allocation is stopping and no other step task runs inside it, it ends too."""
    job = state.jobs.get(task.job_id)
    node = state.nodes[task.node_id]
    nested = task.holder >= 0
    if not nested:
        if job is not None:
            count_usage(state, job, Resources() - task.resources, at)
        node.used = node.used - task.resources
        node.gpus_in_use.difference_update(task.gpus)
    state.live_tasks[node.id].discard(task.key)
    task.state, task.exit_code, task.ended_at = ended, exit_code, at
    task.reason, task.reason_message = str(reason), message
    if not nested:
        state.index.update(node)
    elif job is not None:
        alloc = state.jobs.get(job.alloc_id)
        if alloc is not None and alloc.status is JobStatus.STOPPING and task.holder < len(alloc.tasks):
            release_holders(state, alloc, at)


def stop_attempt(state: ClusterTables, job: Job, reason: str, at: float, cause: str = "", failure: str = "",
                 notice: float | None = None) -> None:
    """Ask every task of the attempt to stop; they keep their resources until gone. `cause` is
    the EndReason of the tasks stopped (Preempted, Cancelled, TimeLimit; "" when a failure stops
    them); `failure`, the first failure of the attempt, which the job keeps.

    A planned stop (`cause` in NOTICED_CAUSES) of a running attempt whose job asks for a
    checkpoint notice gives its tasks the notice first: `stop_notice` seconds (`notice`, else
    the job's: notice_of) from the signal to SIGTERM, counted from the attempt's notice if it
    had one already (its time limit's). An attempt not yet fully started has made no progress
    to save: it stops at once. Neither does anything else: a cancellation, a failure, a lost node."""
    if job.status in (JobStatus.SCHEDULED, JobStatus.RUNNING):
        running = job.status is JobStatus.RUNNING
        job.status, job.stop_reason, job.stop_cause = JobStatus.STOPPING, reason, str(cause)
        if failure:
            job.failure = failure
        job_event(state, job, at, "Stopping", f"attempt {job.attempt} {reason}")
        if running and cause in NOTICED_CAUSES and job.spec.has_checkpoint:
            job.stop_notice = notice_of(state, job) if notice is None else notice
            if job.stop_notice and not job.notice_at:
                give_notice(state, job, at, at + job.stop_notice, cause)
        if job.spec.alloc:
            stop_steps(state, job, at)


def live_steps(state: ClusterTables, alloc: Job) -> list[Job]:
    """The steps of an allocation whose tasks exist (placed, running or stopping), oldest first."""
    return sorted((state.jobs[i] for i in alloc.live_step_ids), key=lambda step: step.seq)


def stop_steps(state: ClusterTables, alloc: Job, at: float) -> None:
    """An allocation stops: so does every step of it (cancelled with it when it is cancelled), and
    its tasks that no step task runs inside end now (they run nothing); the others end with the
    last step task inside them (end_task), and the allocation ends with its last task."""
    for step in live_steps(state, alloc):
        if alloc.cancel_requested:
            step.cancel_requested, step.cancelled_by = True, alloc.cancelled_by
        step.stop_grace = alloc.stop_grace  # a preemption's grace reaches the processes that run
        stop_attempt(state, step, f"its allocation {alloc.id} stops: {alloc.stop_reason}", at,
                     cause=alloc.stop_cause)
        maybe_end_attempt(state, step, at)
    release_holders(state, alloc, at)


def release_holders(state: ClusterTables, alloc: Job, at: float) -> None:
    """End the stopping allocation's live tasks that no live step task runs inside, and the
    allocation once none is left."""
    inside = {t.holder for step in live_steps(state, alloc) for t in step.tasks if t.state.live}
    for task in alloc.tasks:
        if task.state.live and task.index not in inside:
            end_task(state, task, TaskState.EXITED, 0, at, alloc.stop_cause or EndReason.CANCELLED,
                     alloc.stop_reason)
    maybe_end_attempt(state, alloc, at)


def give_notice(state: ClusterTables, job: Job, at: float, stop_at: float, cause: str) -> None:
    """Record that the attempt's tasks get their notice now (dispatch passes it to the workers)."""
    job.notice_at = at
    live = sum(1 for t in job.tasks if t.state.live)
    job_event(state, job, at, "Notice", f"SIG{job.spec.checkpoint.signal} to {live} task(s); "
                                        f"{_PLANNED_STOPS.get(cause, cause)} stops them at "
                                        f"{utc_clock(stop_at)} ({stop_at - at:g}s notice)")


def notice_of(state: ClusterTables, job: Job) -> float:
    """Seconds of checkpoint notice the job's tasks get before a planned stop: its spec's, within
    its queue's max_grace (as it is now: a larger one later gives more); 0 if it asks for none."""
    if not job.spec.has_checkpoint:
        return 0.0
    queue = state.queues.get(queue_of(job))
    return queue.capped(job.spec.checkpoint.notice) if queue is not None else job.spec.checkpoint.notice


def maybe_end_attempt(state: ClusterTables, job: Job, at: float) -> None:
    """Once no task of the attempt is live: succeed, fail, cancel or requeue the job."""
    if not job.status.has_gang or any(t.state.live for t in job.tasks):
        return
    record_run(state, job)
    if job.status is not JobStatus.STOPPING:
        finish(state, job, JobStatus.SUCCEEDED, f"all {len(job.tasks)} task(s) exited 0", at)
    elif job.cancel_requested:
        finish(state, job, JobStatus.CANCELLED, job.stop_reason, at)
    elif job.spec.alloc or job.alloc_id:
        # An allocation is a person's session, and a step a command they wait for: neither comes
        # back later on its own (a lost node, a drain or a preemption ends it; Slurm does the same).
        finish(state, job, JobStatus.FAILED, job.stop_reason, at)
    elif job.stop_cause == EndReason.RESIZED:
        job.resizes += 1
        requeue_unfailed(state, job, at, f"to resize from {len(job.tasks)} task(s)")
    elif job.stop_cause == EndReason.PREEMPTED:
        job.preemptions += 1
        requeue_unfailed(state, job, at, f"after preemption {job.preemptions}")
    elif job.stop_cause == EndReason.REQUEUED:
        job.manual_requeues += 1
        requeue_unfailed(state, job, at, job.stop_reason)
    elif (job.stop_cause in REQUEUED_CAUSES or job.stop_cause == EndReason.IMAGE_PULL_FAILED) \
            and not ((job.stop_cause in NODE_FAULTS or job.stop_cause == EndReason.IMAGE_PULL_FAILED)
                     and job.requeues >= MAX_UNCHARGED_REQUEUES):
        job.requeues += 1
        requeue_unfailed(state, job, at, f"after {job.stop_reason}")
    elif job.final_failure:
        finish(state, job, JobStatus.FAILED, f"{job.stop_reason}; not retried", at)
    elif job.restarts_used() >= job.restarts_allowed():
        finish(state, job, JobStatus.FAILED, f"{job.stop_reason}; no restarts left (max_restarts "
                                             f"{job.restarts_allowed()}, all used)", at)
    else:
        job.attempt += 1
        job.status, job.tasks, job.stop_reason, job.started_at = JobStatus.PENDING, [], "", 0.0
        job.stop_cause, job.pending_since, job.stop_notice, job.notice_at = "", at, 0.0, 0.0
        state.pending.add((job.queue_key(), job.id))
        job_event(state, job, at, "Requeued", f"attempt {job.attempt}: restart {job.restarts_used()} of "
                                              f"{job.restarts_allowed()}")


def requeue_unfailed(state: ClusterTables, job: Job, at: float, why: str) -> None:
    """Requeue an attempt that did not fail (preempted, resized, its MASTER_PORT taken): the next
    attempt keeps the job's place in its queue (the queue key is the original submission time)
    and uses up none of its restarts."""
    job.attempt += 1
    job.status, job.tasks, job.stop_reason, job.started_at = JobStatus.PENDING, [], "", 0.0
    job.stop_grace, job.stop_cause, job.pending_since = 0.0, "", at
    job.stop_notice, job.notice_at = 0.0, 0.0
    state.pending.add((job.queue_key(), job.id))
    job_event(state, job, at, "Requeued", f"attempt {job.attempt} {why}; not charged to max_restarts")


def record_run(state: ClusterTables, job: Job) -> None:
    """Keep the accounting record of the attempt whose tasks are all gone."""
    ended = sorted(job.tasks, key=lambda t: (t.ended_at, t.index))
    failed = [t for t in ended if t.reason != EndReason.COMPLETED]
    if job.status is not JobStatus.STOPPING:
        outcome, why = EndReason.COMPLETED, ""
    elif job.stop_cause:
        outcome, why = job.stop_cause, job.stop_reason
    else:
        outcome, why = (failed[0].reason if failed else EndReason.ERROR), job.failure or job.stop_reason
    # A step's tasks hold a share of their allocation's, which its own run counts: counted again
    # here, the same GPU-seconds would be charged twice (synapse.core.steps).
    held = [(t.resources, max(0.0, t.ended_at - job.placed_at)) for t in job.tasks if t.holder < 0]
    job.runs.append(Run(
        attempt=job.attempt, placed_at=job.placed_at, started_at=job.started_at,
        ended_at=max((t.ended_at for t in job.tasks), default=job.placed_at),
        nodes=tuple(t.node_id for t in job.tasks), resources=job.spec.resources, outcome=str(outcome),
        reason=why, exit_code=next((t.exit_code for t in ended if t.exit_code), 0) or 0,
        gpu_seconds=sum(r.gpu * s for r, s in held), cpu_seconds=sum(r.cpu / 1000 * s for r, s in held),
        checkpoint_at=job.progress.checkpoint_at if job.progress and job.progress.attempt == job.attempt else 0.0))
    if len(job.runs) > MAX_RUNS_PER_JOB:
        del job.runs[1]
    run = job.runs[-1]
    # Learned from command-set version 4 on only (the cluster version is replicated): a replica
    # of an older release does not learn, and while one is a member their states must not part.
    if outcome in LEARNED_OUTCOMES and run.ended_at >= run.started_at and state.cluster_version >= PREDICT_VERSION \
            and not (job.spec.alloc or job.alloc_id):  # neither queues: their run times predict no wait
        state.run_times.learn(job.user, job.spec.name, job.spec.total.gpu, run.ended_at - run.started_at)


def end_pending(state: ClusterTables, job: Job, status: JobStatus, reason: str, at: float) -> None:
    """End a job still in the queue. One that holds no nodes for a preemption and is no array
    element (whose array would queue its next) changes nothing a placement reads but the queue
    and its own status: it is noted in `dequeued` (the command's handler does nothing else)."""
    quiet = job.id not in state.holds and not job.array_id
    finish(state, job, status, reason, at)
    if quiet:
        state.dequeued.append((job.queue_key(), job.id))
        state.dequeued_count += 1


def finish(state: ClusterTables, job: Job, status: JobStatus, reason: str, at: float) -> None:
    """End a job for good: number it for the history store (`archive_seq`), release its hold, and tell
    its array."""
    if job.status is JobStatus.PENDING:
        state.pending.discard((job.queue_key(), job.id))
    release_hold(state, job.id)
    job.status, job.finished_at = status, at
    state.archive_seq += 1
    job.archive_seq = state.archive_seq
    state.unarchived[job.archive_seq] = job.id
    job_event(state, job, at, status.value.capitalize(), reason)
    if job.array_id:
        element_ended(state, job, at)
    alloc = state.jobs.get(job.alloc_id) if job.alloc_id else None
    if alloc is not None:
        alloc.live_step_ids.discard(job.id)
        code = max((t.exit_code for t in job.tasks if t.exit_code is not None), default=0)
        job_event(state, alloc, at, "StepEnded", f"step {job.id} {status.value} (exit code {code}): {reason}")
        if alloc.status is JobStatus.RUNNING and not alloc.live_step_ids:
            alloc.idle_since = at


def utc_clock(at: float) -> str:
    """A time of day as HH:MM:SS UTC (apply may format a timestamp it was given, never read a clock)."""
    s = int(at) % 86400
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d} UTC"
