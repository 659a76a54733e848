"""The gRPC API of a master replica: convert, call the domain, map errors to status codes.

Writes, and reads that must be current, are served by the leader only. A follower answers
FAILED_PRECONDITION with the trailing metadata `synapse-leader: <api address>`; a replica that
knows no leader waits up to LEADER_WAIT_S for one, then answers UNAVAILABLE (at once if it has
just stepped down: it is probably cut off from its peers). A leader answers a
current read only after committing a Barrier, which a deposed leader cannot do, so it never serves
state older than the last acknowledged write.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import math
import re
import secrets
import time

import grpc

from synapse.common import tickets
from synapse.common.auth import (
    LEADER_METADATA_KEY,
    METADATA_KEY,
    NODE_CREDENTIAL_KEY,
    NODE_ID_KEY,
    REPLICA_CREDENTIAL_KEY,
)
from synapse.common.tls import peer_common_name
from synapse.core import codec, dependencies, goodput, versions
from synapse.core import commands as c
from synapse.core.arrays import format_ranges, split_element_id
from synapse.core.brain.stimuli import ProgressReport
from synapse.core.identity import groups_problem, user_name_problem
from synapse.core.jobspec import JobFileError, check_secret_value, check_spec, notice_capped
from synapse.core.model import DEFAULT_QUEUE, Job, JobStatus, NodeStatus, Queue, Resources, Role, image_holders
from synapse.core.queues import batch_problem
from synapse.core.schedule import elastic, fairshare
from synapse.core.schedule.placement import ClusterView
from synapse.master import history_api
from synapse.master.access import (
    ACCESS,
    CALLER,
    Identity,
    denial,
    identify,
    new_join_token,
    new_token,
    token_hash,
    token_key,
)
from synapse.master.cipher import SecretSeal
from synapse.master.dispatch import assignments_for_node
from synapse.master.metrics import Metrics
from synapse.master.raft import ProposeError
from synapse.master.replica import LEADER_WAIT_S, Master
from synapse.proto import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

#: After stepping down, a replica with no known leader sends clients away at once for this long.
DEPOSED_S = 3.0

#: Bounds on what a node may announce.
MAX_TOPOLOGY_LABELS = 8
MAX_LABEL_CHARS = 63
MAX_NODE_GPUS = 1024
#: Node labels a worker may register (gpu_model, gpu_product, gpu_memory today), and how they look.
MAX_NODE_LABELS = 16
_LABEL_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
MAX_ISOLATION_CHARS = 512
#: ListJobs page sizes: a page of full JobInfos stays well inside the 4 MiB message cap.
DEFAULT_PAGE = 500
MAX_PAGE = 5000
#: A watch stream re-sends the current assignments at least this often (a keepalive that also
#: lets the worker notice a silent leader change).
WATCH_REFRESH_S = 5.0
MAX_ID_CHARS = 256
#: How long a worker's report of a pull's progress stands on the leader (workers send one a second).
PULL_PROGRESS_TTL_S = 30.0
#: How long a worker's listing of its image store stands on the leader (workers send one every 10 s).
NODE_IMAGES_TTL_S = 60.0
#: The most image references a worker's listing keeps.
MAX_LISTED_IMAGES = 256
#: The longest a join token may live (0 = never expires is allowed too, for an admin who says so).
MAX_JOIN_TOKEN_TTL_S = 366 * 86400.0
#: Writes are refused when the data dir's disk is short of room, as checked at most this long ago.
DISK_CHECK_S = 0.1


class MasterServicer(api_pb2_grpc.MasterServicer):
    def __init__(self, master: Master, metrics: Metrics | None = None) -> None:
        self.m = master
        self.metrics = metrics
        self._token_key = token_key(master.config.raft_password)
        self._seal = SecretSeal(master.config.raft_password)  #: seals submissions' secrets; opens them for listings
        self._disk_room = True  #: the last answer of Master.disk_has_room (see _disk_has_room)
        self._disk_checked_at = float("-inf")  #: monotonic time of that answer
        self._request_counters: dict[tuple[str, str], object] = {}  #: (method, code) -> its requests counter

    def count(self, method: str, context: grpc.aio.ServicerContext, failed: bool) -> None:
        """Count a finished call by method and status code; a redirect to the leader apart."""
        if self.metrics is None:
            return
        code = context.code() if failed else grpc.StatusCode.OK
        name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
        counter = self._request_counters.get((method, name))
        if counter is None:  # a label lookup per call was a measurable part of a submission's CPU
            counter = self._request_counters[(method, name)] = self.metrics.requests.labels(method, name)
        counter.inc()
        if code == grpc.StatusCode.FAILED_PRECONDITION and any(
                k == LEADER_METADATA_KEY for k, _ in (context.trailing_metadata() or ())):
            self.metrics.redirects.labels(method).inc()

    # ---- identities ----------------------------------------------------------------------------

    def _known(self, token: str, common_name: str, node: tuple[str, str] = ("", ""),
               replica: str = "") -> Identity | None:
        return identify(self.m, self._token_key, token, common_name, *node, replica_credential=replica)

    async def authenticate(self, method: str, context: grpc.aio.ServicerContext) -> Identity:
        """The caller, or abort: UNAUTHENTICATED for unknown credentials, PERMISSION_DENIED when
        the caller's role does not allow `method`.

        Only a ready leader says UNAUTHENTICATED to a token it does not know: a follower (or a new
        leader still catching up) may not have applied the user's creation yet, so it redirects to
        the leader or asks the client to retry, and a valid user is never turned away by a lag.
        """
        metadata = dict(context.invocation_metadata() or ())
        presented = str(metadata.get(METADATA_KEY, ""))
        token = presented[7:] if presented.startswith("Bearer ") else ""
        if presented and not token:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "authorization metadata must be 'Bearer <token>'")
        common_name = peer_common_name(context) if self.m.config.user_certs else ""
        node = (str(metadata.get(NODE_ID_KEY, "")), str(metadata.get(NODE_CREDENTIAL_KEY, "")))
        replica = str(metadata.get(REPLICA_CREDENTIAL_KEY, ""))
        caller = self._known(token, common_name, node, replica)
        if caller is None and (token or common_name) and not self.m.ready_leader_term():
            await self._leader(context)  # redirects, or returns once this replica leads
            caller = self._known(token, common_name, node, replica)
        if caller is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "unknown token" if token else
                                f"not a valid credential for node {node[0][:MAX_ID_CHARS]} in this cluster" if all(node)
                                else "missing credentials: give a token (--token or SYNAPSE_TOKEN)")
        why = denial(method, caller)
        if why:
            log.info("permission denied method=%s user=%s", method, caller.name)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"permission denied: {why}")
        return caller

    @staticmethod
    def caller() -> Identity:
        """The authenticated caller of the RPC being served."""
        return CALLER.get()

    # ---- helpers -------------------------------------------------------------------------------

    async def _leader(self, context: grpc.aio.ServicerContext) -> int:
        """This replica's term if it leads and is ready; otherwise abort with a redirect or UNAVAILABLE."""
        deadline = time.monotonic() + LEADER_WAIT_S
        while True:
            term = self.m.ready_leader_term()
            if term and not self.m.stopping:
                return term
            leader_api = self.m.leader_api_address()
            if leader_api and leader_api != self.m.replica.api:
                context.set_trailing_metadata(((LEADER_METADATA_KEY, leader_api),))
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                    f"replica {self.m.replica.id} is not the leader; the leader is at {leader_api}")
            if self.m.stopping:
                await self._abort_stopping(context)
            if time.monotonic() - self.m.deposed_at < DEPOSED_S:
                # It just stopped leading and knows no successor: most likely it is cut off from
                # its peers (a follower of a live leader would know it at once). Waiting is useless.
                await context.abort(grpc.StatusCode.UNAVAILABLE,
                                    f"replica {self.m.replica.id} stepped down and knows no leader; try another")
            if time.monotonic() > deadline:
                await context.abort(grpc.StatusCode.UNAVAILABLE,
                                    f"replica {self.m.replica.id}: no leader elected within {LEADER_WAIT_S:.1f}s")
            await asyncio.sleep(0.02)

    async def _propose(self, cmd: c.Command, context: grpc.aio.ServicerContext) -> c.Result:
        return (await self._propose_all([cmd], context))[0]

    async def _propose_all(self, cmds: list[c.Command], context: grpc.aio.ServicerContext) -> list[c.Result]:
        """Propose commands as one log entry (all commit or none does); if that fails, abort the call.
        A request makes at most one proposal (tests/test_one_proposal.py), so a leader change can
        never leave it half done."""
        if not cmds:
            return []
        if not all(isinstance(cmd, c.Barrier) for cmd in cmds) and not self._disk_has_room():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"replica {self.m.replica.id}: less than {self.m.config.min_free_disk} bytes free "
                                "under its data dir; writes are refused until there is room")
        try:
            return await self.m.propose_all(cmds)
        except ProposeError as exc:
            await self._abort_proposal(exc, context)
            raise  # _abort_proposal always aborts

    def _disk_has_room(self) -> bool:
        """Master.disk_has_room, asked at most every DISK_CHECK_S: a statvfs per proposal was a
        measurable part of a submission's CPU, and free space does not move faster than that."""
        now = time.monotonic()
        if now - self._disk_checked_at >= DISK_CHECK_S:
            self._disk_room, self._disk_checked_at = self.m.disk_has_room(), now
        return self._disk_room

    async def _abort_proposal(self, exc: ProposeError, context: grpc.aio.ServicerContext) -> None:
        if exc.maybe_applied:
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"outcome unknown ({exc.kind}) during a leader change; "
                                "retry with the same request id")
        if exc.kind == "QUEUE_FULL":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "the command queue is full; retry later")
        if exc.kind == "CLUSTER_VERSION":
            behind = ", ".join(f"{self._replica_of_raft(raft)} ({f'version {v}' if v else 'not heard from'})"
                               for raft, v in exc.behind)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"not proposed (CLUSTER_VERSION): this command needs command-set version {exc.needed} "
                                f"on every replica, and these are behind: {behind}; upgrade them (one at a time), "
                                "then retry")
        if exc.leader and exc.leader != self.m.replica.raft:  # never send a client back here
            leader_api = self.m.api_of_raft(exc.leader)
            if leader_api:
                context.set_trailing_metadata(((LEADER_METADATA_KEY, leader_api),))
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"not committed ({exc.kind}); retry")

    def _replica_of_raft(self, raft_address: str) -> str:
        """A replica's id from its Raft address (the address itself if no directory names it)."""
        known = {r.raft: r.id for r in self.m.config.replicas}
        with self.m.lock:
            known.update({raft: replica_id for replica_id, (raft, _api) in self.m.state.replicas.items()})
        return known.get(raft_address, raft_address)

    async def _abort_stopping(self, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"replica {self.m.replica.id} is stopping; try another")

    async def _current_read(self, context: grpc.aio.ServicerContext) -> None:
        term = await self._leader(context)
        await self._propose(c.Barrier(at=self.m.now(), term=term, reason="read"), context)

    async def _worker_identity(self, node_id: str, context: grpc.aio.ServicerContext) -> None:
        """A worker call must come from that node: its credential, and its certificate under mTLS."""
        await self._check_id(node_id, "node_id", context)
        caller = self.caller()
        if caller.node and caller.node != node_id:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"permission denied: {caller.name} acts only for node {caller.node}, not {node_id}")
        presented = dict(context.invocation_metadata() or ()).get(NODE_CREDENTIAL_KEY, "")
        if not hmac.compare_digest(str(presented).encode(), self.m.node_credential(node_id).encode()):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"no valid credential for node {node_id}: register first, and act only for "
                                "your own node")
        if self.m.config.require_worker_certs and peer_common_name(context) != node_id:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"node {node_id} must present a client certificate issued to {node_id}")

    @staticmethod
    async def _check_id(value: str, field: str, context: grpc.aio.ServicerContext) -> None:
        if not value or len(value) > MAX_ID_CHARS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"{field}: required, at most {MAX_ID_CHARS} characters")

    async def _ok_or_abort(self, result: c.Result, context: grpc.aio.ServicerContext,
                           code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION) -> c.Result:
        if not result.ok:
            if result.code is c.Rejection.NOT_FOUND:
                code = grpc.StatusCode.NOT_FOUND
            elif result.code is c.Rejection.CONFLICT:
                code = grpc.StatusCode.ALREADY_EXISTS
            await context.abort(code, result.error)
        return result

    # ---- clients -------------------------------------------------------------------------------

    async def SubmitJob(self, request, context):
        try:
            spec = codec.job_spec_from_proto(request.spec, default_queue=DEFAULT_QUEUE)
            if spec.secrets:  # sealed by a master alone: a client's sealed bytes could be another job's
                raise JobFileError("spec.secrets", "must be empty: send the values in the request's secrets")
            for name, value in request.secrets.items():
                check_secret_value(name, value)
            # Sealed here, before the proposal, with this master's random nonces: apply only copies.
            spec = dataclasses.replace(spec, secrets=tuple(self._seal.seal(name, value)
                                                           for name, value in sorted(request.secrets.items())))
            check_spec(spec, self.m.config.topology_levels, self.m.config.max_array_size)
        except (JobFileError, codec.CodecError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid job: {exc}")
        if len(request.request_id) > MAX_ID_CHARS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request_id: at most {MAX_ID_CHARS} characters")
        await self._leader(context)
        caller = self.caller()
        with self.m.lock:
            existing = self.m.state.job_by_request.get(request.request_id) if request.request_id else None
            conflict = self.m.state.request_conflict(request.request_id, spec)
            largest, has_nodes = self.m.state.largest, bool(self.m.state.nodes)
            queue = self.m.state.queues.get(spec.queue)
            unknown = [j for _kind, j in spec.after if not dependencies.known(self.m.state, j)]
            unplaceable = elastic.required_domain_problem(
                ClusterView(self.m.state.nodes, self.m.state.index, self.m.state.levels), spec)
        if conflict:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, conflict)
        # The spec keeps the notice asked for: a queue given a larger max_grace later gives all of it.
        warnings = [w for w in (notice_capped(spec, queue),) if w]
        if existing:
            return api_pb2.SubmitJobReply(job_id=existing, warnings=warnings)
        if unplaceable:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid job: tasks.min: {unplaceable}")
        if unknown:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"invalid job: after: unknown job {unknown[0]} (not submitted, or forgotten "
                                "too long ago)")
        if queue is None and spec.queue != DEFAULT_QUEUE:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid job: queue: unknown queue {spec.queue}")
        if queue is not None and (queue.users or queue.groups) and not caller.is_admin \
                and caller.name not in queue.users and not set(caller.groups) & set(queue.groups):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"permission denied: user {caller.name} may not submit to queue {queue.name}: it "
                                f"takes users {', '.join(queue.users) or '-'} and groups "
                                f"{', '.join(queue.groups) or '-'}")
        if has_nodes and not spec.resources.fits_in(largest):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"invalid job: resources: no node can hold one task: "
                                f"{', '.join(spec.resources.short_of(largest))} per task is more than the "
                                f"largest node has (gpu {largest.gpu}, cpu {largest.cpu}m, memory {largest.memory})")
        job_id = self.m.new_job_id(spec.name)
        user = caller.name
        kind = c.submit_kind(spec)
        result = await self._propose(kind(at=self.m.now(), by=user, job_id=job_id,
                                          request_id=request.request_id, spec=spec), context)
        await self._ok_or_abort(result, context, grpc.StatusCode.INVALID_ARGUMENT)
        # DEBUG, not INFO: a log record per submission was a twentieth of the leader's CPU per
        # submission (format, write, flush), and the replicated JobSubmitted event (`synctl events`,
        # the history) already records each one with its user.
        log.debug("job submitted job=%s request=%s tasks=%d user=%s", result.value, request.request_id, spec.tasks,
                  user)
        return api_pb2.SubmitJobReply(job_id=result.value, warnings=warnings)

    def _job_info(self, job, explained: dict[int, tuple[str, ...]] | None = None) -> api_pb2.JobInfo:
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
        info = codec.job_to_info(
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
        if job.spec.after:
            info.dependencies.extend(codec.dependencies_to_proto(dependencies.resolve(state, job.spec.after)))
        info.goodput.CopyFrom(codec.goodput_to_proto(goodput.of_job(job, self.m.now())))
        heard = view.progress_of(job.id) if view is not None else None  # the leader's may be newer than the log's
        logged = job.progress
        codec.progress_to_info(info, heard if heard is not None and (logged is None or heard.at >= logged.at)
                               else logged)
        array = state.arrays.get(job.array_id) if job.array_id else None
        if array is not None and array.rep == job.id:  # it stands for every never-placed element
            info.array_waiting = format_ranges(array.waiting_ranges())
        return info

    def _sees_env(self, owner: str) -> bool:
        """Whether the caller may see the env values of a job of `owner`'s: its owner and admins."""
        caller = self.caller()
        return caller.is_admin or caller.name == owner

    def _array_info(self, array) -> api_pb2.JobInfo:
        """An array as one job (call under the master lock): its status, counts and waiting elements."""
        state = self.m.state
        running = sum(1 for j in state.array_live.get(array.id, ()) if state.jobs[j].status.has_gang)
        status = array.status(running > 0)
        view = Job(id=array.id, spec=array.spec, request_id=array.request_id, submitted_at=array.submitted_at,
                   seq=array.seq, status=status, user=array.user, finished_at=array.finished_at,
                   started_at=array.started_at, array_id=array.id)
        info = codec.job_to_info(view, env_shown=self._sees_env(array.user))
        info.array_index = -1
        info.array.CopyFrom(codec.array_counts_to_proto(array, running))
        info.array_waiting = format_ranges(array.waiting_ranges())
        leader = self.m.leader_view()  # the next element's wait is the array's: they share one spec
        waiting = leader.wait_reason(array.rep) if leader is not None and array.rep else None
        if waiting is not None:
            info.waiting, info.waiting_code = waiting.message, waiting.code
        if array.spec.after:
            info.dependencies.extend(codec.dependencies_to_proto(dependencies.resolve(state, array.spec.after)))
        return info

    async def GetJob(self, request, context):
        await self._check_id(request.job_id, "job_id", context)
        await self._current_read(context)
        with self.m.lock:
            job = self.m.state.jobs.get(request.job_id)
            if job is None and request.job_id in self.m.state.arrays:
                return self._array_info(self.m.state.arrays[request.job_id])
            status = dependencies.upstream_status(self.m.state, request.job_id) if job is None else ""
            if job is None and status and request.job_id not in self.m.state.finished:
                # an element not yet a job: shown as the job it will be
                array_id, index = split_element_id(request.job_id)  # type: ignore[misc]
                array = self.m.state.arrays[array_id]
                return codec.job_to_info(Job(id=request.job_id, spec=array.spec, request_id="",
                                             submitted_at=array.submitted_at, seq=array.seq,
                                             status=JobStatus(status), user=array.user, array_id=array_id,
                                             array_index=index), env_shown=self._sees_env(array.user))
            if job is None:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown job {request.job_id}"
                                    + (f" (forgotten after it ended {status})" if status else ""))
            return self._job_info(job)

    async def ListJobs(self, request, context):
        if request.limit < 0 or request.limit > MAX_PAGE:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit: between 1 and {MAX_PAGE}")
        limit = request.limit or DEFAULT_PAGE
        if len(request.user) > MAX_ID_CHARS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"user: at most {MAX_ID_CHARS} characters")
        await self._current_read(context)
        wanted = set(request.status)
        with self.m.lock:
            jobs = self.m.state.jobs
            after = jobs.get(request.after) if request.after else None
            if request.after and after is None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"after: unknown job {request.after}")
            # Jobs are kept in submission order (dicts keep insertion order; seq grows with it).
            page, more = [], False
            for job in jobs.values():
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
            infos, explained = [], {}
            for job in page:
                info = self._job_info(job, explained)
                del info.events[:]
                infos.append(info)
            return api_pb2.ListJobsReply(jobs=infos, next=page[-1].id if more and page else "")

    async def ListNodes(self, request, context):
        await self._current_read(context)
        with self.m.lock:
            state = self.m.state
            held: dict[str, list[str]] = {}
            for image, nodes in sorted(image_holders(state.jobs.values()).items()):
                for node_id in nodes:
                    held.setdefault(node_id, []).append(image)
            now = time.monotonic()
            for node_id, (images, heard) in self.m.node_images.items():
                if now - heard < NODE_IMAGES_TTL_S:  # what the node's store says beats what the state suggests
                    held[node_id] = list(images)
            return api_pb2.ListNodesReply(nodes=[codec.node_to_info(n, len(state.live_tasks[n.id]), held.get(n.id, ()))
                                                 for n in sorted(state.nodes.values(), key=lambda n: n.id)])

    def _owner(self, job_id: str) -> str | None:
        """Who owns a job, an array or an array's element (call under the master lock); None if unknown."""
        state = self.m.state
        job = state.jobs.get(job_id)
        if job is not None:
            return job.user
        element = split_element_id(job_id)
        array = state.arrays.get(job_id) or (state.arrays.get(element[0]) if element else None)
        if array is None or (job_id != array.id and array.position_of(element[1]) < 0):  # type: ignore[index]
            return None
        return array.user

    async def CancelJob(self, request, context):
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

    async def UpdateJob(self, request, context):
        """Change a running array's throttle: its owner or an admin."""
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

    async def SetSchedulable(self, request, context):
        await self._check_id(request.node_id, "node_id", context)
        await self._leader(context)
        result = await self._propose(c.SetSchedulable(at=self.m.now(), by=self.caller().name, node_id=request.node_id,
                                                      schedulable=request.schedulable, reason=request.reason[:512]),
                                     context)
        await self._ok_or_abort(result, context)
        return api_pb2.SetSchedulableReply()

    async def DrainNode(self, request, context):
        """Cordon the node and stop every gang with a task on it: they requeue at their place,
        uncharged. One proposal: a DrainNode command, or on a cluster not yet at version 3 a cordon
        and one stop per gang together in one log entry (a gang placed on the node between this
        read and that entry's apply escapes that legacy drain; DrainNode decides inside apply)."""
        await self._check_id(request.node_id, "node_id", context)
        term = await self._leader(context)
        by = self.caller().name
        if versions.may_propose(c.DrainNode, self.m.raft.cluster_version()):
            result = await self._propose(c.DrainNode(at=self.m.now(), term=term, by=by, node_id=request.node_id),
                                         context)
            await self._ok_or_abort(result, context)
            return api_pb2.DrainNodeReply(jobs_stopped=[j for j in (result.value or "").split(",") if j])
        now = self.m.now()
        reason = f"node {request.node_id} drained by {by}"
        cmds: list[c.Command] = [c.SetSchedulable(at=now, by=by, node_id=request.node_id, schedulable=False)]
        with self.m.lock:
            jobs = sorted({(t.job_id, t.attempt) for t, wanted in self.m.state.tasks_on_node(request.node_id)
                           if wanted})
            for job_id, attempt in jobs:
                # An elastic gang that keeps its min without the node shrinks instead (synapse.core.schedule.elastic).
                job = self.m.state.jobs[job_id]
                kept = sum(1 for t in job.tasks if t.node_id != request.node_id)
                cmds.append(c.ResizeGang(at=now, term=term, by=by, job_id=job_id, attempt=attempt, size=kept,
                                         reason=reason)
                            if elastic.is_elastic(job.spec) and kept >= job.spec.tasks_min else
                            c.FailAttempt(at=now, term=term, by=by, job_id=job_id, attempt=attempt, reason=reason))
        cordon, *stops = await self._propose_all(cmds, context)
        await self._ok_or_abort(cordon, context)
        stopped = [job_id for (job_id, _), res in zip(jobs, stops, strict=True) if res.ok]
        return api_pb2.DrainNodeReply(jobs_stopped=stopped)

    async def ReplicaStatus(self, request, context):
        status = self.m.raft.status()
        leader = self.m.raft.leader() or ""
        if request.with_digest:
            applied, digest = self.m.raft.replicated.digest()
        else:
            applied, digest = self.m.raft.replicated.applied(), ""
        partners = self.m.raft.partners()
        connected = [p for p in partners if status.get(f"partner_node_status_server_{p}") == 2]
        return api_pb2.ReplicaStatusReply(
            id=self.m.replica.id, api_address=self.m.replica.api, raft_address=self.m.replica.raft,
            state={0: "follower", 1: "candidate", 2: "leader"}.get(status.get("state"), "unknown"),
            leader_raft=leader, leader_api=self.m.api_of_raft(leader) if leader else "",
            term=status.get("raft_term", 0), commit_index=status.get("commit_idx", 0),
            applied_index=status.get("last_applied", 0), commands_applied=applied, digest=digest,
            partners=partners, connected=connected, entries_proposed=self.m.raft.entries_proposed,
            commands_proposed=self.m.raft.commands_proposed,
            match_index={p: status.get(f"match_idx_server_{p}", 0) for p in partners},
            next_index={p: status.get(f"next_node_idx_server_{p}", 0) for p in partners},
            log_start=self.m.raft.log_start(), command_version=self.m.raft.commands.known,
            cluster_version=self.m.raft.cluster_version() if self.m.raft.is_leader() else 0,
            applied_version=self.m.raft.replicated.state.cluster_version)

    async def AddReplica(self, request, context):
        """Add a master replica: record its addresses, then add it to the Raft membership.
        Start the new replica's process afterwards (its cluster file lists every member)."""
        raft_address = await self._membership_request(request, context, "add")
        await self._ok_or_abort(await self._propose(c.SetReplica(
            at=self.m.now(), by=self.caller().name, id=request.id, raft_address=raft_address,
            api_address=request.api_address), context), context)
        await self._change_membership("add", request.id, raft_address, context)
        return api_pb2.MembershipReply(message=f"replica {request.id} added at {request.raft_address}; "
                                               "start its process now")

    async def RemoveReplica(self, request, context):
        """Remove a master replica from the Raft membership (then stop its process)."""
        raft_address = await self._membership_request(request, context, "remove")
        await self._change_membership("remove", request.id, raft_address, context)
        await self._propose(c.SetReplica(at=self.m.now(), by=self.caller().name, id=request.id,
                                         raft_address=raft_address, api_address="", removed=True), context)
        return api_pb2.MembershipReply(message=f"replica {request.id} removed")

    async def _membership_request(self, request, context, action: str) -> str:
        """The Raft address of the replica to add or remove, once the request is valid and this
        replica leads (a follower redirects: it may be the one to remove)."""
        await self._check_id(request.id, "id", context)
        raft_address = request.raft_address
        if action == "remove" and not raft_address:
            known = {r.id: r.raft for r in self.m.config.replicas}
            with self.m.lock:
                known.update({k: v[0] for k, v in self.m.state.replicas.items()})
            raft_address = known.get(request.id, "")
        if not _host_port(raft_address):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"raft_address: must be host:port, not {raft_address!r} (unknown replica?)")
        if action == "add" and not _host_port(request.api_address):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"api_address: must be host:port, not {request.api_address!r}")
        await self._leader(context)
        if action == "remove" and raft_address == self.m.replica.raft:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "the leader cannot remove itself; stop it first so another replica leads")
        return raft_address

    async def _change_membership(self, action: str, replica_id: str, raft_address: str, context) -> None:
        """pysyncobj's own membership entry for `raft_address` (idempotent, so a client may retry a
        change whose answer it lost: a timeout, a failover; the leader's members include every change
        it has appended, committed or not)."""
        members = {self.m.replica.raft, *self.m.raft.partners()}
        if (raft_address in members) != (action == "add"):
            try:
                await self.m.raft.change_membership(action, raft_address)
            except ProposeError as exc:
                reason = ("the previous change is not committed yet (one at a time)"
                          if exc.kind == "REQUEST_DENIED" else "the leader changed or the change timed out")
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                    f"membership change refused ({exc.kind}): {reason}; retry")
        log.info("membership changed action=%s replica=%s raft=%s", action, replica_id, raft_address)

    # ---- users ---------------------------------------------------------------------------------

    async def WhoAmI(self, request, context):
        caller = self.caller()
        if caller.bootstrap:
            return api_pb2.UserInfo(name=caller.name, role=caller.role.value, bootstrap=True)
        with self.m.lock:
            user = self.m.state.users.get(caller.name)
            return codec.user_to_info(user) if user else api_pb2.UserInfo(name=caller.name, role=caller.role.value)

    async def AddUser(self, request, context):
        groups = tuple(request.groups)
        problem = user_name_problem(request.name) or groups_problem(groups)
        if request.role not in ("", Role.USER.value, Role.ADMIN.value):
            problem = problem or f"role: 'user' or 'admin', not {request.role[:40]!r}"
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        await self._leader(context)
        with self.m.lock:
            exists = request.name in self.m.state.users
        if exists:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS,
                                f"user {request.name} already exists (rotate its token to issue a new one)")
        token = new_token()
        result = await self._propose(c.AddUser(at=self.m.now(), by=self.caller().name, name=request.name,
                                               role=Role(request.role or Role.USER.value), groups=groups,
                                               token_hash=token_hash(self._token_key, token)), context)
        await self._ok_or_abort(result, context, grpc.StatusCode.INVALID_ARGUMENT)
        log.info("user added user=%s by=%s", request.name, self.caller().name)
        return await self._user_token(request.name, token, context)

    async def RotateUserToken(self, request, context):
        caller = self.caller()
        name = request.name or caller.name
        if not caller.is_admin and name != caller.name:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"permission denied: user {caller.name} may rotate only its own token, not {name}'s")
        await self._leader(context)
        with self.m.lock:
            exists = name in self.m.state.users
        if not exists:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown user {name}"
                                + (" (the bootstrap admin's token is the cluster token in the cluster file)"
                                   if caller.bootstrap and name == caller.name else ""))
        token = new_token()
        result = await self._propose(c.SetUserToken(at=self.m.now(), by=caller.name, name=name,
                                                    token_hash=token_hash(self._token_key, token)), context)
        await self._ok_or_abort(result, context)
        log.info("user token rotated user=%s by=%s", name, caller.name)
        return await self._user_token(name, token, context)

    async def _user_token(self, name: str, token: str, context) -> api_pb2.UserToken:
        with self.m.lock:
            user = self.m.state.users.get(name)
            info = codec.user_to_info(user) if user else None
        if info is None:  # removed again in between
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown user {name}")
        return api_pb2.UserToken(user=info, token=token)

    async def RemoveUser(self, request, context):
        await self._check_id(request.name, "name", context)
        await self._leader(context)
        result = await self._propose(c.RemoveUser(at=self.m.now(), by=self.caller().name, name=request.name), context)
        await self._ok_or_abort(result, context)
        log.info("user removed user=%s by=%s", request.name, self.caller().name)
        return api_pb2.RemoveUserReply()

    async def ListUsers(self, request, context):
        await self._current_read(context)
        with self.m.lock:
            return api_pb2.ListUsersReply(users=[codec.user_to_info(u) for _, u in sorted(self.m.state.users.items())])

    async def LogAccess(self, request, context):
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

    # ---- queues --------------------------------------------------------------------------------

    async def ApplyQueues(self, request, context):
        """Create or replace queues, all together or none; applying the same file again changes nothing."""
        queues = [codec.queue_from_proto(q) for q in request.queues]
        await self._leader(context)
        with self.m.lock:
            existing = dict(self.m.state.queues)
        problem = batch_problem(existing, queues) if queues else "no queues given"
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid queues: {problem}")
        changed = [q for q in queues if existing.get(q.name) != q]
        if changed:
            result = await self._propose(c.ApplyQueues(at=self.m.now(), by=self.caller().name, queues=tuple(changed)),
                                         context)
            await self._ok_or_abort(result, context, grpc.StatusCode.INVALID_ARGUMENT)
            log.info("queues applied queues=%s by=%s", ",".join(q.name for q in changed), self.caller().name)
        return api_pb2.ApplyQueuesReply(
            created=[q.name for q in changed if q.name not in existing],
            changed=[q.name for q in changed if q.name in existing],
            unchanged=[q.name for q in queues if existing.get(q.name) == q])

    async def DeleteQueue(self, request, context):
        await self._check_id(request.name, "name", context)
        await self._leader(context)
        result = await self._propose(c.DeleteQueue(at=self.m.now(), by=self.caller().name, name=request.name), context)
        await self._ok_or_abort(result, context)
        return api_pb2.DeleteQueueReply()

    async def ListQueues(self, request, context):
        await self._current_read(context)
        with self.m.lock:
            state = self.m.state
            usage = dict(state.queue_usage)  # kept by apply: what each queue's live tasks hold
            now, half_life = self.m.now(), state.usage_half_life
            remembered = {name: fairshare.value_at(entry, now, half_life) / 3600
                          for name, entry in state.queue_decay.items()}
            counts: dict[str, list[int]] = {}
            for job in state.jobs.values():
                if not job.status.terminal:
                    counts.setdefault(state.queue_of(job), [0, 0])[0 if job.status is JobStatus.PENDING else 1] += 1
            queues = dict(state.queues)
        implicit = DEFAULT_QUEUE not in queues
        if implicit:
            queues[DEFAULT_QUEUE] = Queue(DEFAULT_QUEUE)

        def info(name: str, queue: Queue) -> api_pb2.QueueInfo:
            pending, running = counts.get(name, [0, 0])
            return api_pb2.QueueInfo(spec=codec.queue_to_proto(queue), pending=pending, running=running,
                                     usage=codec.resources_to_proto(usage.get(name, Resources())),
                                     implicit=implicit and name == DEFAULT_QUEUE,
                                     decayed_gpu_hours=remembered.get(name, 0.0))

        return api_pb2.ListQueuesReply(queues=[info(n, q) for n, q in sorted(queues.items())])

    async def WatchEvents(self, request, context):
        """The cluster's events after a cursor, from this replica's applied state (any replica)."""
        for field, value in (("job_id", request.job_id), ("node_id", request.node_id)):
            if len(value) > MAX_ID_CHARS:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: at most {MAX_ID_CHARS} characters")
        cursor = request.after
        if cursor <= 0:  # from the oldest event kept
            with self.m.lock:
                cursor = self.m.state.cluster_events[0].seq - 1 if self.m.state.cluster_events else 0
        while True:
            changed = self.m.state_changed()
            with self.m.lock:
                events = self.m.state.events_after(cursor)
                oldest = self.m.state.cluster_events[0].seq if self.m.state.cluster_events else 0
            if events is None:
                await context.abort(grpc.StatusCode.OUT_OF_RANGE,
                                    f"cursor {cursor} is too old: the oldest event kept is {oldest}; "
                                    "start again from 0 (and re-read the state)")
            for e in events:
                cursor = e.seq
                if (request.job_id and (e.topic != "job" or e.object_id != request.job_id)) or \
                        (request.node_id and (e.topic != "node" or e.object_id != request.node_id)):
                    continue
                yield api_pb2.ClusterEventInfo(seq=e.seq, at=e.at, type=e.type, topic=e.topic, reason=e.reason,
                                               object_id=e.object_id, message=e.message)
            if not request.follow:
                return
            if self.m.stopping:
                await self._abort_stopping(context)
            try:
                await asyncio.wait_for(changed.wait(), WATCH_REFRESH_S)
            except TimeoutError:
                pass

    async def PreemptWhatIf(self, request, context):
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

    # ---- history ---------------------------------------------------------------------------------

    async def ListHistory(self, request, context):
        return await self._from_history(history_api.list_history, request, context)

    async def GetUsage(self, request, context):
        return await self._from_history(history_api.usage, request, context)

    async def _from_history(self, query, request, context):
        """Answer from the history store (any replica): INVALID_ARGUMENT for a bad request,
        FAILED_PRECONDITION without a store or while it fails (not UNAVAILABLE: every replica
        shares the store, so a client trying the others would only wait longer)."""
        if self.m.history is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "this cluster keeps no job history (set history.url in the cluster file)")
        try:
            return await query(self.m.history, request)
        except history_api.BadRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except history_api.Unavailable as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"history store unavailable: {exc}")

    # ---- workers -------------------------------------------------------------------------------

    async def RegisterNode(self, request, context):
        """An admin registers any node, a node's credential only that node, and a join token only a
        node that is not registered yet (so it cannot take over a node's id, and its credential)."""
        await self._check_id(request.node_id, "node_id", context)
        caller = self.caller()
        if caller.node and caller.node != request.node_id:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"permission denied: {caller.name} may register only node {caller.node}")
        if self.m.config.require_worker_certs and peer_common_name(context) != request.node_id:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"node {request.node_id} must present a client certificate issued to it")
        capacity = codec.resources_from_proto(request.capacity)
        problem = _capacity_problem(capacity, request)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        await self._leader(context)
        now = self.m.now()
        cmd: c.Command = c.RegisterNode(at=now, by=caller.name, node_id=request.node_id,
                                        address=request.address[:MAX_ID_CHARS], topology=tuple(request.topology),
                                        capacity=capacity, labels=tuple(sorted(request.labels.items())),
                                        isolation=request.isolation[:MAX_ISOLATION_CHARS])
        if caller.join_token:
            with self.m.lock:
                token = self.m.state.join_tokens.get(caller.join_token)
                taken = request.node_id in self.m.state.nodes
            why = "it was revoked" if token is None else token.unusable(now)
            if why or taken:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"permission denied: {why}" if why else
                                    f"permission denied: node {request.node_id} is registered; re-registering it "
                                    "needs an admin or its own credential, not a join token")
            cmd = c.JoinNode(at=now, by=caller.name, token_id=caller.join_token, node=cmd)
        result = await self._propose(cmd, context)
        await self._ok_or_abort(result, context, grpc.StatusCode.INVALID_ARGUMENT)
        loops = self.m.leader_loops
        if loops is not None:
            loops.heard(request.node_id)
        log.info("node registered node=%s address=%s topology=%s gpus=%d", request.node_id, request.address,
                 "/".join(request.topology), capacity.gpu)
        return api_pb2.RegisterNodeReply(status=result.value, heartbeat_interval_s=self.m.config.heartbeat_interval,
                                         node_credential=self.m.node_credential(request.node_id),
                                         lease_ms=self.m.shard.lease_ms(NodeStatus.READY.value))  # READY now

    async def CreateJoinToken(self, request, context):
        if not 0 <= request.ttl_s <= MAX_JOIN_TOKEN_TTL_S:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"ttl: from 0 (never expires) to {MAX_JOIN_TOKEN_TTL_S:.0f} seconds")
        await self._leader(context)
        token, now = new_join_token(), self.m.now()
        cmd = c.CreateJoinToken(at=now, by=self.caller().name, token_id=secrets.token_hex(4),
                                token_hash=token_hash(self._token_key, token),
                                expires_at=now + request.ttl_s if request.ttl_s else 0.0, max_uses=request.uses)
        await self._ok_or_abort(await self._propose(cmd, context), context)
        log.info("join token created id=%s by=%s ttl=%.0f uses=%d", cmd.token_id, cmd.by, request.ttl_s, request.uses)
        with self.m.lock:
            info = codec.join_token_to_proto(self.m.state.join_tokens[cmd.token_id])
        return api_pb2.CreateJoinTokenReply(token=token, info=info)

    async def ListJoinTokens(self, request, context):
        await self._current_read(context)
        with self.m.lock:
            return api_pb2.ListJoinTokensReply(tokens=[codec.join_token_to_proto(t)
                                                       for _, t in sorted(self.m.state.join_tokens.items())])

    async def RevokeJoinToken(self, request, context):
        await self._check_id(request.id, "id", context)
        await self._leader(context)
        result = await self._propose(c.RevokeJoinToken(at=self.m.now(), by=self.caller().name, token_id=request.id),
                                     context)
        await self._ok_or_abort(result, context)
        log.info("join token revoked id=%s by=%s", request.id, self.caller().name)
        return api_pb2.RevokeJoinTokenReply()

    async def _attachable(self, context: grpc.aio.ServicerContext) -> None:
        """Workers attach to any replica that leads or follows a leader its digests reach; one cut
        off answers UNAVAILABLE, so its workers move on (synapse.master.link_shard)."""
        if self.m.stopping:
            await self._abort_stopping(context)
        if not self.m.shard.serving():
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"replica {self.m.replica.id} has no leader in reach; attach to another")

    async def Heartbeat(self, request, context):
        """Absorbed by this replica's link shard, whichever replica it is (never refused): the reply
        names the node's shard, where the worker sends its next heartbeat."""
        await self._worker_identity(request.node_id, context)
        await self._attachable(context)
        status, order = self.m.shard.absorb(request)
        if not status and not self.m.ready_leader_term():
            # Only the leader may tell a worker to register again: a follower may not have applied
            # the registration yet (or be catching up), and a storm of re-registrations would follow.
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"replica {self.m.replica.id} does not hold node {request.node_id} (yet); try another")
        lease_ms = self.m.shard.lease_ms(status)
        if status == NodeStatus.READY.value and lease_ms < self.m.shard.lease.seconds * 500:
            # Less than half a lease to grant (none of its digests reached a leader lately, or
            # yet): the worker goes on to a replica that can renew its lease, in this very call.
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"replica {self.m.replica.id} cannot renew node {request.node_id}'s lease now "
                                "(its digests have not reached a leader lately); try another")
        return api_pb2.HeartbeatReply(node_status=status or "UNKNOWN", term=self.m.raft.term(),
                                      shard=order[0] if order else "", order=order, lease_ms=lease_ms)

    async def ReportLiveness(self, request, context):
        """A link shard's digest, for the leader's brain."""
        term = await self._leader(context)
        if len(request.node_ids) != len(request.ages_ms):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "node_ids and ages_ms: one age per node")
        loops = self.m.leader_loops
        if loops is not None:
            loops.digest(request)
        return api_pb2.LivenessDigestReply(term=term)

    async def WatchAssignments(self, request, context):
        """Served by any replica from its applied state (workers watch from their shard's). A
        replica first waits until it has applied what the worker has seen, so (term, version)
        never goes back for the worker when it moves from one replica to another."""
        await self._worker_identity(request.node_id, context)
        await self._attachable(context)
        deadline = time.monotonic() + LEADER_WAIT_S
        while self.m.state.applied < request.known_version:
            if time.monotonic() > deadline:
                await context.abort(grpc.StatusCode.UNAVAILABLE,
                                    f"replica {self.m.replica.id} has not applied version {request.known_version} yet")
            try:
                await asyncio.wait_for(self.m.state_changed().wait(), 0.1)
            except TimeoutError:
                pass
        log.info("assignments watched node=%s term=%d", request.node_id, self.m.raft.term())  # chaos timelines
        last_sent = None
        while self.m.shard.serving():
            changed = self.m.node_event(request.node_id)
            term = self.m.raft.term()
            with self.m.lock:
                state = self.m.state
                node = state.nodes.get(request.node_id)
                reply = api_pb2.Assignments(
                    term=term, version=state.applied,
                    node_status=node.status.value if node else "UNKNOWN",
                    tasks=[codec.assignment_to_proto(a) for a in assignments_for_node(
                        state, request.node_id, self._seal.open, self.m.config.rendezvous_ports)])
            # Only a changed list goes out (and the keepalive). A newer version alone is not worth
            # a message: every commit touching a gang would send each of its workers a list it
            # already has, and a gang's TaskPrepared and TaskStarted reports, n of them, would send
            # n x n (the last TaskPrepared, the release, then waited behind them, bench/images.py).
            # The worker misses nothing: what it runs follows from the list, and its (term,
            # version) only orders lists and says how far a replica must have applied to serve it.
            body = (reply.node_status, tuple(t.SerializeToString() for t in reply.tasks))
            if body != last_sent:
                last_sent = body
                yield reply
            try:
                await asyncio.wait_for(changed.wait(), WATCH_REFRESH_S)
            except TimeoutError:
                last_sent = None  # keepalive: send the current list again
        if self.m.stopping:
            await self._abort_stopping(context)
        await context.abort(grpc.StatusCode.UNAVAILABLE,
                            f"replica {self.m.replica.id} has no leader in reach; attach to another")

    async def ReportPullProgress(self, request, context):
        """How far a node's pulls are, kept in the leader's memory only (a new leader hears the next)."""
        await self._worker_identity(request.node_id, context)
        if len(request.pulls) > 1000:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "pulls: at most 1000 per report")
        await self._leader(context)
        now = time.monotonic()
        progress = {key: value for key, value in self.m.pull_progress.items() if now - value[3] < PULL_PROGRESS_TTL_S}
        for p in request.pulls:
            progress[(p.job_id[:MAX_ID_CHARS], p.attempt, request.node_id)] = (p.phase[:16], p.done_bytes,
                                                                               p.total_bytes, now)
        self.m.pull_progress = progress
        if request.cache_listed:
            self.m.node_images[request.node_id] = (tuple(sorted(r[:1024] for r in request.cached[:MAX_LISTED_IMAGES])),
                                                   now)
        return api_pb2.ReportPullProgressReply()

    async def ReportTaskEvents(self, request, context):
        await self._worker_identity(request.node_id, context)
        if len(request.events) > 10_000:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "events: at most 10000 per report")
        await self._leader(context)
        now = self.m.now()
        version = self.m.raft.cluster_version()
        progress = [progress_report(e, request.node_id, now) for e in request.events if e.progress]
        loops = self.m.leader_loops
        if progress and loops is not None and loops.ready.is_set():
            loops.progress(progress)  # best effort: the next report says it again
        preparing = versions.may_propose(c.TaskPrepared, version)
        cmds = [c.TaskStarted(at=now, job_id=e.job_id, attempt=e.attempt, index=e.index, node_id=request.node_id)
                if e.started else
                c.TaskPrepared(at=now, job_id=e.job_id, attempt=e.attempt, index=e.index, node_id=request.node_id)
                if e.prepared else
                c.TaskExited(at=now, job_id=e.job_id, attempt=e.attempt, index=e.index, node_id=request.node_id,
                             exit_code=e.exit_code, reason=e.reason[:512],
                             cause=e.cause[:32] if versions.cause_known(e.cause, version) else "",
                             node_side=e.node_side)
                for e in request.events if not e.progress and (preparing or not e.prepared)]
        results = await self._propose_all(cmds, context)
        return api_pb2.ReportTaskEventsReply(accepted=len(progress) + sum(1 for r in results if r.ok))


def progress_report(e, node_id: str, now: float) -> ProgressReport:
    """A worker's progress event (an api_pb2.TaskEvent) as the leader's stimulus: a checkpoint time
    in the future is read as now (a task's clock is not the cluster's)."""
    at = e.checkpoint_at if math.isfinite(e.checkpoint_at) and e.checkpoint_at > 0 else 0.0
    return ProgressReport(job_id=e.job_id, attempt=e.attempt, index=e.index, node_id=node_id, at=now,
                          step=max(-1, e.step),
                          checkpoint_at=min(at, now), checkpoint_step=max(-1, e.checkpoint_step),
                          problem=e.progress_problem[:200])


def _host_port(value: str) -> bool:
    host, _, port = value.rpartition(":")
    return bool(host) and port.isdigit() and len(value) <= MAX_ID_CHARS


def _capacity_problem(capacity, request) -> str:
    """Why a node registration is refused, or ''."""
    if capacity.is_negative():
        return "capacity: must not be negative"
    if capacity.gpu > MAX_NODE_GPUS or capacity.cpu > 1 << 32 or capacity.memory > 1 << 60:
        return "capacity: absurdly large"
    if len(request.topology) > MAX_TOPOLOGY_LABELS or any(
            not label or len(label) > MAX_LABEL_CHARS or "/" in label for label in request.topology):
        return (f"topology: at most {MAX_TOPOLOGY_LABELS} labels of 1-{MAX_LABEL_CHARS} characters, without '/'")
    if not _host_port(request.address):
        return f"address: must be host:port, not {request.address[:80]!r}"
    if len(request.labels) > MAX_NODE_LABELS or any(
            not _LABEL_KEY_RE.match(k) or len(v) > MAX_LABEL_CHARS for k, v in request.labels.items()):
        return (f"labels: at most {MAX_NODE_LABELS}, named with lowercase letters, digits, '_', '.' or '-', values of "
                f"up to {MAX_LABEL_CHARS} characters")
    return ""


class Malformed:
    """A request whose bytes did not parse; the handler wrapper answers INVALID_ARGUMENT."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _lenient(parse):
    def deserialize(data: bytes):
        try:
            return parse(data)
        except Exception as exc:  # noqa: BLE001 - DecodeError and friends: any garbage
            return Malformed(str(exc)[:200] or type(exc).__name__)
    return deserialize


def _unary(servicer: MasterServicer, name: str, impl):
    async def handle(request, context):
        try:
            CALLER.set(await servicer.authenticate(name, context))
            if isinstance(request, Malformed):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {request.reason}")
            reply = await impl(request, context)
        except BaseException:
            servicer.count(name, context, failed=True)
            raise
        servicer.count(name, context, failed=False)
        return reply
    return handle


def _stream(servicer: MasterServicer, name: str, impl):
    async def handle(request, context):
        try:
            CALLER.set(await servicer.authenticate(name, context))
            if isinstance(request, Malformed):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {request.reason}")
            async for reply in impl(request, context):
                yield reply
        except BaseException:
            servicer.count(name, context, failed=True)
            raise
        servicer.count(name, context, failed=False)
    return handle


def add_to_server(servicer: MasterServicer, server: grpc.aio.Server) -> None:
    """Register the servicer like the generated helper does, but authenticate and authorize every
    call first (synapse.master.access), and turn undecodable bytes into INVALID_ARGUMENT instead of
    gRPC's UNKNOWN."""
    service = api_pb2.DESCRIPTOR.services_by_name["Master"]
    unguarded = sorted(m.name for m in service.methods if m.name not in ACCESS)
    if unguarded:
        raise RuntimeError(f"RPCs without an access rule in synapse.master.access.ACCESS: {unguarded}")
    handlers = {}
    for method in service.methods:
        request_cls = getattr(api_pb2, method.input_type.name)
        reply_cls = getattr(api_pb2, method.output_type.name)
        impl = getattr(servicer, method.name)
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make((_stream if method.server_streaming else _unary)(servicer, method.name, impl),
                                     request_deserializer=_lenient(request_cls.FromString),
                                     response_serializer=reply_cls.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
