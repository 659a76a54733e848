"""The array table: job arrays (the JobArray record is synapse.core.jobs.arrays'), their elements that are
jobs, and how an element's end makes the next one a job.

State: `arrays`, `array_live`. Command: SetArrayThrottle; a SubmitWorkflowJob with an array lands
in `submit_array`; cancels of arrays and elements are synapse.core.state.jobs'.
"""

from __future__ import annotations

from synapse.core import commands as c
from synapse.core.commands import Result
from synapse.core.jobs.arrays import JobArray, element_id
from synapse.core.model import Event, Job, JobStatus
from synapse.core.state.events import JOB_REASONS
from synapse.core.state.tables import ClusterTables


def submit_array(state: ClusterTables, cmd: c.SubmitJob) -> Result:
    """One record for the whole array; its first element becomes a job at once (see arrays.py)."""
    state.job_seq += 1
    array = JobArray(id=cmd.job_id, spec=cmd.spec, request_id=cmd.request_id, user=cmd.by,
                     submitted_at=cmd.at, seq=state.job_seq, throttle=cmd.spec.array_throttle)
    state.arrays[array.id] = array
    state.array_live[array.id] = set()
    if cmd.request_id:
        state.job_by_request[cmd.request_id] = array.id
    state.emit(cmd.at, "Normal", "job", "JobSubmitted", array.id,
               (f"by {cmd.by}: " if cmd.by else "") + f"array of {array.count} element(s) "
               f"[{cmd.spec.array}]" + (f", at most {array.throttle} running" if array.throttle else "")
               + f", {cmd.spec.tasks} task(s) each")
    next_element(state, array, cmd.at)
    return Result(True, value=array.id)


def next_element(state: ClusterTables, array: JobArray, at: float) -> None:
    """Make the array's next index a job (pending), if none is queued unplaced and indices remain."""
    if array.rep or array.cancelled:
        return
    while array.next < array.count:
        index = array.index_at(array.next)
        array.next += 1
        if index in array.skipped:
            continue
        state.job_seq += 1
        job = Job(id=element_id(array.id, index), spec=array.spec, request_id="", submitted_at=array.submitted_at,
                  seq=state.job_seq, user=array.user, pending_since=at, array_id=array.id, array_index=index)
        state.jobs[job.id] = job
        state.array_live[array.id].add(job.id)
        array.rep = job.id
        state.pending.add((job.queue_key(), job.id))
        job.events.append(Event(at, "Submitted", f"element {index} of array {array.id}"))
        return


def element_ended(state: ClusterTables, job: Job, at: float) -> None:
    """Count an element's end in its array; queue the next element if this one was never placed."""
    array = state.arrays.get(job.array_id)
    if array is None:
        return
    state.array_live.get(array.id, set()).discard(job.id)
    if job.status is JobStatus.SUCCEEDED:
        array.succeeded += 1
    elif job.status is JobStatus.FAILED:
        array.failed += 1
    else:
        array.cancelled_count += 1
    if array.rep == job.id:
        array.rep = ""
        next_element(state, array, at)
    array_maybe_done(state, array, at)


def array_maybe_done(state: ClusterTables, array: JobArray, at: float) -> None:
    """Once every element of the array has ended, record when and make its final cluster event (once)."""
    if array.done and not array.finished_at:
        array.finished_at = at
        status = array.status(False)
        state.emit(at, "Normal" if status is JobStatus.SUCCEEDED else "Warning", "job",
                   JOB_REASONS[status.value.capitalize()][0], array.id,
                   f"array: {array.succeeded} succeeded, {array.failed} failed, {array.cancelled_count} cancelled")


def set_array_throttle(state: ClusterTables, cmd: c.SetArrayThrottle) -> Result:
    """How many elements of an array may run at once (0: no limit); refused once the array has ended."""
    array = state.arrays.get(cmd.job_id)
    if array is None:
        return Result.not_found(f"unknown array {cmd.job_id}")
    if cmd.throttle < 0:
        return Result.rejected("throttle must not be negative (0: no limit)")
    if array.done:
        return Result.rejected(f"array {array.id} has ended")
    array.throttle = cmd.throttle
    state.emit(cmd.at, "Normal", "job", "ArrayThrottled", array.id,
               (f"at most {cmd.throttle} element(s) running" if cmd.throttle else "no limit on running elements")
               + (f" (by {cmd.by})" if cmd.by else ""))
    return Result(True, value=str(cmd.throttle))
