"""The users' RPCs about their jobs once submitted (`submit` submits them): read, list, cancel, hold
and release, update (an array's throttle; a job's priority, time limit or queue), requeue, get
tickets to read task logs, and ask what preemption would do for a pending job."""

from __future__ import annotations

import logging

import grpc

from synapse.common import tickets
from synapse.core import commands as c
from synapse.core.jobs import dependencies
from synapse.core.jobs.arrays import split_element_id
from synapse.core.model import Job, JobStatus
from synapse.core.state.job_controls import update_denial, update_problem
from synapse.core.steps import step_ids
from synapse.master.api.base import MAX_ID_CHARS, Context
from synapse.master.api.job_info import JobViews
from synapse.proto import api_pb2
from synapse.rpc import convert

log = logging.getLogger(__name__)

#: ListJobs page sizes: a page of full JobInfos stays well inside the 4 MiB message cap.
DEFAULT_PAGE = 500
MAX_PAGE = 5000


class JobsApi(JobViews):
    """GetJob, ListJobs, CancelJob, SetJobHold, UpdateJob, RequeueJob, LogAccess, PreemptWhatIf."""

    async def GetJob(self, request: api_pb2.GetJobRequest, context: Context) -> api_pb2.JobInfo:
        await self._check_id(request.job_id, "job_id", context)
        if request.applied:
            await self._leader(context)
        else:
            await self._current_read(context)
        with self.m.lock:
            job = self.m.state.jobs.get(request.job_id)
            if job is None and request.job_id in self.m.state.arrays:
                return self._array_info(self.m.state.arrays[request.job_id])
            status = dependencies.upstream_status(self.m.state, request.job_id) if job is None else ""
            element = split_element_id(request.job_id) if job is None and status else None
            if element is not None and request.job_id not in self.m.state.finished:
                # an element not yet a job: shown as the job it will be
                array_id, index = element
                array = self.m.state.arrays[array_id]
                return convert.job_to_info(Job(id=request.job_id, spec=array.spec, request_id="",
                                               submitted_at=array.submitted_at, seq=array.seq,
                                               status=JobStatus(status), user=array.user, array_id=array_id,
                                               array_index=index), env_shown=self._sees_env(array.user))
            if job is None:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown job {request.job_id}"
                                    + (f" (forgotten after it ended {status})" if status else ""))
            return self._job_info(job)

    async def ListJobs(self, request: api_pb2.ListJobsRequest, context: Context) -> api_pb2.ListJobsReply:
        if request.limit < 0 or request.limit > MAX_PAGE:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit: between 1 and {MAX_PAGE}")
        limit = request.limit or DEFAULT_PAGE
        if len(request.user) > MAX_ID_CHARS or len(request.alloc_id) > MAX_ID_CHARS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"user, alloc_id: at most {MAX_ID_CHARS} characters")
        await self._current_read(context)
        wanted = set(request.status)
        with self.m.lock:
            jobs = self.m.state.jobs
            after = jobs.get(request.after) if request.after else None
            if request.after and after is None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"after: unknown job {request.after}")
            # Jobs are kept in submission order (dicts keep insertion order; seq grows with it).
            page: list[Job] = []
            more = False
            alloc = jobs.get(request.alloc_id) if request.alloc_id else None
            listed = jobs.values() if not request.alloc_id else \
                [jobs[i] for i in (step_ids(alloc) if alloc is not None else ()) if i in jobs]
            for job in listed:
                if after is not None and job.seq <= after.seq:
                    continue
                if wanted and job.status.value not in wanted:
                    continue
                if request.user and job.user != request.user:
                    continue
                if len(page) == limit:
                    more = True
                    break
                page.append(job)
            infos: list[api_pb2.JobInfo] = []
            explained: dict[int, tuple[str, ...]] = {}
            for job in page:
                info = self._job_info(job, explained)
                del info.events[:]
                infos.append(info)
            return api_pb2.ListJobsReply(jobs=infos, next=page[-1].id if more and page else "")

    def _owner(self, job_id: str) -> str | None:
        """Who owns a job, an array or an array's element (call under the master lock); None if unknown."""
        state = self.m.state
        job = state.jobs.get(job_id)
        if job is not None:
            return job.user
        element = split_element_id(job_id)
        array = state.arrays.get(job_id) or (state.arrays.get(element[0]) if element else None)
        if array is None or (job_id != array.id and element is not None and array.position_of(element[1]) < 0):
            return None
        return array.user

    async def CancelJob(self, request: api_pb2.CancelJobRequest, context: Context) -> api_pb2.CancelJobReply:
        await self._check_id(request.job_id, "job_id", context)
        await self._leader(context)
        caller = self.caller()
        with self.m.lock:
            found = self._owner(request.job_id)
            owner = found or ""
        if found is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown job {request.job_id}")
        if not caller.is_admin and owner != caller.name:
            log.info("permission denied method=CancelJob user=%s job=%s owner=%s", caller.name, request.job_id, owner)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"permission denied: user {caller.name} may not cancel job {request.job_id}: it "
                                f"belongs to {owner or 'no user'}; only its owner or an admin may cancel it")
        # The owner never changes, so the check above still holds when the command applies.
        result = await self._propose(c.CancelJob(at=self.m.now(), by=caller.name, job_id=request.job_id,
                                                 reason=request.reason[:512]), context)
        await self._ok_or_abort(result, context)
        with self.m.lock:
            status = dependencies.upstream_status(self.m.state, request.job_id)
            if request.job_id in self.m.state.arrays and status == JobStatus.RUNNING.value:
                status = JobStatus.STOPPING.value  # a cancelled array's running elements are stopping
        return api_pb2.CancelJobReply(status=status)

    async def _owned_by_caller(self, job_id: str, verb: str, context: Context) -> str:
        """The caller's name once it is known to own `job_id` or to be an admin (else the call aborts)."""
        await self._check_id(job_id, "job_id", context)
        await self._leader(context)
        caller = self.caller()
        with self.m.lock:
            found = self._owner(job_id)
        if found is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown job {job_id}")
        if not caller.is_admin and found != caller.name:
            log.info("permission denied verb=%s user=%s job=%s owner=%s", verb, caller.name, job_id, found)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"permission denied: user {caller.name} may not {verb} job {job_id}: it belongs to "
                                f"{found or 'no user'}; only its owner or an admin may")
        return caller.name

    async def SetJobHold(self, request: api_pb2.SetJobHoldRequest, context: Context) -> api_pb2.SetJobHoldReply:
        """Hold a pending job back from the queue, or release it: its owner or an admin (apply re-checks)."""
        verb = "hold" if request.held else "release"
        by = await self._owned_by_caller(request.job_id, verb, context)
        kind = c.HoldJob if request.held else c.ReleaseJob
        result = await self._propose(kind(at=self.m.now(), by=by, job_id=request.job_id), context)
        await self._ok_or_abort(result, context)
        return api_pb2.SetJobHoldReply(message=f"job {request.job_id} {result.value}")

    async def RequeueJob(self, request: api_pb2.RequeueJobRequest, context: Context) -> api_pb2.RequeueJobReply:
        """Stop a placed job's attempt and queue it again, uncharged: its owner or an admin."""
        by = await self._owned_by_caller(request.job_id, "requeue", context)
        with self.m.lock:
            job = self.m.state.jobs.get(request.job_id)
            attempt = job.attempt if job is not None else 0
        result = await self._propose(c.RequeueJob(at=self.m.now(), by=by, job_id=request.job_id, attempt=attempt,
                                                  reason=request.reason[:512]), context)
        await self._ok_or_abort(result, context)
        return api_pb2.RequeueJobReply(message=f"job {request.job_id}: {result.value}")

    async def _update_job(self, request: api_pb2.UpdateJobRequest, context: Context) -> api_pb2.UpdateJobReply:
        """A job's priority, time limit or queue: its owner lowers and shortens, an admin may also raise
        and lengthen, and a new queue's rules must take the job (apply re-checks all of it)."""
        if request.HasField("time_limit_s") and request.time_limit_s < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "time_limit: must not be negative (0: no limit)")
        if request.HasField("queue") and len(request.queue) > MAX_ID_CHARS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"queue: at most {MAX_ID_CHARS} characters")
        by = await self._owned_by_caller(request.job_id, "update", context)
        cmd = c.UpdateJob(at=self.m.now(), by=by, job_id=request.job_id,
                          priority=request.priority if request.HasField("priority") else None,
                          time_limit=request.time_limit_s if request.HasField("time_limit_s") else None,
                          queue=request.queue if request.HasField("queue") else None)
        with self.m.lock:
            job = self.m.state.jobs.get(request.job_id)
            denied = update_denial(self.m.state, job, cmd) if job is not None else ""
            problem = update_problem(self.m.state, job, cmd) if job is not None else ""
        if denied:  # answered here with the code it deserves; apply would refuse it alike
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"permission denied: job {request.job_id}: {denied}")
        if problem:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"job {request.job_id}: {problem}")
        result = await self._propose(cmd, context)
        await self._ok_or_abort(result, context)
        return api_pb2.UpdateJobReply(message=f"job {request.job_id}: {result.value}")

    async def UpdateJob(self, request: api_pb2.UpdateJobRequest, context: Context) -> api_pb2.UpdateJobReply:
        """Change an array's throttle, or (with priority, time limit or queue) a job: its owner or an admin."""
        if request.HasField("priority") or request.HasField("time_limit_s") or request.HasField("queue"):
            return await self._update_job(request, context)
        await self._check_id(request.job_id, "job_id", context)
        if request.throttle < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "throttle: 0 (no limit) or more")
        await self._leader(context)
        caller = self.caller()
        with self.m.lock:
            array = self.m.state.arrays.get(request.job_id)
            owner = array.user if array is not None else ""
        if array is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown array {request.job_id} (only an array's "
                                                           "throttle can be changed)")
        if not caller.is_admin and owner != caller.name:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"permission denied: user {caller.name} may not update job {request.job_id}: it "
                                f"belongs to {owner or 'no user'}")
        result = await self._propose(c.SetArrayThrottle(at=self.m.now(), by=caller.name, job_id=request.job_id,
                                                        throttle=request.throttle), context)
        await self._ok_or_abort(result, context)
        return api_pb2.UpdateJobReply(message=f"array {request.job_id}: "
                                              + (f"at most {request.throttle} element(s) running"
                                                 if request.throttle else "no limit on running elements"))

    async def LogAccess(self, request: api_pb2.LogAccessRequest, context: Context) -> api_pb2.LogAccessReply:
        """Tickets to read a job's task logs from its workers: for its owner and for admins."""
        await self._check_id(request.job_id, "job_id", context)
        await self._current_read(context)
        caller = self.caller()
        with self.m.lock:
            state = self.m.state
            job = state.jobs.get(request.job_id)
            if job is None:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown job {request.job_id}")
            attempt = request.attempt or max(job.placements, default=0)
            nodes = job.placements.get(attempt)
            addresses = {n: state.nodes[n].address if n in state.nodes else "" for n in nodes or ()}
            owner, status = job.user, job.status.value
        if not caller.is_admin and owner != caller.name:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"permission denied: user {caller.name} may not read the logs of job {request.job_id}:"
                                f" it belongs to {owner or 'no user'}; only its owner or an admin may")
        if not nodes:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"job {request.job_id} has no attempt {attempt} that ran (attempts that ran: "
                                f"{sorted(job.placements)})" if attempt else
                                f"job {request.job_id} has not run yet ({status})")
        expires = self.m.now() + tickets.TICKET_TTL_S
        return api_pb2.LogAccessReply(attempt=attempt, expires_at=expires, tickets=[
            api_pb2.LogTicket(index=i, node_id=node, address=addresses[node],
                              ticket=tickets.sign(self.m.node_credential(node), request.job_id, attempt, i, expires))
            for i, node in enumerate(nodes)])

    async def PreemptWhatIf(self, request: api_pb2.PreemptWhatIfRequest,
                            context: Context) -> api_pb2.PreemptWhatIfReply:
        """What the leader's preemption step would do for a pending job now (its own function, rules
        and last round: LeaderState.what_if); commits nothing."""
        await self._check_id(request.job_id, "job_id", context)
        await self._current_read(context)
        view = self.m.leader_view()
        if view is None:  # it led for the read, and stepped down since
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"replica {self.m.replica.id} no longer leads; retry")
        with self.m.lock:
            job = self.m.state.jobs.get(request.job_id)
            if job is None:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown job {request.job_id}")
            if job.status is not JobStatus.PENDING:
                return api_pb2.PreemptWhatIfReply(explanation=f"job {job.id} is {job.status.value}, not PENDING")
            hold = self.m.state.holds.get(job.id)
            if hold is not None:
                return api_pb2.PreemptWhatIfReply(
                    explanation=f"job {job.id} already preempted {', '.join(hold.victims)} (rule {hold.rule}) and "
                                f"holds {', '.join(hold.nodes)}")
            found = view.what_if(self.m.state, job, self.m.now())
        if isinstance(found, str):
            return api_pb2.PreemptWhatIfReply(explanation=found)
        cmd = found.command
        return api_pb2.PreemptWhatIfReply(possible=True, rule=cmd.rule, victims=[v.job_id for v in cmd.victims],
                                          nodes=list(cmd.nodes), explanation=cmd.explanation,
                                          lost_gpu_seconds=found.lost_gpu_seconds)
