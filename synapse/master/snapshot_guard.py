"""The replica's snapshots and journal, guarded: a part of synapse.master.safesyncobj.SafeSyncObj.

* **Dump loading and journal trimming.** A replica stopped between writing a snapshot and trimming
  its journal started with a journal beginning before the snapshot, and pysyncobj cleared all of
  it, acknowledged entries after the snapshot included: the entries after it are kept, and the
  journal is cut in memory only (`tests/cluster/test_snapshots.py`).
* **No snapshot after a stop.** Compaction waits while the consumer has stopped applying
  (`_stopped` names why): a snapshot then would record as applied an entry it never applied.
* **Snapshot contents.** pysyncobj pickles every attribute set after its own `__init__` into its
  snapshots: `snapshot_extras` lists any that slipped through.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pysyncobj import SyncObj
from pysyncobj.journal import FileJournal

log = logging.getLogger(__name__)


class SnapshotGuard(SyncObj):  # type: ignore[misc]  # pysyncobj has no types: SyncObj is Any to the checker
    """SyncObj whose snapshot load, journal trim and log compaction keep the guards above."""

    _stopped: Callable[[], str]

    def snapshot_extras(self) -> list[str]:
        """Attributes pysyncobj would pickle into a snapshot besides its own (none, if all is well)."""
        own = self._SyncObj__properies
        return sorted(k for k in self.__dict__ if k not in own and not k.startswith("_SyncObj__"))

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:  # noqa: N802,N803 - overrides the mangled name
        """Load the snapshot, keeping the journal's entries after it (Raft's rule for snapshots).

        A snapshot replaces `raft.dump` first; the journal's entries up to it are deleted on a
        later tick. A replica stopped in between (kill -9, a restart) started with a journal that
        still began before the snapshot, and pysyncobj, finding the journal's first entries unlike
        the snapshot's, cleared the whole journal: every entry after the snapshot was gone,
        acknowledged ones too (pysyncobj then warns that the commit index exceeds the journal's
        end). When the journal holds the snapshot's last two entries, what comes before them is
        dropped instead, as if the replica had not stopped in between (`tests/cluster/test_snapshots.py`)."""
        serializer = self._SyncObj__serializer
        try:
            data = serializer.deserialize()
        except Exception:  # noqa: BLE001 - pysyncobj reads it again and reports the failure
            SyncObj._SyncObj__loadDumpFile(self, clearJournal)
            return
        if not clearJournal:  # data[1]: the snapshot's last entry; data[2]: the one before it
            self._trim_journal_to(data[2], data[1])
        serializer.deserialize = lambda: data  # read once: pysyncobj's load reads the same file
        try:
            SyncObj._SyncObj__loadDumpFile(self, clearJournal)
        finally:
            del serializer.deserialize
        journal = self._SyncObj__raftLog
        log.info("snapshot loaded index=%s from=%s journal=%s..%s", data[1][1] if isinstance(data[1], tuple) else "-",
                 "leader" if clearJournal else "disk", journal[0][1] if len(journal) else "-",
                 journal[len(journal) - 1][1] if len(journal) else "-")

    def _trim_journal_to(self, first: object, last: tuple[bytes, int, int]) -> None:
        """Drop the journal's entries before `first` if the journal holds `first` and `last` at
        their indexes: `last` is the snapshot's last entry, and `first` the one before it, which a
        journal trimmed to the snapshot begins with.

        Only the journal's list in memory is cut. pysyncobj's own trim rewrites the whole file
        (an empty journal first, then every entry kept), and a kill during that loop would leave a
        part of it; the file keeps its older records instead until the next snapshot rewrites it,
        and the next start cuts them again."""
        journal = self._SyncObj__raftLog
        if len(journal) < 2 or not isinstance(first, tuple) or journal[0] == first:
            return
        offset = first[1] - journal[0][1]
        if not 0 < offset < len(journal) - 1 or journal[offset] != first or journal[offset + 1] != last:
            return
        log.warning("journal starts at %d, before the snapshot at %d (stopped between writing the snapshot and "
                    "trimming the journal): keeping the %d entries after it", journal[0][1], last[1],
                    len(journal) - offset - 2)
        if isinstance(journal, FileJournal):
            journal._FileJournal__journal = journal._FileJournal__journal[offset:]
        else:
            journal.deleteEntriesTo(offset)

    def _SyncObj__tryLogCompaction(self) -> None:  # noqa: N802 - overrides the mangled name
        if self._stopped():
            return  # the state stands before an entry pysyncobj counts as applied: see the module docstring
        SyncObj._SyncObj__tryLogCompaction(self)
