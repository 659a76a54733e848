"""The Raft transport's seal (synapse.master.cipher): AES-GCM once every member reads it, Fernet before.

Both formats open on a replica of this release, a replica of an older one (Fernet only) refuses
AES-GCM, and a forged, damaged or foreign message is refused. Three real replicas, one of which reads
only Fernet, are in tests/cluster/test_cipher.py.
"""

from __future__ import annotations

import pytest
from cryptography.fernet import InvalidToken
from pysyncobj.encryptor import getEncryptor

from synapse.master.cipher import MAGIC, MAX_SENDERS, RaftCipher


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


