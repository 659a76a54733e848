"""The Raft transport's seal: AES-GCM in place of pysyncobj's Fernet, with Fernet still read.

pysyncobj seals every message between replicas with Fernet under a key from the Raft password
(AES-CBC, HMAC-SHA256, base64, in Python around C calls). A loaded leader seals and opens a few
messages per submission, and Fernet cost 16-28 us to seal and 18-60 us to open one (an open checks
the HMAC twice: pysyncobj reads the timestamp first), about a tenth of the leader's CPU per
submission (docs/benchmarks.md). AES-GCM from the same library does either in about 1 us.

A sealed message here is

    MAGIC (1) | sender salt (16) | timestamp (8) | nonce (12) | ciphertext and tag

under AES-256-GCM with the whole header as associated data. The key is the sender's own: HMAC-
SHA256 of the key pysyncobj derives from the Raft password for Fernet (PBKDF2, derived once here
for both) and of a salt drawn once per process, so the nonces, a counter, never repeat under one key however long a
cluster lives or however often a replica restarts. A receiver derives each sender's key once.

Rolling upgrades: a replica of an older release reads only Fernet. Every replica reads both (a
Fernet token starts with base64's 'g', never MAGIC) and seals with AES-GCM only once `sealed()`
says so: synapse.master.raft.RaftNode answers from the replicated cluster version, which reaches
`versions.SEALED_TRANSPORT_VERSION` only once every member runs a release that reads AES-GCM.

Job secrets (`SecretSeal`) are sealed under another key from the same derivation: a job's secret
lives in the replicated state (log, journal, snapshots) only as

    nonce (12) | AES-256-GCM ciphertext and tag, the secret's name as associated data

with a random nonce drawn by the master that took the submission (apply copies the bytes; it
never seals), beside a keyed fingerprint of name and value that lets apply tell a retried
submission from another job without the key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import os
from collections.abc import Callable
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC
from pysyncobj.encryptor import SALT as FERNET_SALT

from synapse.core.model import Secret

#: The first byte of an AES-GCM message (a Fernet token is base64 text: its first byte is 'g').
MAGIC = b"\xa5"
_SALT = 16
_NONCE = 12
_HEADER = 1 + _SALT + 8 + _NONCE
_TAG = 16
#: pysyncobj's derivation of its Fernet key from the password (pysyncobj.encryptor.getEncryptor).
FERNET_ITERATIONS = 100_000
#: How many senders' keys a receiver keeps: each replica process is one sender; a restart adds one.
MAX_SENDERS = 64


@lru_cache(maxsize=4)
def password_key(password: str) -> bytes:
    """pysyncobj's Fernet key for a Raft password (PBKDF2: derived once per process and password)."""
    return PBKDF2HMAC(algorithm=hashes.SHA256(), length=32, salt=FERNET_SALT,
                      iterations=FERNET_ITERATIONS).derive(password.encode())


class RaftCipher:
    """What pysyncobj's connections call as their encryptor: `encrypt_at_time`, `extract_timestamp`,
    `decrypt` (Fernet's names), for one replica. `reads_sealed` False plays a release that knows only
    Fernet (tests of a mixed-version cluster)."""

    def __init__(self, password: str, reads_sealed: bool = True) -> None:
        fernet_key = password_key(password)
        self.fernet = Fernet(base64.urlsafe_b64encode(fernet_key))  #: pysyncobj's, what older releases read
        self._key = hmac.new(fernet_key, b"synapse-raft-transport-aes-gcm-v1", hashlib.sha256).digest()
        self._salt = os.urandom(_SALT)
        self._own = AESGCM(self._sender_key(self._salt))
        self._counter = itertools.count(1)
        self._senders: dict[bytes, AESGCM] = {}
        self.reads_sealed = reads_sealed
        #: whether to seal with AES-GCM (every peer reads it); Fernet until told
        self.sealed: Callable[[], bool] = lambda: False
        #: the last message opened by `extract_timestamp` and its plain text, for the `decrypt` after it
        self._opened: tuple[bytes, bytes] = (b"", b"")

    def _sender_key(self, salt: bytes) -> bytes:
        return hmac.new(self._key, b"synapse-raft-sender\0" + salt, hashlib.sha256).digest()

    def encrypt_at_time(self, data: bytes, at: int) -> bytes:
        if not self.sealed():
            return self.fernet.encrypt_at_time(data, at)
        nonce = next(self._counter).to_bytes(_NONCE, "big")
        header = MAGIC + self._salt + at.to_bytes(8, "big") + nonce
        return header + self._own.encrypt(nonce, data, header)

    def extract_timestamp(self, token: bytes) -> int:
        """The sender's timestamp, once the message is known to be genuine."""
        if token[:1] != MAGIC:
            return self.fernet.extract_timestamp(token)
        self._opened = (token, self._open(token))
        return int.from_bytes(token[1 + _SALT:1 + _SALT + 8], "big")

    def decrypt(self, token: bytes) -> bytes:
        if token[:1] != MAGIC:
            return self.fernet.decrypt(token)
        token_opened, plain = self._opened
        if token_opened is token:
            return plain
        return self._open(token)

    def _open(self, token: bytes) -> bytes:
        if not self.reads_sealed or len(token) < _HEADER + _TAG:
            raise InvalidToken
        salt = token[1:1 + _SALT]
        aead = self._senders.get(salt)
        if aead is None:
            if len(self._senders) >= MAX_SENDERS:
                self._senders.clear()
            aead = self._senders[salt] = AESGCM(self._sender_key(salt))
        try:
            return aead.decrypt(token[_HEADER - _NONCE:_HEADER], token[_HEADER:], token[:_HEADER])
        except Exception as exc:  # InvalidTag: forged, damaged, or under another password
            raise InvalidToken from exc


class SecretError(ValueError):
    """A sealed secret that does not open: damaged, or sealed under another cluster's key."""


class SecretSeal:
    """Seals a job's secrets for the replicated state and opens them for its tasks' listings, under
    a key only the masters hold (from the Raft password, with a label of its own)."""

    def __init__(self, password: str) -> None:
        key = password_key(password)
        self._aead = AESGCM(hmac.new(key, b"synapse-job-secrets-aes-gcm-v1", hashlib.sha256).digest())
        self._fingerprint_key = hmac.new(key, b"synapse-job-secrets-fingerprint-v1", hashlib.sha256).digest()

    def seal(self, name: str, value: str) -> Secret:
        """`value` sealed under a fresh random nonce, with its fingerprint (call before proposing)."""
        nonce = os.urandom(_NONCE)
        data = value.encode()
        return Secret(name, self.fingerprint(name, value), nonce + self._aead.encrypt(nonce, data, name.encode()))

    def fingerprint(self, name: str, value: str) -> bytes:
        """A keyed hash of a secret: the same for the same name and value, and nothing without the key."""
        return hmac.new(self._fingerprint_key, name.encode() + b"\0" + value.encode(), hashlib.sha256).digest()[:16]

    def open(self, secret: Secret) -> str:
        """The value of a sealed secret; SecretError if it does not open under this cluster's key."""
        nonce, body = secret.sealed[:_NONCE], secret.sealed[_NONCE:]
        try:
            return self._aead.decrypt(nonce, body, secret.name.encode()).decode()
        except Exception as exc:  # InvalidTag (another key, damaged), short input, bad UTF-8
            raise SecretError(f"secret {secret.name} does not open under this cluster's key") from exc
