"""The masters' own RPCs: a replica's status, membership changes (an admin adds or removes a
replica), and the link shards' liveness digests to the leader (a replica's credential)."""

from __future__ import annotations

import logging

import grpc

from synapse.core import commands as c
from synapse.master.api.base import Context, ServicerBase, host_port
from synapse.master.raft import ProposeError
from synapse.proto import api_pb2

log = logging.getLogger(__name__)


class ReplicasApi(ServicerBase):
    """ReplicaStatus, AddReplica, RemoveReplica, ReportLiveness."""

    async def ReplicaStatus(self, request: api_pb2.ReplicaStatusRequest,
                            context: Context) -> api_pb2.ReplicaStatusReply:
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
            state={0: "follower", 1: "candidate", 2: "leader"}.get(status.get("state", -1), "unknown"),
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

    async def AddReplica(self, request: api_pb2.MembershipRequest, context: Context) -> api_pb2.MembershipReply:
        """Add a master replica: record its addresses, then add it to the Raft membership.
        Start the new replica's process afterwards (its cluster file lists every member)."""
        raft_address = await self._membership_request(request, context, "add")
        await self._ok_or_abort(await self._propose(c.SetReplica(
            at=self.m.now(), by=self.caller().name, id=request.id, raft_address=raft_address,
            api_address=request.api_address), context), context)
        await self._change_membership("add", request.id, raft_address, context)
        return api_pb2.MembershipReply(message=f"replica {request.id} added at {request.raft_address}; "
                                               "start its process now")

    async def RemoveReplica(self, request: api_pb2.MembershipRequest, context: Context) -> api_pb2.MembershipReply:
        """Remove a master replica from the Raft membership (then stop its process)."""
        raft_address = await self._membership_request(request, context, "remove")
        await self._change_membership("remove", request.id, raft_address, context)
        await self._propose(c.SetReplica(at=self.m.now(), by=self.caller().name, id=request.id,
                                         raft_address=raft_address, api_address="", removed=True), context)
        return api_pb2.MembershipReply(message=f"replica {request.id} removed")

    async def _membership_request(self, request: api_pb2.MembershipRequest, context: Context, action: str) -> str:
        """The Raft address of the replica to add or remove, once the request is valid and this
        replica leads (a follower redirects: it may be the one to remove)."""
        await self._check_id(request.id, "id", context)
        raft_address = request.raft_address
        if action == "remove" and not raft_address:
            known = {r.id: r.raft for r in self.m.config.replicas}
            with self.m.lock:
                known.update({k: v[0] for k, v in self.m.state.replicas.items()})
            raft_address = known.get(request.id, "")
        if not host_port(raft_address):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"raft_address: must be host:port, not {raft_address!r} (unknown replica?)")
        if action == "add" and not host_port(request.api_address):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"api_address: must be host:port, not {request.api_address!r}")
        await self._leader(context)
        if action == "remove" and raft_address == self.m.replica.raft:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "the leader cannot remove itself; stop it first so another replica leads")
        return raft_address

    async def _change_membership(self, action: str, replica_id: str, raft_address: str, context: Context) -> None:
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

    async def ReportLiveness(self, request: api_pb2.LivenessDigest, context: Context) -> api_pb2.LivenessDigestReply:
        """A link shard's digest, for the leader's brain."""
        term = await self._leader(context)
        if len(request.node_ids) != len(request.ages_ms):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "node_ids and ages_ms: one age per node")
        loops = self.m.leader_loops
        if loops is not None:
            loops.digest(request)
        return api_pb2.LivenessDigestReply(term=term)
