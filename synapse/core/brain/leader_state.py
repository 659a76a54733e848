"""The leader's decisions, in one pure state machine: stimuli in, commands to propose out.

dask's `WorkerState` is the model. `LeaderState.handle(state, *stimuli)` is the only way in: it reads
the replicated `ClusterState` (never changes it) and its own memory, and returns instructions —
commands to propose and requests for another round (synapse.core.brain.stimuli). Whoever drives it
carries them out: on a real cluster `synapse.master.leader` proposes them through Raft (stamping its
term) and feeds each outcome back as a `Proposed` stimulus; `synapse.sim.engine` applies them to its
state on a simulated clock and does the same. No clock, no lock, no I/O here: the driver passes the
time in every stimulus and holds whatever lock guards the state while `handle` runs.

`LeaderState` dispatches each stimulus to the room of its concern:

* `RoundDue` -> `rounds` (the scheduling round, spares, evictions, elastic growth, pending reasons,
  unsatisfiable dependencies) and `preempting` (the preemption step and what-if);
* `MonitorDue` -> `nodes` (silent nodes go DOWN, behind the mass-silence guard), `progress`
  (checkpoints due into the log, every one ahead of a NodeDown) and `monitors` (the cluster
  version, time limits, image pull timeouts, retention);
* `Heartbeat`, `LivenessDigest` -> `nodes`; `ProgressReport` -> `progress`;
* `Proposed` -> `inflight`, the one ledger of proposals on their way, which every room asks
  before it proposes a decision a second time.

Readers (the API, metrics, the dashboard) see it only through `LeaderView`. They may run on other
threads, so every attribute a view reads is replaced whole, never changed in place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from synapse.core import commands as c
from synapse.core import versions
from synapse.core.brain import monitors
from synapse.core.brain.config import LeaderConfig
from synapse.core.brain.inflight import InFlight
from synapse.core.brain.nodes import NodeWatch
from synapse.core.brain.progress import ProgressBook
from synapse.core.brain.rounds import Rounds
from synapse.core.brain.stimuli import (
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
from synapse.core.model import Job, Progress
from synapse.core.schedule import preemption
from synapse.core.schedule.estimate import Estimate
from synapse.core.schedule.reservations import Reservation
from synapse.core.schedule.scheduler import RoundResult, WaitReason
from synapse.core.state.fsm import ClusterState

log = logging.getLogger(__name__)

#: A leader told nothing special.
DEFAULT_CONFIG = LeaderConfig()


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

    def estimates(self, state: ClusterState, now: float) -> dict[str, Estimate]:
        """Each pending job's estimated start from the last round's plan (call under the state's lock)."""

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

    def __init__(self, config: LeaderConfig = DEFAULT_CONFIG) -> None:
        self.config = config  #: fixed for the term
        self.inflight = InFlight()  #: the proposals on their way, of every room; handle only
        self.rounds = Rounds(config, self.inflight)  #: the scheduling rounds' memory; handle only
        self.nodes = NodeWatch(config, self.inflight)  #: heartbeats and the mass-silence guard; handle only
        #: each job's latest progress and what goes into the log of it; handle only
        self.progress = ProgressBook(config.checkpoint_record_interval, self.inflight)
        self.retention = monitors.Retention(config)  #: when finished jobs were last swept; handle only
        #: the command-set version every member applies, as the last MonitorDue said; handle only
        self.cluster_version = versions.BASE_VERSION
        self._handlers: dict[type, Callable[[ClusterState, Any], list[Instruction]]] = {
            Started: self._started, RoundDue: self._round, MonitorDue: self._monitor,
            Heartbeat: self._heartbeat, LivenessDigest: self.nodes.digest, ProgressReport: self._progress,
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
        """Why a pending job waited in the last round, or None."""
        return self.rounds.wait_reason(job_id)

    def head_reservation(self) -> Reservation | None:
        """The head blocked gang's reservation, from the last round."""
        return self.rounds.head_reservation()

    def reservations(self) -> tuple[Reservation, ...]:
        """Every blocked gang's reservation from the last round, the head's first."""
        return self.rounds.reservations()

    def waiting(self) -> dict[str, WaitReason]:
        """Every pending job's wait reason from the last round (do not change it)."""
        return self.rounds.waiting()

    def estimates(self, state: ClusterState, now: float) -> dict[str, Estimate]:
        """Each pending job's estimated start from the last round's plan (worked out once a round, when
        first asked; call under the state's lock, do not change it)."""
        return self.rounds.estimates(state, now)

    def shard_silences(self, shards: Iterable[str], now: float) -> dict[str, float]:
        """Seconds since each link shard's last digest reached the leader (`now`: monotonic)."""
        return self.nodes.heartbeats.shard_silences(shards, now)

    @property
    def held_silent(self) -> int:
        """Silent nodes the mass-silence guard held back from DOWN at the last monitor pass."""
        return self.nodes.held_silent

    @property
    def last_round(self) -> RoundResult | None:
        """The last round's result."""
        return self.rounds.last_round

    def progress_of(self, job_id: str) -> Progress | None:
        """A job's latest progress as its tasks reported it to this leader (newer than the log's)."""
        return self.progress.latest.get(job_id)

    def what_if(self, state: ClusterState, job: Job, now: float) -> preemption.PreemptionPlan | str:
        """What the preemption step would do for `job` now: its plan, or why it preempts nothing
        for it (call under the state's lock; changes nothing)."""
        return self.rounds.what_if(state, job, now)

    # ---- stimuli -----------------------------------------------------------------------------------

    def _version(self, state: ClusterState) -> int:
        """The command-set version every member applies: the last MonitorDue's, or the state's before it."""
        return max(self.cluster_version, state.cluster_version)

    def _started(self, state: ClusterState, s: Started) -> list[Instruction]:
        self.nodes.heartbeats.grace(state.nodes, s.mono)
        half_life = self.config.usage_half_life
        if half_life is not None and half_life != state.usage_half_life:
            return [Propose(c.SetUsageHalfLife(at=s.at, half_life=half_life)), Reschedule("leader ready")]
        return [Reschedule("leader ready")]

    def _round(self, state: ClusterState, s: RoundDue) -> list[Instruction]:
        return self.rounds.round(state, s, self._version(state))

    def _monitor(self, state: ClusterState, s: MonitorDue) -> list[Instruction]:
        self.cluster_version = s.cluster_version
        out = monitors.cluster_version(state, s)
        declared = self.nodes.expired(state, s.mono)
        # Every checkpoint this leader knows goes into the log ahead of a NodeDown (the log keeps the
        # order): the attempts it ends are accounted with their last checkpoint.
        out += self.progress.due(state, s.at, self._version(state), force=bool(declared))
        out += self.nodes.down(declared, s)
        out += monitors.limits(state, s, self.inflight)
        return out + self.retention.sweep(state, s)

    def _heartbeat(self, state: ClusterState, s: Heartbeat) -> list[Instruction]:
        return self.nodes.heartbeat(state, s, self._version(state))

    def _progress(self, state: ClusterState, s: ProgressReport) -> list[Instruction]:
        return self.progress.report(state, s, self._version(state))

    def _proposed(self, state: ClusterState, s: Proposed) -> list[Instruction]:
        cmd = s.proposal.cmd
        self.inflight.heard(cmd)
        return outcome(cmd, s, self.config.job_retention)

    # ---- checks ------------------------------------------------------------------------------------

    def validate(self, state: ClusterState) -> None:
        """Raise AssertionError if the leader's memory contradicts itself or the state (tests call
        it after every scenario)."""
        self.rounds.validate()
        self.inflight.validate(state)
        self.nodes.validate()
        self.progress.validate()


def outcome(cmd: c.Command, s: Proposed, retention: float) -> list[Instruction]:
    """What a proposal's outcome calls for (its ledger entry is cleared already): a log line, and
    another round after a plan that did not commit or a preemption."""
    if isinstance(cmd, c.SetNodeHealth):
        if s.ok:
            log.info("node health recorded node=%s healthy=%s message=%s", cmd.node_id, cmd.healthy, cmd.message)
    elif isinstance(cmd, c.DrainNode):
        if s.ok:
            log.info("node drained node=%s reason=%s jobs=%s", cmd.node_id, cmd.reason, s.value)
    elif isinstance(cmd, c.GpuFault):
        if s.ok:
            log.warning("GPU error recorded node=%s gpus=%s stopped=%s message=%s", cmd.node_id,
                        ",".join(map(str, cmd.gpus)) or "all", s.value or "-", cmd.message)
    elif isinstance(cmd, c.CommitPlan):
        if s.ok:
            log.info("gang committed job=%s attempt=%d tasks=%d nodes=%d", cmd.job_id, cmd.attempt,
                     len(cmd.placements), len({p.node_id for p in cmd.placements}))
        else:
            return [Reschedule(f"plan of job {cmd.job_id} not committed")]
    elif isinstance(cmd, c.Preempt):
        if s.ok:
            log.info("preemption committed job=%s rule=%s victims=%s nodes=%s", cmd.job_id, cmd.rule,
                     ",".join(v.job_id for v in cmd.victims), ",".join(cmd.nodes))
        return [Reschedule(f"preemption for job {cmd.job_id}")]
    elif isinstance(cmd, c.ForgetJobs) and s.ok:
        log.info("finished jobs forgotten count=%s retention_s=%.0f", s.value, retention)
    elif isinstance(cmd, c.HistoryOverflow) and s.ok:
        log.warning("finished jobs forgotten unarchived count=%s", s.value)
    return []
