"""The workers' RPCs, each for the caller's own node: register, heartbeat (to the node's link
shard, on any replica), watch its assignments, and report its tasks' events and its pulls."""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import time
from collections.abc import AsyncIterator

import grpc

from synapse.common.auth import NODE_CREDENTIAL_KEY
from synapse.common.tls import peer_common_name
from synapse.core import codec
from synapse.core import commands as c
from synapse.core.model import NodeStatus, Resources
from synapse.master.api.base import MAX_ID_CHARS, WATCH_REFRESH_S, Context, ServicerBase, host_port
from synapse.master.api.job_info import PULL_PROGRESS_TTL_S
from synapse.master.dispatch import assignments_for_node
from synapse.master.replica import LEADER_WAIT_S, ShardWork
from synapse.master.reports import MAX_REPORTED, take_reports
from synapse.proto import api_pb2
from synapse.rpc import convert

log = logging.getLogger(__name__)

#: Bounds on what a node may announce.
MAX_TOPOLOGY_LABELS = 8
MAX_LABEL_CHARS = 63
MAX_NODE_GPUS = 1024
#: Node labels a worker may register (gpu_model, gpu_product, gpu_memory today), and how they look.
MAX_NODE_LABELS = 16
_LABEL_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
MAX_ISOLATION_CHARS = 512
#: The most image references a worker's listing keeps.
MAX_LISTED_IMAGES = 256


class WorkersApi(ServicerBase):
    """RegisterNode, Heartbeat, WatchAssignments, ReportPullProgress, ReportTaskEvents."""

    async def _worker_identity(self, node_id: str, context: Context) -> None:
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

    async def RegisterNode(self, request: api_pb2.RegisterNodeRequest, context: Context) -> api_pb2.RegisterNodeReply:
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
        register = c.RegisterNode(at=now, by=caller.name, node_id=request.node_id,
                                  address=request.address[:MAX_ID_CHARS], topology=tuple(request.topology),
                                  capacity=capacity, labels=tuple(sorted(request.labels.items())),
                                  isolation=request.isolation[:MAX_ISOLATION_CHARS])
        cmd: c.Command = register
        if caller.join_token:
            with self.m.lock:
                token = self.m.state.join_tokens.get(caller.join_token)
                taken = request.node_id in self.m.state.nodes
            why = "it was revoked" if token is None else token.unusable(now)
            if why or taken:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"permission denied: {why}" if why else
                                    f"permission denied: node {request.node_id} is registered; re-registering it "
                                    "needs an admin or its own credential, not a join token")
            cmd = c.JoinNode(at=now, by=caller.name, token_id=caller.join_token, node=register)
        result = await self._propose(cmd, context)
        await self._ok_or_abort(result, context, grpc.StatusCode.INVALID_ARGUMENT)
        loops = self.m.leader_loops
        if loops is not None:
            loops.heard(request.node_id)
        log.info("node registered node=%s address=%s topology=%s gpus=%d", request.node_id, request.address,
                 "/".join(request.topology), capacity.gpu)
        return api_pb2.RegisterNodeReply(status=result.value, heartbeat_interval_s=self.m.config.heartbeat_interval,
                                         node_credential=self.m.node_credential(request.node_id),
                                         lease_ms=self._shard().lease_ms(NodeStatus.READY.value))  # READY now

    def _shard(self) -> ShardWork:
        """This replica's link shard (main makes it before the API serves)."""
        if self.m.shard is None:
            raise RuntimeError("the link shard is made before the API serves")
        return self.m.shard

    async def _attachable(self, context: Context) -> None:
        """Workers attach to any replica that leads or follows a leader its digests reach; one cut
        off answers UNAVAILABLE, so its workers move on (synapse.master.link_shard)."""
        if self.m.stopping:
            await self._abort_stopping(context)
        if not self._shard().serving():
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"replica {self.m.replica.id} has no leader in reach; attach to another")

    async def Heartbeat(self, request: api_pb2.HeartbeatRequest, context: Context) -> api_pb2.HeartbeatReply:
        """Absorbed by this replica's link shard, whichever replica it is (never refused): the reply
        names the node's shard, where the worker sends its next heartbeat. (Workers send most
        heartbeats by datagram, synapse.master.beats; this call is their way when none is answered.)"""
        await self._worker_identity(request.node_id, context)
        reply, refused = self._shard().answer(request)
        if reply is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, refused)
        return reply

    async def WatchAssignments(self, request: api_pb2.WatchAssignmentsRequest,
                               context: Context) -> AsyncIterator[api_pb2.Assignments]:
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
        while self._shard().serving():
            changed = self.m.node_event(request.node_id)
            term = self.m.raft.term()
            with self.m.lock:
                state = self.m.state
                node = state.nodes.get(request.node_id)
                reply = api_pb2.Assignments(
                    term=term, version=state.applied,
                    node_status=node.status.value if node else "UNKNOWN",
                    tasks=[convert.assignment_to_proto(a) for a in assignments_for_node(
                        state, request.node_id, self._seal.open, self.m.config.rendezvous_ports)])
            # Only a changed list goes out (and the keepalive). A newer version alone is not worth
            # a message: every commit touching a gang would send each of its workers a list it
            # already has, and a gang's TaskPrepared and TaskStarted reports, n of them, would send
            # n x n (the last TaskPrepared, the release, then waited behind them, bench/images.py).
            # The worker misses nothing: what it runs follows from the list, and its (term,
            # version) only orders lists and says how far a replica must have applied to serve it.
            body = (reply.node_status, tuple(t.SerializeToString() for t in reply.tasks))
            sent = body != last_sent
            if self.metrics is not None:
                (self.metrics.watch_lists_sent if sent else self.metrics.watch_lists_unchanged).inc()
            if sent:
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

    async def ReportPullProgress(self, request: api_pb2.ReportPullProgressRequest,
                                 context: Context) -> api_pb2.ReportPullProgressReply:
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

    async def ReportTaskEvents(self, request: api_pb2.ReportTaskEventsRequest,
                               context: Context) -> api_pb2.ReportTaskEventsReply:
        await self._worker_identity(request.node_id, context)
        if len(request.events) > MAX_REPORTED:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"events: at most {MAX_REPORTED} per report")
        await self._leader(context)
        cmds, progress = take_reports(self.m, request)
        results = await self._propose_all(cmds, context)
        return api_pb2.ReportTaskEventsReply(accepted=progress + sum(1 for r in results if r.ok))


def _capacity_problem(capacity: Resources, request: api_pb2.RegisterNodeRequest) -> str:
    """Why a node registration is refused, or ''."""
    if capacity.is_negative():
        return "capacity: must not be negative"
    if capacity.gpu > MAX_NODE_GPUS or capacity.cpu > 1 << 32 or capacity.memory > 1 << 60:
        return "capacity: absurdly large"
    if len(request.topology) > MAX_TOPOLOGY_LABELS or any(
            not label or len(label) > MAX_LABEL_CHARS or "/" in label for label in request.topology):
        return (f"topology: at most {MAX_TOPOLOGY_LABELS} labels of 1-{MAX_LABEL_CHARS} characters, without '/'")
    if not host_port(request.address):
        return f"address: must be host:port, not {request.address[:80]!r}"
    if len(request.labels) > MAX_NODE_LABELS or any(
            not _LABEL_KEY_RE.match(k) or len(v) > MAX_LABEL_CHARS for k, v in request.labels.items()):
        return (f"labels: at most {MAX_NODE_LABELS}, named with lowercase letters, digits, '_', '.' or '-', values of "
                f"up to {MAX_LABEL_CHARS} characters")
    return ""
