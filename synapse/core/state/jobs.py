"""The job table: submissions (single jobs and arrays), cancels, failures of an attempt.

State: `jobs`, `job_by_request`, `pending`, `job_seq`. Commands: SubmitJob, SubmitWorkflowJob,
SubmitCheckpointJob, SubmitImageJob, SubmitSecretJob, CancelJob, FailAttempt.
"""

from __future__ import annotations

import dataclasses

from synapse.core import commands as c
from synapse.core.commands import Result
from synapse.core.jobs import dependencies
from synapse.core.jobs.arrays import MAX_ARRAY_SIZE, JobArray, element_id, split_element_id
from synapse.core.jobs.jobspec import JobFileError, check_checkpoint, check_workflow, notice_capped
from synapse.core.model import DEFAULT_QUEUE, EndReason, Job, JobSpec, JobStatus, Resources
from synapse.core.state.arrays import array_maybe_done, submit_array
from synapse.core.state.events import job_event
from synapse.core.state.tables import ClusterTables
from synapse.core.state.transitions import end_pending, maybe_end_attempt, stop_attempt
from synapse.core.state.usage import queue_of
from synapse.core.submission import limit_problem


def validate_spec(state: ClusterTables, spec: JobSpec) -> str:
    """Why a job spec can never be accepted, or '' when it is well formed."""
    if not spec.name:
        return "name must not be empty"
    if spec.tasks < 1:
        return f"tasks must be at least 1, not {spec.tasks}"
    if spec.resources.is_negative():
        return "resources must not be negative"
    if spec.resources == Resources():
        return "a task must ask for some cpu, memory or gpu"
    if not spec.command and not spec.image and not spec.alloc:  # with an image, its entrypoint (a SubmitImageJob alone)
        return "command must not be empty"
    if spec.alloc and (spec.command or spec.image or spec.array or spec.tasks_min):
        return "an allocation runs nothing itself (its steps do): no command, image, array or elastic size"
    if spec.idle_timeout < 0 or (spec.idle_timeout and not spec.alloc):
        return "idle_timeout is an allocation's, and must not be negative"
    if spec.max_restarts < 0:
        return "max_restarts must not be negative"
    if spec.time_limit < 0:
        return "time_limit must not be negative"
    if spec.topology.pack and spec.topology.pack not in (*state.levels, "node"):
        return (f"topology.pack must be one of {', '.join((*state.levels, 'node'))}, "
                f"not {spec.topology.pack!r}")
    return ""


def request_conflict(state: ClusterTables, request_id: str, spec: JobSpec) -> str:
    """Why a submission of `spec` under `request_id` is refused, or ''. A request id makes one
    job: sent again with that job's spec it is a retry, which gets that job; with another spec
    it is a reused id, and the new job would be lost silently behind the old one."""
    job_id = state.job_by_request.get(request_id, "") if request_id else ""
    made = state.arrays.get(job_id) or state.jobs.get(job_id)
    if made is None or made.spec == spec:
        return ""
    if isinstance(made, Job) and made.updates and made.spec == dataclasses.replace(
            spec, priority=made.spec.priority, time_limit=made.spec.time_limit, queue=made.spec.queue):
        return ""  # its spec as submitted, since changed by UpdateJob: still a retry
    return (f"request id {request_id} already made job {job_id}, from another spec: "
            "a new job needs a new request id")


def submit_job(state: ClusterTables, cmd: c.SubmitJob) -> Result:
    """A new job or array, pending in its queue; a request id already used returns the job it made (a
    retry), or is refused with another spec."""
    if cmd.request_id and cmd.request_id in state.job_by_request:
        conflict = request_conflict(state, cmd.request_id, cmd.spec)
        if conflict:
            return Result.rejected(conflict, c.Rejection.CONFLICT)
        return Result(True, value=state.job_by_request[cmd.request_id])
    if not cmd.job_id:
        return Result.rejected("job id must not be empty")
    if cmd.job_id in state.jobs or cmd.job_id in state.arrays:
        return Result.rejected(f"job id {cmd.job_id} already exists")
    problem = validate_spec(state, cmd.spec) or workflow_problem(state, cmd) or checkpoint_problem(cmd)
    if problem:
        return Result.rejected(f"job {cmd.spec.name or cmd.job_id}: {problem}")
    if cmd.spec.queue not in ("", DEFAULT_QUEUE) and cmd.spec.queue not in state.queues:
        return Result.rejected(f"job {cmd.spec.name or cmd.job_id}: queue: unknown queue {cmd.spec.queue}")
    held = isinstance(cmd, c.SubmitInteractiveJob) and cmd.held
    problem = limit_problem(state, cmd.spec, cmd.by)  # its queue's per-user jobs, an interactive maximum
    if problem:
        return Result.rejected(f"job {cmd.spec.name or cmd.job_id}: {problem}")
    if cmd.spec.array:
        if held:
            return Result.rejected(f"job {cmd.spec.name or cmd.job_id}: an array cannot be held; hold its elements")
        return submit_array(state, cmd)
    state.job_seq += 1
    job = Job(id=cmd.job_id, spec=cmd.spec, request_id=cmd.request_id, submitted_at=cmd.at,
              seq=state.job_seq, user=cmd.by, pending_since=cmd.at)
    state.jobs[job.id] = job
    if cmd.request_id:
        state.job_by_request[cmd.request_id] = job.id
    state.pending.add((job.queue_key(), job.id))
    if held:
        job.held_by = cmd.by or "-"
    capped = notice_capped(cmd.spec, state.queues.get(queue_of(job)))
    job_event(state, job, cmd.at, "Submitted", (f"by {cmd.by}: " if cmd.by else "")
              + f"{cmd.spec.tasks} task(s), max_restarts {cmd.spec.max_restarts}"
              + (f"; warning: {capped}" if capped else "") + (f"; held by {job.held_by}" if held else ""))
    return Result(True, value=job.id)


def checkpoint_problem(cmd: c.SubmitJob) -> str:
    """Why a submission's checkpoint notice cannot be accepted, or '' (jobspec.check_checkpoint)."""
    if cmd.spec.has_checkpoint and not isinstance(cmd, c.SubmitCheckpointJob):
        return "a checkpoint notice needs a SubmitCheckpointJob command"
    if cmd.spec.has_image_run and not isinstance(cmd, c.SubmitImageJob):
        return "mounts, or a job without a command, need a SubmitImageJob command"
    if cmd.spec.has_secrets and not isinstance(cmd, c.SubmitSecretJob):
        return "secrets need a SubmitSecretJob command"
    if cmd.spec.has_alloc and not isinstance(cmd, c.SubmitAllocJob):
        return "an allocation needs a SubmitAllocJob command"
    try:
        check_checkpoint(cmd.spec)
    except JobFileError as exc:
        return str(exc)
    return ""


def workflow_problem(state: ClusterTables, cmd: c.SubmitJob) -> str:
    """Why a submission's array or dependencies cannot be accepted against this state, or ''.

    The same rules as the endpoint's (jobspec.check_workflow), but for the array size: the
    cluster file's max_array_size is configuration, not replicated state, so apply holds
    arrays to the absolute MAX_ARRAY_SIZE only (the endpoint refuses beyond the cluster's)."""
    spec = cmd.spec
    if spec.has_workflow and not isinstance(cmd, c.SubmitWorkflowJob):
        return "arrays and dependencies need a SubmitWorkflowJob command"
    try:
        check_workflow(spec, MAX_ARRAY_SIZE)
    except JobFileError as exc:
        return str(exc)
    for _kind, upstream in spec.after:
        if upstream == cmd.job_id or (element := split_element_id(upstream)) is not None and \
                element[0] == cmd.job_id:
            return f"after: job {upstream} is this job itself"
        if not dependencies.known(state, upstream):
            return f"after: unknown job {upstream}"
    return ""


def cancel_job(state: ClusterTables, cmd: c.CancelJob) -> Result:
    """Cancel a job, an array, or an element not yet a job: a pending job ends at once; a gang stops,
    and the job ends once its tasks are gone."""
    job = state.jobs.get(cmd.job_id)
    if job is None and cmd.job_id in state.arrays:
        return cancel_array(state, state.arrays[cmd.job_id], cmd)
    element = split_element_id(cmd.job_id) if job is None else None
    if element is not None:
        result = cancel_unplaced_element(state, *element, cmd)
        if result is not None:
            return result
    if job is None:
        return Result.not_found(f"unknown job {cmd.job_id}")
    if job.status.terminal:
        return Result(True, value=f"already {job.status.value}")
    reason = "cancelled" + (f" by {cmd.by}" if cmd.by else "") + (f": {cmd.reason}" if cmd.reason else "")
    job.cancel_requested = True
    job.cancelled_by = cmd.by
    if job.status is JobStatus.PENDING:
        end_pending(state, job, JobStatus.CANCELLED, reason, cmd.at)
        return Result(True)
    stop_attempt(state, job, reason, cmd.at, cause=EndReason.CANCELLED)
    maybe_end_attempt(state, job, cmd.at)
    return Result(True)


def cancel_array(state: ClusterTables, array: JobArray, cmd: c.CancelJob) -> Result:
    """`cancel ID`: no more elements become jobs, and every element not ended is cancelled."""
    if array.done:
        return Result(True, value=f"already {array.status(False).value}")
    array.cancelled = True
    array.cancelled_count += array.remaining()
    array.next = array.count
    for job_id in sorted(state.array_live.get(array.id, ())):
        cancel_job(state, dataclasses.replace(cmd, job_id=job_id))
    array_maybe_done(state, array, cmd.at)
    return Result(True)


def cancel_unplaced_element(state: ClusterTables, array_id: str, index: int, cmd: c.CancelJob) -> Result | None:
    """`cancel ID_7` of an element not yet a job: it never becomes one. None if it is not such an element."""
    array = state.arrays.get(array_id)
    if array is None or array.cancelled:
        return None
    position = array.position_of(index)
    if position < array.next or index in array.skipped:
        return None
    array.skipped.add(index)
    array.cancelled_count += 1
    state.emit(cmd.at, "Normal", "job", "JobCancelled", element_id(array_id, index),
               "cancelled before it started" + (f" by {cmd.by}" if cmd.by else ""))
    array_maybe_done(state, array, cmd.at)
    return Result(True)


def fail_attempt(state: ClusterTables, cmd: c.FailAttempt) -> Result:
    """Fail the job's current attempt, as the leader decided (a time limit, a dependency never
    satisfied): a pending job only when `final`; a gang stops, and its job restarts unless `final`
    or out of restarts."""
    job = state.jobs.get(cmd.job_id)
    if job is None:
        return Result.not_found(f"unknown job {cmd.job_id}")
    if cmd.attempt != job.attempt or job.status.terminal:
        return Result.rejected(f"job {job.id} is {job.status.value} at attempt {job.attempt}, "
                               f"not at attempt {cmd.attempt}")
    if job.status is JobStatus.PENDING:
        if not cmd.final:
            return Result.rejected(f"job {job.id} is PENDING; only a final failure applies")
        if cmd.cause:  # e.g. DependencyNeverSatisfied (a version-2 job: see versions.KIND_VERSIONS)
            job.failure_cause, job.failure = cmd.cause, f"{cmd.cause}: {cmd.reason}"
        array = state.arrays.get(job.array_id) if job.array_id else None
        if array is not None and cmd.cause == dependencies.NEVER_SATISFIED:
            # Every element shares the dependency: the array ends with it, not one element a round.
            array.never_satisfied = True
            array.failed += array.remaining()
            array.next = array.count
        end_pending(state, job, JobStatus.FAILED, f"failed: {cmd.reason}", cmd.at)
        return Result(True)
    if cmd.final:
        job.final_failure = True
    stop_attempt(state, job, f"failed: {cmd.reason}", cmd.at, cause=cmd.cause,
                 failure=(f"{cmd.cause}: " if cmd.cause else "") + cmd.reason)
    maybe_end_attempt(state, job, cmd.at)
    return Result(True)
