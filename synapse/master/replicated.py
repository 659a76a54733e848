"""The one replicated door: the cluster state as pysyncobj's consumer, applied through the Raft log.

What pysyncobj 0.3.17 does not do for us at its consumer, and how this module makes up for it
(the proposal pipeline that feeds it is synapse.master.raft):

* One door, forever at the same id: pysyncobj numbers `@replicated` methods by sorted name, so the
  consumer has exactly one, `apply(bytes)`, and the command inside is a versioned protobuf.
* Apply must never raise (an exception stops that replica applying for good): `ClusterState.apply`
  catches everything, and the listener hook below is wrapped too.
* Snapshots pickle the consumer's attributes: `_serialize` hands pysyncobj the plain-data
  snapshot of the state instead, and `_deserialize` rebuilds the indexes from it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from pysyncobj import SyncObjConsumer, replicated

from synapse.core import codec
from synapse.core import commands as c
from synapse.core.model import DEFAULT_LEVELS
from synapse.core.state.fsm import ApplyFailed, ClusterState
from synapse.core.state.snapshot import snapshot_digest
from synapse.master.durability import CorruptionError, unseal

log = logging.getLogger(__name__)

#: Own entries whose commands a replica keeps for their apply (ReplicatedState.proposing): one or
#: two are in flight; the rest never applied (a lost leadership) and are dropped past this many.
OWN_KEPT = 64
#: The kinds whose entries the replica that proposed them applies as it encoded them, undecoded
#: (ReplicatedState.proposing): submissions, which only MasterServicer.SubmitJob(s) make, from a spec
#: the codec decoded from the request, a float clock reading and strings, so that decoding gives
#: them back type for type (tests/unit/test_codec.py). Other kinds are built from Python values that
#: decode to equal but not always identical ones (an int time comes back a float): decoded.
OWN_KINDS = frozenset({c.SubmitJob, c.SubmitWorkflowJob, c.SubmitCheckpointJob, c.SubmitImageJob})
#: TEST ONLY (set by tests/conftest.py): a replica decodes the entries it proposed anyway and stops
#: if they differ from the commands it encoded (ReplicatedState.proposing).
CHECK_OWN_ENTRIES_ENV = "SYNAPSE_TEST_CHECK_OWN_ENTRIES"


class ReplicatedState(SyncObjConsumer):  # type: ignore[misc]  # pysyncobj has no types: its classes are Any
    """A ClusterState applied through the Raft log. Read it under `lock`.

    It stops applying, for good, at the first log entry it must not apply: one that fails its
    checksum (`corruption`), or one its code does not know (`unknown_entry`: a command kind or
    version from a newer release, an undecodable body). Applying it, or skipping it as a
    rejection, would part this replica's state from its peers'; so the state stays as it was
    before that entry, later entries are not applied either, no snapshot is taken (SafeSyncObj
    asks `stop_reason`), and the master's watchdog stops the process. Restarted with code that
    knows the entry, the replica replays its journal from there."""

    def __init__(self, levels: tuple[str, ...] = DEFAULT_LEVELS, commands: codec.CommandSet = codec.CURRENT) -> None:
        super().__init__()
        self.lock = threading.RLock()  #: held by apply and by every compound read
        self.state = ClusterState(levels)  #: replaced wholesale when a snapshot is loaded
        self.commands = commands  #: the command kinds and versions this replica's code applies; fixed
        #: set (and never cleared) when stored data fails its checksum: this replica must stop
        self.corruption = ""
        #: set (and never cleared) at the first log entry this replica's code cannot apply: it must stop
        self.unknown_entry = ""
        #: set (and never cleared) when applying an entry raised midway (ApplyFailed): it must stop
        self.apply_failure = ""
        self._digest_cache: tuple[int, str] = (-1, "")  #: (applied, digest) last computed
        #: called on the tick thread once per applied log entry with its (command, result) pairs;
        #: must be trivial (hand off to another thread)
        self.listener: Callable[[Sequence[tuple[c.Command | None, c.Result]]], None] | None = None
        #: sealed entry -> the commands this replica encoded into it, for the entries it proposed
        #: (written by the loop, taken by the tick thread's apply): see `proposing`
        self._own: dict[bytes, list[c.Command]] = {}
        #: decode own entries anyway and stop if they differ from what was encoded (tests)
        self.check_own = os.environ.get(CHECK_OWN_ENTRIES_ENV) == "1"

    def proposing(self, data: bytes, cmds: list[c.Command]) -> None:
        """`data`, about to be proposed, encodes `cmds`: its apply here takes them as they are.

        A leader decoded every submission it had just encoded: most of its apply's decoding. For the
        kinds of OWN_KINDS, decoding gives the same commands back, field for field and type for type
        (tests/unit/test_codec.py; with CHECK_OWN_ENTRIES_ENV set, as the test suite sets it, every such
        apply checks it), and an entry is looked up by its whole bytes, so what applies is what the
        log holds. An entry that never applies (a lost leadership) is forgotten with the rest past
        OWN_KEPT."""
        if len(self._own) >= OWN_KEPT:
            self._own.clear()
        self._own[data] = cmds

    # pysyncobj has no types; the replicated method also takes callback=, sync= and timeout= (RaftNode).
    @replicated  # type: ignore[untyped-decorator]
    def apply(self, data: bytes) -> list[c.Result] | None:
        """The one replicated door: a sealed (checksummed), versioned, encoded command or batch.
        None when the entry was not applied because this replica stopped applying (see the class)."""
        if self.stop_reason():
            return None  # stopped at an earlier entry: applying this one would skip that one
        try:
            payload = unseal(data)
        except CorruptionError as exc:
            # Only a damaged copy fails its CRC: applying it (even as a rejection) would make this
            # replica diverge from the others. Stop applying; the master process stops serving.
            self.corruption = f"corrupt log entry{self._entry_index()}: {exc}"
            log.critical("%s; this replica stops applying", self.corruption)
            return None
        own = self._own.pop(data, None) if self._own else None
        if own is not None and self.check_own and not self._decodes_to(payload, own):
            return None
        try:
            with self.lock:
                applied = self.state.apply_entry(payload, self.commands, decoded=own)
        except codec.CodecError as exc:  # written by code that knows more (apply_entry changed nothing)
            self.unknown_entry = (f"log entry{self._entry_index()} holds a command this replica's code cannot "
                                  f"apply: {exc}")
            log.critical("%s; this replica stops applying", self.unknown_entry)
            return None
        except ApplyFailed as exc:  # a handler failed midway: this state may be half-changed
            self.apply_failure = f"log entry{self._entry_index()} failed to apply: {exc}"
            log.critical("%s; this replica stops applying", self.apply_failure)
            return None
        listener = self.listener
        if listener is not None:
            try:
                listener(applied)
            except Exception:  # noqa: BLE001 - a raising callback makes pysyncobj apply twice
                log.exception("apply listener failed")
        return [result for _, result in applied]

    def _decodes_to(self, payload: bytes, cmds: list[c.Command]) -> bool:
        """Whether `payload` decodes to `cmds` exactly; if not, this replica stops (CHECK_OWN_ENTRIES_ENV)."""
        decoded = codec.decode_entry(payload, self.commands)
        if codec.identical(decoded, cmds):
            return True
        self.apply_failure = (f"log entry{self._entry_index()} does not decode to the commands encoded into it: "
                              f"{cmds!r} encoded, {decoded!r} decoded")
        log.critical("%s; this replica stops applying", self.apply_failure)
        return False

    def stop_reason(self) -> str:
        """Why this replica stopped applying ('' while it applies)."""
        return self.corruption or self.unknown_entry or self.apply_failure

    def _entry_index(self) -> str:
        """' <raft index>' of the entry being applied, when a SyncObj applies it ('' otherwise)."""
        sync = self._syncObj
        return f" {sync.raftLastApplied + 1}" if sync is not None else ""

    def _serialize(self) -> dict[str, Any]:
        with self.lock:
            snapshot = self.state.to_snapshot()
        return {"sha256": snapshot_digest(snapshot), "state": snapshot}

    def _deserialize(self, data: dict[str, Any]) -> None:
        snapshot = data.get("state") if isinstance(data, dict) else None
        if snapshot is None or data.get("sha256") != snapshot_digest(snapshot):
            self.corruption = self.corruption or "the snapshot fails its SHA-256"
            log.critical("%s; this replica stops", self.corruption)
            return
        state = ClusterState.from_snapshot(snapshot)
        with self.lock:
            self.state = state

    def digest(self) -> tuple[int, str]:
        """(commands applied, state digest), read together. Only the copy holds the lock that
        apply needs; hashing happens outside it, and the result is reused until a command applies."""
        with self.lock:
            applied = self.state.applied
            cached = self._digest_cache
            if cached[0] == applied:
                return cached
            snapshot = self.state.to_snapshot()
        result = (applied, snapshot_digest(snapshot))
        self._digest_cache = result
        return result

    def applied(self) -> int:
        with self.lock:
            return self.state.applied
