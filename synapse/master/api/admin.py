"""The admins' RPCs: nodes (list, cordon, drain), users and their tokens, queues, and join tokens.
Users call a few of them too (ListNodes, ListQueues, WhoAmI, RotateUserToken for their own)."""

from __future__ import annotations

import logging
import secrets
import time

import grpc

from synapse.core import codec
from synapse.core import commands as c
from synapse.core.identity import groups_problem, user_name_problem
from synapse.core.model import DEFAULT_QUEUE, JobStatus, Queue, Resources, Role, image_holders
from synapse.core.queues import batch_problem
from synapse.core.schedule import elastic, fairshare
from synapse.core.versions import admits
from synapse.master.access import new_join_token, new_token, token_hash
from synapse.master.api.base import Context, ServicerBase
from synapse.proto import api_pb2
from synapse.rpc import convert

log = logging.getLogger(__name__)

#: How long a worker's listing of its image store stands on the leader (workers send one every 10 s).
NODE_IMAGES_TTL_S = 60.0
#: The longest a join token may live (0 = never expires is allowed too, for an admin who says so).
MAX_JOIN_TOKEN_TTL_S = 366 * 86400.0


class AdminApi(ServicerBase):
    """ListNodes, SetSchedulable, DrainNode; WhoAmI and users; queues; join tokens."""

    async def ListNodes(self, request: api_pb2.ListNodesRequest, context: Context) -> api_pb2.ListNodesReply:
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
            return api_pb2.ListNodesReply(nodes=[
                convert.node_to_info(n, len(state.live_tasks[n.id]), held.get(n.id, ()))
                for n in sorted(state.nodes.values(), key=lambda n: n.id)])

    async def SetSchedulable(self, request: api_pb2.SetSchedulableRequest,
                             context: Context) -> api_pb2.SetSchedulableReply:
        await self._check_id(request.node_id, "node_id", context)
        await self._leader(context)
        result = await self._propose(c.SetSchedulable(at=self.m.now(), by=self.caller().name, node_id=request.node_id,
                                                      schedulable=request.schedulable, reason=request.reason[:512]),
                                     context)
        await self._ok_or_abort(result, context)
        return api_pb2.SetSchedulableReply()

    async def DrainNode(self, request: api_pb2.DrainNodeRequest, context: Context) -> api_pb2.DrainNodeReply:
        """Cordon the node and stop every gang with a task on it: they requeue at their place,
        uncharged. One proposal: a DrainNode command, or on a cluster not yet at version 3 a cordon
        and one stop per gang together in one log entry (a gang placed on the node between this
        read and that entry's apply escapes that legacy drain; DrainNode decides inside apply)."""
        await self._check_id(request.node_id, "node_id", context)
        term = await self._leader(context)
        by = self.caller().name
        if admits(self.m.raft.cluster_version(), c.DrainNode):
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

    async def WhoAmI(self, request: api_pb2.WhoAmIRequest, context: Context) -> api_pb2.UserInfo:
        caller = self.caller()
        if caller.bootstrap:
            return api_pb2.UserInfo(name=caller.name, role=caller.role.value, bootstrap=True)
        with self.m.lock:
            user = self.m.state.users.get(caller.name)
            return convert.user_to_info(user) if user else api_pb2.UserInfo(name=caller.name, role=caller.role.value)

    async def AddUser(self, request: api_pb2.AddUserRequest, context: Context) -> api_pb2.UserToken:
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

    async def RotateUserToken(self, request: api_pb2.RotateUserTokenRequest, context: Context) -> api_pb2.UserToken:
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

    async def _user_token(self, name: str, token: str, context: Context) -> api_pb2.UserToken:
        with self.m.lock:
            user = self.m.state.users.get(name)
            info = convert.user_to_info(user) if user else None
        if info is None:  # removed again in between
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown user {name}")
        return api_pb2.UserToken(user=info, token=token)

    async def RemoveUser(self, request: api_pb2.RemoveUserRequest, context: Context) -> api_pb2.RemoveUserReply:
        await self._check_id(request.name, "name", context)
        await self._leader(context)
        result = await self._propose(c.RemoveUser(at=self.m.now(), by=self.caller().name, name=request.name), context)
        await self._ok_or_abort(result, context)
        log.info("user removed user=%s by=%s", request.name, self.caller().name)
        return api_pb2.RemoveUserReply()

    async def ListUsers(self, request: api_pb2.ListUsersRequest, context: Context) -> api_pb2.ListUsersReply:
        await self._current_read(context)
        with self.m.lock:
            users = sorted(self.m.state.users.items())
            return api_pb2.ListUsersReply(users=[convert.user_to_info(u) for _, u in users])

    async def ApplyQueues(self, request: api_pb2.ApplyQueuesRequest, context: Context) -> api_pb2.ApplyQueuesReply:
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
            kind = c.queues_kind(tuple(changed))  # per-user limits or an interactive maximum: version 7
            result = await self._propose(kind(at=self.m.now(), by=self.caller().name, queues=tuple(changed)), context)
            await self._ok_or_abort(result, context, grpc.StatusCode.INVALID_ARGUMENT)
            log.info("queues applied queues=%s by=%s", ",".join(q.name for q in changed), self.caller().name)
        return api_pb2.ApplyQueuesReply(
            created=[q.name for q in changed if q.name not in existing],
            changed=[q.name for q in changed if q.name in existing],
            unchanged=[q.name for q in queues if existing.get(q.name) == q])

    async def DeleteQueue(self, request: api_pb2.DeleteQueueRequest, context: Context) -> api_pb2.DeleteQueueReply:
        await self._check_id(request.name, "name", context)
        await self._leader(context)
        result = await self._propose(c.DeleteQueue(at=self.m.now(), by=self.caller().name, name=request.name), context)
        await self._ok_or_abort(result, context)
        return api_pb2.DeleteQueueReply()

    async def ListQueues(self, request: api_pb2.ListQueuesRequest, context: Context) -> api_pb2.ListQueuesReply:
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

    async def CreateJoinToken(self, request: api_pb2.CreateJoinTokenRequest,
                              context: Context) -> api_pb2.CreateJoinTokenReply:
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
            info = convert.join_token_to_proto(self.m.state.join_tokens[cmd.token_id])
        return api_pb2.CreateJoinTokenReply(token=token, info=info)

    async def ListJoinTokens(self, request: api_pb2.ListJoinTokensRequest,
                             context: Context) -> api_pb2.ListJoinTokensReply:
        await self._current_read(context)
        with self.m.lock:
            return api_pb2.ListJoinTokensReply(tokens=[convert.join_token_to_proto(t)
                                                         for _, t in sorted(self.m.state.join_tokens.items())])

    async def RevokeJoinToken(self, request: api_pb2.RevokeJoinTokenRequest,
                              context: Context) -> api_pb2.RevokeJoinTokenReply:
        await self._check_id(request.id, "id", context)
        await self._leader(context)
        result = await self._propose(c.RevokeJoinToken(at=self.m.now(), by=self.caller().name, token_id=request.id),
                                     context)
        await self._ok_or_abort(result, context)
        log.info("join token revoked id=%s by=%s", request.id, self.caller().name)
        return api_pb2.RevokeJoinTokenReply()
