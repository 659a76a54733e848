"""The link-shard map: which master replica absorbs a node's heartbeats and serves its assignments.

Borg runs a link shard on every replica, each talking to a subset of the machines; Synapse does the
same with rendezvous (highest-random-weight) hashing of the node id over the shard hosts: every
replica and every worker computing the map from the same member list gets the same answer, and a
change of membership moves only the nodes of the replica that came or went (a node's order of the
other replicas does not depend on the one removed). The leader hosts no shard while it has a
follower to leave them to (its liveness work is then only the followers' digests), so a leader
change moves the nodes of the follower that became leader, and only those.

Members are named by their API addresses, which workers know (their master list) and replicas know
(the cluster file and the replicated directory). The map is a function of the configured members
and the leader, not of which replicas answer right now: a replica that dies keeps its place, and
its workers, finding it silent, go on to the next replica of their own order (which the map also
gives them), so replicas never disagree about the map while links flap. Pure: no clock, no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def weight(member: str, node_id: str) -> int:
    """The stable pseudo-random weight of `node_id` on `member` (the same in every process)."""
    return int.from_bytes(hashlib.blake2b(f"{member}\0{node_id}".encode(), digest_size=8).digest(), "big")


def ranked(node_id: str, members: Iterable[str]) -> list[str]:
    """The members in the order a node tries them: its shard first, then where it moves if that is gone."""
    return sorted(set(members), key=lambda m: (-weight(m, node_id), m))


def hosts(members: Iterable[str], leader: str = "") -> list[str]:
    """The members that host shards: all but the leader, unless the leader is alone."""
    members = sorted(set(members))
    others = [m for m in members if m != leader]
    return others or members


def shard_of(node_id: str, members: Iterable[str], leader: str = "") -> str:
    """The replica whose shard `node_id` belongs to ('' when there are no members)."""
    order = ranked(node_id, hosts(members, leader))
    return order[0] if order else ""


def order_of(node_id: str, members: Iterable[str], leader: str = "") -> list[str]:
    """Where a node goes: its shard, then the other shard hosts in its own order (so the nodes of a
    replica that died spread over the others), the leader last."""
    members = sorted(set(members))
    order = ranked(node_id, hosts(members, leader))
    return order + [m for m in members if m not in order]


class ShardMap:
    """`order_of` for one member list and leader, memoized per node (a replica asks on every heartbeat)."""

    def __init__(self, members: Iterable[str], leader: str = "") -> None:
        self.members = tuple(sorted(set(members)))  #: every replica's API address
        self.leader = leader  #: the leader's API address ('' if unknown)
        self._memo: dict[str, tuple[str, ...]] = {}  #: node id -> its order; filled by order_of only

    def key(self) -> tuple[tuple[str, ...], str]:
        """What the map is a function of: a replica rebuilds it when this changes."""
        return self.members, self.leader

    def order_of(self, node_id: str) -> tuple[str, ...]:
        order = self._memo.get(node_id)
        if order is None:
            order = self._memo[node_id] = tuple(order_of(node_id, self.members, self.leader))
        return order

    def shard_of(self, node_id: str) -> str:
        order = self.order_of(node_id)
        return order[0] if order else ""
