"""A follower's handling of AppendEntries, message by message, on a real (unconnected) SyncObj.

pysyncobj 0.3.17 truncates everything after prevLogIdx before it appends. The first test shows
what that costs on the bare library: a repeated, shorter append from the same leader removes
entries the follower has already applied. SafeSyncObj follows Raft's receiver rules instead.
"""

from __future__ import annotations

import itertools
import logging

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.syncobj import _COMMAND_TYPE, _bchr

from synapse.master.safesyncobj import SafeSyncObj, held_prefix

NOOP = _bchr(_COMMAND_TYPE.NO_OP)
_ports = itertools.count(47100)


def follower(cls, tmp_path):
    port = next(_ports)
    conf = SyncObjConf(autoTick=False, password="test", appendEntriesUseBatch=False,
                       journalFile=str(tmp_path / f"j{port}"), fullDumpFile=str(tmp_path / f"d{port}"))
    node = cls(f"127.0.0.1:{port}", [f"127.0.0.1:{port + 1000}"], conf=conf)
    leader = next(iter(node._SyncObj__otherNodes))
    sent: list[dict] = []
    node._SyncObj__transport.send = lambda _node, message: sent.append(message) or True

    def deliver(prev: int, prev_term: int, entries: list[tuple[int, int]], commit: int, term: int = 1) -> None:
        node._SyncObj__onMessageReceived(leader, {
            "type": "append_entries", "term": term, "commit_index": commit,
            "prevLogIdx": prev, "prevLogTerm": prev_term,
            "entries": [(NOOP, index, t) for index, t in entries]})
        node._SyncObj__applyLogEntries()

    return node, deliver, sent


def log_of(node) -> list[tuple[int, int]]:
    return [(entry[1], entry[2]) for entry in node._SyncObj__raftLog[:]]


def applied(node) -> int:
    return node._SyncObj__raftLastApplied


@pytest.fixture
def quiet_pysyncobj():
    logger = logging.getLogger("pysyncobj.syncobj")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    yield
    logger.setLevel(level)


def test_bare_pysyncobj_drops_applied_entries_on_a_repeated_append(tmp_path, quiet_pysyncobj):
    node, deliver, _ = follower(SyncObj, tmp_path)
    try:
        deliver(1, 0, [(2, 1), (3, 1), (4, 1)], commit=4)
        assert applied(node) == 4
        deliver(1, 0, [(2, 1)], commit=4)  # the same leader repeats a shorter prefix
        assert log_of(node) == [(1, 0), (2, 1)]  # entries 3 and 4, applied, are gone
        assert applied(node) == 4
    finally:
        node.destroy()


def test_a_repeated_append_keeps_what_the_follower_holds(tmp_path):
    node, deliver, sent = follower(SafeSyncObj, tmp_path)
    try:
        deliver(1, 0, [(2, 1), (3, 1), (4, 1)], commit=4)
        deliver(1, 0, [(2, 1)], commit=4)
        assert log_of(node) == [(1, 0), (2, 1), (3, 1), (4, 1)]
        assert applied(node) == 4
        assert sent[-1] == {"type": "next_node_idx", "next_node_idx": 3, "reset": False, "success": True}
        deliver(2, 1, [(3, 1), (4, 1), (5, 1)], commit=5)  # overlapping: only 5 is new
        assert log_of(node)[-1] == (5, 1) and len(log_of(node)) == 5
        assert applied(node) == 5 and not node.diverged
    finally:
        node.destroy()


def test_commit_never_passes_the_last_entry_the_leader_vouched_for(tmp_path):
    node, deliver, _ = follower(SafeSyncObj, tmp_path)
    try:
        deliver(1, 0, [(2, 1), (3, 1), (4, 1)], commit=1)  # held, not yet committed
        assert applied(node) == 1
        # A new leader (term 2) whose log matches up to 2 reports commit 4: entries 3 and 4 here
        # may be stale, so the follower commits only what this message covers.
        deliver(1, 0, [(2, 1)], commit=4, term=2)
        assert applied(node) == 2
        assert log_of(node) == [(1, 0), (2, 1), (3, 1), (4, 1)]
    finally:
        node.destroy()


def test_conflicting_unapplied_entries_are_replaced(tmp_path):
    node, deliver, _ = follower(SafeSyncObj, tmp_path)
    try:
        deliver(1, 0, [(2, 1), (3, 1), (4, 1)], commit=2)
        deliver(2, 1, [(3, 2)], commit=3, term=2)  # a new leader overwrites 3 and drops 4
        assert log_of(node) == [(1, 0), (2, 1), (3, 2)]
        assert applied(node) == 3 and not node.diverged
    finally:
        node.destroy()


def test_a_conflict_at_an_applied_index_fail_stops_the_replica(tmp_path, quiet_pysyncobj):
    node, deliver, _ = follower(SafeSyncObj, tmp_path)
    try:
        deliver(1, 0, [(2, 1), (3, 1)], commit=3)
        deliver(2, 1, [(3, 2), (4, 2)], commit=4, term=2)
        assert "index 3" in node.diverged
        assert log_of(node) == [(1, 0), (2, 1), (3, 1)]  # nothing applied is touched
        deliver(3, 1, [(4, 1)], commit=4)  # and nothing more is accepted
        assert log_of(node)[-1] == (3, 1)
    finally:
        node.destroy()


def test_a_heartbeat_that_would_cut_applied_entries_fail_stops(tmp_path, quiet_pysyncobj):
    node, deliver, _ = follower(SafeSyncObj, tmp_path)
    try:
        deliver(1, 0, [(2, 1), (3, 1)], commit=3)
        deliver(2, 1, [], commit=3, term=2)
        assert "index 3" in node.diverged
    finally:
        node.destroy()


def test_held_prefix():
    log = {1: 0, 2: 1, 3: 1, 4: 2}
    assert held_prefix(log.get, [(b"", 2, 1), (b"", 3, 1), (b"", 4, 2)]) == 3
    assert held_prefix(log.get, [(b"", 2, 1), (b"", 3, 2)]) == 1
    assert held_prefix(log.get, [(b"", 5, 2)]) == 0
    assert held_prefix(log.get, []) == 0
