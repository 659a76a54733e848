"""The history exporter of a master: the I/O around `synapse.core.history.export_batch`.

On the leader only, `export_loop` reads the store's cursor, takes the next batch of finished jobs
from the replicated state (under the master lock), writes the rows and the new cursor in one store
transaction (in a worker thread: the event loop, and so submission and scheduling, never wait on
the database), then proposes HistoryExported(upto) so every replica knows those jobs are archived
and retention may count from now. If the leader dies between the store's commit and the proposal,
the next leader reads the store's cursor, finds nothing newer to write and proposes the cursor
alone; rows written twice are upserts of the same values. While the store is unreachable the loop
retries with backoff, and finished jobs wait in the replicated state (up to the cap, see
`LeaderState._forget`); `History.lag_reason` says why for logs, metrics and `readyz?verbose`.

Beside it, `utilization_loop` samples the nodes every UTILIZATION_EVERY_S and adds the seconds since
the store's last sample to the day's cluster row (`HistoryStore.add_utilization`): utilisation is
not in the log, so a failover or a store outage loses what is beyond UTILIZATION_MAX_GAP_S.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from synapse.core import codec
from synapse.core import commands as c
from synapse.core.history import EXPORT_BATCH, UTILIZATION_EVERY_S, cluster_sample, export_batch
from synapse.history.settings import HistorySettings
from synapse.history.store import CursorMoved, HistoryStore, StoreError, redacted

log = logging.getLogger(__name__)

#: How often the exporter looks for finished jobs when nothing woke it.
EXPORT_IDLE_S = 1.0
#: Exports (and the passes that look for them) are at least this far apart: jobs finishing meanwhile go
#: into one transaction and one proposal.
EXPORT_MIN_INTERVAL_S = 0.2
#: Backoff between attempts while the store fails: from the first to the last, doubling.
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 30.0
#: How often the leader purges rows older than `history.retention`.
PURGE_EVERY_S = 3600.0


class ExportDriver(Protocol):
    """What the exporter needs of the leader loops it runs in (synapse.master.leader.LeaderLoops)."""

    master: Any  #: the replica (synapse.master.replica.Master): its lock, state and change events
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


async def export_loop(loops: ExportDriver, history: History) -> None:
    """Export finished jobs for as long as this term lasts (see the module docstring)."""
    master = loops.master
    cursor: int | None = None  # the store's, as last read or written by this loop
    delay = RETRY_FIRST_S
    while not loops.stopped:
        changed = master.state_changed()
        try:
            if cursor is None:
                await asyncio.to_thread(history.store.migrate)
                cursor = await asyncio.to_thread(history.store.cursor)
                with master.lock:
                    archived = master.state.archived_upto
                if cursor < archived:
                    history.gap = (f"the store lacks finished jobs {cursor + 1}..{archived}, which the cluster "
                                   "archived in another store (a SQLite file per machine? a restored backup?)")
                    log.warning("history store behind the cluster: %s", history.gap)
            with master.lock:
                batch = export_batch(master.state, cursor)
                archived = master.state.archived_upto
            if batch.problem:
                raise StoreError(batch.problem)
            if batch.records:
                started = time.perf_counter()
                new = await asyncio.to_thread(history.store.export, batch.records, cursor, batch.upto, master.now())
                history.exported += new
                log.debug("history exported jobs=%d new=%d upto=%d seconds=%.3f", len(batch.records), new,
                          batch.upto, time.perf_counter() - started)
                cursor = batch.upto
            if batch.upto > archived:
                if master.raft.cluster_version() < codec.KIND_VERSIONS[c.HistoryExported]:
                    # A new leader has not heard every member's version yet (or one still runs an
                    # older release): the rows are in the store; the cursor's entry waits for it.
                    await asyncio.sleep(RETRY_FIRST_S)
                    continue
                result = await loops.propose(c.HistoryExported(at=master.now(), upto=batch.upto))
                if result is None or not result.ok:
                    cursor = None  # re-read: the state or the store may have moved
                    await asyncio.sleep(RETRY_FIRST_S)
                    continue
            history._recovered()
            delay = RETRY_FIRST_S
            await _purge_if_due(history, master.now())
            if batch.more:
                continue
            # Passes at least this far apart, found something or not: the state changes at every
            # applied entry, hundreds of times a second under load, and a pass per change (the
            # lock, the scan, a wake-up) was 2 % of a loaded leader's event loop for nothing. What
            # changes meanwhile sets `changed`, taken before this pass: the wait below returns at once.
            await asyncio.sleep(EXPORT_MIN_INTERVAL_S)
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
        try:
            await asyncio.wait_for(changed.wait(), EXPORT_IDLE_S)
        except TimeoutError:
            pass


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
