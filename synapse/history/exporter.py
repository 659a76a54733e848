"""The history exporter of a master: the I/O around `synapse.core.history.export_batch`.

A follower writes the rows, so the leader's process (its event loop, its Raft thread, Python's
lock) spends nothing on them: the first member by Raft address other than the leader
(`exporter_of`), while it has a live link to the leader, runs `follower_export_loop`. Each pass
reads the store's cursor, takes the next batch of finished jobs from its own replicated state
(under the master lock) and writes the rows and the new cursor in one store transaction (in a
worker thread: the event loop never waits on the database). The leader's `export_loop` reads the
store's cursor and proposes HistoryExported(cursor), so every replica knows those jobs are
archived and retention may count from then. The leader exports itself, the same way, when it is
alone, when it has not heard from that follower lately (down, cut off), and when a finished job has
waited TAKEOVER_S unarchived (the follower cannot write, or runs an earlier release, which does not
export).

Two exporters at once (a follower cut off from its leader that still reaches the store, a leader
taking over) write nothing twice: the store's cursor moves in the rows' transaction only from the
value the pass read (else CursorMoved, and the pass reads it again), and rows are upserts of
values fixed once a job has finished. A leader that dies between a commit and its proposal leaves
nothing to repair: the next one reads the store's cursor and proposes it. While the store is
unreachable the loops retry with backoff, and finished jobs wait in the replicated state (up to
the cap, see `LeaderState._forget`); `History.lag_reason` says why for logs, metrics and
`readyz?verbose`.

Beside it, `utilization_loop` samples the nodes every UTILIZATION_EVERY_S and adds the seconds since
the store's last sample to the day's cluster row (`HistoryStore.add_utilization`): utilisation is
not in the log, so a failover or a store outage loses what is beyond UTILIZATION_MAX_GAP_S.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from synapse.core import commands as c
from synapse.core import versions
from synapse.core.history import EXPORT_BATCH, UTILIZATION_EVERY_S, ExportBatch, cluster_sample, export_batch
from synapse.core.state.fsm import ClusterState
from synapse.history.settings import HistorySettings
from synapse.history.store import CursorMoved, HistoryStore, StoreError, redacted

log = logging.getLogger(__name__)

#: How often the exporter looks for finished jobs when nothing woke it.
EXPORT_IDLE_S = 1.0
#: Exports (and the passes that look for them) are at least this far apart: jobs finishing meanwhile go
#: into one transaction and one proposal.
EXPORT_MIN_INTERVAL_S = 0.2
#: A pass waits for the state to stay unchanged this long after the change that woke it, for at
#: most EXPORT_SETTLE_MAX_S: a job's end comes with the hand-over of its nodes (the next gang's
#: placement, its workers' starts and reports, a commit every few ms), which the pass's scan, store
#: writes and proposal would otherwise compete with, on the leader's loop and in the log.
EXPORT_QUIET_S, EXPORT_SETTLE_MAX_S = 0.05, 1.0
#: The leader exports itself once a finished job has waited this long unarchived: the exporting
#: follower is down, or cannot reach the store.
TAKEOVER_S = 10.0
#: Backoff between attempts while the store fails: from the first to the last, doubling.
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 30.0
#: How often the leader purges rows older than `history.retention`.
PURGE_EVERY_S = 3600.0


class ReplicaRaft(Protocol):
    """What the exporter asks of its replica's Raft node (synapse.master.raft.RaftNode)."""

    def is_leader(self) -> bool: ...

    def leader_if_connected(self) -> str | None: ...

    def member_versions(self) -> dict[str, int]: ...

    def partners(self) -> list[str]: ...

    def cluster_version(self) -> int: ...


class ReplicaAddresses(Protocol):
    """A replica's addresses (synapse.master.config.ReplicaConfig)."""

    @property
    def raft(self) -> str: ...


class Replica(Protocol):
    """What the exporter needs of the replica it runs in (synapse.master.replica.Master, which this
    package may not import): its lock, state, clock, change events and Raft node."""

    @property
    def raft(self) -> ReplicaRaft: ...

    @property
    def replica(self) -> ReplicaAddresses: ...

    @property
    def lock(self) -> threading.RLock: ...

    @property
    def state(self) -> ClusterState: ...

    def now(self) -> float: ...

    def state_changed(self) -> asyncio.Event: ...


class ExportDriver(Protocol):
    """What the exporter needs of the leader loops it runs in (synapse.master.leader.LeaderLoops)."""

    @property
    def master(self) -> Replica: ...

    stopped: bool  #: the term is over

    async def propose(self, cmd: c.Command) -> c.Result | None:
        """Propose a command of this term; None if it did not commit."""


class History:
    """One master process's history store and what its exporter knows (read by metrics, readyz)."""

    def __init__(self, settings: HistorySettings) -> None:
        self.settings = settings
        self.store = HistoryStore(settings.url)
        self.error = ""  #: the store's last failure, '' once it works again; exporter only
        self.error_since = 0.0  #: when the current run of failures began (wall clock)
        self.exported = 0  #: job rows this process wrote (new ones); exporter only
        self.errors = 0  #: failed store attempts of this process; exporter only
        self.last_purge = 0.0  #: monotonic time of the last purge; exporter only
        #: the store's cursor was found behind what the cluster knows archived (another store: a
        #: SQLite file per machine, a restored backup): the jobs numbered in between are not in it
        self.gap = ""

    def lag_reason(self, unarchived: int) -> str:
        """Why history lags behind the cluster, or '' (read on any thread)."""
        why = [self.gap] if self.gap else []
        if self.error:
            why.append(f"history store {redacted(self.settings.url)} failing since "
                       f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(self.error_since))}: {self.error}")
        if unarchived >= self.settings.max_unarchived:
            why.append(f"{unarchived} finished jobs not archived: the cap (history.max_unarchived "
                       f"{self.settings.max_unarchived}) is reached, the oldest are forgotten unarchived")
        elif unarchived > EXPORT_BATCH:
            why.append(f"{unarchived} finished jobs not archived yet")
        return "; ".join(why)

    def _failed(self, exc: Exception, now: float) -> None:
        if not self.error:
            self.error_since = now
            log.warning("history store failing url=%s error=%s; finished jobs wait in the state",
                        redacted(self.settings.url), exc)
        self.error = str(exc)
        self.errors += 1

    def _recovered(self) -> None:
        if self.error:
            log.info("history store reachable again url=%s", redacted(self.settings.url))
        self.error = ""

    def _stood_down(self) -> None:
        """This replica no longer writes (another does): a failure it saw is not its to report."""
        self.error = ""


def exporter_of(members: Iterable[str], leader: str | None) -> str | None:
    """The replica (Raft address) that exports: the first member other than the leader, so the
    leader's process spends nothing on the store's writes; None when the leader is alone or no
    leader is known (then the leader exports, if there is one)."""
    followers = sorted(set(members) - {leader}) if leader else []
    return followers[0] if followers else None


def _exporter(master: Replica, leader: str | None) -> str | None:
    """`exporter_of` this replica's view of the members, under `leader`."""
    return exporter_of([master.replica.raft, *master.raft.partners()], leader)


def _oldest_unarchived_wait(state: ClusterState, now: float) -> float:
    """Seconds the oldest finished job not yet archived has waited (0 if none; call under the lock)."""
    for job_id in state.unarchived.values():
        return max(0.0, now - state.jobs[job_id].finished_at)
    return 0.0


async def _export_pass(master: Replica, history: History, cursor: int | None) -> tuple[int, ExportBatch]:
    """Write this replica's next batch of finished jobs to the store, the rows and the store's
    cursor in one transaction; return the store's cursor after it, and the batch (an empty one
    when the store is ahead of a follower's state: it is a moment behind). Raises StoreError or
    CursorMoved."""
    if cursor is None:
        cursor = await _read_cursor(master, history)
    with master.lock:
        if cursor > master.state.archive_seq and not master.raft.is_leader():
            return cursor, ExportBatch()
        batch = export_batch(master.state, cursor)
    if batch.problem:
        raise StoreError(batch.problem)
    if batch.records:
        started = time.perf_counter()
        new = await asyncio.to_thread(history.store.export, batch.records, cursor, batch.upto, master.now())
        history.exported += new
        log.debug("history exported jobs=%d new=%d upto=%d seconds=%.3f", len(batch.records), new,
                  batch.upto, time.perf_counter() - started)
    return (batch.upto if batch.records else cursor), batch


async def _read_cursor(master: Replica, history: History) -> int:
    """The store's cursor (its tables created or migrated first); notes a store behind the cluster."""
    await asyncio.to_thread(history.store.migrate)
    cursor = await asyncio.to_thread(history.store.cursor)
    with master.lock:
        archived = master.state.archived_upto
    if cursor < archived:
        history.gap = (f"the store lacks finished jobs {cursor + 1}..{archived}, which the cluster "
                       "archived in another store (a SQLite file per machine? a restored backup?)")
        log.warning("history store behind the cluster: %s", history.gap)
    return cursor


async def _wait_for_change(changed: asyncio.Event, next_change: Callable[[], asyncio.Event]) -> None:
    # Passes at least this far apart, found something or not: the state changes at every applied
    # entry, hundreds of times a second under load, and a pass per change (the lock, the scan, a
    # wake-up) was 2 % of a loaded leader's event loop for nothing. What changes meanwhile sets
    # `changed`, taken before the pass: the wait returns at once.
    await asyncio.sleep(EXPORT_MIN_INTERVAL_S)
    try:
        await asyncio.wait_for(changed.wait(), EXPORT_IDLE_S)
    except TimeoutError:
        return
    settled_by = time.monotonic() + EXPORT_SETTLE_MAX_S
    while (left := settled_by - time.monotonic()) > 0:
        try:
            await asyncio.wait_for(next_change().wait(), min(EXPORT_QUIET_S, left))
        except TimeoutError:
            return


async def _passes(master: Replica, history: History, running: Callable[[], bool],
                  one_pass: Callable[[int | None], Awaitable[tuple[int | None, bool] | None]]) -> None:
    """Run `one_pass(cursor)` while `running()`: it gets the store's cursor as last read or written
    (None: read it) and returns it with whether more waits (go on at once), or None when it did
    not use the store (this replica does not export now). A store that fails is retried with
    backoff, a cursor that moved is read again; between passes, `_wait_for_change`."""
    cursor: int | None = None
    delay = RETRY_FIRST_S
    while running():
        changed = master.state_changed()
        try:
            done = await one_pass(cursor)
            if done is None:  # nothing tried: the store's state is another loop's to tell
                cursor = None
                await asyncio.sleep(EXPORT_IDLE_S)
                continue
            cursor, more = done
            history._recovered()
            delay = RETRY_FIRST_S
            if more:
                continue
        except CursorMoved as exc:
            log.info("history cursor moved under this exporter: %s; re-reading it", exc)
            cursor = None
            continue
        except StoreError as exc:
            history._failed(exc, master.now())
            cursor = None
            await asyncio.sleep(delay)
            delay = min(RETRY_MAX_S, delay * 2)
            continue
        await _wait_for_change(changed, master.state_changed)


async def export_loop(loops: ExportDriver, history: History) -> None:
    """The leader's part, for as long as this term lasts (see the module docstring): propose
    HistoryExported up to the store's cursor as the exporting follower moves it; export itself when
    there is no follower, when it has not heard from the exporting one lately, or when finished
    jobs have waited TAKEOVER_S unarchived (that follower cut off from the store, or of a release
    that does not export)."""
    master = loops.master

    async def one_pass(cursor: int | None) -> tuple[int | None, bool] | None:
        with master.lock:
            waited = _oldest_unarchived_wait(master.state, master.now())
        exporter = _exporter(master, master.replica.raft)
        # Not heard from lately (down, cut off, or of a release that tells no version): no wait.
        if exporter is None or not master.raft.member_versions().get(exporter) or waited > TAKEOVER_S:
            cursor, batch = await _export_pass(master, history, cursor)
            upto = batch.upto  # above the store's cursor with nothing written: a proposal was lost
        else:  # the follower writes: read where it got
            cursor = upto = await (_read_cursor(master, history) if cursor is None
                                   else asyncio.to_thread(history.store.cursor))
            batch = ExportBatch()
        with master.lock:
            archived, last = master.state.archived_upto, master.state.archive_seq
        if archived < upto <= last:
            if not versions.may_propose(c.HistoryExported, master.raft.cluster_version()):
                # A new leader has not heard every member's version yet (or one still runs an
                # older release): the rows are in the store; the cursor's entry waits for it.
                await asyncio.sleep(RETRY_FIRST_S)
                return cursor, True
            result = await loops.propose(c.HistoryExported(at=master.now(), upto=upto))
            if result is None or not result.ok:
                await asyncio.sleep(RETRY_FIRST_S)
                return None, True  # read it again: the state or the store may have moved
        await _purge_if_due(history, master.now())
        return cursor, batch.more

    await _passes(master, history, lambda: not loops.stopped, one_pass)


async def follower_export_loop(master: Replica, history: History, stop: asyncio.Event) -> None:
    """A follower's part, until `stop`: while it is the exporter (`exporter_of`) and linked to its
    leader, write finished jobs to the store from its own state; the leader proposes the cursor."""

    async def one_pass(cursor: int | None) -> tuple[int | None, bool] | None:
        if master.raft.is_leader():
            return None  # export_loop's to do
        leader = master.raft.leader_if_connected()
        if leader is None or _exporter(master, leader) != master.replica.raft:
            history._stood_down()
            return None
        cursor, batch = await _export_pass(master, history, cursor)
        return cursor, batch.more

    await _passes(master, history, lambda: not stop.is_set(), one_pass)


async def _purge_if_due(history: History, now: float) -> None:
    retention = history.settings.retention
    if not retention or time.monotonic() - history.last_purge < PURGE_EVERY_S:
        return
    history.last_purge = time.monotonic()
    purged = await asyncio.to_thread(history.store.purge, now - retention)
    if purged:
        log.info("history purged jobs=%d retention_s=%.0f", purged, retention)


async def utilization_loop(loops: ExportDriver, history: History, every: float = UTILIZATION_EVERY_S) -> None:
    """Sample the cluster's utilisation into the store for as long as this term lasts."""
    master = loops.master
    failing = False
    while not loops.stopped:
        with master.lock:
            sample = cluster_sample(master.state.nodes.values())
        try:
            await asyncio.to_thread(history.store.add_utilization, sample, master.now())
            if failing:
                log.info("cluster utilisation sampled again")
            failing = False
        except StoreError as exc:  # the exporter reports the store's failures; the sample is lost
            if not failing:
                log.info("cluster utilisation not sampled: %s", exc)
            failing = True
        await asyncio.sleep(min(every, RETRY_FIRST_S * 4) if failing else every)  # soon: the exporter may migrate
