"""The asyncio driver of one leadership term: it feeds the leader's brain and proposes what it decides.

Every decision lives in `synapse.core.brain.leader_state.LeaderState` (pure, and driven by the simulator
too). This module only keeps time: it runs the scheduling loop (a round on every change, at least
every SCHEDULE_TICK_S) and the monitor loop, turns heartbeats into stimuli, takes the master lock
while the brain reads the state, proposes the brain's commands stamped with this term, and feeds
back each outcome.

Every command proposed here carries the term the loops were started in. If this replica was
deposed and a newer leader has already committed a command, the state machine refuses ours (term
fencing), so a stale leader can never commit a plan or declare a node dead.

Before acting, the loops commit a Barrier: once it is applied, this replica's state holds every
command committed by earlier leaders, so its first plan is computed from current state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING

from synapse.core import commands as c
from synapse.core.brain.config import LeaderConfig
from synapse.core.brain.leader_state import LeaderState, LeaderView
from synapse.core.brain.stimuli import (
    HealthReport,
    Heartbeat,
    Instruction,
    LivenessDigest,
    MonitorDue,
    ProgressReport,
    Propose,
    Proposed,
    Reschedule,
    RoundDue,
    Started,
    Stimulus,
)
from synapse.master.link_shard import ShardTimings
from synapse.master.raft import ProposeError
from synapse.proto import api_pb2
from synapse.rpc import convert

if TYPE_CHECKING:
    from synapse.master.replica import Master

log = logging.getLogger(__name__)

#: Safety tick: a scheduling round runs at least this often even if nothing signalled a change.
SCHEDULE_TICK_S = 1.0
#: Rounds are at least this far apart: changes arriving meanwhile are handled by one round. A
#: change that may let a waiting gang start (Replica.scheduler_urgent) waits less (`_pace`).
SCHEDULE_MIN_INTERVAL_S = 0.02


class LeaderLoops:
    """The loops one leadership term runs; `stop()` cancels them all.

    Every loop also checks `stopped`, and a stopped term proposes nothing: Python 3.11's
    `asyncio.wait_for` can swallow a cancellation that races with its result, and a loop that
    survived its term went on proposing with the old term (rejected as stale, but forever) and
    kept the process from stopping."""

    def __init__(self, master: Master, term: int) -> None:
        self.master = master
        self.term = term  #: every proposal carries it
        self.ready = asyncio.Event()  #: set once the barrier committed and state is current
        config = master.config
        #: the term's decisions; touched only on the event loop, under the master lock
        history = master.history
        shards = ShardTimings.of(config.heartbeat_interval)
        self.brain = LeaderState(LeaderConfig(
            heartbeat_timeout=config.heartbeat_timeout, shard_silence=shards.silence, shard_move=shards.move,
            late_after=max(config.heartbeat_timeout / 2, config.heartbeat_timeout - config.heartbeat_interval),
            job_retention=config.job_retention,
            history=history is not None, usage_half_life=config.fair_share_half_life,
            max_unarchived=history.settings.max_unarchived if history is not None else 0, spares=config.spares))
        self.view: LeaderView = self.brain  #: what endpoints, metrics and the dashboard read
        self._tasks: list[asyncio.Task[None]] = []
        self.stopped = False

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._run()))

    def stop(self) -> None:
        self.stopped = True
        for task in self._tasks:
            task.cancel()

    async def _run(self) -> None:
        while not self.stopped:
            try:
                await self.master.propose(c.Barrier(at=time.time(), term=self.term, reason="leader start"))
                break
            except ProposeError as exc:
                log.info("leader barrier failed term=%d kind=%s; retrying", self.term, exc.kind)
                await asyncio.sleep(0.05)
        if self.stopped:
            return
        out = self._handle(Started(at=time.time(), mono=time.monotonic()))
        self.ready.set()
        log.info("leader ready term=%d nodes=%d", self.term, len(self.master.state.nodes))
        self._spawn(self.carry_out(out))
        self._tasks += [asyncio.create_task(self._schedule_loop()), asyncio.create_task(self._monitor_loop())]
        if self.master.history is not None:
            from synapse.history.exporter import (  # SQLAlchemy: loaded with a history store only
                export_loop,
                utilization_loop,
            )

            self._tasks += [asyncio.create_task(export_loop(self, self.master.history)),
                            asyncio.create_task(utilization_loop(self, self.master.history))]

    # ---- feeding the brain, carrying out what it says ------------------------------------------------

    def _handle(self, *stimuli: Stimulus) -> list[Instruction]:
        with self.master.lock:
            return self.brain.handle(self.master.state, *stimuli)

    async def carry_out(self, instructions: list[Instruction]) -> None:
        """Propose the commands (together: the log keeps their order), feed back their outcomes,
        and carry out what those call for in turn."""
        while instructions:
            proposals = [i for i in instructions if isinstance(i, Propose)]
            if any(isinstance(i, Reschedule) for i in instructions):
                self.master.scheduler_dirty.set()
            results = await asyncio.gather(*(self.propose(p.cmd) for p in proposals))
            instructions = self._handle(*(Proposed(p, r is not None and r.ok, r.value if r is not None else "")
                                          for p, r in zip(proposals, results, strict=True)))

    async def propose(self, cmd: c.Command) -> c.Result | None:
        """Propose a command of this term; None if it did not commit (the brain hears it failed)."""
        if self.stopped:
            return None
        cmd = dataclasses.replace(cmd, term=self.term)
        try:
            result = await self.master.propose(cmd)
        except ProposeError as exc:
            log.info("leader proposal failed cmd=%s kind=%s term=%d", type(cmd).__name__, exc.kind, self.term)
            return None
        if not result.ok:
            log.info("leader proposal rejected cmd=%s error=%s", type(cmd).__name__, result.error)
        elif isinstance(cmd, c.NodeDown):  # the chaos checker holds every one against a machine fault
            log.warning("node declared down node=%s term=%d reason=%s", cmd.node_id, self.term, cmd.reason)
        return result

    def _spawn(self, work: Coroutine[object, object, None]) -> None:
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(asyncio.create_task(work))

    # ---- the loops ---------------------------------------------------------------------------------

    async def _schedule_loop(self) -> None:
        dirty = self.master.scheduler_dirty
        while not self.stopped:
            full = False
            try:
                await asyncio.wait_for(dirty.wait(), SCHEDULE_TICK_S)
            except TimeoutError:
                full = True  # the periodic round looks at every job (time moves backfill windows)
            dirty.clear()
            self.master.scheduler_urgent.clear()
            started = time.monotonic()
            try:
                await self.schedule_once(full)
            except Exception:  # noqa: BLE001 - a bad round must not end scheduling for the whole term
                log.exception("scheduling round failed term=%d; the next round tries again", self.term)
            await self._pace(started, time.monotonic())

    async def _pace(self, started: float, ended: float) -> None:
        """Wait before the next round. Changes batch for up to SCHEDULE_MIN_INTERVAL_S from the last
        round's start (a stream of submissions to a long queue gets a round per batch, not per
        submission); one that may let a waiting gang start (resources freed, a hold released) or
        a submission to a short queue (replica.urgent: scheduler_urgent) ends the wait, but no
        sooner than the last round took after it, so rounds never take more than half the loop.
        Before, a cancel's freed nodes waited out the pause that followed the round its own commit
        set off (bench/gang.py measures the hand-over by cancel)."""
        urgent = self.master.scheduler_urgent
        until, soonest = started + SCHEDULE_MIN_INTERVAL_S, ended + (ended - started)
        while (now := time.monotonic()) < until and not self.stopped:
            if urgent.is_set():
                if soonest > now:
                    await asyncio.sleep(min(soonest, until) - now)
                return
            try:
                await asyncio.wait_for(urgent.wait(), until - now)
            except TimeoutError:
                return

    async def schedule_once(self, full: bool = True) -> None:
        """One round: the brain plans, this proposes, and the next round waits for the outcomes."""
        started = time.perf_counter()
        out = self._handle(RoundDue(at=time.time(), full=full))
        if self.master.metrics is not None:
            self.master.metrics.round_seconds.observe(time.perf_counter() - started)
        await self.carry_out(out)

    async def _monitor_loop(self) -> None:
        period = min(1.0, self.master.config.heartbeat_timeout / 4)
        while not self.stopped:
            await asyncio.sleep(period)
            await self.check_once()

    async def check_once(self) -> None:
        """Silent nodes, time limits and retention, by the brain's verdict."""
        await self.carry_out(self._handle(MonitorDue(at=time.time(), mono=time.monotonic(),
                                                     cluster_version=self.master.raft.cluster_version())))

    def heard(self, node_id: str, health: HealthReport | None = None) -> str:
        """A node was heard from (heartbeat or registration); its status in the state ('' if unknown).
        What the brain proposes in answer (NodeUp, SetNodeHealth) goes out without holding the caller."""
        with self.master.lock:
            out = self.brain.handle(self.master.state, Heartbeat(node_id, time.time(), time.monotonic(), health))
            node = self.master.state.nodes.get(node_id)
            status = node.status.value if node is not None else ""
        if out:
            self._spawn(self.carry_out(out))
        return status

    def progress(self, reports: list[ProgressReport]) -> None:
        """Tasks' progress reports (synapse.worker.progress); what the brain proposes goes out
        without holding the caller."""
        out = self._handle(*reports)
        if out:
            self._spawn(self.carry_out(out))

    def digest(self, digest: api_pb2.LivenessDigest) -> None:
        """A link shard's digest (an api_pb2.LivenessDigest): its changes as heartbeats, its ages as
        one stimulus; what the brain proposes goes out without holding the caller."""
        now, mono = time.time(), time.monotonic()
        stimuli: list[Stimulus] = [Heartbeat(h.node_id, now, mono,
                                   HealthReport(h.unhealthy, h.health_message, h.drain_on_failure),
                                   convert.gpu_errors_from_proto(h)) for h in digest.changes]
        stimuli.append(LivenessDigest(digest.shard, now, mono, tuple(zip(
            digest.node_ids, (age / 1000 for age in digest.ages_ms), strict=True))))
        out = self._handle(*stimuli)
        if out:
            self._spawn(self.carry_out(out))
