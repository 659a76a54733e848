"""What an acknowledgement promises, and how a replica keeps the promise on top of pysyncobj.

The promise (`durability: fsync`, the default): when a client is told a write succeeded, the
command is in the journal of a majority of replicas **and on their disks**. pysyncobj keeps its
journal in an mmap'd file that it never flushes. A follower acknowledges AppendEntries only after
`journal.add` returns, and the leader counts only those acknowledgements. So flushing inside `add`
(fdatasync of the mapped file, see `datasync`) puts every acknowledged write on a majority's disks
before the client hears of it (the leader's own copy is flushed after it has gone to the
followers, and counted only then: JournalFlush). The term and vote (`raft.journal.meta`) are written with fsync too,
as Raft requires. With
`durability: none` the journal reaches the disk whenever the kernel writes it back: acknowledged
writes survive kill -9 (the page cache outlives the process) but not a power loss.

Detection: every log entry carries a CRC32 (`seal` / `unseal`). A replica that reads back an
entry that fails it stops instead of applying it (it would diverge). At start the journal is read
record by record (`check_journal`): a truncated or corrupted journal means the replica refuses to
start and names the rebuild command. Snapshots carry a SHA-256 over their contents, and
pysyncobj's silent "failed to load full dump" is caught as corruption too.

Disk space: a leader refuses writes (RESOURCE_EXHAUSTED) once the data dir's file system has less
than `min_free_disk` left. A replica whose disk falls below a quarter of that stops cleanly rather
than die of SIGBUS when mmap cannot extend the journal.
"""

from __future__ import annotations

import gzip
import logging
import os
import pickle
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from prometheus_client import Histogram
from pysyncobj import SyncObj
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.journal import FileJournal
from pysyncobj.serializer import Serializer

log = logging.getLogger(__name__)

#: Prefix of every sealed log entry: magic, then the CRC32 of the payload.
SEAL_MAGIC = b"SY1"
_SEAL_LEN = len(SEAL_MAGIC) + 4


class CorruptionError(ValueError):
    """Stored data that fails its checksum or its framing."""


def seal(payload: bytes) -> bytes:
    return SEAL_MAGIC + struct.pack("<I", zlib.crc32(payload)) + payload


def unseal(data: bytes) -> bytes:
    """The payload of a sealed entry; raises CorruptionError if it fails its checksum."""
    if len(data) < _SEAL_LEN or data[:len(SEAL_MAGIC)] != SEAL_MAGIC:
        raise CorruptionError("log entry without its checksum header")
    (crc,) = struct.unpack("<I", data[len(SEAL_MAGIC):_SEAL_LEN])
    payload = data[_SEAL_LEN:]
    if zlib.crc32(payload) != crc:
        raise CorruptionError(f"log entry fails its CRC32 (stored {crc:08x}, computed {zlib.crc32(payload):08x})")
    return payload


#: How long each journal flush takes (served by synapse.master.metrics; registered there).
FSYNC_SECONDS = Histogram("synapse_journal_fsync_seconds", "journal flushes (fdatasync) by duration", registry=None,
                          buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0))


class JournalFlush:
    """The leader's flush of its own new entries, put off until they have gone to the followers.

    A leader appended each new entry and flushed it (`add`) before pysyncobj sent it to the
    followers, which then flushed it too: two flushes one after the other in every commit. (On the
    development machine's disk a flush of the preallocated journal takes 0.1 ms, and a commit
    seen by a client 4-5 ms either way; on a disk whose flush costs milliseconds it is those.)
    Raft lets the leader write its own copy while the followers write theirs (Ongaro's thesis,
    10.2.1). While `deferring` (SafeSyncObj._checkCommandsToApply:
    the tick thread taking new commands in, and sending each), an `add` marks the flush owed;
    `settle` flushes once, before that method returns. The leader counts its own copy towards a
    commit only on a later tick, on the same thread, so only after that flush: an acknowledged
    write is still on a majority's disks. Every other write (a follower's append, a truncation,
    the leader's entry at election) flushes at once, as before."""

    def __init__(self, journal: Any) -> None:
        self.journal = journal
        self.deferring = False  #: an append now leaves its flush to `settle`
        self.owed = False  #: an append was left unflushed

    def settle(self) -> None:
        self.deferring = False
        if self.owed:
            self.owed = False
            datasync(self.journal)


def fsync_durable(sync: SyncObj) -> JournalFlush:
    """Make a SyncObj's file journal flush every append before it is acknowledged (see module doc);
    returns what lets the leader flush its own appends after sending them (JournalFlush)."""
    journal = sync._SyncObj__raftLog
    rewriting = [False]  #: inside deleteEntriesTo: one flush at its end, not one per entry
    deferred = JournalFlush(journal)
    for name in ("add", "deleteEntriesFrom", "clear"):
        original = getattr(journal, name)

        def flushed(*args: object, _original: Callable[..., object] = original, _add: bool = name == "add") -> object:
            result = _original(*args)
            if _add and deferred.deferring:
                deferred.owed = True
            elif not rewriting[0]:
                datasync(journal)
            return result

        setattr(journal, name, flushed)
    rewrite = journal.deleteEntriesTo

    def trimmed(entry_to: int) -> None:
        # pysyncobj trims after each snapshot by emptying the journal and adding back every entry
        # kept: a flush per entry stalled the tick thread, and a kill during the loop leaves only a
        # part of the entries whatever was flushed. One flush at the end keeps that window short.
        rewriting[0] = True
        try:
            rewrite(entry_to)
        finally:
            rewriting[0] = False
        datasync(journal)

    journal.deleteEntriesTo = trimmed
    meta = journal._FileJournal__metaStorer
    original_store = meta.storeMeta

    def store_synced(data: dict[str, Any]) -> None:
        original_store(data)
        fsync_path(meta.getPath())
        fsync_path(os.path.dirname(meta.getPath()) or ".")

    meta.storeMeta = store_synced
    return deferred


def fsync_path(path: str) -> None:
    """fsync a file or a directory by its path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SnapshotWriter(Serializer):  # type: ignore[misc]  # pysyncobj has no types: Serializer is Any to the checker
    """pysyncobj's snapshot file (`raft.dump`), written by a thread of the replica, not a forked child.

    pysyncobj forks the replica to pickle its state. A master is a gRPC server with many threads,
    and forking one is unsafe (gRPC logs that it skips its fork handlers). In the long chaos runs
    the children failed ("Failed to store full dump", seven times in a row after one restart; the
    child's reason is not logged), and while a child lives the leader streams no snapshot to
    anyone: pysyncobj's transmission answers nothing until the child is reaped. A replica added
    by grow-shrink, behind the leader's log start, waited 60 s for a snapshot that never came.

    The state handed over is already a copy (`ClusterState.to_snapshot` builds plain data), so a
    thread pickles it while the replica goes on, and snapshots keep streaming to followers from the
    previous file meanwhile (until the new one is in place: then they start again on it, as in
    pysyncobj). Pickle protocol 4 writes in frames, so the tick thread gets the GIL between them.
    A write that fails is logged with its reason and retried after `RETRY_S`, not at every tick.

    The file is fsynced before its rename and the directory after: pysyncobj drops the journal's
    entries up to the snapshot once it succeeds, and a snapshot lost to a power cut would take
    them along. A snapshot received from the leader is fsynced before its rename too (pysyncobj
    renamed it unsynced), and the two renames exclude each other: a follower's own write that
    started before a snapshot from the leader arrived is dropped instead of replacing the newer
    one (it would have put the replica's state back behind its journal).
    """

    COMPRESS_LEVEL = 6  #: zlib's default: a third faster than gzip's 9 for a 4 % larger file
    RETRY_S = 5.0  #: after a failed write, the next one waits this long

    def __init__(self, file_name: str, batch_size: int) -> None:
        super().__init__(file_name, batch_size, False, None, None, None)
        self.file_name = file_name
        self._writer: threading.Thread | None = None
        self._index = 0  #: the log index of the snapshot being written
        self._error = ""  #: why the last write failed
        self._retry_at = 0.0  #: monotonic time before which no write starts, after a failure
        self._renames = threading.Lock()  #: one rename of raft.dump at a time (write vs install)
        self._installs = 0  #: snapshots received from the leader and put in place
        self._incoming: IO[bytes] | None = None  #: the file a snapshot from the leader is being received into

    def serialize(self, data: object, id: int) -> None:  # noqa: A002 - pysyncobj's signature
        if self._writer is not None:
            return
        self._index, self._error = id, ""
        self._writer = threading.Thread(target=self._write, args=(data, id, self._installs), name="snapshot-writer",
                                        daemon=True)
        self._writer.start()

    def _write(self, data: object, index: int, installs: int) -> None:
        started = time.perf_counter()
        tmp = self.file_name + ".tmp"
        try:
            with open(tmp, "wb") as f:
                with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=self.COMPRESS_LEVEL) as g:
                    pickle.dump(data, g, protocol=4)
                f.flush()
                os.fsync(f.fileno())
            with self._renames:
                if self._installs != installs:
                    os.unlink(tmp)
                    self._error = "a newer snapshot arrived from the leader meanwhile; this one is dropped"
                    return
                os.replace(tmp, self.file_name)
            fsync_path(os.path.dirname(self.file_name) or ".")
        except Exception as exc:  # noqa: BLE001 - reported to pysyncobj as FAILED, and logged
            self._error = f"{type(exc).__name__}: {exc}"
            return
        log.info("snapshot written index=%d bytes=%d seconds=%.2f", index, os.path.getsize(self.file_name),
                 time.perf_counter() - started)

    def checkSerializing(self) -> tuple[int, int | None]:  # noqa: N802 - pysyncobj's name
        writer = self._writer
        if writer is None:
            if time.monotonic() < self._retry_at:  # pysyncobj would build the next snapshot at once
                return SERIALIZER_STATE.SERIALIZING, self._index
            return SERIALIZER_STATE.NOT_SERIALIZING, None
        if writer.is_alive():
            return SERIALIZER_STATE.SERIALIZING, self._index
        self._writer = None
        if self._error:
            log.warning("snapshot not written index=%d: %s", self._index, self._error)
            self._retry_at = time.monotonic() + self.RETRY_S
            return SERIALIZER_STATE.FAILED, self._index
        # as pysyncobj does: followers restart on the new file
        self._Serializer__transmissions: dict[object, dict[str, Any]] = {}
        return SERIALIZER_STATE.SUCCESS, self._index

    def setTransmissionData(self, data: tuple[bytes, bool, bool] | None) -> bool:  # noqa: N802 - pysyncobj's name
        """One chunk of a snapshot from the leader; True once the whole file is in place."""
        if data is None:
            return False
        chunk, first, last = data
        tmp = self.file_name + ".1.tmp"
        try:
            if first:
                if self._incoming is not None:
                    self._incoming.close()
                self._incoming = open(tmp, "wb")  # noqa: SIM115 - kept open across chunks
            elif self._incoming is None:
                return False
            self._incoming.write(chunk)
            if not last:
                return False
            self._incoming.flush()
            os.fsync(self._incoming.fileno())
            self._incoming.close()
            self._incoming = None
            with self._renames:
                os.replace(tmp, self.file_name)
                self._installs += 1
            fsync_path(os.path.dirname(self.file_name) or ".")
            return True
        except OSError:
            log.exception("snapshot from the leader not stored")
            self._incoming = None
            return False


def datasync(journal: FileJournal) -> None:
    """Put a pysyncobj FileJournal's writes on disk.

    pysyncobj's own `flush` is mmap.flush (msync), which CPython runs holding the GIL: every
    append stalled the whole master (gRPC handlers, the event loop) for a disk write. On Linux,
    msync(MS_SYNC) of a shared file mapping is an fsync of that range, and writes through the
    mapping dirty the file's page cache: fdatasync on the file writes the same pages, and
    os.fdatasync releases the GIL while it waits. The file object is looked up each time because
    pysyncobj reopens it when the journal grows."""
    handle = journal._FileJournal__journalFile._ResizableFile__f
    started = time.perf_counter()
    os.fdatasync(handle.fileno())
    FSYNC_SECONDS.observe(time.perf_counter() - started)


def journal_records(path: str | Path) -> Iterator[tuple[int, int, bytes]]:
    """(index, term, command bytes) of each record of a pysyncobj journal; raises CorruptionError on
    truncation or bad framing."""
    data = Path(path).read_bytes()
    header = 24 + 8 + 4 + 4
    if len(data) < header:
        raise CorruptionError(f"{path}: shorter than its header ({len(data)} bytes)")
    (last,) = struct.unpack("<I", data[header - 4:header])
    if last > len(data):
        raise CorruptionError(f"{path}: records end at byte {last} but the file has {len(data)} (truncated)")
    offset, count = header, 0
    while offset < last:
        if offset + 4 > last:
            raise CorruptionError(f"{path}: record {count} is cut short at byte {offset}")
        (size,) = struct.unpack("<I", data[offset:offset + 4])
        end = offset + 4 + size
        if size < 16 or end + 4 > last or struct.unpack("<I", data[end:end + 4])[0] != size:
            raise CorruptionError(f"{path}: record {count} at byte {offset} has inconsistent framing")
        idx, term = struct.unpack("<QQ", data[offset + 4:offset + 20])
        yield idx, term, data[offset + 20:end]
        offset = end + 4
        count += 1


def entry_payload(command: bytes) -> bytes | None:
    """The unsealed Synapse payload of a journal record, or None for pysyncobj's own records
    (no-ops, membership changes); raises CorruptionError if it is damaged."""
    from pysyncobj import pickle as psopickle  # the same decoder pysyncobj uses on this file

    if command[:1] != b"\x00":  # not a regular (replicated method) command
        return None
    try:
        call = psopickle.loads(command[1:])
    except Exception as exc:  # noqa: BLE001 - any garbage in the record
        raise CorruptionError(f"record does not decode: {exc!r}") from None
    sealed = call[1][0] if isinstance(call, tuple) and len(call) >= 2 and call[1] else None
    if not isinstance(sealed, bytes):
        raise CorruptionError("record holds no Synapse command")
    return unseal(sealed)


def check_journal(path: str | Path) -> str:
    """'' if pysyncobj's journal file is sound, else what is wrong (truncation, bad framing, bad CRC)."""
    path = Path(path)
    if not path.exists():
        return ""
    try:
        for idx, term, command in journal_records(path):
            try:
                entry_payload(command)
            except CorruptionError as exc:
                return f"{path}: raft index {idx}, term {term}: {exc}"
    except CorruptionError as exc:
        return str(exc)
    return ""


def free_bytes(path: str | Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class DumpFailureWatch(logging.Handler):
    """Turns pysyncobj's 'failed to load full dump' (logged, then ignored) into a corruption flag."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.failure = ""

    def emit(self, record: logging.LogRecord) -> None:
        if "failed to load full dump" in record.getMessage():
            self.failure = "the snapshot (raft.dump) could not be loaded"
