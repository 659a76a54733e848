"""Submissions: one job (SubmitJob) or several in one request (SubmitJobs).

Both go one way: each job is decoded and checked as a lone submission is (its spec, its request id,
then under the master lock its queue, limits and dependencies, `synapse.core.submission`), and the
new jobs travel as one proposal, one log entry: a request of many costs one RPC, one Raft round and
one fsync. A request of several is all or nothing as far as the master can tell before it commits:
the first job refused refuses the request, and nothing is proposed. The commit re-checks each job
as apply re-checks a lone one; only a state that changed in between (another submission that filled
a per-user limit, a queue deleted) can refuse one there, and then the status names it and the jobs
that were submitted, whose request ids a retry gets back.
"""

from __future__ import annotations

import dataclasses
import logging

import grpc

from synapse.core import codec, submission
from synapse.core import commands as c
from synapse.core.jobs.jobspec import JobFileError, check_secret_value, check_spec, notice_capped
from synapse.core.model import DEFAULT_QUEUE, JobSpec, Queue
from synapse.master.access import Identity
from synapse.master.api.base import MAX_ID_CHARS, Context, ServicerBase
from synapse.proto import api_pb2

log = logging.getLogger(__name__)

#: Most jobs one SubmitJobs request carries: its specs stay well inside gRPC's 4 MiB message cap.
MAX_JOBS_PER_REQUEST = 1000

#: How a submission refused by the rules of `synapse.core.submission` is answered.
_REFUSED_CODES = {submission.Refused.DENIED: (grpc.StatusCode.PERMISSION_DENIED, "permission denied"),
                  submission.Refused.LIMIT: (grpc.StatusCode.RESOURCE_EXHAUSTED, "limit reached"),
                  submission.Refused.INVALID: (grpc.StatusCode.INVALID_ARGUMENT, "invalid job")}


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """A submission refused before anything was proposed: the status code and its message."""

    code: grpc.StatusCode
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class Admitted:
    """A submission that passed its checks: the command to propose, or None for a retry of a
    request id that already made `job_id`; and what the job is accepted with but not as asked."""

    command: c.SubmitJob | None
    job_id: str
    warnings: tuple[str, ...]


class SubmitApi(ServicerBase):
    """SubmitJob and SubmitJobs."""

    async def SubmitJob(self, request: api_pb2.SubmitJobRequest, context: Context) -> api_pb2.SubmitJobReply:
        [reply] = await self._submit([request], context, several=False)
        return reply

    async def SubmitJobs(self, request: api_pb2.SubmitJobsRequest, context: Context) -> api_pb2.SubmitJobsReply:
        if not request.jobs or len(request.jobs) > MAX_JOBS_PER_REQUEST:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"jobs: give 1 to {MAX_JOBS_PER_REQUEST} jobs, not {len(request.jobs)}")
        ids = [job.request_id for job in request.jobs if job.request_id]
        if len(set(ids)) < len(ids):
            again = next(rid for k, rid in enumerate(ids) if rid in ids[:k])
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"jobs: request id {again[:MAX_ID_CHARS]} is given twice: each job needs its own")
        return api_pb2.SubmitJobsReply(jobs=await self._submit(list(request.jobs), context, several=True))

    async def _submit(self, requests: list[api_pb2.SubmitJobRequest], context: Context,
                      several: bool) -> list[api_pb2.SubmitJobReply]:
        """Check every submission, abort at the first refused, propose the new jobs in one log
        entry; one reply per request. `several`: refusals name the job ("job K of N (name): ...")."""
        specs: list[JobSpec] = []
        for k, request in enumerate(requests):
            refused = self._spec_refusal(request)
            if isinstance(refused, Refusal):
                await context.abort(refused.code, self._which(k, requests, request.spec.name, several)
                                    + refused.message)
            specs.append(refused)
        await self._leader(context)
        caller = self.caller()
        admitted: list[Admitted | Refusal] = []
        earlier: dict[str, int] = {}  #: per queue, the jobs this request adds ahead of the next one
        taken: set[str] = set()  #: the job ids drawn for this request
        with self.m.lock:
            for request, spec in zip(requests, specs, strict=True):
                admitted.append(self._admit(request, spec, caller, earlier, taken))
        for k, outcome in enumerate(admitted):
            if isinstance(outcome, Refusal):
                await context.abort(outcome.code, self._which(k, requests, specs[k].name, several) + outcome.message)
        new = [(k, a.command) for k, a in enumerate(admitted) if isinstance(a, Admitted) and a.command is not None]
        results = await self._propose_all([cmd for _, cmd in new], context)
        job_ids = [a.job_id for a in admitted if isinstance(a, Admitted)]
        refused_at = []
        for (k, cmd), result in zip(new, results, strict=True):
            if result.ok:
                job_ids[k] = str(result.value)
                # DEBUG, not INFO: a log record per submission was a twentieth of the leader's CPU per
                # submission (format, write, flush), and the replicated JobSubmitted event (`synctl
                # events`, the history) already records each one with its user.
                log.debug("job submitted job=%s request=%s tasks=%d user=%s", result.value, cmd.request_id,
                          cmd.spec.tasks, cmd.by)
            else:
                refused_at.append((k, result))
        if refused_at:
            k, result = refused_at[0]
            submitted = [job_ids[j] for j in range(len(requests)) if j not in dict(refused_at)]
            message = self._which(k, requests, specs[k].name, several) + result.error
            if submitted:
                message += (f"; committed meanwhile, the others were submitted ({', '.join(submitted)}): a retry "
                            "with the same request ids gets them and submits the rest")
            await self._ok_or_abort(dataclasses.replace(result, error=message), context,
                                    grpc.StatusCode.INVALID_ARGUMENT)
        return [api_pb2.SubmitJobReply(job_id=job_id, warnings=a.warnings)
                for job_id, a in zip(job_ids, admitted, strict=True) if isinstance(a, Admitted)]

    @staticmethod
    def _which(k: int, requests: list[api_pb2.SubmitJobRequest], name: str, several: bool) -> str:
        """The start of a refusal's message that names the job, in a request of several."""
        return f"job {k + 1} of {len(requests)} ({name[:MAX_ID_CHARS] or '-'}): " if several else ""

    def _spec_refusal(self, request: api_pb2.SubmitJobRequest) -> JobSpec | Refusal:
        """The request's spec, its secrets sealed, if the spec and the request id are well formed
        (no state needed); else the refusal."""
        try:
            spec = codec.job_spec_from_proto(request.spec, default_queue=DEFAULT_QUEUE)
            if spec.secrets:  # sealed by a master alone: a client's sealed bytes could be another job's
                raise JobFileError("spec.secrets", "must be empty: send the values in the request's secrets")
            if request.secrets:  # only then: replacing the spec was 7 of this step's 19 µs
                for name, value in request.secrets.items():
                    check_secret_value(name, value)
                # Sealed here, before the proposal, with this master's random nonces: apply only copies.
                spec = dataclasses.replace(spec, secrets=tuple(self._seal.seal(name, value)
                                                               for name, value in sorted(request.secrets.items())))
            check_spec(spec, self.m.config.topology_levels, self.m.config.max_array_size)
        except (JobFileError, codec.CodecError) as exc:
            return Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"invalid job: {exc}")
        if len(request.request_id) > MAX_ID_CHARS:
            return Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"request_id: at most {MAX_ID_CHARS} characters")
        return spec

    def _admit(self, request: api_pb2.SubmitJobRequest, spec: JobSpec, caller: Identity, earlier: dict[str, int],
               taken: set[str]) -> Admitted | Refusal:
        """The command that submits `spec`, a retry's job, or the refusal, by the rules against the
        state as it stands (call under the master lock). `earlier`: per queue, the jobs the request
        adds before this one, which its per-user limit counts (updated here); `taken`: job ids
        drawn for the request so far (updated here)."""
        state = self.m.state
        queue = state.queues.get(spec.queue)
        if spec.interactive and not spec.time_limit:  # a session runs at most its queue's maximum
            spec = dataclasses.replace(spec, time_limit=(queue or Queue(spec.queue)).interactive_max_duration)
        conflict = state.request_conflict(request.request_id, spec)
        if conflict:
            return Refusal(grpc.StatusCode.ALREADY_EXISTS, conflict)
        # The spec keeps the notice asked for: a queue given a larger max_grace later gives all of it.
        warnings = tuple(w for w in (notice_capped(spec, queue),) if w)
        existing = state.job_by_request.get(request.request_id) if request.request_id else None
        if existing:
            return Admitted(None, existing, warnings)
        queue_name = spec.queue or DEFAULT_QUEUE
        refused = submission.refusal(state, spec, submission.Submitter(caller.name, caller.groups, caller.is_admin),
                                     earlier=earlier.get(queue_name, 0))
        if refused is not None:
            code, what = _REFUSED_CODES[refused.kind]
            return Refusal(code, f"{what}: {refused.reason}")
        earlier[queue_name] = earlier.get(queue_name, 0) + submission.elements(spec)
        job_id = self.m.new_job_id(spec.name)
        # 32 random bits: a job of the same name already holding them (one in 43,000 among 100,000
        # retained jobs of one name; bench/ha.py met one), or another of this request, would refuse
        # this one at apply: "job id ... already exists" for a submission that did nothing wrong.
        while job_id in taken or job_id in state.jobs:
            job_id = self.m.new_job_id(spec.name)
        taken.add(job_id)
        kind = c.submit_kind(spec, request.hold)
        held = {"held": True} if request.hold else {}
        return Admitted(kind(at=self.m.now(), by=caller.name, job_id=job_id, request_id=request.request_id, spec=spec,
                             **held), job_id, warnings)
