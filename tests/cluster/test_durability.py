"""Durability: corrupt or truncated journals are refused, a full disk is refused before it kills."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from synapse.client.master_client import ClientError, ClusterUnavailable
from synapse.core import codec
from synapse.local import cluster as local
from synapse.master.durability import CorruptionError, check_journal, fsync_durable, seal, unseal
from tests.support.cluster import LocalCluster, wait_exit
from tests.support.helpers import spec, wait_for
from tests.support.paths import ROOT


def test_seal_detects_any_flipped_byte():
    sealed = seal(b"a command payload")
    assert unseal(sealed) == b"a command payload"
    for i in range(len(sealed)):
        damaged = sealed[:i] + bytes([sealed[i] ^ 0x40]) + sealed[i + 1:]
        with pytest.raises(CorruptionError):
            unseal(damaged)


@pytest.mark.slow
def test_every_journal_append_reaches_the_disk_through_fdatasync_of_the_journal(tmp_path, monkeypatch):
    from pysyncobj import SyncObj, SyncObjConf

    journal_path = tmp_path / "raft.journal"
    conf = SyncObjConf(autoTick=False, password="test", journalFile=str(journal_path),
                       fullDumpFile=str(tmp_path / "raft.dump"))
    node = SyncObj("127.0.0.1:47290", [], conf=conf)
    try:
        synced: list[int] = []
        monkeypatch.setattr(os, "fdatasync", lambda fd: synced.append(os.fstat(fd).st_ino))
        fsync_durable(node)
        journal = node._SyncObj__raftLog
        journal.add(b"\x01", len(journal) + 1, 1)
        journal.deleteEntriesFrom(len(journal))
        assert synced == [journal_path.stat().st_ino] * 2
    finally:
        node.destroy()


def test_corrupt_journal_is_refused_and_the_replica_rebuilds_from_its_peers(make_cluster):
    cluster = make_cluster()
    for i in range(5):
        cluster.client.submit(codec.job_spec_to_proto(spec(name=f"durable-{i}")), request_id=f"durable-{i}")
    digest = cluster.converged_digest()
    victim = next(m for m in ("m1", "m2", "m3") if m != cluster.wait_leader())
    cluster.kill_master(victim)
    journal = cluster.data_dir / "masters" / victim / "raft.journal"
    data = bytearray(journal.read_bytes())
    at = data.find(b"durable-3")
    assert at > 0
    data[at + 2] ^= 0x01  # one bit
    journal.write_bytes(bytes(data))
    assert "CRC32" in check_journal(journal)

    cluster.restart_master(victim)
    assert wait_exit(cluster.master(victim)["pid"]) == 3
    log = (cluster.data_dir / "logs" / f"{victim}.log").read_text()
    assert "journal corrupt" in log and "synapse-master rebuild" in log

    rebuild = subprocess.run([sys.executable, "-m", "synapse.master", "rebuild", "--config",
                              str(cluster.data_dir / "cluster.yaml"), "--id", victim],
                             capture_output=True, text=True, cwd=ROOT)
    assert rebuild.returncode == 0 and "moved" in rebuild.stdout
    cluster.restart_master(victim)
    # The rebuilt replica holds the leader's state: compared once both have applied the same
    # commands (two status calls in a row raced the leader's own periodic commands on a loaded run).
    def same_point():
        try:
            mine = cluster.client.replica_status(cluster.master(victim)["api_address"], digest=True)
            theirs = cluster.client.replica_status(cluster.client.leader, digest=True)
        except (ClientError, ClusterUnavailable):  # the restarted replica does not answer yet
            return None
        return (mine, theirs) if mine.commands_applied == theirs.commands_applied else None
    mine, theirs = wait_for(same_point, 30, "the rebuilt replica to catch up with the leader")
    assert mine.digest == theirs.digest
    assert len(cluster.client.list_jobs()) == 5 and digest


def test_truncated_journal_is_reported(tmp_path):
    from synapse.master.raft import RaftNode, raft_config

    node = RaftNode("127.0.0.1:1", [], raft_config(bind_address=f"127.0.0.1:{local.free_base_port(1)}",
                                                   data_dir=str(tmp_path), password="pw"))
    node.destroy()
    journal = tmp_path / "raft.journal"
    assert check_journal(journal) == ""
    data = journal.read_bytes()
    records_end = int.from_bytes(data[36:40], "little")  # the header says where the records end
    journal.write_bytes(data[:records_end - 3])  # the file cut short inside its last record
    assert "truncated" in check_journal(journal)


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    run = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True)
    if run.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here (needs root): {run.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.mark.slow
def test_full_disk_refuses_writes_then_stops_cleanly(small_disk):
    cluster = LocalCluster(small_disk / "c", masters=3, workers=0, racks=1, gpus=8, min_free_disk="32Mi")
    try:
        cluster.client.submit(codec.job_spec_to_proto(spec()))
        filler = small_disk / "filler"
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        with open(filler, "wb") as f:
            f.write(b"\0" * (free - (20 << 20)))  # 20 MiB left: below 32 MiB, above a quarter of it
        time.sleep(0.3)  # the leader reads the disk again at most every replica.DISK_CHECK_S
        with pytest.raises(ClientError) as err:
            cluster.client.submit(codec.job_spec_to_proto(spec()))
        assert err.value.code.name == "RESOURCE_EXHAUSTED" and "writes are refused" in err.value.message
        assert len(cluster.client.list_jobs()) == 1  # reads still work
        with open(filler, "ab") as f:
            f.write(b"\0" * (16 << 20))  # ~4 MiB left: below a quarter; replicas stop, no SIGBUS
        codes = [wait_exit(m["pid"]) for m in cluster.state["masters"]]
        assert codes == [3, 3, 3], codes
        logs = "".join((cluster.data_dir / "logs" / f"{m['id']}.log").read_text() for m in cluster.state["masters"])
        assert "stopping before the journal cannot grow" in logs and "SIGBUS" not in logs
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_leader_sends_a_new_entry_before_it_flushes_it_and_counts_it_only_after(tmp_path, monkeypatch):
    """The leader's own flush of a new entry overlaps the followers' (durability.JournalFlush): its
    AppendEntries go out before its fdatasync, and the entry commits (the proposer's callback)
    only after that fdatasync, so an acknowledged write is still on a majority's disks."""
    from synapse.core import commands as c
    from synapse.master.safesyncobj import SafeSyncObj
    from tests.support.raft import elect, start, tick

    _, nodes = start(tmp_path, SafeSyncObj)
    try:
        for node in nodes:
            node.journal_flush = fsync_durable(node)
        leader = elect(nodes)
        tick(nodes, 0.2)
        events: list[str] = []
        journal_file = nodes[leader]._SyncObj__raftLog._FileJournal__journalFile._ResizableFile__f
        journal_inode = os.fstat(journal_file.fileno()).st_ino
        real_fdatasync = os.fdatasync

        def fdatasync(fd: int) -> None:
            if os.fstat(fd).st_ino == journal_inode:
                events.append("leader flush")
            real_fdatasync(fd)

        monkeypatch.setattr(os, "fdatasync", fdatasync)
        send = nodes[leader]._send

        def recorded(peer, message):
            if message.get("type") == "append_entries" and message.get("entries"):
                events.append("sent")
            return send(peer, message)

        nodes[leader]._send = recorded
        replicated = nodes[leader]._SyncObj__consumers[0]
        replicated.apply(seal(codec.encode_command(c.Barrier(at=1.0))),
                         callback=lambda result, error: events.append(f"committed {error}"))
        deadline = time.monotonic() + 10
        while not any(e.startswith("committed") for e in events) and time.monotonic() < deadline:
            for node in nodes:
                node._onTick(0.0005)
        assert events[:3] == ["sent", "sent", "leader flush"], events  # both followers first, one flush
        assert events.index("committed 0") > events.index("leader flush"), events
    finally:
        for node in nodes:
            node.destroy()
