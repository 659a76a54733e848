"""The leader's decisions, in one pure state machine: stimuli in, commands to propose out.

dask's `WorkerState` is the model. `LeaderState.handle(state, *stimuli)` is the only way in: it reads
the replicated `ClusterState` (never changes it) and its own memory, and returns instructions —
commands to propose and requests for another round. Whoever drives it carries them out: on a real
cluster `synapse.master.leader` proposes them through Raft (stamping its term) and feeds each
outcome back as a `Proposed` stimulus; `synapse.sim.engine` applies them to its state on a simulated
clock and does the same. No clock, no lock, no I/O here: the driver passes the time in every
stimulus and holds whatever lock guards the state while `handle` runs.

What it decides:

* **A scheduling round** (`RoundDue`): the queue policy's plans become CommitPlan commands; the
  reservations and the memo of the round carry over to the next. A round that places nothing may
  plan one preemption (`Preempt`) for the first waiting gang of an admin-defined queue, in queue
  order, that a rule allows (at most PREEMPT_TRIES tried; a gang found to have no plan is not
  planned again until the state changes otherwise than by submissions), and records why gangs wait
  (`PendingReasons`, for those whose reason changed). A pending job a dependency of which can never
  be met (synapse.core.dependencies) is failed for good, `FailAttempt(final, cause
  DependencyNeverSatisfied)` naming the upstream job, unless it asked to wait.
* **Spares** (with `LeaderConfig.spares`, synapse.core.schedule.spares): each round first proposes the
  spare set `designate` chooses when it differs from the state's (`SetSpares`, from command-set
  version 4), and evicts the guests of spares for the first restart after a lost node that waits
  (`Preempt`, rule `spare`: their notice and grace, then the nodes are the restart's).
* **Heartbeat expiry, time limits, retention** (`MonitorDue`): a READY node silent for longer than
  the heartbeat timeout goes DOWN (a new leader first gives every node a full timeout, `Started`);
  a running attempt past its time limit fails for good (a job with a checkpoint notice gets its
  notice first: `CheckpointNotice` `notice` seconds before the limit, and the stop at the limit, or
  `notice` after a notice that went out late); finished jobs past their retention are
  forgotten (with a history store: counted from when the store held them, and never before, unless
  the unarchived jobs outgrow their cap: then the oldest go with HistoryOverflow, a Warning event).
  The mass-silence guard (Kubernetes' node lifecycle controller stops evicting when most of a
  zone goes unready at once): when more than `mass_silence_share` of the READY nodes, and more
  than `mass_silence_min`, are late at a pass that would declare nodes DOWN, the fault is more
  likely the leader's own view (its network, a stall) than the machines, so it holds them; only a
  silence that lasts `mass_silence_hold` longer gets them declared.
* **Heartbeats** (`Heartbeat`): a node the state holds DOWN comes back up, and a health report that
  differs from the state is recorded, and a GPU error the worker reports (from command-set
  version 4) cordons the node and stops the gangs on those GPUs (GpuFault, `gpu_fault_change`);
  one proposal at a time per node for each. Replicas absorb
  their link shard's heartbeats and forward only those that call for such a change.
* **Progress** (`ProgressReport`): what a task wrote to its progress file, as its worker forwarded
  it. The leader keeps each job's latest in memory (describe job reads it) and puts the attempt's
  last checkpoint into the log (`RecordProgress`, command-set version 4) so that a new leader
  accounts goodput the same: only when the checkpoint changed, the attempt's first at once and then
  at most one per job every `checkpoint_record_interval` (a stopping attempt's, and every pending
  one before a node is declared DOWN, at once), never one per report; a progress file's garbage
  once per attempt.
* **Liveness digests** (`LivenessDigest`): a shard's nodes heard since its last digest, with how
  long ago; they feed heartbeat expiry (synapse.core.brain.heartbeat: a shard whose digests stop gives
  its nodes a full timeout to move before any is declared DOWN).

Readers (the API, metrics, the dashboard) see it only through `LeaderView`. They may run on other
threads, so every attribute a view reads is replaced whole, never changed in place.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from synapse.core import codec, dependencies
from synapse.core import commands as c
from synapse.core.brain.heartbeat import GpuErrorReport, HeartbeatTracker, Silence, gpu_fault_change, health_change
from synapse.core.model import (
    DEFAULT_IMAGE_PULL_TIMEOUT_S,
    EndReason,
    Job,
    JobStatus,
    NodeStatus,
    Progress,
    excluded_for,
    gang_unprepared,
)
from synapse.core.schedule import admission, preemption, spares
from synapse.core.schedule.elastic import at_size, growth, is_elastic, place_largest
from synapse.core.schedule.eligibility import HELD_CODES
from synapse.core.schedule.placement import ClusterView
from synapse.core.schedule.reservations import Reservation
from synapse.core.schedule.scheduler import RoundMemo, RoundResult, WaitReason, schedule_round
from synapse.core.schedule.spares import SparePolicy
from synapse.core.state.fsm import ClusterState

log = logging.getLogger(__name__)

#: Pending reasons recorded per round, at most (about 100 bytes each in the log entry).
PENDING_BATCH = 1000
#: Waiting gangs a round may try to plan a preemption for.
PREEMPT_TRIES = 20
#: Gangs remembered to have no preemption plan, at most (the memo is cleared beyond it).
NO_PLAN_MEMO = 10_000
#: How often finished jobs past their retention are forgotten, and how many per command.
RETENTION_SWEEP_S = 10.0
FORGET_CHUNK = 500


@dataclass(frozen=True, slots=True)
class PreemptionStep:
    """What the preemption step decides: the gang it preempts for (its plan), or none; and the gangs
    it found without a plan, why, by (job, attempt, state.other_changes)."""

    job_id: str = ""
    plan: preemption.PreemptionPlan | None = None
    no_plan: dict[tuple[str, int, int], str] = dataclasses.field(default_factory=dict)
    cut: bool = False  #: it stopped at PREEMPT_TRIES gangs tried


#: A queue policy: (state, now, previous reservations, memo) -> the round's plans, as schedule_round.
QueuePolicy = Callable[[ClusterState, float, "Reservation | tuple[Reservation, ...] | None", "RoundMemo | None"],
                       RoundResult]


@dataclass(frozen=True, slots=True)
class LeaderConfig:
    """What a leader is told once, for its whole term."""

    heartbeat_timeout: float = 10.0  #: a READY node silent this long goes DOWN
    shard_silence: float = 3.0  #: a link shard whose digests stopped this long is silent
    #: a silent shard's nodes may take this long (at least the timeout) from its last digest to move
    shard_move: float = 0.0
    #: a node silent this long counts toward a mass silence (0: half the timeout); at most the
    #: timeout less the heartbeat interval, so all the nodes of a sudden silence count at once
    late_after: float = 0.0
    #: the guard holds expiring nodes while more than this share of the READY nodes is late ...
    mass_silence_share: float = 0.5
    #: ... and more than this many (a rack of a small cluster going dark is declared at once, and
    #: a 3-node test cluster never trips it)
    mass_silence_min: int = 10
    #: a mass silence must last this much longer (from when the guard engaged) for its nodes to
    #: go DOWN (0: one heartbeat timeout)
    mass_silence_hold: float = 0.0
    #: finished jobs are forgotten this long after they end (with history: after the store holds
    #: them); 0 keeps them
    job_retention: float = 3600.0
    history: bool = False  #: a history store is configured: never forget a job it does not hold yet
    max_unarchived: int = 0  #: with history: finished jobs kept unarchived at most; beyond, the oldest go (loudly)
    #: the decayed usage's half-life the state should have (synapse.core.schedule.fairshare); None: leave it be
    usage_half_life: float | None = None
    preempt: bool = True  #: plan preemptions (only for jobs of admin-defined queues)
    #: a job's changed checkpoint goes into the log at most this often (its attempt's first at once)
    checkpoint_record_interval: float = 15.0
    policy: QueuePolicy = schedule_round  #: the queue policy (the simulator runs baselines through it)
    spares: SparePolicy | None = None  #: spare nodes to keep (synapse.core.schedule.spares); None: none


# ---- stimuli --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    """The leader's barrier committed: the state holds everything earlier leaders committed."""

    at: float  #: wall clock
    mono: float  #: monotonic clock (heartbeat silence is counted on it)


@dataclass(frozen=True, slots=True)
class RoundDue:
    """Time for a scheduling round; `full` looks at every pending job, else the memo may skip
    the ones the last round saw (the periodic round is full: time moves backfill windows)."""

    at: float
    full: bool = True


@dataclass(frozen=True, slots=True)
class MonitorDue:
    """Time to look for silent nodes, attempts past their time limit and expired jobs."""

    at: float
    mono: float
    #: the command-set version every member applies (synapse.master.raft.RaftNode.cluster_version):
    #: from 2, forgotten jobs keep their final states (ArchiveJobs) and arrays are forgotten too
    cluster_version: int = codec.BASE_VERSION


@dataclass(frozen=True, slots=True)
class HealthReport:
    """A worker's health check result, as its heartbeat carries it."""

    unhealthy: bool
    message: str = ""
    drain: bool = False  #: a failing check drains the node (stops its gangs), not just cordons it


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A node was heard from (a heartbeat, or its registration, which carries no health)."""

    node_id: str
    at: float
    mono: float
    health: HealthReport | None = None
    gpu_errors: tuple[GpuErrorReport, ...] = ()  #: the GPU errors its worker sees now


@dataclass(frozen=True, slots=True)
class LivenessDigest:
    """A link shard's digest: the nodes it heard since its last one, each with the seconds since."""

    shard: str  #: the replica that sends it (its API address)
    at: float
    mono: float  #: when it arrived, on the leader's monotonic clock
    ages: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Proposed:
    """The outcome of a `Propose`: `ok` when its command committed and applied without rejection."""

    proposal: Propose
    ok: bool
    value: str = ""  #: the command's result value (e.g. how many jobs a ForgetJobs forgot)


@dataclass(frozen=True, slots=True)
class ProgressReport:
    """A task's progress file changed: its last complete value, as its worker forwarded it."""

    job_id: str
    attempt: int
    index: int
    node_id: str  #: the worker that forwarded it: only the task's own node may speak for it
    at: float  #: when the leader heard it (wall clock)
    step: int = -1  #: -1: not said
    checkpoint_at: float = 0.0  #: when its last checkpoint was saved; 0: none said
    checkpoint_step: int = -1
    problem: str = ""  #: the file held garbage (ignored); the worker says it once per task


Stimulus = Started | RoundDue | MonitorDue | Heartbeat | LivenessDigest | ProgressReport | Proposed


# ---- instructions ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Propose:
    """Propose this command (the driver stamps its term) and report the outcome with `Proposed`."""

    cmd: c.Command


@dataclass(frozen=True, slots=True)
class Reschedule:
    """Run another scheduling round soon: the state may have moved under the last one."""

    why: str


Instruction = Propose | Reschedule


class LeaderView(Protocol):
    """What the API, metrics and the dashboard may read of the leader: read-only, whole values."""

    def wait_reason(self, job_id: str) -> WaitReason | None:
        """Why a pending job waited in the last round, or None."""

    def head_reservation(self) -> Reservation | None:
        """The head blocked gang's reservation, from the last round."""

    def reservations(self) -> tuple[Reservation, ...]:
        """Every blocked gang's reservation from the last round, the head's first."""

    def waiting(self) -> dict[str, WaitReason]:
        """Every pending job's wait reason from the last round (do not change it)."""

    def shard_silences(self, shards: Iterable[str], now: float) -> dict[str, float]:
        """Seconds since each link shard's last digest reached the leader (`now`: monotonic)."""

    @property
    def held_silent(self) -> int:
        """Silent nodes the mass-silence guard held back from DOWN at the last monitor pass."""

    def progress_of(self, job_id: str) -> Progress | None:
        """A job's latest progress as its tasks reported it to this leader (newer than the log's)."""

    def what_if(self, state: ClusterState, job: Job, now: float) -> preemption.PreemptionPlan | str:
        """What the leader's preemption step would do for a pending job now: its plan, or why none."""


class LeaderState:
    """One leadership term's memory and decisions. Mutated only through `handle`."""

    def __init__(self, config: LeaderConfig = LeaderConfig()) -> None:
        self.config = config  #: fixed for the term
        #: last heartbeat per node (monotonic); handle only
        self.heartbeats = HeartbeatTracker(config.heartbeat_timeout, config.shard_silence,
                                           config.shard_move, config.late_after)
        #: monotonic time the mass-silence guard engaged, or None while it is off; handle only
        self.mass_silence_since: float | None = None
        #: silent nodes the guard held back from DOWN at the last monitor pass; handle only (a metric)
        self.held_silent = 0
        self.last_round: RoundResult | None = None  #: the last round's result; handle only, replaced whole
        #: the reservations handed to the next round (every blocked gang's, or the head's alone for a
        #: policy that keeps one); handle only
        self.previous: Reservation | tuple[Reservation, ...] | None = None
        self.memo: RoundMemo | None = None  #: lets a round after submissions alone skip the jobs seen; handle only
        #: why each pending job waits, from the last round (with any preemption verdict); handle only,
        #: replaced whole (readers may be on other threads)
        self._waiting: dict[str, WaitReason] = {}
        #: (job, attempt, state.other_changes) found to have no preemption plan, and why; handle only
        self.no_plan: dict[tuple[str, int, int], str] = {}
        self.proposed_up: set[str] = set()  #: nodes a NodeUp is on its way for; handle only
        self.proposed_health: set[str] = set()  #: nodes a SetNodeHealth is on its way for; handle only
        self.proposed_gpu: set[str] = set()  #: nodes a GpuFault is on its way for; handle only
        self.last_sweep = -math.inf  #: monotonic time of the last retention sweep; handle only
        #: the command-set version every member applies, as the last MonitorDue said; handle only
        self.cluster_version = codec.BASE_VERSION
        self.resizing: set[str] = set()  #: elastic gangs a ResizeGang is on its way for; handle only
        #: (job, attempt) a CheckpointNotice is on its way for; handle only
        self.noticing: set[tuple[str, int]] = set()
        #: (job, attempt) a FailAttempt for an unsatisfiable dependency is on its way for; handle only
        self.failing: set[tuple[str, int]] = set()
        #: each job's latest reported progress (its current attempt's); handle only; readers only
        #: `get` an entry, and entries are replaced whole
        self.progress: dict[str, Progress] = {}
        #: (job, attempt) -> when its last RecordProgress was proposed (the rate limit); handle only
        self.progress_recorded: dict[tuple[str, int], float] = {}
        self.progress_recording: set[tuple[str, int]] = set()  #: a RecordProgress in flight; handle only
        #: (job, attempt) -> a progress file's garbage not yet put into the log; handle only
        self.progress_problems: dict[tuple[str, int], str] = {}
        #: (job, attempt) whose garbage was said already (once per attempt); handle only
        self.progress_said: set[tuple[str, int]] = set()
        #: a SetSpares is on its way; handle only
        self.designating = False
        #: state.other_changes when the spares were last found right (nothing to designate since); handle only
        self.spares_checked = -1
        #: (job, attempt) an eviction from spares is on its way for; handle only
        self.evicting: set[tuple[str, int]] = set()
        self._handlers: dict[type, Callable[[ClusterState, Any], list[Instruction]]] = {
            Started: self._started, RoundDue: self._round, MonitorDue: self._monitor,
            Heartbeat: self._heartbeat, LivenessDigest: self._digest, ProgressReport: self._progress,
            Proposed: self._proposed,
        }

    def handle(self, state: ClusterState, *stimuli: Stimulus) -> list[Instruction]:
        """Take the stimuli in order; the instructions they call for, in order."""
        out: list[Instruction] = []
        for stimulus in stimuli:
            out += self._handlers[type(stimulus)](state, stimulus)
        return out

    # ---- the view ----------------------------------------------------------------------------------

    def wait_reason(self, job_id: str) -> WaitReason | None:
        return self._waiting.get(job_id)

    def head_reservation(self) -> Reservation | None:
        return self.last_round.reservation if self.last_round is not None else None

    def reservations(self) -> tuple[Reservation, ...]:
        last = self.last_round
        if last is None:
            return ()
        return last.reservations or ((last.reservation,) if last.reservation is not None else ())

    def waiting(self) -> dict[str, WaitReason]:
        return self._waiting

    def shard_silences(self, shards: Iterable[str], now: float) -> dict[str, float]:
        return self.heartbeats.shard_silences(shards, now)

    def progress_of(self, job_id: str) -> Progress | None:
        return self.progress.get(job_id)

    # ---- stimuli -----------------------------------------------------------------------------------

    def _started(self, state: ClusterState, s: Started) -> list[Instruction]:
        self.heartbeats.grace(state.nodes, s.mono)
        half_life = self.config.usage_half_life
        if half_life is not None and half_life != state.usage_half_life:
            return [Propose(c.SetUsageHalfLife(at=s.at, half_life=half_life)), Reschedule("leader ready")]
        return [Reschedule("leader ready")]

    def _round(self, state: ClusterState, s: RoundDue) -> list[Instruction]:
        designation = self._designate(state, s.at)
        if designation:  # plan once it applies: a plan of this round could fall on a node it designates
            return designation + [Reschedule("spares designated")]
        result = self.config.policy(state, s.at, self.previous, None if s.full else self.memo)
        self.last_round = result
        self.previous = result.reservations or result.reservation
        self.memo, self._waiting = result.memo, result.waiting
        failures = self._unsatisfiable(state, s.at, result.examined)
        evictions = self._evict(state, s.at, result)  # after the commits: their nodes are none of them
        if result.plans:
            return failures + [Propose(c.CommitPlan(at=s.at, job_id=p.job_id, attempt=p.attempt,
                                                    placements=p.placements)) for p in result.plans] + evictions
        failures += evictions
        out = failures + self._preempt(state, s.at)
        out += self._grow(state, s.at, result)
        return out + self._pending_reasons(state, s.at, result.examined)

    def _designate(self, state: ClusterState, now: float) -> list[Instruction]:
        """Propose the spares the policy asks for when they differ from the state's (one SetSpares
        in flight at a time; command-set version 4). The choice keeps the spares there are, so a new
        leader agrees with the last one and proposes nothing."""
        policy = self.config.spares
        version = max(self.cluster_version, state.cluster_version)
        if (policy is None and not state.spares) or self.designating or state.other_changes == self.spares_checked \
                or version < codec.KIND_VERSIONS[c.SetSpares]:
            return []
        # A cluster file that no longer asks for spares releases them.
        chosen, notes = spares.designate(state, policy) if policy is not None else (frozenset(), ())
        if chosen == state.spares:
            self.spares_checked = state.other_changes
            return []
        for note in notes:
            log.warning("spares: %s", note)
        reason = "; ".join(filter(None, (spares.change_reason(state, chosen), *notes)))
        log.info("designating spares count=%d change=%s", len(chosen), reason)
        self.designating = True
        return [Propose(c.SetSpares(at=now, node_ids=tuple(sorted(chosen)), reason=reason))]

    def _evict(self, state: ClusterState, now: float, result: RoundResult) -> list[Instruction]:
        """Evict the guests of spares for the first restart after a lost node that waits (one a
        round: the next sees the nodes held for it), on nodes none of this round's plans use."""
        if not state.spares or self.evicting:
            return []
        planned = {p.node_id for plan in result.plans for p in plan.placements}
        for job_id in result.examined:  # in queue order
            job = state.jobs.get(job_id)
            if job is None or job.id in state.holds or job.status is not JobStatus.PENDING \
                    or not spares.restarting(job):
                continue
            cmd = spares.eviction(state, job, now)
            if cmd is not None and not planned.intersection(cmd.nodes):
                self.evicting.add((job.id, job.attempt))
                log.info("evicting from spares job=%s attempt=%d victims=%s nodes=%s", job.id, job.attempt,
                         ",".join(v.job_id for v in cmd.victims), ",".join(cmd.nodes))
                return [Propose(cmd)]
        return []

    def _grow(self, state: ClusterState, now: float, result: RoundResult) -> list[Instruction]:
        """Grow running elastic gangs that room now allows, in queue order, while nothing waits ahead
        of them (a round that placed nothing; a gang held back by a dependency or throttle does not
        count as waiting for room), at most one resize in flight per gang."""
        # A RUNNING gang has live tasks: look at those, not at every job the state keeps.
        live = {job_id for keys in state.live_tasks.values() for job_id, _attempt, _index in keys}
        growing = [j for j in map(state.jobs.get, live) if j is not None and j.status is JobStatus.RUNNING
                   and is_elastic(j.spec) and len(j.tasks) < j.spec.tasks and j.id not in self.resizing]
        if not growing:
            return []
        waiting = [state.jobs[j].queue_key() for j, w in result.waiting.items()
                   if w.code not in HELD_CODES and j in state.jobs]
        first_waiting = min(waiting, default=None)
        view = ClusterView(state.nodes, state.index, state.levels, state.jobs)
        blocked = frozenset(state.held_nodes).union(*(r.nodes for r in result.reservations))
        out: list[Instruction] = []
        for job in sorted(growing, key=lambda j: j.queue_key()):
            if first_waiting is not None and first_waiting < job.queue_key():
                continue
            # never grow onto a node that failed it, nor onto spares unless it may be evicted from them
            view.set_blocked(blocked | excluded_for(state.nodes, job)
                             | (frozenset() if spares.may_use_spares(job) else state.spares))
            size = growth(view, job, now)
            if size:
                self.resizing.add(job.id)
                log.info("growing elastic gang job=%s attempt=%d from=%d to=%d", job.id, job.attempt,
                         len(job.tasks), size)
                out.append(Propose(c.ResizeGang(at=now, job_id=job.id, attempt=job.attempt, size=size,
                                                reason="room for more tasks")))
                extra = place_largest(view, job.id, job.attempt, at_size(job.spec, size - len(job.tasks)))
                if extra is not None:  # what it takes is no longer room for the next one
                    view.claim(extra, job.spec.resources)
        return out

    def _unsatisfiable(self, state: ClusterState, now: float, examined: Iterable[str]) -> list[Instruction]:
        """Fail, for good, each pending job a dependency of which can never be met (unless it asked
        to wait): the cause DependencyNeverSatisfied, the reason naming the upstream job."""
        out: list[Instruction] = []
        for job_id in examined:
            reason, job = self._waiting.get(job_id), state.jobs.get(job_id)
            if reason is None or job is None or reason.code != dependencies.NEVER_SATISFIED \
                    or job.spec.on_unsatisfiable == "wait" or (job_id, job.attempt) in self.failing:
                continue
            self.failing.add((job_id, job.attempt))
            log.info("dependency never satisfied job=%s reason=%s", job_id, reason.message)
            out.append(Propose(c.FailAttempt(at=now, job_id=job_id, attempt=job.attempt, reason=reason.message,
                                             final=True, cause=dependencies.NEVER_SATISFIED)))
        return out

    def _preempt(self, state: ClusterState, now: float) -> list[Instruction]:
        """Plan one preemption for the first waiting gang, in queue order, that a rule allows
        (`preemption_step`); its wait reason and reservation then name the preemption's domain.

        Only jobs of queues an admin defined preempt (the implicit default queue never does, so a
        cluster without queues schedules as before)."""
        step = self.preemption_step(state, now)
        for key, why in step.no_plan.items():
            self.no_plan[key] = why
        if len(self.no_plan) > NO_PLAN_MEMO:
            self.no_plan.clear()
        waiting = dict(self._waiting)
        for (job_id, _attempt, _changes), why in step.no_plan.items():
            waiting[job_id] = dataclasses.replace(waiting[job_id],
                                                  message=f"{waiting[job_id].message}; no preemption: {why}")
        if step.plan is None:
            if step.no_plan:
                self._waiting = waiting
            return []
        cmd = step.plan.command
        # The round's reservation for this gang (the nodes expected to drain first) is not where it
        # will run: the preemption holds other nodes for it. Its wait reason and `describe` say
        # the preemption's domain, as the Preempting event does, and keep no reservation for it.
        waiting[cmd.job_id] = WaitReason(
            (), f"preempting in {step.plan.domain}: stopping {', '.join(v.job_id for v in cmd.victims)} (rule "
                f"{cmd.rule}); {', '.join(cmd.nodes)} to be held for it", "Preempting")
        self._waiting = waiting
        if self.last_round is not None:
            kept = tuple(r for r in self.reservations() if r.job_id != cmd.job_id)
            self.last_round = dataclasses.replace(self.last_round, reservation=kept[0] if kept else None,
                                                  reservations=kept)
        return [Propose(cmd)]

    def preemption_step(self, state: ClusterState, now: float, upto: str = "") -> PreemptionStep:
        """What the preemption step decides now (it changes nothing): the first waiting gang, in
        queue order, that may preempt (`preemption_gate`) and has a plan, trying at most
        PREEMPT_TRIES gangs not already known to have none. With `upto`, it stops at that job:
        what-if (`what_if`) asks this same question, so it answers what the leader does."""
        no_plan: dict[tuple[str, int, int], str] = {}
        tried = 0
        for job in state.pending_jobs():
            if tried >= PREEMPT_TRIES:
                return PreemptionStep(no_plan=no_plan, cut=True)
            if self.preemption_gate(state, job):
                if job.id == upto:
                    break
                continue
            key = (job.id, job.attempt, state.other_changes)
            known = self.no_plan.get(key)
            if known is not None:
                if job.id == upto:
                    return PreemptionStep(job.id, no_plan={key: known})
                continue
            tried += 1
            planned = preemption.plan(state, job, now)
            if isinstance(planned, str):
                no_plan[key] = planned
                if job.id == upto:
                    break
                continue
            return PreemptionStep(job.id, planned, no_plan)
        return PreemptionStep(no_plan=no_plan)

    def preemption_gate(self, state: ClusterState, job: Job) -> str:
        """Why the leader's preemption step passes over this pending job ("" if it weighs it)."""
        if not self.config.preempt:
            return "this leader does not preempt"
        if not state.queues:
            return "no queue is defined: only jobs of a queue an admin defined preempt"
        waiting = self._waiting.get(job.id)
        if job.id in state.holds:
            return f"it already holds {', '.join(state.holds[job.id].nodes)} from a preemption"
        if waiting is None:
            return "the scheduler has not weighed it yet (it will within a round)"
        if waiting.code in HELD_CODES:  # it may not run now (dependency, throttle, singleton): it takes no room
            return f"it may not run now: {waiting.message}"
        if state.queue_of(job) not in state.queues:
            return f"its queue {state.queue_of(job)} is not one an admin defined: only those preempt"
        return admission.max_block(state, job)

    def what_if(self, state: ClusterState, job: Job, now: float) -> preemption.PreemptionPlan | str:
        """What the preemption step would do for `job` now: its plan, or why it preempts nothing
        for it (call under the state's lock; changes nothing)."""
        why = self.preemption_gate(state, job)
        if why:
            return why
        step = self.preemption_step(state, now, upto=job.id)
        if step.job_id == job.id and step.plan is not None:
            return step.plan
        if step.plan is not None:
            return f"job {step.job_id} comes first in queue order and preempts first; this job is weighed after it"
        if step.cut:
            return f"the leader weighs the first {PREEMPT_TRIES} waiting gangs a round that may preempt, and this " \
                   "job is behind them"
        return next(iter(step.no_plan.values()), "no preemption plan")

    def _pending_reasons(self, state: ClusterState, now: float, examined: Iterable[str]) -> list[Instruction]:
        """Put into the log why gangs wait, for those whose reason changed since it was recorded
        (at most PENDING_BATCH a round): `describe job` and the event stream then show it on any
        replica, and the log grows with changes, not with rounds."""
        entries = []
        for job_id in examined:
            reason, job = self._waiting.get(job_id), state.jobs.get(job_id)
            if reason is not None and job is not None and job.status is JobStatus.PENDING \
                    and job.pending_reason != reason.code and (job_id, job.attempt) not in self.failing:
                entries.append(c.PendingReason(job_id, job.attempt, reason.code, reason.message))
                if len(entries) == PENDING_BATCH:
                    break
        if not entries:
            return []
        out: list[Instruction] = [Propose(c.PendingReasons(at=now, entries=tuple(entries)))]
        if len(entries) == PENDING_BATCH:  # more to record: the next round looks at every job again
            self.memo = None
            out.append(Reschedule("more pending reasons to record"))
        return out

    def _monitor(self, state: ClusterState, s: MonitorDue) -> list[Instruction]:
        out: list[Instruction] = []
        self.cluster_version = s.cluster_version
        if s.cluster_version > state.cluster_version >= codec.BASE_VERSION \
                and s.cluster_version >= codec.KIND_VERSIONS[c.SetClusterVersion]:
            # Every member knows it now: record it, so that a member down later holds nothing back.
            out.append(Propose(c.SetClusterVersion(at=s.at, version=s.cluster_version)))
        # From version 3 a lost node's gangs requeue uncharged (NodeLost); before, as every release does.
        down = c.NodeLost if s.cluster_version >= codec.KIND_VERSIONS[c.NodeLost] else c.NodeDown
        ready = [n.id for n in state.nodes.values() if n.status is NodeStatus.READY]
        declared = self._declarable(self.heartbeats.silence(ready, s.mono), len(ready), s.mono)
        # Every checkpoint this leader knows goes into the log ahead of a NodeDown (the log keeps the
        # order): the attempts it ends are accounted with their last checkpoint.
        out += self._record_progress_due(state, s.at, force=bool(declared))
        for node_id, silent in declared:
            log.warning("node silent node=%s silent_s=%.1f; declaring it down", node_id, silent)
            out.append(Propose(down(at=s.at, node_id=node_id, reason=f"no heartbeat for {silent:.1f}s")))
        noticeable = s.cluster_version >= codec.KIND_VERSIONS[c.CheckpointNotice]
        preparing = s.cluster_version >= codec.KIND_VERSIONS[c.TaskPrepared]
        for job in state.jobs.values():
            if job.status is JobStatus.RUNNING and job.spec.time_limit:
                out += self._time_limit(state, job, s.at, noticeable)
            elif job.status is JobStatus.SCHEDULED and job.spec.image and preparing:
                out += self._pull_timeout(job, s.at)
        return out + self._forget(state, s)

    @staticmethod
    def _pull_timeout(job: Job, now: float) -> list[Instruction]:
        """A gang whose image is not on all its nodes `image_pull_timeout` after it was placed: the
        attempt ends ImagePullFailed naming the nodes not ready, and requeues (a cause in the nodes,
        uncharged; fsm `_maybe_end_attempt`)."""
        waiting = gang_unprepared(job)
        timeout = job.spec.image_pull_timeout or DEFAULT_IMAGE_PULL_TIMEOUT_S
        if not waiting or now - job.placed_at <= timeout:
            return []
        nodes = ", ".join(sorted({t.node_id for t in waiting}))
        log.info("image pull timed out job=%s attempt=%d nodes=%s", job.id, job.attempt, nodes)
        return [Propose(c.FailAttempt(at=now, job_id=job.id, attempt=job.attempt, cause=EndReason.IMAGE_PULL_FAILED,
                                      reason=f"TIMEOUT: image {job.spec.image} not ready after {timeout:g}s "
                                             f"on node(s) {nodes}"))]

    def _time_limit(self, state: ClusterState, job: Job, now: float, noticeable: bool) -> list[Instruction]:
        """A running attempt's time limit: its checkpoint notice `notice` before the limit, then the
        stop (a final FailAttempt, cause TimeLimit) at the limit, or `notice` after the notice if it
        went out late (a new leader, a slow monitor pass): the tasks always get all of their notice.
        Below command-set version 3 (never, with such a job in the state: only a version-3 kind
        submits one) the stop comes at the limit and gives the notice itself, as other stops do."""
        limit = job.spec.time_limit
        limit_at = job.started_at + limit
        notice = state.notice_of(job) if noticeable else 0.0
        if notice and not job.notice_at:
            key = (job.id, job.attempt)
            if now >= limit_at - notice and key not in self.noticing:
                self.noticing.add(key)
                stop_at = max(limit_at, now + notice)
                log.info("checkpoint notice job=%s attempt=%d notice_s=%g stop_in_s=%.1f", job.id, job.attempt,
                         notice, stop_at - now)
                return [Propose(c.CheckpointNotice(at=now, job_id=job.id, attempt=job.attempt, stop_at=stop_at,
                                                   cause=EndReason.TIME_LIMIT))]
            return []
        stop_at = max(limit_at, job.notice_at + notice) if job.notice_at else limit_at
        if now <= stop_at:
            return []
        log.info("time limit reached job=%s attempt=%d limit_s=%.0f", job.id, job.attempt, limit)
        return [Propose(c.FailAttempt(at=now, job_id=job.id, attempt=job.attempt,
                                      reason=f"time limit of {limit:.0f}s exceeded", final=True,
                                      cause=EndReason.TIME_LIMIT))]

    def _declarable(self, silence: Silence, ready: int, now: float) -> list[tuple[str, float]]:
        """The expired nodes to declare DOWN now: all of them, unless a mass silence holds them."""
        config = self.config
        hold = config.mass_silence_hold or config.heartbeat_timeout
        mass = silence.late > config.mass_silence_min and silence.late > config.mass_silence_share * ready
        if not mass:
            if self.mass_silence_since is not None:
                log.warning("mass silence over late=%d ready=%d held_s=%.1f", silence.late, ready,
                            now - self.mass_silence_since)
            self.mass_silence_since, self.held_silent = None, 0
            return silence.expired
        if not silence.expired:  # late, none expired yet: nothing to hold (a stall that ends in time)
            self.held_silent = 0
            return []
        if self.mass_silence_since is None:
            self.mass_silence_since = now
            log.warning("mass silence late=%d ready=%d expired=%d; holding NodeDowns for %.1fs (the leader's "
                        "own view is the likelier fault)", silence.late, ready, len(silence.expired), hold)
        if now - self.mass_silence_since > hold:
            self.held_silent = 0
            return silence.expired
        self.held_silent = len(silence.expired)
        return []

    def _forget(self, state: ClusterState, s: MonitorDue) -> list[Instruction]:
        """Forget finished jobs older than the retention period (Slurm's MinJobAge); with a history
        store, only those it holds, counted from when it held them, unless the unarchived outgrow their cap.

        Once every member applies version 2, as ArchiveJobs (final states kept for dependencies,
        arrays too); before, as the version-1 ForgetJobs every release applies, and only plain jobs
        (arrays and their elements exist only once the cluster is at version 2: they wait for it)."""
        retention, history = self.config.job_retention, self.config.history
        if not (retention or history) or s.mono - self.last_sweep < RETENTION_SWEEP_S:
            return []
        self.last_sweep = s.mono
        out: list[Instruction] = []
        archive = s.cluster_version >= codec.KIND_VERSIONS[c.ArchiveJobs]
        if history:
            overflow = len(state.unarchived) - self.config.max_unarchived
            if overflow > 0:
                oldest = list(itertools.islice(state.unarchived.values(), overflow))
                log.warning("history cap reached unarchived=%d cap=%d; forgetting the oldest %d unarchived",
                            len(state.unarchived), self.config.max_unarchived, overflow)
                out += [Propose(c.HistoryOverflow(at=s.at, job_ids=tuple(oldest[i:i + FORGET_CHUNK])))
                        for i in range(0, len(oldest), FORGET_CHUNK)]
            expired = [j.id for j in state.jobs.values()
                       if j.status.terminal and j.archived_at and s.at - j.archived_at > retention
                       and (archive or not j.array_id)] if retention else []
        else:
            expired = [j.id for j in state.jobs.values()
                       if j.status.terminal and s.at - j.finished_at > retention and (archive or not j.array_id)]
        if archive and retention:
            expired += [a.id for a in state.arrays.values() if a.done and s.at - a.finished_at > retention]
        kind = c.ArchiveJobs if archive else c.ForgetJobs
        return out + [Propose(kind(at=s.at, job_ids=tuple(expired[i:i + FORGET_CHUNK])))
                      for i in range(0, len(expired), FORGET_CHUNK)]

    def _heartbeat(self, state: ClusterState, s: Heartbeat) -> list[Instruction]:
        node = state.nodes.get(s.node_id)
        if node is None:
            return []
        self.heartbeats.beat(s.node_id, s.mono)
        out: list[Instruction] = []
        if node.status is NodeStatus.DOWN and s.node_id not in self.proposed_up:
            self.proposed_up.add(s.node_id)
            out.append(Propose(c.NodeUp(at=s.at, node_id=s.node_id)))
        if s.health is not None and s.node_id not in self.proposed_health:
            # From version 3 a failing check's drain is a DrainNode (its gangs requeue uncharged) after
            # the health cordon, and level-triggered: proposed while the node is health-cordoned with
            # gangs wanted on it, so a drain lost to a leader change is made by the next heartbeat.
            version = max(self.cluster_version, state.cluster_version)  # the state's, before a first MonitorDue
            drain = s.health.drain and version >= codec.KIND_VERSIONS[c.DrainNode]
            cmd = health_change(node, s.health.unhealthy, s.health.message, s.health.drain and not drain, s.at)
            reason = f"health check failed: {s.health.message or 'health check failed'}"
            if cmd is not None:
                self.proposed_health.add(s.node_id)
                out.append(Propose(cmd))
                if drain and isinstance(cmd, c.SetNodeHealth) and not cmd.healthy:
                    out.append(Propose(c.DrainNode(at=s.at, node_id=s.node_id, cordon=False, reason=reason)))
            elif drain and s.health.unhealthy and node.health_cordon \
                    and any(wanted for _, wanted in state.tasks_on_node(node.id)):
                self.proposed_health.add(s.node_id)
                out.append(Propose(c.DrainNode(at=s.at, node_id=s.node_id, cordon=False, reason=reason)))
        if s.gpu_errors and s.node_id not in self.proposed_gpu \
                and max(self.cluster_version, state.cluster_version) >= codec.KIND_VERSIONS[c.GpuFault]:
            # Below version 4 a GPU error is not acted on: an older replica knows no GpuFault.
            fault = gpu_fault_change(node, s.gpu_errors, state.tasks_on_node(node.id), s.at)
            if fault is not None:
                self.proposed_gpu.add(s.node_id)
                out.append(Propose(fault))
        return out

    def _progress(self, state: ClusterState, s: ProgressReport) -> list[Instruction]:
        """Keep the job's latest progress (a checkpoint never goes back); put it into the log when
        the rate limit allows (`_record_progress`)."""
        job = state.jobs.get(s.job_id)
        if job is None or job.attempt != s.attempt or not job.status.has_gang \
                or not 0 <= s.index < len(job.tasks) or job.tasks[s.index].node_id != s.node_id:
            return []
        key = (job.id, job.attempt)
        old = self.progress.get(job.id)
        if old is not None and old.attempt != job.attempt:
            old = None
        checkpoint_at, checkpoint_step = s.checkpoint_at, s.checkpoint_step
        if old is not None and old.checkpoint_at >= checkpoint_at:
            checkpoint_at, checkpoint_step = old.checkpoint_at, old.checkpoint_step
        step = s.step if s.step >= 0 or old is None else old.step
        self.progress[job.id] = Progress(job.attempt, checkpoint_at, checkpoint_step, step, s.at)
        if s.problem and key not in self.progress_said:
            self.progress_said.add(key)
            self.progress_problems[key] = f"progress file of task {s.index} ignored: {s.problem}"
        return self._record_progress(state, job, s.at)

    def _record_progress(self, state: ClusterState, job: Job, now: float, force: bool = False) -> list[Instruction]:
        """A RecordProgress for the job's attempt when its checkpoint differs from the log's (or it
        has garbage to say): the attempt's first at once, later ones at most every
        `checkpoint_record_interval`, a stopping attempt's (it saves on its notice) or a forced one
        at once; one in flight at a time. Below command-set version 4, nothing: memory only."""
        key = (job.id, job.attempt)
        mine = self.progress.get(job.id)
        if key in self.progress_recording or mine is None or mine.attempt != job.attempt \
                or max(self.cluster_version, state.cluster_version) < codec.KIND_VERSIONS[c.RecordProgress]:
            return []
        logged = job.progress if job.progress is not None and job.progress.attempt == job.attempt else None
        changed = bool(mine.checkpoint_at) and (logged is None or logged.checkpoint_at != mine.checkpoint_at)
        problem = self.progress_problems.get(key, "")
        if not (changed or problem):
            return []
        last = self.progress_recorded.get(key)
        if not (problem or force or last is None or job.status is JobStatus.STOPPING
                or now - last >= self.config.checkpoint_record_interval):
            return []
        self.progress_recording.add(key)
        self.progress_recorded[key] = now
        self.progress_problems.pop(key, None)
        return [Propose(c.RecordProgress(at=now, job_id=job.id, attempt=job.attempt, checkpoint_at=mine.checkpoint_at,
                                         checkpoint_step=mine.checkpoint_step, step=mine.step, problem=problem))]

    def _record_progress_due(self, state: ClusterState, now: float, force: bool) -> list[Instruction]:
        """The RecordProgress commands the rate limit held back and now allows (all of them when
        `force`); the memory of jobs no longer holding that attempt's gang is dropped."""
        out: list[Instruction] = []
        for job_id, mine in list(self.progress.items()):
            job = state.jobs.get(job_id)
            if job is None or job.attempt != mine.attempt or not job.status.has_gang:
                del self.progress[job_id]
                continue
            out += self._record_progress(state, job, now, force)
        live = {(j, p.attempt) for j, p in self.progress.items()}
        for memo in (self.progress_recorded, self.progress_problems):
            for key in [k for k in memo if k not in live and k not in self.progress_recording]:
                del memo[key]
        self.progress_said &= live | self.progress_recording
        return out

    def _digest(self, state: ClusterState, s: LivenessDigest) -> list[Instruction]:
        self.heartbeats.digest(s.shard, s.mono, s.ages)
        return []

    def _proposed(self, state: ClusterState, s: Proposed) -> list[Instruction]:
        cmd = s.proposal.cmd
        if isinstance(cmd, c.NodeUp):
            self.proposed_up.discard(cmd.node_id)
        elif isinstance(cmd, c.SetNodeHealth):
            self.proposed_health.discard(cmd.node_id)
            if s.ok:
                log.info("node health recorded node=%s healthy=%s message=%s", cmd.node_id, cmd.healthy, cmd.message)
        elif isinstance(cmd, c.DrainNode):
            # (A DrainNode has no health of its own: logging one as a SetNodeHealth raised here, and
            # the stimuli after it in the batch went unheard. mypy --strict found it.)
            self.proposed_health.discard(cmd.node_id)
            if s.ok:
                log.info("node drained node=%s reason=%s jobs=%s", cmd.node_id, cmd.reason, s.value)
        elif isinstance(cmd, c.GpuFault):
            self.proposed_gpu.discard(cmd.node_id)
            if s.ok:
                log.warning("GPU error recorded node=%s gpus=%s stopped=%s message=%s", cmd.node_id,
                            ",".join(map(str, cmd.gpus)) or "all", s.value or "-", cmd.message)
        elif isinstance(cmd, c.CommitPlan):
            if s.ok:
                log.info("gang committed job=%s attempt=%d tasks=%d nodes=%d", cmd.job_id, cmd.attempt,
                         len(cmd.placements), len({p.node_id for p in cmd.placements}))
            else:
                return [Reschedule(f"plan of job {cmd.job_id} not committed")]
        elif isinstance(cmd, c.SetSpares):
            self.designating = False
        elif isinstance(cmd, c.Preempt):
            self.evicting.discard((cmd.job_id, cmd.attempt))
            if s.ok:
                log.info("preemption committed job=%s rule=%s victims=%s nodes=%s", cmd.job_id, cmd.rule,
                         ",".join(v.job_id for v in cmd.victims), ",".join(cmd.nodes))
            return [Reschedule(f"preemption for job {cmd.job_id}")]
        elif isinstance(cmd, c.ResizeGang):
            self.resizing.discard(cmd.job_id)
        elif isinstance(cmd, c.CheckpointNotice):
            self.noticing.discard((cmd.job_id, cmd.attempt))
        elif isinstance(cmd, c.RecordProgress):
            self.progress_recording.discard((cmd.job_id, cmd.attempt))
        elif isinstance(cmd, c.FailAttempt) and cmd.cause == dependencies.NEVER_SATISFIED:
            self.failing.discard((cmd.job_id, cmd.attempt))
        elif isinstance(cmd, c.ForgetJobs) and s.ok:
            log.info("finished jobs forgotten count=%s retention_s=%.0f", s.value, self.config.job_retention)
        elif isinstance(cmd, c.HistoryOverflow) and s.ok:
            log.warning("finished jobs forgotten unarchived count=%s", s.value)
        return []

    # ---- checks ------------------------------------------------------------------------------------

    def validate(self, state: ClusterState) -> None:
        """Raise AssertionError if the leader's memory contradicts itself or the state (tests call
        it after every scenario)."""
        if self.last_round is not None:
            held = self.last_round.reservations
            assert all(not (a.nodes & b.nodes) or a.ends_at <= b.starts_at
                       for i, a in enumerate(held) for b in held[i + 1:]), "reservations overlap in time"
            head = self.last_round.reservation
            assert head is None or head == self.last_round.reservations[0] or not self.last_round.reservations, \
                "the head reservation is not the first"
        assert set(self._waiting).isdisjoint(p.job_id for p in (self.last_round.plans if self.last_round else ())), \
            "a job both planned and waiting"
        assert self.proposed_up <= set(state.nodes), "a NodeUp in flight for an unknown node"
        assert self.proposed_health <= set(state.nodes), "a SetNodeHealth in flight for an unknown node"
        assert self.proposed_gpu <= set(state.nodes), "a GpuFault in flight for an unknown node"
        assert len(self.no_plan) <= NO_PLAN_MEMO + PREEMPT_TRIES, "the no-plan memo outgrew its bound"
        assert all(state.jobs.get(j) is not None for j, _ in self.failing), "a FailAttempt in flight for no job"
        assert self.resizing <= set(state.jobs), "a ResizeGang in flight for no job"
        assert all(state.jobs.get(j) is not None for j, _ in self.noticing), "a CheckpointNotice in flight for no job"
        assert all(state.jobs.get(j) is not None for j, _ in self.evicting), "an eviction in flight for no job"
        assert self.mass_silence_since is not None or not self.held_silent, "nodes held with no mass silence"
        assert self.progress_recording <= set(self.progress_recorded), "a RecordProgress in flight, not recorded"
        assert set(self.progress_problems) <= self.progress_said, "garbage to say that was not said once"
