"""Fencing by lease, the arithmetic: the lease ends a margin before the node can be declared down, and a
follower grants less the longer its digests have not reached a leader (the fence's processes are in
tests/cluster/test_fencing.py)."""

from __future__ import annotations

from synapse.core.brain.heartbeat import Lease


def test_the_lease_ends_a_margin_before_the_node_can_be_declared_down():
    assert Lease.of(10.0).seconds == 8.0  # a fifth of the timeout
    assert Lease.of(3.0).seconds == 2.0  # at least a second
    for timeout in (1.5, 3.0, 10.0, 60.0):
        lease = Lease.of(timeout)
        assert timeout - lease.seconds >= max(1.0, timeout / 5) - 1e-9


def test_a_follower_grants_less_the_longer_its_digests_have_not_reached_a_leader():
    lease = Lease(8.0)
    assert lease.grant(0.0) == 8.0  # the leader, or a follower whose digest just got through
    assert lease.grant(3.0) == 5.0
    assert lease.grant(9.0) == 0.0  # cut off longer than a lease: nothing
    assert lease.grant(None) == 0.0  # none of its digests has reached a leader yet
