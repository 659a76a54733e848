"""A follower whose link to the leader closes campaigns at once (SafeSyncObj._leader_link_lost).

Three SafeSyncObj replicas in this process, ticked by hand on 127.0.0.1, with election timeouts of
2-3 s so that the fast path and the timer cannot be confused on a loaded machine: the leader's
sockets close (as when its process dies), and the others elect a new leader well before any
election timer could fire; without the fast path, only a timer elects one.
"""

from __future__ import annotations

import time

import pytest

from synapse.local.cluster import free_base_port
from synapse.master.raft import RaftTimeouts, raft_config
from synapse.master.replicated import ReplicatedState
from synapse.master.safesyncobj import SafeSyncObj

pytestmark = pytest.mark.slow

SLOW = RaftTimeouts(election_min=2.0, election_max=3.0, leader_fallback=2.0)


class TimerOnly(SafeSyncObj):
    FAST_FAILOVER = False


class Counted(SafeSyncObj):
    """Counts the links to a leader it saw close."""

    def __init__(self, *args, **kwargs) -> None:
        self.links_lost = 0
        super().__init__(*args, **kwargs)

    def _leader_link_lost(self, node) -> None:
        self.links_lost += 1
        super()._leader_link_lost(node)


def tick(nodes, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for node in nodes:
            node._onTick(0.002)


def seconds_to_a_new_leader(tmp_path, cls, *, cut: bool) -> float:
    """Elect a leader, then close its sockets (`cut`: it also goes on living, deaf to one follower
    only). Seconds until another leads (inf: not within 5 s)."""
    base = free_base_port(3)
    addrs = [f"127.0.0.1:{base + i}" for i in range(3)]
    nodes = [cls(a, [b for b in addrs if b != a], consumers=[ReplicatedState()],
                 conf=raft_config(bind_address=a, data_dir=str(tmp_path / f"r{i}"), password="pw", timeouts=SLOW,
                                  autoTick=False))
             for i, a in enumerate(addrs)]
    destroyed = set()
    try:
        for _ in range(100):
            tick(nodes, 0.1)
            leaders = [i for i, n in enumerate(nodes) if n._isLeader()]
            if len(leaders) == 1 and all(n._getLeader() is not None for n in nodes):
                break
        [old] = leaders
        rest = [n for i, n in enumerate(nodes) if i != old]
        tick(nodes, 0.2)  # every follower has just heard the leader
        started = time.monotonic()
        if cut:  # one follower's link to the live leader closes (pysyncobj reconnects it); the other still hears it
            follower = rest[0]
            follower._SyncObj__transport._connections[nodes[old]._SyncObj__selfNode].disconnect()
            live = nodes
        else:
            nodes[old].destroy()  # its sockets close, as a killed process's do
            destroyed.add(old)
            live = rest
        while time.monotonic() - started < 5.0:
            tick(live, 0.02)
            if any(n._isLeader() for i, n in enumerate(nodes) if i != old):
                return time.monotonic() - started
        return float("inf")
    finally:
        for i, node in enumerate(nodes):
            if i not in destroyed:
                node.destroy()


def test_a_dead_leader_is_replaced_before_any_election_timer_fires(tmp_path):
    took = seconds_to_a_new_leader(tmp_path, SafeSyncObj, cut=False)
    print(f"new leader after {took:.3f} s")
    assert took < SLOW.election_min / 2, took


def test_without_the_fast_path_only_a_timer_replaces_it(tmp_path):
    took = seconds_to_a_new_leader(tmp_path, TimerOnly, cut=False)
    print(f"new leader after {took:.3f} s")
    assert SLOW.election_min - 0.3 <= took < float("inf"), took


def test_a_link_lost_to_a_leader_that_lives_deposes_no_one(tmp_path):
    """The other follower still hears the leader: it refuses the pre-vote, and the leader stays."""
    lost: list[int] = []

    class Seen(Counted):
        def destroy(self) -> None:
            lost.append(self.links_lost)
            super().destroy()

    assert seconds_to_a_new_leader(tmp_path, Seen, cut=True) == float("inf")
    assert sum(lost) >= 1, lost  # the follower did see its link to the leader close
