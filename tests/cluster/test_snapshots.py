"""Snapshots (raft.dump) are written by a thread of the replica, never by a forked child.

pysyncobj forks the replica to write each snapshot. A master is a gRPC server with many threads:
in the long chaos runs the children failed ("Failed to store full dump"), and while one lived the
leader streamed no snapshot to any follower, so a replica that joined behind the leader's log start
waited for one in vain. `SnapshotWriter` writes from a thread, keeps streaming the previous file
meanwhile, and fsyncs what it writes and what it receives.
"""

from __future__ import annotations

import logging
import os
import threading

import pytest
from pysyncobj.config import SERIALIZER_STATE

from synapse.core import codec
from synapse.core import commands as c
from synapse.local.cluster import free_base_port
from synapse.master.durability import SnapshotWriter, seal
from synapse.master.raft import raft_config
from synapse.master.replicated import ReplicatedState
from synapse.master.safesyncobj import SafeSyncObj
from tests.support.raft import cut_off, elect, tick


def wait_written(writer: SnapshotWriter) -> tuple[int, int]:
    for _ in range(500):
        state, index = writer.checkSerializing()
        if state != SERIALIZER_STATE.SERIALIZING:
            return state, index
        threading.Event().wait(0.01)
    raise AssertionError("the snapshot was not written within 5 s")


def log_start(node: SafeSyncObj) -> int:
    return node._SyncObj__raftLog[0][1]


class Held(SnapshotWriter):
    """A writer whose thread waits for `release` before it writes."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.release = threading.Event()

    def _write(self, data, index, installs):
        self.release.wait(10)
        super()._write(data, index, installs)


def test_a_snapshot_written_by_a_thread_loads_as_pysyncobj_s_own(tmp_path):
    writer = SnapshotWriter(str(tmp_path / "raft.dump"), 1 << 10)
    data = ([{}, {"state": list(range(5000))}], ("entry", 41, 3), ("entry", 40, 3), {"peer"})
    writer.serialize(data, 40)
    assert wait_written(writer) == (SERIALIZER_STATE.SUCCESS, 40)
    assert writer.checkSerializing() == (SERIALIZER_STATE.NOT_SERIALIZING, None)
    assert writer.deserialize() == data
    assert not (tmp_path / "raft.dump.tmp").exists()


def test_snapshots_keep_streaming_to_followers_while_the_next_one_is_written(tmp_path):
    """pysyncobj's transmission answers nothing while its child writes: the stall behind grow-shrink."""
    writer = Held(str(tmp_path / "raft.dump"), 1 << 10)
    release = writer.release
    writer.serialize(([{}, {"state": "first"}], None, None, set()), 1)
    release.set()
    assert wait_written(writer)[0] == SERIALIZER_STATE.SUCCESS
    release.clear()
    writer.serialize(([{}, {"state": "second" * 1000}], None, None, set()), 2)
    assert writer.checkSerializing() == (SERIALIZER_STATE.SERIALIZING, 2)
    chunk, first, last = writer.getTransmissionData("follower")
    assert first and not last and len(chunk) > 0  # the first file, while the second is written
    release.set()
    assert wait_written(writer) == (SERIALIZER_STATE.SUCCESS, 2)


def test_a_failed_write_is_reported_with_its_reason_and_retried_later(tmp_path, caplog):
    writer = SnapshotWriter(str(tmp_path / "gone" / "raft.dump"), 1 << 10)
    writer.serialize(([{}, {}], None, None, set()), 7)
    with caplog.at_level(logging.WARNING, logger="synapse.master.durability"):
        assert wait_written(writer) == (SERIALIZER_STATE.FAILED, 7)
    assert "snapshot not written index=7: FileNotFoundError" in caplog.text
    # pysyncobj would build the next snapshot at the next tick: it is told a write is under way
    assert writer.checkSerializing()[0] == SERIALIZER_STATE.SERIALIZING
    writer._retry_at = 0.0
    assert writer.checkSerializing() == (SERIALIZER_STATE.NOT_SERIALIZING, None)


def test_a_write_that_began_before_a_snapshot_from_the_leader_arrived_does_not_replace_it(tmp_path):
    """A follower compacts on its own; the leader's newer snapshot, installed meanwhile, must stay."""
    leader = SnapshotWriter(str(tmp_path / "leader.dump"), 1 << 6)
    leader.serialize(([{}, {"state": "the leader's, newer"}], ("e", 91, 2), ("e", 90, 2), set()), 90)
    assert wait_written(leader)[0] == SERIALIZER_STATE.SUCCESS
    follower = Held(str(tmp_path / "raft.dump"), 1 << 6)
    release = follower.release
    follower.serialize(([{}, {"state": "the follower's own, older"}], ("e", 41, 1), ("e", 40, 1), set()), 40)
    assert any(follower.setTransmissionData(leader.getTransmissionData("follower")) for _ in range(100))
    release.set()
    state, index = wait_written(follower)
    assert (state, index) == (SERIALIZER_STATE.FAILED, 40)
    assert follower.deserialize()[0][1] == {"state": "the leader's, newer"}
    assert not (tmp_path / "raft.dump.tmp").exists()


@pytest.mark.flaky(reruns=2)  # real pysyncobj timers ticked by hand: load can delay a catch-up past its ticks
def test_a_follower_behind_the_log_start_catches_up_from_a_snapshot_without_any_fork(tmp_path, monkeypatch):
    """Three replicas ticked by hand; one is cut off while the others commit and compact past it."""
    def no_fork():
        raise AssertionError("a replica forked")
    monkeypatch.setattr(os, "fork", no_fork)
    base = free_base_port(3)
    addrs = [f"127.0.0.1:{base + i}" for i in range(3)]
    states = [ReplicatedState() for _ in addrs]
    nodes = [SafeSyncObj(a, [b for b in addrs if b != a], consumers=[states[i]],
                         conf=raft_config(bind_address=a, data_dir=str(tmp_path / f"r{i}"), password="pw",
                                          autoTick=False, logCompactionMinEntries=20))
             for i, a in enumerate(addrs)]
    try:
        leader = elect(nodes)
        behind = (leader + 1) % 3
        cut = {behind}
        cut_off(nodes, addrs, behind, cut)
        done: list[object] = []
        for i in range(120):
            entry = seal(codec.encode_command(c.Barrier(at=float(i))))
            states[leader].apply(entry, callback=lambda r, e: done.append(e))
            tick(nodes, 0.01)
        for _ in range(300):
            tick(nodes, 0.05)
            if len(done) == 120 and log_start(nodes[leader]) > nodes[behind]._SyncObj__getCurrentLogIndex():
                break
        start = log_start(nodes[leader])
        assert start > nodes[behind]._SyncObj__getCurrentLogIndex(), "the leader did not compact past the follower"
        cut.clear()
        for _ in range(200):
            tick(nodes, 0.05)
            if states[behind].digest() == states[leader].digest():
                break
        assert states[behind].digest() == states[leader].digest()
        assert log_start(nodes[behind]) >= start  # it got there by a snapshot
        assert os.path.exists(tmp_path / f"r{behind}" / "raft.dump")
    finally:
        for node in nodes:
            node.destroy()


class Untrimmed(SafeSyncObj):
    def _SyncObj__deleteEntriesTo(self, index):  # noqa: N802 - pysyncobj's mangled name
        pass


def test_a_restart_between_the_snapshot_and_the_journal_trim_keeps_the_journal_after_it(tmp_path):
    """A replica stopped after its new raft.dump was in place and before the tick that deletes the
    journal's entries up to it: pysyncobj cleared the whole journal on the next start, entries
    after the snapshot included. Here the trim never runs, as if the replica had stopped."""
    base = free_base_port(1)
    data_dir = tmp_path / "r"

    def replica(cls=SafeSyncObj):
        state = ReplicatedState()
        node = cls(f"127.0.0.1:{base}", [], consumers=[state],
                           conf=raft_config(bind_address=f"127.0.0.1:{base}", data_dir=str(data_dir), password="pw",
                                            autoTick=False, logCompactionMinEntries=1000))
        return node, state

    def append(node, state, n):
        for i in range(n):
            state.apply(seal(codec.encode_command(c.Barrier(at=float(i)))), callback=lambda r, e: None)
            tick([node], 0.01)
        tick([node], 0.2)

    node, state = replica(Untrimmed)  # stopped before the trim
    try:
        elect([node])
        append(node, state, 30)
        node.forceLogCompaction()
        for _ in range(500):
            tick([node], 0.02)
            if (data_dir / "raft.dump").exists() and node._SyncObj__serializer._writer is None:
                break  # written, and its success seen by pysyncobj (which would trim the journal now)
        assert (data_dir / "raft.dump").exists() and node._SyncObj__serializer._writer is None
        append(node, state, 10)  # entries after the snapshot
        last, digest = node._SyncObj__getCurrentLogIndex(), state.digest()
        assert log_start(node) == 1 and last > 40
    finally:
        node.destroy()
    node, state = replica()
    try:
        elect([node])
        assert log_start(node) > 1, "the snapshot was not loaded"
        assert node._SyncObj__getCurrentLogIndex() >= last, "entries after the snapshot were dropped"
        assert state.digest() == digest  # every command applied again, from the snapshot and the journal
    finally:
        node.destroy()
