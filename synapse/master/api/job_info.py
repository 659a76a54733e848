"""How a job shows in the API: a JobInfo of a job, or of an array as one job, with what the leader
knows beyond the log (why it waits, its pulls, its progress, what the scheduler expects of it)."""

from __future__ import annotations

import time

from synapse.core import goodput
from synapse.core.jobs import dependencies
from synapse.core.jobs.arrays import JobArray, format_ranges
from synapse.core.model import Job, JobStatus
from synapse.master.api.base import ServicerBase
from synapse.proto import api_pb2
from synapse.rpc import convert

#: How long a worker's report of a pull's progress stands on the leader (workers send one a second).
PULL_PROGRESS_TTL_S = 30.0


class JobViews(ServicerBase):
    """The JobInfo of jobs and arrays, as the users' RPCs answer them."""

    def _job_info(self, job: Job, explained: dict[int, tuple[str, ...]] | None = None) -> api_pb2.JobInfo:
        """The job as the API shows it (call under the master lock). `explained` caches the
        shortfalls of wait reasons across one call's jobs (gangs of one shape share a reason)."""
        view = self.m.leader_view()
        waiting = view.wait_reason(job.id) if view is not None and job.status is JobStatus.PENDING else None
        reservation = view.head_reservation() if view is not None else None
        shortfalls: tuple[str, ...] = ()
        if waiting is not None:
            explained = {} if explained is None else explained
            if id(waiting) not in explained:
                explained[id(waiting)] = tuple(map(str, waiting.shortfalls_in(self.m.state)))
            shortfalls = explained[id(waiting)]
        info = convert.job_to_info(
            job, waiting=waiting.message if waiting else "", waiting_code=waiting.code if waiting else "",
            shortfalls=shortfalls, env_shown=self._sees_env(job.user),
            reservation=reservation.describe(self.m.now()) if reservation and reservation.job_id == job.id else "")
        state = self.m.state
        if job.spec.image and job.status is JobStatus.SCHEDULED:
            now = time.monotonic()
            for node_id in sorted({t.node_id for t in job.tasks}):
                heard = self.m.pull_progress.get((job.id, job.attempt, node_id))
                if heard is not None and now - heard[3] < PULL_PROGRESS_TTL_S:
                    info.pulls.append(api_pb2.PullProgress(job_id=job.id, attempt=job.attempt, node_id=node_id,
                                                           phase=heard[0], done_bytes=heard[1], total_bytes=heard[2]))
        if not job.status.terminal:  # what the scheduler expects of its run (synapse.core.schedule.predict)
            elapsed = self.m.now() - job.started_at if job.started_at else 0.0
            info.prediction = state.run_times.predict(job.user, job.spec.name, job.spec.total.gpu,
                                                      job.spec.time_limit, elapsed).describe(
                job.user or "-", job.spec.name, job.spec.total.gpu)
        if view is not None and job.status is JobStatus.PENDING:  # the leader's alone (synapse.core.brain.rounds)
            estimate = view.estimates(state, self.m.now()).get(job.id)
            if estimate is not None:
                info.estimated_start = estimate.at or 0.0
                info.estimate_basis, info.estimate_detail, info.estimate_why = \
                    estimate.basis, estimate.detail, estimate.why
                info.estimate_ahead.extend(api_pb2.EstimateAhead(job_id=j, ends_at=at) for j, at in estimate.ahead)
            else:
                info.estimate_basis, info.estimate_why = "unknown", "not yet weighed by a round"
        if job.spec.after:
            info.dependencies.extend(convert.dependencies_to_proto(dependencies.resolve(state, job.spec.after)))
        info.goodput.CopyFrom(convert.goodput_to_proto(goodput.of_job(job, self.m.now())))
        heard = view.progress_of(job.id) if view is not None else None  # the leader's may be newer than the log's
        logged = job.progress
        convert.progress_to_info(info, heard if heard is not None and (logged is None or heard.at >= logged.at)
                                 else logged)
        array = state.arrays.get(job.array_id) if job.array_id else None
        if array is not None and array.rep == job.id:  # it stands for every never-placed element
            info.array_waiting = format_ranges(array.waiting_ranges())
        return info

    def _sees_env(self, owner: str) -> bool:
        """Whether the caller may see the env values of a job of `owner`'s: its owner and admins."""
        caller = self.caller()
        return caller.is_admin or caller.name == owner

    def _array_info(self, array: JobArray) -> api_pb2.JobInfo:
        """An array as one job (call under the master lock): its status, counts and waiting elements."""
        state = self.m.state
        running = sum(1 for j in state.array_live.get(array.id, ()) if state.jobs[j].status.has_gang)
        status = array.status(running > 0)
        view = Job(id=array.id, spec=array.spec, request_id=array.request_id, submitted_at=array.submitted_at,
                   seq=array.seq, status=status, user=array.user, finished_at=array.finished_at,
                   started_at=array.started_at, array_id=array.id)
        info = convert.job_to_info(view, env_shown=self._sees_env(array.user))
        info.array_index = -1
        info.array.CopyFrom(convert.array_counts_to_proto(array, running))
        info.array_waiting = format_ranges(array.waiting_ranges())
        leader = self.m.leader_view()  # the next element's wait is the array's: they share one spec
        waiting = leader.wait_reason(array.rep) if leader is not None and array.rep else None
        if waiting is not None:
            info.waiting, info.waiting_code = waiting.message, waiting.code
        if array.spec.after:
            info.dependencies.extend(convert.dependencies_to_proto(dependencies.resolve(state, array.spec.after)))
        return info
