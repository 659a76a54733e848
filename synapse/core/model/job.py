"""A job: what a user asks for (`JobSpec`), its status, the tasks of its current gang, the runs it
ended and the progress they reported.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from synapse.core.model.node import Node, Resources


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
    #: an allocation (`synctl alloc`, command-set version 7): its tasks hold their resources and run
    #: nothing; steps (StartStep) run inside them without queueing (synapse.core.steps)
    alloc: bool = False
    #: an allocation ends (cancelled) after this many seconds with no step running; 0: the default
    #: (DEFAULT_IDLE_TIMEOUT_S)
    idle_timeout: float = 0.0
    #: an interactive session (`synctl run --pty`, `synctl alloc`; command-set version 7): its time
    #: limit is bounded by its queue's interactive max_duration, and it is never preempted while its
    #: queue is within its guarantee
    interactive: bool = False

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
    def has_alloc(self) -> bool:
        """True when it is an allocation (a field that needs command-set version 7)."""
        return self.alloc or bool(self.idle_timeout)

    @property
    def has_interactive(self) -> bool:
        """True when it is an interactive session (a field that needs command-set version 7)."""
        return self.interactive

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


#: How long a gang waits for its image on all its nodes, unless its job says otherwise.
DEFAULT_IMAGE_PULL_TIMEOUT_S = 600.0
#: How long an allocation may stay with no step running before it ends, unless its job says otherwise:
#: an idle session holds GPUs for nothing (Kubeflow culls notebooks after a day, SkyPilot stops idle
#: clusters after 5 minutes; a researcher between two steps rarely pauses half an hour).
DEFAULT_IDLE_TIMEOUT_S = 1800.0


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
    #: a step's task: the index of the task of its allocation it runs inside (on the same node, with
    #: a share of that task's resources and GPUs, which its node counts once, for the allocation's
    #: task); -1: not a step's (synapse.core.steps)
    holder: int = -1

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
    #: a step's allocation (StartStep, command-set version 7): the step runs inside its tasks, never
    #: queues and never restarts; "" for any other job
    alloc_id: str = ""
    #: an allocation's steps started so far: step k is job `<id>.<k>` (synapse.core.steps.step_id); apply only
    step_count: int = 0
    #: an allocation: since when no step of it runs (0 while one does); its idle timeout counts from
    #: it; apply only
    idle_since: float = 0.0
    #: an allocation: the ids of its steps whose tasks exist (placed, running or stopping), so that
    #: apply never walks every step it ever ran; derived: apply keeps it, a snapshot's load rebuilds it
    live_step_ids: set[str] = field(default_factory=set)
    #: who holds it back from the queue (`synctl hold`, `submit --hold`; command-set version 7): a held
    #: job is never placed; "" = not held; apply only
    held_by: str = ""
    #: attempts ended by its owner's or an admin's requeue (RequeueJob); they use up none of its restarts
    manual_requeues: int = 0
    #: UpdateJob commands applied to it (its spec's priority, time limit or queue changed); apply only
    updates: int = 0

    def restarts_allowed(self) -> int:
        return 0 if self.final_failure else self.spec.max_restarts

    def restarts_used(self) -> int:
        return self.attempt - 1 - self.preemptions - self.resizes - self.requeues - self.manual_requeues

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
