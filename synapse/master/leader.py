"""Leader-only work: scheduling, heartbeat expiry, time limits. Started on gaining leadership.

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
from typing import TYPE_CHECKING

from synapse.core import commands as c
from synapse.core import preemption
from synapse.core.admission import max_block
from synapse.core.model import JobStatus, NodeStatus
from synapse.core.scheduler import Reservation, RoundMemo, WaitReason, schedule_round
from synapse.master.heartbeat import health_change
from synapse.master.raft import ProposeError

if TYPE_CHECKING:
    from synapse.master.replica import Master

log = logging.getLogger(__name__)

#: Safety tick: a scheduling round runs at least this often even if nothing signalled a change.
SCHEDULE_TICK_S = 1.0
#: Rounds are at least this far apart: changes arriving meanwhile are handled by one round.
SCHEDULE_MIN_INTERVAL_S = 0.02
#: Pending reasons recorded per round, at most (about 100 bytes each in the log entry).
PENDING_BATCH = 1000
#: Waiting gangs a round may try to plan a preemption for.
PREEMPT_TRIES = 20
#: How often finished jobs past their retention are forgotten, and how many per command.
RETENTION_SWEEP_S = 10.0
FORGET_CHUNK = 500


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
        self.reservation: Reservation | None = None  #: the head blocked gang's (describe shows it)
        self.reservations: tuple[Reservation, ...] = ()  #: every blocked gang's, carried between rounds
        self.waiting: dict[str, WaitReason] = {}  #: why each pending job waits, from the last round
        self.memo: RoundMemo | None = None  #: lets a round after submissions alone skip the jobs seen
        self._tasks: list[asyncio.Task] = []
        self.stopped = False
        self._proposed_up: set[str] = set()  #: nodes a NodeUp is already on its way for
        self._proposed_health: set[str] = set()  #: nodes a SetNodeHealth is already on its way for
        self._last_sweep = 0.0  #: monotonic time of the last retention sweep
        #: (job, attempt, state.other_changes) found to have no preemption plan, and why
        self._no_plan: dict[tuple[str, int, int], str] = {}

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
        with self.master.lock:
            nodes = list(self.master.state.nodes)
        self.master.heartbeats.grace(nodes, time.monotonic())
        self.ready.set()
        log.info("leader ready term=%d nodes=%d", self.term, len(nodes))
        self.master.scheduler_dirty.set()
        self._tasks += [asyncio.create_task(self._schedule_loop()), asyncio.create_task(self._monitor_loop())]

    async def propose(self, cmd: c.Command) -> c.Result | None:
        """Propose a leader-only command; None if it did not commit (the next round retries)."""
        if self.stopped:
            return None
        try:
            result = await self.master.propose(cmd)
        except ProposeError as exc:
            log.info("leader proposal failed cmd=%s kind=%s term=%d", type(cmd).__name__, exc.kind, self.term)
            return None
        if not result.ok:
            log.info("leader proposal rejected cmd=%s error=%s", type(cmd).__name__, result.error)
        return result

    # ---- scheduling ----------------------------------------------------------------------------

    async def _schedule_loop(self) -> None:
        dirty = self.master.scheduler_dirty
        while not self.stopped:
            full = False
            try:
                await asyncio.wait_for(dirty.wait(), SCHEDULE_TICK_S)
            except TimeoutError:
                full = True  # the periodic round looks at every job (time moves backfill windows)
            dirty.clear()
            started = time.monotonic()
            await self.schedule_once(full)
            await asyncio.sleep(max(0.0, SCHEDULE_MIN_INTERVAL_S - (time.monotonic() - started)))

    async def schedule_once(self, full: bool = True) -> None:
        now = time.time()
        started = time.perf_counter()
        with self.master.lock:
            result = schedule_round(self.master.state, now, self.reservations, None if full else self.memo)
        if self.master.metrics is not None:
            self.master.metrics.round_seconds.observe(time.perf_counter() - started)
        self.reservation, self.reservations = result.reservation, result.reservations
        self.waiting, self.memo = result.waiting, result.memo
        if not result.plans:
            await self.preempt_once(now)
            await self.record_pending(now, result.examined)
            return
        outcomes = await asyncio.gather(*(self.propose(c.CommitPlan(
            at=now, term=self.term, job_id=p.job_id, attempt=p.attempt, placements=p.placements))
            for p in result.plans))
        for plan, outcome in zip(result.plans, outcomes, strict=True):
            if outcome is not None and outcome.ok:
                log.info("gang committed job=%s attempt=%d tasks=%d nodes=%d", plan.job_id, plan.attempt,
                         len(plan.placements), len({p.node_id for p in plan.placements}))
            else:
                self.master.scheduler_dirty.set()  # the state moved under the plan: plan again

    async def record_pending(self, now: float, examined: list[str]) -> None:
        """Put into the log why gangs wait, for those whose reason changed since it was recorded
        (at most PENDING_BATCH a round): `describe job` and the event stream then show it on any
        replica, and the log grows with changes, not with rounds."""
        with self.master.lock:
            jobs = self.master.state.jobs
            entries = []
            for job_id in examined:
                reason, job = self.waiting.get(job_id), jobs.get(job_id)
                if reason is not None and job is not None and job.status is JobStatus.PENDING \
                        and job.pending_reason != reason.code:
                    entries.append(c.PendingReason(job_id, job.attempt, reason.code, reason.message))
                    if len(entries) == PENDING_BATCH:
                        break
        if entries:
            await self.propose(c.PendingReasons(at=now, term=self.term, entries=tuple(entries)))
        if len(entries) == PENDING_BATCH:  # more to record: the next round looks at every job again
            self.memo = None
            self.master.scheduler_dirty.set()

    async def preempt_once(self, now: float) -> None:
        """Plan one preemption for the first waiting gang, in queue order, that a rule allows.

        Only jobs of queues an admin defined preempt (the implicit default queue never does, so a
        cluster without queues schedules as before). A job found to have no plan is not planned
        again until the state changes otherwise than by submissions."""
        proposal = None
        with self.master.lock:
            state = self.master.state
            if not state.queues:
                return
            tried = 0
            for job in state.pending_jobs():
                if tried >= PREEMPT_TRIES or job.id not in self.waiting or job.id in state.holds:
                    continue
                if state.queue_of(job) not in state.queues or max_block(state, job):
                    continue
                key = (job.id, job.attempt, state.other_changes)
                if key in self._no_plan:
                    continue
                tried += 1
                found = preemption.plan(state, job, now)
                if isinstance(found, str):
                    self._no_plan[key] = found
                    reason = self.waiting[job.id]
                    self.waiting[job.id] = dataclasses.replace(
                        reason, message=f"{reason.message}; no preemption: {found}")
                    continue
                proposal = dataclasses.replace(found.command, term=self.term)
                break
        if len(self._no_plan) > 10_000:
            self._no_plan.clear()
        if proposal is None:
            return
        result = await self.propose(proposal)
        if result is not None and result.ok:
            log.info("preemption committed job=%s rule=%s victims=%s nodes=%s", proposal.job_id, proposal.rule,
                     ",".join(v.job_id for v in proposal.victims), ",".join(proposal.nodes))
        self.master.scheduler_dirty.set()

    # ---- heartbeats and time limits ---------------------------------------------------------------

    async def _monitor_loop(self) -> None:
        period = min(1.0, self.master.config.heartbeat_timeout / 4)
        while not self.stopped:
            await asyncio.sleep(period)
            await self.check_once()

    async def check_once(self) -> None:
        now, mono = time.time(), time.monotonic()
        with self.master.lock:
            state = self.master.state
            ready = [n.id for n in state.nodes.values() if n.status is NodeStatus.READY]
            overdue = [(j.id, j.attempt, j.spec.time_limit) for j in state.jobs.values()
                       if j.status is JobStatus.RUNNING and j.spec.time_limit
                       and now - j.started_at > j.spec.time_limit]
        for node_id, silent in self.master.heartbeats.expired(ready, mono):
            log.warning("node silent node=%s silent_s=%.1f; declaring it down", node_id, silent)
            await self.propose(c.NodeDown(at=now, term=self.term, node_id=node_id,
                                          reason=f"no heartbeat for {silent:.1f}s"))
        for job_id, attempt, limit in overdue:
            log.info("time limit reached job=%s attempt=%d limit_s=%.0f", job_id, attempt, limit)
            await self.propose(c.FailAttempt(at=now, term=self.term, job_id=job_id, attempt=attempt,
                                             reason=f"time limit of {limit:.0f}s exceeded", final=True,
                                             cause="TimeLimit"))
        await self.forget_expired(now, mono)

    async def forget_expired(self, now: float, mono: float) -> None:
        """Forget finished jobs older than the retention period (Slurm's MinJobAge)."""
        retention = self.master.config.job_retention
        if not retention or mono - self._last_sweep < RETENTION_SWEEP_S:
            return
        self._last_sweep = mono
        with self.master.lock:
            expired = [j.id for j in self.master.state.jobs.values()
                       if j.status.terminal and now - j.finished_at > retention]
        for start in range(0, len(expired), FORGET_CHUNK):
            chunk = tuple(expired[start:start + FORGET_CHUNK])
            result = await self.propose(c.ForgetJobs(at=now, term=self.term, job_ids=chunk))
            if result is not None and result.ok:
                log.info("finished jobs forgotten count=%s retention_s=%.0f", result.value, retention)

    def node_heard(self, node_id: str) -> None:
        """A heartbeat arrived; a node the state holds DOWN is brought back (once)."""
        self.master.heartbeats.beat(node_id, time.monotonic())
        with self.master.lock:
            node = self.master.state.nodes.get(node_id)
            down = node is not None and node.status is NodeStatus.DOWN
        if down and node_id not in self._proposed_up:
            self._proposed_up.add(node_id)
            self._tasks = [t for t in self._tasks if not t.done()]

            async def bring_up() -> None:
                try:
                    await self.propose(c.NodeUp(at=time.time(), term=self.term, node_id=node_id))
                finally:
                    self._proposed_up.discard(node_id)

            self._tasks.append(asyncio.create_task(bring_up()))

    def node_health(self, node_id: str, unhealthy: bool, message: str, drain: bool) -> None:
        """A heartbeat's health report: record a change in the state (one proposal at a time per node)."""
        with self.master.lock:
            cmd = health_change(self.master.state.nodes.get(node_id), unhealthy, message, drain, time.time(),
                                self.term)
        if cmd is None or node_id in self._proposed_health:
            return
        self._proposed_health.add(node_id)
        self._tasks = [t for t in self._tasks if not t.done()]

        async def record() -> None:
            try:
                result = await self.propose(cmd)
                if result is not None and result.ok:
                    log.info("node health recorded node=%s healthy=%s message=%s", node_id, cmd.healthy, cmd.message)
            finally:
                self._proposed_health.discard(node_id)

        self._tasks.append(asyncio.create_task(record()))
