"""The Raft transport's seal on real replicas: members seal with AES-GCM only once the cluster version
says every one reads it (the seal itself is in tests/unit/test_cipher.py)."""

from __future__ import annotations

from synapse.core import codec, versions
from synapse.core import commands as c
from synapse.core.model import Resources
from synapse.local.cluster import free_base_port
from synapse.master.cipher import MAGIC
from synapse.master.raft import RaftNode, raft_config
from tests.support.helpers import wait_for


def _register(i: int) -> c.RegisterNode:
    return c.RegisterNode(at=float(i), node_id=f"n{i}", address=f"h{i}:1", topology=("z", "b", f"r{i}"),
                          capacity=Resources(8000, 1 << 30, 8))


def _noted(sent: list[bytes], token: bytes) -> bytes:
    sent.append(token[:1])
    return token


OLDER = codec.CommandSet(versions.KIND_VERSIONS, versions.SEALED_TRANSPORT_VERSION - 1)


def test_members_seal_only_once_the_cluster_version_says_every_one_reads_it(tmp_path):
    port = free_base_port(3)
    addresses = [f"127.0.0.1:{port + i}" for i in range(3)]
    nodes: list[RaftNode] = []
    try:
        for i, me in enumerate(addresses):
            conf = raft_config(bind_address=me, data_dir=str(tmp_path / str(i)), password="pw")
            nodes.append(RaftNode(me, [a for a in addresses if a != me], conf, durable=False,
                                  commands=OLDER if i == 2 else codec.CURRENT))
        older = nodes[2]
        assert not older.sync.cipher.reads_sealed and nodes[0].sync.cipher.reads_sealed
        sent: list[bytes] = []  # the first byte of every message the members sent
        for node in nodes:
            cipher = node.sync.cipher
            cipher.encrypt_at_time = lambda data, at, seal=cipher.encrypt_at_time: _noted(sent, seal(data, at))

        def applied_everywhere(n: int) -> bool:
            return all(len(node.replicated.state.nodes) >= n for node in nodes)

        def propose(cmd: c.Command) -> c.Result:
            leader = wait_for(lambda: next((n for n in nodes if n.is_leader()), None), 20, "a leader")
            return leader.propose(cmd, timeout=10)

        assert propose(_register(1)).ok
        wait_for(lambda: applied_everywhere(1), 10, "every member, the older one too, to apply it")
        assert not any(node.sync.cipher.sealed() for node in nodes)
        assert sent and MAGIC not in sent

        # The older member upgraded in place (it reads AES-GCM now): the cluster version rises.
        older.sync.cipher.reads_sealed = True
        assert propose(c.SetClusterVersion(at=2.0, version=versions.SEALED_TRANSPORT_VERSION)).ok
        wait_for(lambda: all(node.sync.cipher.sealed() for node in nodes), 10, "every member to seal")
        sent.clear()
        assert propose(_register(2)).ok
        wait_for(lambda: applied_everywhere(2), 10, "every member to apply a sealed entry")
        assert sent and set(sent) == {MAGIC}
    finally:
        for node in nodes:
            node.destroy()
