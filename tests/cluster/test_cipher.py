"""The Raft transport's seal (synapse.master.cipher): AES-GCM once every member reads it, Fernet before.

Unit level: both formats open on a replica of this release, a replica of an older one (Fernet only)
refuses AES-GCM, and a forged, damaged or foreign message is refused. Cluster level, three
replicas in this process: with one member that reads only Fernet the others keep to Fernet (it
applies every entry); once the cluster version reaches SEALED_TRANSPORT_VERSION they seal, which
every message then goes out sealed.
"""

from __future__ import annotations

import pytest
from cryptography.fernet import InvalidToken
from pysyncobj.encryptor import getEncryptor

from synapse.core import codec, versions
from synapse.core import commands as c
from synapse.core.model import Resources
from synapse.local.cluster import free_base_port
from synapse.master.cipher import MAGIC, MAX_SENDERS, RaftCipher
from synapse.master.raft import RaftNode, raft_config
from tests.support.helpers import wait_for


def sealing(password: str = "pw", reads_sealed: bool = True) -> RaftCipher:
    cipher = RaftCipher(password, reads_sealed=reads_sealed)
    cipher.sealed = lambda: True
    return cipher


def test_both_formats_open_with_their_timestamps():
    old_format, new_format, reader = RaftCipher("pw"), sealing(), RaftCipher("pw")
    for sender in (old_format, new_format):
        for data in (b"", b"x", bytes(range(256)) * 40):
            token = sender.encrypt_at_time(data, 1234)
            assert (token[:1] == MAGIC) is (sender is new_format)
            assert reader.extract_timestamp(token) == 1234
            assert reader.decrypt(token) == data
            assert reader.decrypt(token) == data  # again, not only the one extract_timestamp opened


def test_an_older_release_reads_fernet_and_refuses_the_seal():
    older = RaftCipher("pw", reads_sealed=False)
    assert older.decrypt(RaftCipher("pw").encrypt_at_time(b"entry", 1)) == b"entry"
    # Fernet under pysyncobj's own key, both ways: what a replica of an older release seals and reads.
    assert getEncryptor("pw").decrypt(RaftCipher("pw").encrypt_at_time(b"entry", 1)) == b"entry"
    assert older.decrypt(getEncryptor("pw").encrypt_at_time(b"entry", 1)) == b"entry"
    token = sealing().encrypt_at_time(b"entry", 1)
    with pytest.raises(InvalidToken):
        older.extract_timestamp(token)
    with pytest.raises(InvalidToken):
        older.decrypt(token)


def test_a_forged_damaged_or_foreign_message_is_refused():
    sender, reader = sealing(), RaftCipher("pw")
    token = sender.encrypt_at_time(b"append entries", 7)
    for i in range(1, len(token)):  # every byte but the magic: salt, timestamp, nonce, ciphertext, tag
        damaged = token[:i] + bytes([token[i] ^ 1]) + token[i + 1:]
        with pytest.raises(InvalidToken):
            reader.extract_timestamp(damaged)
        with pytest.raises(InvalidToken):
            reader.decrypt(damaged)
    for short in (MAGIC, token[:40], token[:-1]):
        with pytest.raises(InvalidToken):
            reader.decrypt(short)
    with pytest.raises(InvalidToken):
        RaftCipher("another password").decrypt(token)


def test_nonces_never_repeat_and_each_process_seals_under_its_own_key():
    a, b = sealing(), sealing()
    tokens = [a.encrypt_at_time(b"same", 1) for _ in range(100)]
    assert len({t[-28:-16] for t in tokens}) == 100  # the nonce field, a counter
    assert a.encrypt_at_time(b"same", 1)[1:17] != b.encrypt_at_time(b"same", 1)[1:17]  # salts differ
    reader = RaftCipher("pw")
    for _ in range(MAX_SENDERS + 5):  # senders' keys beyond the bound are derived again, not kept
        assert reader.decrypt(sealing().encrypt_at_time(b"m", 1)) == b"m"
    assert len(reader._senders) <= MAX_SENDERS


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
