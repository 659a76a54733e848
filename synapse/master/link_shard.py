"""This replica's link shard: the heartbeats of the nodes whose shard it is, absorbed in memory.

Borg's design (SCALE.md): every replica talks to a subset of the workers, chosen by
synapse.core.shards, and passes the leader only what matters. A heartbeat here is a dict write. Every
second (at most) this replica sends the leader one `LivenessDigest`: each node heard since the last digest
with the milliseconds since, plus the heartbeats that call for a change in the state (a DOWN node
heard, a health report that differs from the applied state, a GPU error it does not hold yet), which
also go at once. The leader's
brain decides expiry from the digests (synapse.core.brain.heartbeat); on the leader itself the digest is
handed to its brain without a call.

A replica hears a worker that is not its shard's too (never refused: it absorbs the heartbeat, and
its reply names the node's shard, where the worker goes next, and the order of replicas to try
when that one does not answer). A replica with no link to a leader, or none of whose digests got
through to one, for `cut_off` stops serving workers (UNAVAILABLE), so they move to another replica
within a heartbeat or two, before the leader's timeout: its silence is the leader's cue to give
their nodes that time.

Runs on the replica's event loop only; no lock of its own. Its counters are plain numbers that
metrics (synapse.master.metrics, on the HTTP thread) read whole.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from synapse.common.auth import REPLICA_CREDENTIAL_KEY
from synapse.core.brain.heartbeat import Lease, gpu_fault_change, health_change
from synapse.core.model import NodeStatus
from synapse.core.shards import ShardMap
from synapse.proto import api_pb2, api_pb2_grpc
from synapse.rpc import convert

if TYPE_CHECKING:
    from synapse.master.replica import Master

log = logging.getLogger(__name__)

#: A change (a node back up, a health report) waits at most this long to be gathered with others.
CHANGE_DELAY_S = 0.05


@dataclass(frozen=True, slots=True)
class ShardTimings:
    """The link shards' clocks, from the cluster's heartbeat interval (docs/architecture/failover.md)."""

    digest: float  #: a shard sends its digest this often (also its sign of life)
    silence: float  #: the leader holds a shard silent after this long without its digest
    #: a follower whose digests have not reached a leader for this long stops serving workers
    #: (longer than an election, so a leader change moves no worker)
    cut_off: float
    move: float  #: a silent shard's nodes may take this long, from its last digest, to be heard elsewhere

    @classmethod
    def of(cls, heartbeat_interval: float) -> ShardTimings:
        digest = min(1.0, heartbeat_interval / 2)
        cut_off = max(3.0, heartbeat_interval)
        return cls(digest=digest, silence=3 * digest, cut_off=cut_off,
                   move=cut_off + 2 * heartbeat_interval + digest)
#: Largest digest sent at once (node ids are at most 256 characters: well under the 4 MiB cap).
MAX_DIGEST_NODES = 10_000


class LinkShard:
    """Heartbeats absorbed since the last digest, the changes to forward, and the shard map."""

    def __init__(self, master: Master) -> None:
        self.m = master
        self.timings = ShardTimings.of(master.config.heartbeat_interval)
        self.heard: dict[str, float] = {}  #: node id -> monotonic time of its last heartbeat since the digest
        #: node id -> its last heartbeat that calls for a change, not yet forwarded
        self.changes: dict[str, api_pb2.HeartbeatRequest] = {}
        self.map = ShardMap([master.replica.api])  #: rebuilt by refresh_map when members or leader change
        #: when this replica last led or had a link to a leader (serving() and the digest loop)
        self.leader_contact = time.monotonic()
        self.failures = 0  #: digests not delivered since the last one that was
        #: node id -> monotonic time of its last heartbeat here, pruned of nodes silent for a
        #: heartbeat timeout every timeout (`attached`); absorb and run only
        self.seen: dict[str, float] = {}
        self.absorbed = 0  #: heartbeats absorbed (of nodes the state holds); absorb only
        self.redirects = 0  #: of those, heartbeats of nodes whose shard is another replica's; absorb only
        self.delivered = 0  #: digests that reached the leader's brain; run only
        self.failed = 0  #: digests that did not; run only
        self.delivered_at = time.monotonic()  #: when the last digest reached a leader (start: when none yet)
        self.vouched = False  #: a digest of this replica's has reached a leader (it grants leases only then)
        self.lease = Lease.of(master.config.heartbeat_timeout)  #: what a heartbeat's answer renews
        self._wake = asyncio.Event()  #: set when a change waits to be forwarded
        self._channel: tuple[str, grpc.aio.Channel] | None = None  #: (leader API address, channel to it)

    # ---- the map -----------------------------------------------------------------------------------

    def refresh_map(self) -> None:
        """Recompute the map from the configured members and the leader this replica follows."""
        try:
            partners = self.m.raft.partners()
        except Exception:  # noqa: BLE001 - pysyncobj's status read off its thread: keep the last map
            log.exception("shard map not refreshed shard=%s", self.m.replica.api)
            return
        members = [self.m.replica.api] + [api for api in map(self.m.api_of_raft, partners) if api]
        # During an election no leader is known: keep the last one (gone, or about to be confirmed),
        # so the map does not hand the nodes to every replica in turn.
        leader = self.m.leader_api_address() or self.map.leader
        if (tuple(sorted(set(members))), leader) != self.map.key():
            self.map = ShardMap(members, leader)
            log.info("shard map members=%s leader=%s", ",".join(self.map.members), leader or "-")

    def serving(self) -> bool:
        """Whether workers may attach here: it leads, or within the cut-off it has both had a link to
        a leader and got a digest through to one (an election passes unnoticed; a replica cut off
        from the others lets its workers go). A slow digest alone does not send workers away
        (moving thousands at once would only move the load onto the others): only a whole cut-off
        without one getting through does, and by then the leader holds this shard silent and gives
        its nodes only the move window (`ShardTimings.move`) to be heard elsewhere.

        A link alone is not enough. A partition that drops only this replica's outgoing packets (a
        blackhole route: chaos `partition-leader`) still lets the new leader's appends in now and
        then, so this replica named that leader, kept serving and, its map now agreeing with the
        leader's, kept its workers, while none of its digests got out. The leader never heard those
        nodes, and when its grace ran out (about 2.5 s after the heal) before the replica's first
        digest got through, it declared one DOWN."""
        if self.m.stopping:
            return False
        now = time.monotonic()
        if self.m.ready_leader_term():
            self.leader_contact = now
            return True
        if self.m.leader_api_address():
            self.leader_contact = now
        cut_off = self.timings.cut_off
        return now - self.leader_contact < cut_off and now - self.delivered_at < cut_off

    # ---- heartbeats ----------------------------------------------------------------------------------

    def absorb(self, request: api_pb2.HeartbeatRequest) -> tuple[str, tuple[str, ...]]:
        """Take one heartbeat in; (the node's status in this replica's state, '' if it holds no such
        node, and the replicas it should try in order: its shard first)."""
        node_id = request.node_id
        leader = self.m.leader_api_address()
        if leader and leader != self.map.leader:  # a new leader: the map follows it at once
            self.refresh_map()
        with self.m.lock:
            node = self.m.state.nodes.get(node_id)
            if node is None:
                return "", self.map.order_of(node_id)
            change = node.status is NodeStatus.DOWN or health_change(
                node, request.unhealthy, request.health_message, request.drain_on_failure, 0.0) is not None \
                or (len(request.gpu_errors) > 0 and gpu_fault_change(
                    node, convert.gpu_errors_from_proto(request), self.m.state.tasks_on_node(node_id), 0.0) is not None)
            status = node.status.value
        self.heard[node_id] = self.seen[node_id] = time.monotonic()
        if change:
            self.changes[node_id] = request
            self._wake.set()
        order = self.map.order_of(node_id)
        self.absorbed += 1
        if order and order[0] != self.m.replica.api:
            self.redirects += 1
        return status, order

    def answer(self, request: api_pb2.HeartbeatRequest) -> tuple[api_pb2.HeartbeatReply | None, str]:
        """A heartbeat taken in and answered, by call or by datagram alike: (the reply, '') or
        (None, why this replica will not take it: the worker tries another)."""
        if self.m.stopping:
            return None, f"replica {self.m.replica.id} is stopping; try another"
        if not self.serving():
            return None, f"replica {self.m.replica.id} has no leader in reach; attach to another"
        status, order = self.absorb(request)
        if not status and not self.m.ready_leader_term():
            # Only the leader may tell a worker to register again: a follower may not have applied
            # the registration yet (or be catching up), and a storm of re-registrations would follow.
            return None, f"replica {self.m.replica.id} does not hold node {request.node_id} (yet); try another"
        lease_ms = self.lease_ms(status)
        if status == NodeStatus.READY.value and lease_ms < self.lease.seconds * 500:
            # Less than half a lease to grant (none of its digests reached a leader lately, or
            # yet): the worker goes on to a replica that can renew its lease, in this very beat.
            return None, (f"replica {self.m.replica.id} cannot renew node {request.node_id}'s lease now "
                          "(its digests have not reached a leader lately); try another")
        return api_pb2.HeartbeatReply(node_status=status or "UNKNOWN", term=self.m.raft.term(),
                                      shard=order[0] if order else "", order=order, lease_ms=lease_ms), ""

    def lease_ms(self, status: str) -> int:
        """The lease (milliseconds) an answer to a heartbeat of a node in `status` grants: the
        whole lease from the leader, less the age of this replica's last digest to reach a leader
        from a follower, none for a node that is not READY here (synapse.core.brain.heartbeat.Lease)."""
        if status != NodeStatus.READY.value:
            return 0
        if self.m.ready_leader_term():
            age: float | None = 0.0
        else:
            age = time.monotonic() - self.delivered_at if self.vouched else None
        return int(self.lease.grant(age) * 1000)

    def attached(self) -> int:
        """Nodes heard here within the heartbeat timeout (may be called from any thread)."""
        horizon = time.monotonic() - self.m.config.heartbeat_timeout
        return sum(1 for at in list(self.seen.values()) if at >= horizon)  # one copy in C, under the GIL

    def _prune(self) -> None:
        """Forget the nodes not heard here for a heartbeat timeout (they moved, or died)."""
        horizon = time.monotonic() - self.m.config.heartbeat_timeout
        self.seen = {node_id: at for node_id, at in self.seen.items() if at >= horizon}

    # ---- digests -------------------------------------------------------------------------------------

    def take(self) -> api_pb2.LivenessDigest:
        """The digest of what was heard since the last one (which it empties)."""
        now = time.monotonic()
        heard, self.heard = self.heard, {}
        changes, self.changes = self.changes, {}
        if len(heard) > MAX_DIGEST_NODES:  # the rest goes with the next digest, a moment later
            items = list(heard.items())
            heard, self.heard = dict(items[:MAX_DIGEST_NODES]), dict(items[MAX_DIGEST_NODES:])
        return api_pb2.LivenessDigest(shard=self.m.replica.api, node_ids=list(heard),
                                      ages_ms=[int((now - t) * 1000) for t in heard.values()],
                                      changes=list(changes.values()))

    def give_back(self, digest: api_pb2.LivenessDigest) -> None:
        """A digest that did not reach the leader: its news goes with the next one."""
        now = time.monotonic()
        for node_id, age in zip(digest.node_ids, digest.ages_ms, strict=True):
            self.heard.setdefault(node_id, now - age / 1000)
        for change in digest.changes:
            self.changes.setdefault(change.node_id, change)

    async def run(self, stop: asyncio.Event) -> None:
        """Send a digest every `timings.digest`, and soon after any change, to whichever replica leads."""
        next_digest = next_prune = time.monotonic()
        while not stop.is_set():
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.0, next_digest - time.monotonic()))
                await asyncio.sleep(CHANGE_DELAY_S)
            except TimeoutError:
                pass
            self._wake.clear()
            self.refresh_map()
            full = time.monotonic() >= next_digest
            if full:
                next_digest = time.monotonic() + self.timings.digest
            if time.monotonic() >= next_prune:
                next_prune = time.monotonic() + self.m.config.heartbeat_timeout
                self._prune()
            digest = self.take() if full else api_pb2.LivenessDigest(
                shard=self.m.replica.api, changes=list(self.changes.values()))
            if not full:
                self.changes = {}
            try:
                await self.deliver(digest)
                if self.failures:
                    log.info("digests delivered again shard=%s after_failures=%d", digest.shard, self.failures)
                self.failures = 0
                self.delivered += 1
                self.delivered_at = time.monotonic()
                self.vouched = True
            except Exception as exc:  # noqa: BLE001 - any failure: the news goes with the next digest
                if not self.failures:
                    log.warning("digest not delivered shard=%s error=%s", digest.shard, str(exc)[:200])
                self.failures += 1
                self.failed += 1
                self.give_back(digest)

    async def deliver(self, digest: api_pb2.LivenessDigest) -> None:
        """Hand the digest to this replica's brain if it leads, else send it to the leader."""
        loops = self.m.leader_loops
        if loops is not None and self.m.ready_leader_term():
            loops.digest(digest)
            self.leader_contact = time.monotonic()
            return
        leader = self.m.leader_api_address()
        if not leader or leader == self.m.replica.api:
            raise ConnectionError("no leader to send the digest to")
        if self._channel is None or self._channel[0] != leader:
            if self._channel is not None:
                await self._channel[1].close()
            self._channel = (leader, self.m.api_channel(leader))
        stub = api_pb2_grpc.MasterStub(self._channel[1])
        await stub.ReportLiveness(digest, timeout=max(1.0, self.timings.digest),
                                  metadata=((REPLICA_CREDENTIAL_KEY, self.m.replica_credential()),))
        self.leader_contact = time.monotonic()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel[1].close()
            self._channel = None
