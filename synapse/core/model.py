"""The domain model: nodes, jobs, tasks and the plans that bind them. No protobuf types here.

Everything in this module is plain data. The replicated state machine (`fsm.py`) is the only code
that mutates instances held in the cluster state; everything else reads them or builds new ones.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

#: Topology levels from the widest to the narrowest. A node's topology path has one label per level.
DEFAULT_LEVELS: tuple[str, ...] = ("zone", "block", "rack")
#: Label used for a level a node did not name (a worker started with only `--rack r1`).
DEFAULT_LABEL = "default"


@dataclass(frozen=True, slots=True)
class Resources:
    """An amount of cpu (millicores), memory (bytes) and GPUs (whole devices)."""

    cpu: int = 0
    memory: int = 0
    gpu: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpu + other.cpu, self.memory + other.memory, self.gpu + other.gpu)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.cpu - other.cpu, self.memory - other.memory, self.gpu - other.gpu)

    def scaled(self, n: int) -> Resources:
        """These resources times `n`."""
        return Resources(self.cpu * n, self.memory * n, self.gpu * n)

    def fits_in(self, other: Resources) -> bool:
        """True when every dimension is at most the other's."""
        return self.cpu <= other.cpu and self.memory <= other.memory and self.gpu <= other.gpu

    def is_negative(self) -> bool:
        return self.cpu < 0 or self.memory < 0 or self.gpu < 0

    def count_in(self, free: Resources) -> int:
        """How many copies of these (per-task) resources fit in `free`; -1 means unbounded."""
        counts = [free.cpu // self.cpu if self.cpu else -1,
                  free.memory // self.memory if self.memory else -1,
                  free.gpu // self.gpu if self.gpu else -1]
        bounded = [c for c in counts if c >= 0]
        return min(bounded) if bounded else -1

    def short_of(self, free: Resources) -> list[str]:
        """Names of the dimensions in which `free` is below these resources."""
        return [name for name, need, have in (("cpu", self.cpu, free.cpu),
                                               ("memory", self.memory, free.memory),
                                               ("gpu", self.gpu, free.gpu)) if need > have]


class NodeStatus(enum.StrEnum):
    READY = "READY"
    DOWN = "DOWN"


@dataclass(slots=True)
class Node:
    """A worker machine as the replicated state knows it."""

    id: str
    address: str
    topology: tuple[str, ...]  #: one label per level, widest first
    capacity: Resources
    used: Resources = Resources()
    gpus_in_use: set[int] = field(default_factory=set)  #: GPU indices given to live tasks
    status: NodeStatus = NodeStatus.READY
    schedulable: bool = True  #: False when cordoned or draining
    registered_at: float = 0.0
    status_changed_at: float = 0.0
    #: what its worker discovered, e.g. (("gpu_model", "H100"),), sorted; set by RegisterNode
    labels: tuple[tuple[str, str], ...] = ()
    isolation: str = ""  #: how its worker confines tasks, as the worker said when it registered
    cordon_reason: str = ""  #: why it is not schedulable; "" while schedulable
    health_cordon: bool = False  #: cordoned by its failing health check (not by an admin)
    health: str = ""  #: its health check's failure ("" while it passes, or the node has none)
    #: cordoned as a suspect (gangs of different jobs ended here by a node-side cause, see fsm
    #: SUSPECT_WINDOW_S); only an admin's cordon or uncordon lifts it; apply only
    suspect: bool = False
    #: the latest node-side ends of gangs here, oldest first: (at, job id, NODE_SIDE_CAUSES member),
    #: at most fsm.MAX_NODE_FAILURES; an admin's uncordon clears them; apply only
    failures: tuple[tuple[float, str, str], ...] = ()
    #: designated a spare (SetSpares, synapse.core.schedule.spares): only restarts after a lost node and jobs
    #: that may be evicted for one are placed here; apply only
    spare: bool = False
    #: the GPU error its worker reported, as a GpuFault recorded it (cordoning the node); "" when
    #: none; only an admin's uncordon clears it; apply only
    gpu_error: str = ""

    def label(self, name: str) -> str:
        return dict(self.labels).get(name, "")

    @property
    def free(self) -> Resources:
        return self.capacity - self.used

    @property
    def accepts_work(self) -> bool:
        return self.status is NodeStatus.READY and self.schedulable

    def free_gpu_indices(self) -> list[int]:
        return [i for i in range(self.capacity.gpu) if i not in self.gpus_in_use]


class PackMode(enum.StrEnum):
    PREFERRED = "preferred"  #: pack as low as possible, else span the fewest domains one level up
    REQUIRED = "required"  #: the whole gang inside one domain of the `pack` level, or wait


@dataclass(frozen=True, slots=True)
class TopologySpec:
    """Where a gang should be packed: `pack` names a topology level (or `node`)."""

    pack: str = ""  #: empty: as low as the cluster allows, preferred
    mode: PackMode = PackMode.PREFERRED


@dataclass(frozen=True, slots=True)
class Secret:
    """A job's secret as the replicated state holds it: sealed under the cluster's key by the master
    that took the submission (synapse.master.cipher.SecretSeal), opened only to list it to the job's
    tasks. Two specs are equal when their secrets have the same names and fingerprints: the sealed
    bytes differ at each seal (a random nonce), and a retried submission is still the same job."""

    name: str  #: the environment variable the tasks get it as
    fingerprint: bytes  #: a keyed hash of the name and value: equal values, equal fingerprints
    sealed: bytes = field(default=b"", compare=False)  #: nonce and AES-GCM ciphertext; b"" in what the API shows


@dataclass(frozen=True, slots=True)
class CheckpointSpec:
    """The checkpoint notice a job asks for: `signal` to every task `notice` seconds before any stop
    the cluster plans (NOTICED_CAUSES), ahead of SIGTERM, so it can save its work."""

    signal: str = ""  #: a signal name as jobspec.NOTICE_SIGNALS spells it (USR1, no SIG); "" = no notice
    notice: float = 0.0  #: seconds from the signal to SIGTERM (capped by the job's queue's max_grace)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a user asks for: the job file of DESIGN.md."""

    name: str
    tasks: int
    resources: Resources  #: per task
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    topology: TopologySpec = TopologySpec()
    priority: int = 0
    max_restarts: int = 0
    time_limit: float = 0.0  #: seconds; 0 means none
    image: str = ""
    queue: str = ""  #: the queue it is admitted through; "" is the default queue
    grace: float = 0.0  #: seconds from SIGTERM to SIGKILL when preempted (capped by the queue); 0: default
    gpu_model: str = ""  #: only nodes whose `gpu_model` label matches (case-insensitive); "" = any
    array: str = ""  #: an array's canonical index spec, e.g. `0-99` ("" for a single job); synapse.core.jobs.arrays
    array_throttle: int = 0  #: the most elements of the array with a gang at once, as submitted; 0 = no limit
    after: tuple[tuple[str, str], ...] = ()  #: dependencies (ok | any | notok, job id); synapse.core.jobs.dependencies
    singleton: bool = False  #: start only while no other job of the same name and user holds a gang
    on_unsatisfiable: str = ""  #: "wait": stay pending when a dependency can never be met; "" = fail
    tasks_min: int = 0  #: elastic gangs: the least tasks it runs with (`tasks` is the most); 0 = not elastic
    resize_interval: float = 0.0  #: elastic gangs: seconds between two growths at least; 0 = the default
    checkpoint: CheckpointSpec = CheckpointSpec()  #: the checkpoint notice (command-set version 3)
    #: bind mounts into the job's image: (source on the node, target in the image, read-only)
    #: (command-set version 4); each worker allows only the sources under its --allow-mount prefixes
    mounts: tuple[tuple[str, str, bool], ...] = ()
    #: seconds an attempt may wait for its image on every node before it ends ImagePullFailed; 0: the
    #: default (DEFAULT_IMAGE_PULL_TIMEOUT_S)
    image_pull_timeout: float = 0.0
    #: the job's secrets, sealed, by name (command-set version 6): given to its tasks as environment
    #: variables, never shown (the API shows their names)
    secrets: tuple[Secret, ...] = ()

    @property
    def has_workflow(self) -> bool:
        """True when it uses a field that needs command-set version 2 (arrays, dependencies)."""
        return bool(self.array or self.after or self.singleton or self.on_unsatisfiable or self.tasks_min)

    @property
    def has_checkpoint(self) -> bool:
        """True when it asks for a checkpoint notice (a field that needs command-set version 3)."""
        return bool(self.checkpoint.signal)

    @property
    def has_image_run(self) -> bool:
        """True when it uses what needs command-set version 4: mounts, or an image's entrypoint in
        place of a command (an older replica refuses a spec without a command)."""
        return bool(self.mounts or (self.image and not self.command) or self.image_pull_timeout)

    @property
    def has_secrets(self) -> bool:
        """True when it carries secrets (a field that needs command-set version 6)."""
        return bool(self.secrets)

    @property
    def total(self) -> Resources:
        return self.resources.scaled(self.tasks)


class JobStatus(enum.StrEnum):
    PENDING = "PENDING"  #: waiting for a placement; holds nothing
    SCHEDULED = "SCHEDULED"  #: the gang is committed; tasks are starting
    RUNNING = "RUNNING"  #: every task of the attempt has started
    STOPPING = "STOPPING"  #: the attempt failed or was cancelled; waiting for its tasks to be gone
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)

    @property
    def has_gang(self) -> bool:
        """True when an attempt's tasks exist and may hold resources."""
        return self in (JobStatus.SCHEDULED, JobStatus.RUNNING, JobStatus.STOPPING)


class EndReason(enum.StrEnum):
    """Why a task ended (the worker's reading of its exit, or the cluster's reason to stop it)."""

    COMPLETED = "Completed"  #: exited 0 on its own
    ERROR = "Error"  #: exited non-zero
    SIGNAL = "Signal"  #: killed by a signal not of the cluster's making (or it left no exit status)
    OOM_KILLED = "OOMKilled"  #: the kernel's OOM killer acted inside the task's memory limit
    COMMAND_NOT_FOUND = "CommandNotFound"  #: the command it names is not there, or the runtime hides it
    TIME_LIMIT = "TimeLimit"  #: stopped because its job's time_limit passed
    NODE_LOST = "NodeLost"  #: its node was declared DOWN
    PREEMPTED = "Preempted"  #: stopped to make room for another gang
    CANCELLED = "Cancelled"  #: stopped because its job was cancelled
    RESIZED = "Resized"  #: stopped so that its elastic gang restarts at another size
    DRAINED = "Drained"  #: stopped because its node (or another node of its gang) was drained
    #: rank 0's rendezvous port was in use on its node, so rank 0 never started (synapse.core.rendezvous)
    MASTER_PORT_IN_USE = "MasterPortInUse"
    #: its node could not get the job's image: the reference is wrong (not found, unauthorised, a
    #: digest mismatch: the job fails, not retried) or the node is (unreachable registry, full disk,
    #: timeout: the gang requeues elsewhere, uncharged, without that node)
    IMAGE_PULL_FAILED = "ImagePullFailed"
    #: its node's worker reported an error of a GPU it used (synapse.core.brain.heartbeat.GpuErrorReport)
    GPU_ERROR = "GpuError"
    #: a host path it asks to mount lies outside the prefixes its worker allows: the job fails at
    #: once, not retried (no attempt can mend it), and the reason names the allowed prefixes
    MOUNT_REFUSED = "MountRefused"


#: The ends of a task whose command never ran: it has no exit code (a worker sends 127 in its place).
NEVER_RAN = frozenset({EndReason.MASTER_PORT_IN_USE, EndReason.IMAGE_PULL_FAILED, EndReason.MOUNT_REFUSED})
#: The command-set version that brought MountRefused, and from which apply records no exit code for
#: a task that never ran (an older replica keeps the worker's 127: the change waits for every member).
NEVER_RAN_VERSION = 6


#: The causes besides preemption and resizing that end an attempt through no fault of the job: it
#: requeues at its place in the queue and uses up none of its restarts (`Job.requeues`);
#: `max_restarts` counts the job's own failures only.
REQUEUED_CAUSES = frozenset({EndReason.NODE_LOST, EndReason.DRAINED, EndReason.MASTER_PORT_IN_USE,
                             EndReason.GPU_ERROR})
#: The ends a node's fault forces on a gang without notice: the attempt after one restarts at once
#: (synapse.core.schedule.spares.restarting), and a job requeues uncharged after them only
#: fsm.MAX_UNCHARGED_REQUEUES times (a job that breaks its nodes must not walk the cluster for ever).
NODE_FAULTS = frozenset({EndReason.NODE_LOST, EndReason.GPU_ERROR})


#: The causes of a gang's end that count against its node (a suspect node, fsm `_note_node_failure`):
#: the node was lost, its failing health check drained it, or its worker reported a GPU error. Admin
#: drains and task exits do not.
HEALTH_CHECK_FAILED = "HealthCheckFailed"
NODE_SIDE_CAUSES = frozenset({EndReason.NODE_LOST.value, HEALTH_CHECK_FAILED, EndReason.GPU_ERROR.value})


def gpu_fault_hits(task_gpus: tuple[int, ...], gpus: tuple[int, ...]) -> bool:
    """Whether a GPU error of `gpus` (none named: the node's GPUs as a whole) hits a task holding
    `task_gpus` (a task that holds no GPU never is)."""
    return bool(set(task_gpus) & set(gpus)) if gpus else bool(task_gpus)


#: The planned stops: a job with a checkpoint notice has its tasks signalled that long before SIGTERM
#: (synapse.core.state.transitions `stop_attempt`, synapse.worker.state). A cancellation, a failure or a lost
#: node is not planned, and gives none.
NOTICED_CAUSES = frozenset({EndReason.TIME_LIMIT, EndReason.PREEMPTED, EndReason.DRAINED, EndReason.RESIZED})


#: The reasons a worker may report; the others come from the cluster's own decisions.
WORKER_REASONS = frozenset({EndReason.COMPLETED, EndReason.ERROR, EndReason.SIGNAL, EndReason.OOM_KILLED,
                            EndReason.COMMAND_NOT_FOUND, EndReason.MASTER_PORT_IN_USE, EndReason.IMAGE_PULL_FAILED,
                            EndReason.MOUNT_REFUSED})


#: How long a gang waits for its image on all its nodes, unless its job says otherwise.
DEFAULT_IMAGE_PULL_TIMEOUT_S = 600.0


def gang_unprepared(job: Job) -> list[Task]:
    """The tasks of a gang in an image whose node does not hold the image yet (a task that started
    counts as holding it: an older worker, or a runtime template, starts without preparing)."""
    if not job.spec.image:
        return []
    return [t for t in job.tasks if t.state is TaskState.ASSIGNED and not t.prepared and not t.started_at]


def image_holders(jobs: Iterable[Job]) -> dict[str, frozenset[str]]:
    """Image reference -> the nodes known to hold it: those where a task of a job still in the state,
    with that image, was prepared or started. What the replicated state knows (a node's store may
    have evicted an image since); placement prefers such nodes among equally good ones."""
    out: dict[str, set[str]] = {}
    for job in jobs:
        if job.spec.image:
            nodes = {t.node_id for t in job.tasks if t.prepared or t.started_at}
            if nodes:
                out.setdefault(job.spec.image, set()).update(nodes)
    return {image: frozenset(nodes) for image, nodes in out.items()}


class TaskState(enum.StrEnum):
    ASSIGNED = "ASSIGNED"  #: committed to a node, not yet reported started
    RUNNING = "RUNNING"
    EXITED = "EXITED"  #: reported gone by its worker, with an exit code
    LOST = "LOST"  #: its node was declared DOWN

    @property
    def live(self) -> bool:
        """A live task holds its resources."""
        return self in (TaskState.ASSIGNED, TaskState.RUNNING)


@dataclass(slots=True)
class Task:
    """One member of a gang for one attempt; holds its resources while live."""

    job_id: str
    attempt: int
    index: int
    node_id: str
    resources: Resources
    gpus: tuple[int, ...]
    rank: int
    state: TaskState = TaskState.ASSIGNED
    exit_code: int | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    reason: str = ""  #: an EndReason once ended
    reason_message: str = ""  #: the detail: exit code, signal, memory limit, who cancelled…
    #: its node holds the job's image (TaskPrepared, version 4): the gang starts once every task is
    prepared: bool = False

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.job_id, self.attempt, self.index)


@dataclass(frozen=True, slots=True)
class Event:
    """One line of a job's history."""

    at: float
    kind: str
    message: str


class ClusterEvent(NamedTuple):
    """One typed event of the cluster, derived in apply (so every replica has the same ones)."""

    seq: int  #: the cursor: 1, 2, 3… across the cluster's life
    at: float
    type: str  #: Normal | Warning
    topic: str  #: job | node | history
    reason: str  #: stable: JobSubmitted, GangPlaced, TaskStarted, TaskExited, NodeDown, Preempted…
    object_id: str  #: the job or node id
    message: str


@dataclass(frozen=True, slots=True)
class Run:
    """One placed attempt of a job, once it ended: what the accounting record of that run holds."""

    attempt: int
    placed_at: float  #: when the gang got its resources (Slurm's Start)
    started_at: float  #: when every task had started (0: the gang never fully started)
    ended_at: float  #: when its last task was gone
    nodes: tuple[str, ...]  #: node of each task index
    resources: Resources  #: per task
    outcome: str  #: an EndReason: Completed, Error, Signal, OOMKilled, TimeLimit, NodeLost, Preempted, Cancelled
    reason: str  #: why it ended, for people (the first failure, who preempted or cancelled it)
    exit_code: int  #: the first non-zero exit code of its tasks, else 0
    gpu_seconds: float  #: GPUs held times how long each task held them (placement to its end)
    cpu_seconds: float  #: cores (cpu/1000) held times how long, likewise
    #: when its last checkpoint was saved, as its tasks reported it (RecordProgress); 0: none reported
    checkpoint_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Progress:
    """An attempt's progress as its tasks last reported it (SYNAPSE_PROGRESS_FILE, RecordProgress)."""

    attempt: int
    checkpoint_at: float = 0.0  #: when its last checkpoint was saved (seconds since the epoch); 0: none
    checkpoint_step: int = -1  #: the step that checkpoint saved; -1: not said
    step: int = -1  #: the latest step reported with it; -1: not said
    at: float = 0.0  #: when it was recorded


@dataclass(slots=True)
class Job:
    """A submitted job and the bookkeeping of its attempts."""

    id: str
    spec: JobSpec
    request_id: str
    submitted_at: float
    seq: int  #: submission order inside the state machine; breaks ties deterministically
    status: JobStatus = JobStatus.PENDING
    attempt: int = 1
    tasks: list[Task] = field(default_factory=list)  #: the current attempt's gang, by index
    started_at: float = 0.0  #: when every task of the current attempt had started
    finished_at: float = 0.0
    stop_reason: str = ""  #: why a STOPPING attempt stops ("failed: …" or "cancelled: …")
    cancel_requested: bool = False
    final_failure: bool = False  #: the current attempt's failure must not be retried
    events: list[Event] = field(default_factory=list)
    #: attempt -> node of each task index, for every attempt that was placed (logs of old attempts)
    placements: dict[int, tuple[str, ...]] = field(default_factory=dict)
    user: str = ""  #: who submitted it: the authenticated caller, never a name the client claims
    preemptions: int = 0  #: attempts ended by preemption; they do not use up max_restarts
    preempted_at: tuple[float, ...] = ()  #: when its last few preemptions were planned (the budget)
    stop_grace: float = 0.0  #: seconds from SIGTERM to SIGKILL for the stopping attempt (0: the worker's)
    #: seconds from the checkpoint notice to SIGTERM for the stopping attempt: its notice, when a planned
    #: stop (NOTICED_CAUSES) ends a running attempt of a job that asked for one; 0: none; apply only
    stop_notice: float = 0.0
    #: when the current attempt's tasks were given their checkpoint notice (0: not yet); apply only
    notice_at: float = 0.0
    pending_reason: str = ""  #: why it waits, as the leader last recorded it (a PENDING_REASONS code)
    cancelled_by: str = ""  #: who asked to cancel it, if anyone did
    #: the EndReason the stopping attempt gives the tasks it stops (Preempted, Cancelled, TimeLimit),
    #: or "" when they are stopped because a task failed; apply only
    stop_cause: str = ""
    failure: str = ""  #: the task that failed first in the latest failed attempt, and why; apply only
    pending_since: float = 0.0  #: when it last became pending (submitted, or requeued); apply only
    placed_at: float = 0.0  #: when its latest attempt was placed (0 until one is); apply only
    array_id: str = ""  #: the array it is an element of ("" for a single job); set when materialised
    array_index: int = -1  #: its index in that array
    failure_cause: str = ""  #: the typed cause when the cluster failed it outright (DependencyNeverSatisfied)
    resizes: int = 0  #: attempts ended to resize its elastic gang; they use up none of its restarts
    #: attempts ended by what is not the job's fault besides preemption and resizing (a node of its
    #: gang lost or drained, rank 0's MASTER_PORT in use: REQUEUED_CAUSES); they use up none of its restarts
    requeues: int = 0
    #: nodes whose loss (or failing health check's drain) ended an attempt of its, oldest first, at
    #: most fsm.MAX_EXCLUDED_NODES: its later attempts are never placed on them; apply only
    excluded_nodes: tuple[str, ...] = ()
    runs: list[Run] = field(default_factory=list)  #: its ended attempts that were placed, oldest first; apply only
    #: its place in the order jobs finished (1, 2, 3… across the cluster), given when it ends; the
    #: history exporter's cursor counts these; 0 while unfinished; apply only
    archive_seq: int = 0
    archived_at: float = 0.0  #: when the history store was known to hold it (0: not yet); apply only
    #: its latest attempt's progress as recorded (RecordProgress, command-set version 4); None: none
    #: reported; apply only
    progress: Progress | None = None

    def restarts_allowed(self) -> int:
        return 0 if self.final_failure else self.spec.max_restarts

    def restarts_used(self) -> int:
        return self.attempt - 1 - self.preemptions - self.resizes - self.requeues

    def queue_key(self) -> tuple[int, float, int]:
        """Queue order: higher priority first, then earlier submission."""
        return (-self.spec.priority, self.submitted_at, self.seq)



def excluded_for(nodes: Mapping[str, Node], job: Job) -> frozenset[str]:
    """The nodes the scheduler keeps `job` off: those that ended its earlier attempts, while the
    other nodes of the cluster could hold its gang (counting whole tasks per node by capacity,
    whatever they run now and whatever their status). When they could not, none: a gang that
    needs every node a small cluster has must not wait for ever for a node that was repaired."""
    if not job.excluded_nodes:
        return frozenset()
    per, slots = job.spec.resources, 0
    for node_id, node in nodes.items():
        if node_id in job.excluded_nodes:
            continue
        fits = [have // need for have, need in ((node.capacity.cpu, per.cpu), (node.capacity.memory, per.memory),
                                                (node.capacity.gpu, per.gpu)) if need > 0]
        slots += min(fits) if fits else 0
        if slots >= job.spec.tasks:
            return frozenset(job.excluded_nodes)
    return frozenset()

#: The queue of jobs that name none. It exists without being defined (no limits, anyone may submit);
#: an admin may define it like any other queue to give it limits.
DEFAULT_QUEUE = "default"
#: In a queue's `max` or `lending_limit`, an amount meaning "no limit" for that resource.
UNLIMITED = -1


@dataclass(frozen=True, slots=True)
class Queue:
    """A share of the cluster (see synapse.core.queues for the rules a queue file must follow)."""

    name: str
    parent: str = ""  #: the organisation above this team; "" for a top-level queue
    weight: float = 1.0  #: for fair share
    guaranteed: Resources = Resources()
    max: Resources = Resources(UNLIMITED, UNLIMITED, UNLIMITED)  #: UNLIMITED per resource: no cap
    lending_limit: Resources = Resources(UNLIMITED, UNLIMITED, UNLIMITED)
    users: tuple[str, ...] = ()  #: who may submit; with `groups` empty too: everyone
    groups: tuple[str, ...] = ()
    preemption_rules: tuple[str, ...] = ()  #: of reclaim, priority, fair_share
    min_runtime: float = 0.0  #: seconds a gang runs before it may be preempted
    max_grace: float = 0.0  #: cap, in seconds, on a job's grace when preempted and on its checkpoint notice; 0: no cap

    def capped(self, seconds: float) -> float:
        """`seconds` (a grace or a checkpoint notice) within this queue's max_grace."""
        return min(seconds, self.max_grace) if self.max_grace else seconds


#: A preempted gang's grace when its job file gives none.
DEFAULT_GRACE_S = 30.0


@dataclass(frozen=True, slots=True)
class Hold:
    """Nodes kept for one preemptor alone while its victims stop (a committed preemption plan)."""

    job_id: str
    attempt: int
    nodes: tuple[str, ...]
    victims: tuple[str, ...]
    rule: str
    at: float


class Role(enum.StrEnum):
    """What a user may do: `admin` everything; `user` submit, read, and cancel its own jobs."""

    ADMIN = "admin"
    USER = "user"


@dataclass(slots=True)
class User:
    """A user of the cluster. Only the token's keyed hash is kept (see synapse.master.access)."""

    name: str
    role: Role
    groups: tuple[str, ...]
    token_hash: str
    created_at: float
    created_by: str
    token_set_at: float


@dataclass(slots=True)
class JoinToken:
    """A bootstrap credential that allows one thing: registering a new node (only its keyed hash is kept)."""

    id: str  #: shown by `synctl node token list`; names it for revocation
    token_hash: str
    created_at: float
    created_by: str
    expires_at: float  #: seconds since the epoch; 0 = never
    max_uses: int  #: registrations it allows; 0 = any number
    uses: int = 0  #: registrations it made so far
    nodes: tuple[str, ...] = ()  #: the nodes it registered, oldest first (at most JOIN_TOKEN_NODES kept)

    def unusable(self, at: float) -> str:
        """Why this token cannot register a node at time `at`, or ''."""
        if self.expires_at and at >= self.expires_at:
            return f"join token {self.id} expired"
        if self.max_uses and self.uses >= self.max_uses:
            return f"join token {self.id} is used up ({self.uses} of {self.max_uses} uses)"
        return ""


#: How many registered node ids a join token remembers (for `synctl node token list`).
JOIN_TOKEN_NODES = 32


@dataclass(frozen=True, slots=True)
class Placement:
    """Task `index` of a gang runs on `node_id` with these GPU indices and this rank."""

    index: int
    node_id: str
    gpus: tuple[int, ...]
    rank: int


@dataclass(frozen=True, slots=True)
class Plan:
    """A whole gang's placement for one attempt of one job."""

    job_id: str
    attempt: int
    placements: tuple[Placement, ...]


@dataclass(frozen=True, slots=True)
class Shortfall:
    """Why a gang does not fit one topology domain."""

    domain: str  #: e.g. `z1/b2/r7`, or `cluster`
    fits: int  #: tasks that fit there now (for domains above racks: at most this many)
    needed: int
    short: tuple[str, ...]  #: resources whose free total is below the gang's need, if any

    def __str__(self) -> str:
        if self.fits >= self.needed:
            return f"{self.domain}: room for {self.fits} task(s), but not packed as the job requires"
        why = ", ".join(self.short) if self.short else "capacity"
        if not self.short:
            why = "whole nodes (free capacity is fragmented)"
        return f"{self.domain}: {self.fits}/{self.needed} tasks fit (short of {why})"


def topology_path(labels: tuple[str, ...]) -> str:
    return "/".join(labels) if labels else "cluster"


@dataclass(frozen=True, slots=True)
class Assignment:
    """One task a worker must run (or stop), with everything its process environment needs."""

    job_id: str
    attempt: int
    index: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    gpus: tuple[int, ...]
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    image: str = ""
    stop: bool = False  #: no longer wanted: stop it and report its exit
    grace: float = 0.0  #: with stop: seconds from SIGTERM to SIGKILL; 0 means the worker's default
    resources: Resources = Resources()  #: the task's own; the worker confines it to them
    #: a planned stop is near (while wanted) or this is one (with stop): give the task this signal once,
    #: ahead of SIGTERM (jobspec.NOTICE_SIGNALS spelling); "" = no notice
    notice_signal: str = ""
    notice: float = 0.0  #: with stop and notice_signal: SIGTERM comes this many seconds after the notice
    #: the job's bind mounts (source on the node, target in the image, read-only), for a task in an image
    mounts: tuple[tuple[str, str, bool], ...] = ()
    #: in an image: pull it and report the task prepared, but start it only once a listing says not held
    hold: bool = False

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.job_id, self.attempt, self.index)
