"""SafeSyncObj and pysyncobj's internals: links kept to the leader, snapshots free of our fields.

A follower replaying the removal of the replica that now leads keeps listening to it.

A replica that joins empty (or restarts from an old snapshot) replays old membership changes. When
one of them removed the replica that leads today, pysyncobj dropped the link to the leader and
refused it afterwards: the entry that added the leader back could never arrive, and the replica
never caught up (seen in the chaos runs' replace-follower faults). Three SafeSyncObj replicas in this
process, ticked by hand on 127.0.0.1; the replay is driven through pysyncobj's own change method.
"""

from __future__ import annotations

import pytest

from synapse.master.safesyncobj import SafeSyncObj
from tests.support.raft import elect, start, tick

pytestmark = pytest.mark.slow


class Unguarded(SafeSyncObj):
    """pysyncobj's plain link handling, to show the test fails without the guard."""

    def _guarded_drop(self, node) -> None:
        self._drop_link(node)

    def _guarded_add(self, node) -> None:
        self._add_link(node)


def _stored(leader, follower) -> bool:
    """The leader knows the follower stores its whole log (its match index for it is the last)."""
    match = {n.address: i for n, i in leader._SyncObj__raftMatchIndex.items()}
    return match.get(follower.selfNode.address) == leader._SyncObj__getCurrentLogIndex()


def replay_removal_of_leader(tmp_path, cls) -> tuple[bool, bool]:
    """(a follower, after replaying 'remove the leader', still follows the leader's commits;
    after replaying 'add it back', it still does)."""
    addrs, nodes = start(tmp_path, cls)
    try:
        leader = elect(nodes)
        follower = nodes[(leader + 1) % 3]
        leader_node = nodes[leader]
        follower._SyncObj__doChangeCluster(("rem", addrs[leader]))
        tick(nodes, 1.0)
        leader_node.addNodeToCluster("127.0.0.1:9")  # a new entry (for a member that never answers)
        tick(nodes, 2.0)
        after_removal = _stored(leader_node, follower)
        follower._SyncObj__doChangeCluster(("add", addrs[leader]))
        leader_node.removeNodeFromCluster("127.0.0.1:9")
        tick(nodes, 2.0)
        after_add = _stored(leader_node, follower) and not follower._kept_links
        return after_removal, after_add
    finally:
        for node in nodes:
            node.destroy()


def test_a_follower_replaying_the_removal_of_its_leader_keeps_following_it(tmp_path):
    assert replay_removal_of_leader(tmp_path, SafeSyncObj) == (True, True)


def test_without_the_guard_the_follower_loses_its_leader(tmp_path):
    after_removal, _ = replay_removal_of_leader(tmp_path, Unguarded)
    assert not after_removal


def test_snapshots_carry_none_of_safesyncobj_s_own_attributes(tmp_path):
    """pysyncobj pickles into each snapshot every attribute set after its __init__ listed its own,
    and a replica loading the snapshot takes them over. A bound method among them made every
    snapshot fail to store; runtime fields (pre-vote rounds, tick times) travelled to other
    replicas. After elections, pre-votes and a replayed membership change, there must be none."""
    addrs, nodes = start(tmp_path, SafeSyncObj)
    try:
        leader = elect(nodes)
        nodes[(leader + 1) % 3]._SyncObj__doChangeCluster(("rem", addrs[leader]))
        tick(nodes, 0.5)
        assert [n.snapshot_extras() for n in nodes] == [[], [], []]
    finally:
        for node in nodes:
            node.destroy()
