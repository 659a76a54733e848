"""The commands of the replicated log, as domain objects.

Each command carries everything apply needs: ids, timestamps (`at`, the proposer's clock) and, for
leader-only commands, the proposer's Raft term (`term`), so apply is a pure function of the state
and the command. `codec.py` turns them into the versioned protobuf envelope that goes into the log.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from synapse.core.model import JobSpec, Placement, Queue, Resources, Role


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    at: float  #: proposer's wall clock, seconds since the epoch
    term: int = 0  #: proposing leader's term; 0 for commands that any replica may forward
    by: str = ""  #: the authenticated user who asked for it; "" for the cluster's own commands


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterNode(Command):
    """A worker's node joins (or re-joins, with new capacity or topology): the first register
    makes it READY; a later one of a DOWN node brings it back."""

    node_id: str
    address: str
    topology: tuple[str, ...]
    capacity: Resources
    labels: tuple[tuple[str, str], ...] = ()  #: sorted (name, value) pairs the worker discovered
    isolation: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateJoinToken(Command):
    """A new join token; its keyed hash only (the token never enters the log)."""

    token_id: str
    token_hash: str
    expires_at: float  #: 0 = never
    max_uses: int  #: 0 = any number


@dataclass(frozen=True, slots=True, kw_only=True)
class RevokeJoinToken(Command):
    """A join token stops working; nodes that joined with it stay."""

    token_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinNode(Command):
    """Register a new node with a join token: refused if the token is unusable at `at` or the node
    id is taken (re-registering a node needs an admin or the node's own credential)."""

    token_id: str
    node: RegisterNode  #: its at, term and by are the JoinNode's own (the log stores them once)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeDown(Command):
    """A node is DOWN (its heartbeats stopped): its tasks are lost and their resources freed, and
    their gangs stop as failed (an older leader's node loss: NodeLost requeues them uncharged)."""

    node_id: str
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeLost(NodeDown):
    """A NodeDown after which the node's gangs requeue at their place in the queue without using up
    a restart (command-set version 3): an older replica would fail them, so it is its own kind."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainNode(Command):
    """Cordon a node (an admin's drain; a health check's drain has its cordon already: `cordon`
    False) and stop every gang with a task on it, in one command: each requeues at its place,
    uncharged, and an elastic gang that keeps its minimum without the node shrinks instead."""

    node_id: str
    reason: str = ""
    cordon: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuFault(Command):
    """A node's worker reports an error of its GPUs `gpus` (none named: its GPUs as a whole), in one
    command: the node is cordoned with `message` until an admin uncordons it, and every gang with a
    wanted task on those GPUs stops, requeues at its place uncharged (EndReason GpuError) and avoids
    the node from then on; the end counts against the node (a suspect). Command-set version 4."""

    node_id: str
    gpus: tuple[int, ...] = ()
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SetClusterVersion(Command):
    """Every member of the cluster applies command-set `version` (etcd's cluster version, kept in
    the replicated state): the kinds of that version may be proposed from now on even while a member
    is down or unheard, and a replica of an older release may no longer join. It only rises."""

    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeUp(Command):
    """A DOWN node's worker is heard from again: READY (its cordon, if any, stays)."""

    node_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SetSchedulable(Command):
    """An admin's cordon or uncordon."""

    node_id: str
    schedulable: bool
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SetNodeHealth(Command):
    """A node's health check turned: cordon (or drain) it, or lift the cordon its health check set."""

    node_id: str
    healthy: bool
    message: str = ""
    drain: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitJob(Command):
    """A new job, pending in its queue; a request id already used for the same spec returns the
    job it made (an idempotent retry)."""

    job_id: str
    request_id: str
    spec: JobSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitWorkflowJob(SubmitJob):
    """A SubmitJob whose spec uses arrays or dependencies (command-set version 2): an older replica
    would apply it as a plain job, so it travels as its own kind."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitCheckpointJob(SubmitWorkflowJob):
    """A SubmitJob whose spec asks for a checkpoint notice (command-set version 3): an older replica
    would drop the notice and hold another job, so it travels as its own kind. It carries any spec,
    arrays and dependencies included."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitImageJob(SubmitCheckpointJob):
    """A SubmitJob whose spec has mounts or runs its image's entrypoint (command-set version 4): an
    older replica would drop the mounts, or refuse a spec without a command, so it travels as its
    own kind. It carries any spec."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitSecretJob(SubmitImageJob):
    """A SubmitJob whose spec carries sealed secrets (command-set version 6): an older replica would
    drop them and run the job without them, so it travels as its own kind. It carries any spec."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitAllocJob(SubmitSecretJob):
    """A SubmitJob of an allocation (command-set version 7): its tasks hold resources and run nothing,
    and steps run inside them; an older replica would apply it as a job without a command, so it
    travels as its own kind. It carries any spec."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StartStep(Command):
    """Start a step inside a running allocation, without queueing (command-set version 7): `spec`'s
    tasks go onto the allocation's tasks where they fit beside its running steps
    (synapse.core.steps.fit_step), all or none, as job `<alloc_id>.<k>` (k: the allocation's next
    step number); a request id already used returns the step it made (an idempotent retry)."""

    alloc_id: str
    request_id: str
    spec: JobSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitInteractiveJob(SubmitAllocJob):
    """A SubmitJob whose spec is interactive, or that is held from the start (command-set version 7):
    an older replica would drop the mark (and preempt the session, or place the held job), so it
    travels as its own kind. It carries any spec, an allocation's too; `held`: queued but held by
    its submitter (`synctl submit --hold`) until released."""

    held: bool = False


def submit_kind(spec: JobSpec, held: bool = False) -> type[SubmitJob]:
    """The kind a submission of `spec` travels as: the oldest that carries all of it (of the two of
    version 7, an allocation that is neither interactive nor held travels as SubmitAllocJob)."""
    if held or spec.has_interactive:
        return SubmitInteractiveJob
    if spec.has_alloc:
        return SubmitAllocJob
    if spec.has_secrets:
        return SubmitSecretJob
    if spec.has_image_run:
        return SubmitImageJob
    if spec.has_checkpoint:
        return SubmitCheckpointJob
    return SubmitWorkflowJob if spec.has_workflow else SubmitJob


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointNotice(Command):
    """Give a running attempt's tasks their checkpoint notice now, ahead of the stop planned for
    `stop_at` (its time limit: the leader proposes this `notice` before the limit, and the stop at
    `stop_at`). Command-set version 3."""

    job_id: str
    attempt: int
    stop_at: float
    cause: str = "TimeLimit"  #: the planned stop's EndReason


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordExec(Command):
    """A process was started in a running task's sandbox (`synctl exec`) by `by`: a job event, so
    every exec is on record. Command-set version 7."""

    job_id: str
    attempt: int
    index: int
    command: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordProgress(Command):
    """An attempt's progress as its tasks reported it (SYNAPSE_PROGRESS_FILE): its last checkpoint,
    which goodput accounting needs on every replica (a new leader must know it), and a progress
    file's garbage, once, as a job event. Command-set version 4; the leader proposes it only when
    the checkpoint changed, sparingly (synapse.core.brain.leader_state)."""

    job_id: str
    attempt: int
    checkpoint_at: float = 0.0  #: when the attempt's last checkpoint was saved; 0 = none
    checkpoint_step: int = -1  #: the step it saved (-1: not said)
    step: int = -1  #: the latest step reported (-1: not said)
    problem: str = ""  #: a task's progress file held garbage (ignored): said as an event; "" = none


@dataclass(frozen=True, slots=True, kw_only=True)
class SetSpares(Command):
    """The nodes designated spares, all of them: every other node is not one (command-set version 4;
    the leader proposes the set synapse.core.schedule.spares.designate chooses, `reason` saying why it changed)."""

    node_ids: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SetArrayThrottle(Command):
    """Change how many elements of an array may hold a gang at once (0: no limit)."""

    job_id: str
    throttle: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HoldJob(Command):
    """Hold a pending job back from the queue (`synctl hold`): it keeps its place and is never placed
    until released (command-set version 7). Refused for a job that is not pending."""

    job_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseJob(Command):
    """Release a held job: it takes part in the next round at its place (command-set version 7)."""

    job_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateJob(Command):
    """Change a job's priority, time limit or queue (command-set version 7), re-checked at apply: its
    owner may lower the priority and shorten the limit, only an admin raise or lengthen them (`by`
    names who asks, and the state says whether that user is an admin); a new queue must take the job
    by its rules (synapse.core.submission). None: that field stays. Queue and a running gang: refused."""

    job_id: str
    priority: int | None = None
    time_limit: float | None = None  #: seconds; 0: no limit
    queue: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RequeueJob(Command):
    """Stop a job's placed attempt and queue it again, a new attempt at its place, not charged to
    max_restarts (`synctl requeue`, command-set version 7); refused unless it is SCHEDULED or RUNNING
    at `attempt`."""

    job_id: str
    attempt: int
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ResizeGang(Command):
    """Stop an elastic gang's attempt so that it restarts larger (a new attempt, no restart used)."""

    job_id: str
    attempt: int
    size: int
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitPlan(Command):
    """Place a pending gang: every task on its node and GPUs, all or none, re-checked against
    the state at apply (the gang commit)."""

    job_id: str
    attempt: int
    placements: tuple[Placement, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskStarted(Command):
    """A worker started a task of the attempt; the gang is RUNNING once all its tasks have
    started."""

    job_id: str
    attempt: int
    index: int
    node_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskPrepared(Command):
    """A task's node holds its job's image (command-set version 4); the gang's tasks start once
    every one is (synapse.master.dispatch lists them held until then)."""

    job_id: str
    attempt: int
    index: int
    node_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskExited(Command):
    """A task ended (the worker's exit code and EndReason): its resources are freed; a failure
    stops the gang, and the last task's end settles the attempt."""

    job_id: str
    attempt: int
    index: int
    node_id: str
    exit_code: int
    reason: str = ""  #: the worker's detail
    cause: str = ""  #: the worker's EndReason: Completed, Error, Signal or OOMKilled ("" from older workers)
    #: with cause ImagePullFailed: the failure lies in the node, so another node may succeed
    node_side: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelJob(Command):
    """A user's or admin's cancel: a pending job ends, a running gang stops with its grace."""

    job_id: str
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class FailAttempt(Command):
    """Stop a running attempt as failed, or for a planned cause (its time limit): it restarts
    while restarts are left, unless `final`."""

    job_id: str
    attempt: int
    reason: str
    final: bool = False
    cause: str = ""  #: the EndReason of the tasks it stops (e.g. TimeLimit); "" = a failure


@dataclass(frozen=True, slots=True, kw_only=True)
class Barrier(Command):
    """Changes nothing; committing it proves the proposer still leads (see api.proto)."""

    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SetReplica(Command):
    """Records a master replica's addresses (or its removal) in the replicated directory."""

    id: str
    raft_address: str
    api_address: str
    removed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ForgetJobs(Command):
    """Drop finished jobs from the state (retention); unfinished ones are left alone."""

    job_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ArchiveJobs(ForgetJobs):
    """ForgetJobs that also forgets ended arrays and keeps each forgotten job's and array's final
    status for dependencies on it (command-set version 2: a version-1 ForgetJobs keeps none, as
    older replicas apply it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AddUser(Command):
    """A new user; the token's keyed hash only (the token never enters the log)."""

    name: str
    role: Role
    groups: tuple[str, ...]
    token_hash: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SetUserToken(Command):
    """A user's new token (rotation): the old one stops working when this applies."""

    name: str
    token_hash: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoveUser(Command):
    """A user is removed; its token stops working when this applies."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplyQueues(Command):
    """Create or replace these queues, all together or none."""

    queues: tuple[Queue, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplyQueuesWithLimits(ApplyQueues):
    """ApplyQueues whose queues set per-user limits or an interactive maximum (command-set version 7):
    an older replica would drop them and accept submissions this one refuses, so it is its own kind."""


def queues_kind(queues: tuple[Queue, ...]) -> type[ApplyQueues]:
    """The kind an ApplyQueues of `queues` travels as: the oldest that carries all of it."""
    return ApplyQueuesWithLimits if any(q.has_limits for q in queues) else ApplyQueues


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteQueue(Command):
    """Refused while the queue holds unfinished jobs or has child queues."""

    name: str


@dataclass(frozen=True, slots=True)
class Victim:
    job_id: str
    attempt: int
    grace: float  #: seconds from SIGTERM to SIGKILL
    notice: float = 0.0  #: its checkpoint notice (seconds before SIGTERM), capped by its queue's max_grace


@dataclass(frozen=True, slots=True, kw_only=True)
class Preempt(Command):
    """A whole preemption plan: stop these gangs, hold these nodes for the preemptor alone."""

    job_id: str
    attempt: int
    rule: str
    victims: tuple[Victim, ...]
    nodes: tuple[str, ...]
    explanation: str = ""


@dataclass(frozen=True, slots=True)
class PendingReason:
    job_id: str
    attempt: int
    code: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingReasons(Command):
    """Why pending gangs wait, recorded by the leader when a gang's reason changes."""

    entries: tuple[PendingReason, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryExported(Command):
    """The history store holds every finished job with an archive sequence number up to `upto`
    (the exporter committed its rows and this cursor in one transaction before proposing it)."""

    upto: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryOverflow(Command):
    """Forget these finished jobs although the history store does not hold them: the unarchived
    jobs reached the cap (`history.max_unarchived`). Loud: a Warning event, a counter, a metric."""

    job_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SetUsageHalfLife(Command):
    """The half-life of the decayed usage admission weighs (synapse.core.schedule.fairshare); 0: none."""

    half_life: float


class Rejection(enum.StrEnum):
    """Why a command was rejected, for code that acts on it (the error text is for people)."""

    REFUSED = "Refused"  #: the state or the command's own content does not allow it
    NOT_FOUND = "NotFound"  #: it names a job, node, user or queue the state does not hold
    STALE = "Stale"  #: it comes from a leader's term that a newer leader has overtaken
    CONFLICT = "Conflict"  #: it would make what already exists otherwise (a request id reused for another job)


@dataclass(frozen=True, slots=True)
class Result:
    """What applying a command did: `ok`, or a rejection with the reason. Nothing changed if not ok."""

    ok: bool
    error: str = ""
    value: str = ""  #: e.g. the job id of a submission
    code: Rejection | None = None  #: set on every rejection

    @classmethod
    def rejected(cls, error: str, code: Rejection = Rejection.REFUSED) -> Result:
        return cls(False, error, code=code)

    @classmethod
    def not_found(cls, error: str) -> Result:
        return cls(False, error, code=Rejection.NOT_FOUND)
