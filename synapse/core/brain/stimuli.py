"""What the leader's brain hears (stimuli: each carries its time) and what it asks its driver to do
(instructions): small frozen dataclasses, as dask's worker state machine has them."""

from __future__ import annotations

from dataclasses import dataclass

from synapse.core import commands as c
from synapse.core import versions
from synapse.core.brain.heartbeat import GpuErrorReport

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
    cluster_version: int = versions.BASE_VERSION


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
