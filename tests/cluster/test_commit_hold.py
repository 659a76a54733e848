"""The leader's commit index rides on the next entry's AppendEntries, or follows alone soon after.

pysyncobj (batching off) sent each follower one AppendEntries per new entry and another, empty but
for the commit index, after each apply. SafeSyncObj holds that second message up to COMMIT_HOLD_S
for the next entry to carry it. Three replicas in this process, ticked by hand on 127.0.0.1; the
writes go one entry at a time, the next proposed once the previous one is applied, as
synapse.master.raft.RaftNode proposes under load.
"""

from __future__ import annotations

import time

import pytest

from synapse.core import codec
from synapse.core import commands as c
from synapse.master.durability import seal
from synapse.master.safesyncobj import SafeSyncObj
from tests.support.raft import elect, start, tick

pytestmark = pytest.mark.slow


class Immediate(SafeSyncObj):
    """pysyncobj's own rule: the commit index goes out alone right after each apply."""

    COMMIT_HOLD_S = 0.0


def count_appends(nodes) -> dict:
    """Count, per (sender, receiver address), the AppendEntries each replica sends."""
    counts: dict = {}
    for i, node in enumerate(nodes):
        own = node._send

        def send(peer, message, i=i, own=own) -> bool:
            if message.get("type") == "append_entries":
                key = (i, peer.address)
                counts[key] = counts.get(key, 0) + 1
            return own(peer, message)

        node._send = send
    return counts


def write_in_a_pipeline(nodes, leader: int, writes: int) -> list[int]:
    """Propose `writes` entries on the leader, each once the previous one is applied there (the
    ticks run meanwhile); the error codes of their callbacks."""
    outcomes: list[int] = []
    replicated = nodes[leader]._SyncObj__consumers[0]
    deadline = time.monotonic() + 30
    for i in range(writes):
        done: list[int] = []
        entry = seal(codec.encode_command(c.Barrier(at=float(i))))
        replicated.apply(entry, callback=lambda r, e, done=done: done.append(e))
        while not done and time.monotonic() < deadline:
            for node in nodes:
                node._onTick(0.0005)
        outcomes.extend(done)
    return outcomes


def commit_messages(tmp_path, cls, writes: int = 40, more_coming=None,
                    urgent: bool = False) -> tuple[float, list[int], list[int]]:
    """(AppendEntries per entry the leader sent each follower during the writes, each follower's
    commit index after the writes and a short quiet spell, the leader's). `more_coming`: what the
    leader's proposer says of proposals waiting for the next entry (None: it says nothing);
    `urgent`: every entry changes what a worker runs (the leader's apply says so, as
    synapse.master.replica.Replica.on_applied does for a placement)."""
    _, nodes = start(tmp_path, cls)
    try:
        leader = elect(nodes)
        nodes[leader].more_coming = more_coming
        if urgent:
            nodes[leader]._SyncObj__consumers[0].listener = lambda applied: nodes[leader].commit_at_once()
        tick(nodes, 0.2)
        counts = count_appends(nodes)
        outcomes = write_in_a_pipeline(nodes, leader, writes)
        assert outcomes == [0] * writes  # FAIL_REASON.SUCCESS, every one
        sent = sum(n for (i, _), n in counts.items() if i == leader)
        per_entry = sent / (2 * writes)  # two followers
        tick(nodes, 3 * SafeSyncObj.COMMIT_HOLD_S)  # well under a heartbeat (50 ms)
        commits = [n.raftCommitIndex for n in nodes]
        leader_commit = commits.pop(leader)
        return per_entry, commits, [leader_commit]
    finally:
        for node in nodes:
            node.destroy()


def test_a_leader_under_a_stream_of_writes_sends_one_appendentries_per_entry(tmp_path):
    per_entry, followers, [leader] = commit_messages(tmp_path, SafeSyncObj)
    assert per_entry < 1.4, f"{per_entry:.2f} AppendEntries per entry and follower"
    # The last write's commit index reached the followers alone, within the hold, not a heartbeat.
    assert followers == [leader, leader]


def test_with_no_proposal_waiting_the_commit_index_goes_out_at_once(tmp_path):
    """An idle leader (raft.RaftNode says no proposal waits) holds nothing: followers, which serve
    the workers' assignments, apply each write as soon as pysyncobj would have them."""
    per_entry, followers, [leader] = commit_messages(tmp_path, SafeSyncObj, more_coming=lambda: False)
    assert per_entry > 1.8, f"{per_entry:.2f} AppendEntries per entry and follower"
    assert followers == [leader, leader]


def test_without_the_hold_each_entry_costs_two(tmp_path):
    per_entry, followers, [leader] = commit_messages(tmp_path, Immediate)
    assert per_entry > 1.8, f"{per_entry:.2f} AppendEntries per entry and follower"
    assert followers == [leader, leader]


def test_after_an_entry_that_changes_what_a_worker_runs_the_commit_index_goes_out_at_once(tmp_path):
    """A gang's placement (or a stop) applied on the leader: the workers that watch a follower wait
    for that follower to learn the commit, so it is not held for the next entry."""
    per_entry, followers, [leader] = commit_messages(tmp_path, SafeSyncObj, urgent=True)
    assert per_entry > 1.8, f"{per_entry:.2f} AppendEntries per entry and follower"
    assert followers == [leader, leader]
