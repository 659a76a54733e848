"""The Raft log's encoding: domain objects to and from the messages of commands.proto and types.proto,
in flat `x_to_proto` / `x_from_proto` pairs (the API's own messages are synapse.rpc.convert's).

Decoding never trusts its input: a malformed or unknown command raises `CodecError`. Coming from
the Raft log, such an entry stops the replica (synapse.master.replicated.ReplicatedState): written by
code that knows more than this replica's, it cannot be skipped without this replica's state
parting from its peers'.

Each log entry carries the command-set version of its kind (synapse.core.versions): a replica
refuses an entry of a version it does not know.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypedDict

from google.protobuf.message import DecodeError

from synapse.core import commands as c
from synapse.core.jobs.wire import (
    NO_CHECKPOINT as NO_CHECKPOINT,
)

# The spec's, resources' and queue's messages (synapse.core.jobs.wire), as codec.* for the log's users too
from synapse.core.jobs.wire import (
    CodecError as CodecError,
)
from synapse.core.jobs.wire import (
    job_spec_from_proto as job_spec_from_proto,
)
from synapse.core.jobs.wire import (
    job_spec_into as job_spec_into,
)
from synapse.core.jobs.wire import (
    job_spec_to_proto as job_spec_to_proto,
)
from synapse.core.jobs.wire import (
    mounts_from_proto as mounts_from_proto,
)
from synapse.core.jobs.wire import (
    mounts_to_proto as mounts_to_proto,
)
from synapse.core.jobs.wire import (
    queue_from_proto as queue_from_proto,
)
from synapse.core.jobs.wire import (
    queue_to_proto as queue_to_proto,
)
from synapse.core.jobs.wire import (
    resources_from_proto as resources_from_proto,
)
from synapse.core.jobs.wire import (
    resources_to_proto as resources_to_proto,
)
from synapse.core.model import UNLIMITED, CheckpointSpec, JobSpec, Placement, Role
from synapse.core.versions import BASE_VERSION, COMMAND_VERSION, KIND_VERSIONS
from synapse.proto import commands_pb2, types_pb2


@dataclass(frozen=True, slots=True)
class CommandSet:
    """The commands a replica's code applies: the version that introduced each kind, and the highest
    version it knows. `CURRENT` is this code's; a test builds an older one (synapse.master.main)."""

    introduced: Mapping[type[c.Command], int]
    known: int

    def version_of(self, cmd: c.Command) -> int:
        """The command-set version a replica needs to apply `cmd`."""
        version = self.introduced.get(type(cmd))
        if version is None:
            raise CodecError(f"unknown command type {type(cmd).__name__}")
        return version


CURRENT = CommandSet(KIND_VERSIONS, COMMAND_VERSION)


def _before_images(spec: JobSpec) -> JobSpec:
    """A spec as a replica before command-set version 4 reads it: no mounts, no pull timeout (and
    no secrets or allocation, which came later still)."""
    return dataclasses.replace(spec, mounts=(), image_pull_timeout=0.0, secrets=(), alloc=False, idle_timeout=0.0,
                               interactive=False)


def _before_secrets(spec: JobSpec) -> JobSpec:
    """A spec as a replica before command-set version 6 reads it: no secrets (and nothing of version 7)."""
    return dataclasses.replace(spec, secrets=(), alloc=False, idle_timeout=0.0, interactive=False) \
        if spec.secrets or spec.has_alloc or spec.interactive else spec


def _before_alloc(spec: JobSpec) -> JobSpec:
    """A spec as a replica before command-set version 7 reads it: no allocation, no interactive mark."""
    return dataclasses.replace(spec, alloc=False, idle_timeout=0.0, interactive=False) \
        if spec.has_alloc or spec.interactive else spec


def _before_interactive(spec: JobSpec) -> JobSpec:
    """A spec as SubmitAllocJob carries it: no interactive mark (an interactive spec travels as
    SubmitInteractiveJob)."""
    return dataclasses.replace(spec, interactive=False) if spec.interactive else spec


def placement_to_proto(pl: Placement) -> types_pb2.Placement:
    return types_pb2.Placement(index=pl.index, node_id=pl.node_id, gpus=list(pl.gpus), rank=pl.rank)


def placement_from_proto(p: types_pb2.Placement) -> Placement:
    return Placement(index=p.index, node_id=p.node_id, gpus=tuple(p.gpus), rank=p.rank)


def command_to_proto(cmd: c.Command, commands: CommandSet = CURRENT) -> commands_pb2.Command:
    return _command_into(commands_pb2.Command(), cmd, commands)


def register_node_to_proto(cmd: c.RegisterNode) -> commands_pb2.RegisterNode:
    return commands_pb2.RegisterNode(
        node_id=cmd.node_id, address=cmd.address, topology=list(cmd.topology),
        capacity=resources_to_proto(cmd.capacity), labels=dict(cmd.labels), isolation=cmd.isolation)


class _Base(TypedDict):
    """The fields every command carries in its envelope (synapse.core.commands.Command)."""

    at: float
    term: int
    by: str


def register_node_from_proto(b: commands_pb2.RegisterNode, base: _Base) -> c.RegisterNode:
    return c.RegisterNode(node_id=b.node_id, address=b.address, topology=tuple(b.topology),
                          capacity=resources_from_proto(b.capacity), labels=tuple(sorted(b.labels.items())),
                          isolation=b.isolation, **base)


def _submission_into(body: commands_pb2.SubmitJob, cmd: c.SubmitJob) -> None:
    body.SetInParent()
    body.job_id = cmd.job_id
    body.request_id = cmd.request_id
    job_spec_into(body.spec, cmd.spec)
    if isinstance(cmd, c.SubmitInteractiveJob) and cmd.held:
        body.held = True


#: What a submission's spec may not hold for a kind older than the one that carries it: (the spec
#: flag that says it holds it, what the error says), checked in order. An older replica would drop
#: such fields and apply another job.
_TRAVELS_AS = {
    "interactive": ("has_interactive", "an interactive spec travels as SubmitInteractiveJob"),
    "alloc": ("has_alloc", "an allocation's spec travels as SubmitAllocJob"),
    "secrets": ("has_secrets", "a spec with secrets travels as SubmitSecretJob"),
    "workflow": ("has_workflow", "a spec with an array or dependencies travels as SubmitWorkflowJob"),
    "checkpoint": ("has_checkpoint", "a spec with a checkpoint notice travels as SubmitCheckpointJob"),
    "image": ("has_image_run", "a spec with mounts or without a command travels as SubmitImageJob"),
}
#: Per submission kind, what its spec may not hold (_TRAVELS_AS), in the order it is checked.
_REFUSED_BY_KIND: dict[type[c.Command], tuple[str, ...]] = {
    c.SubmitInteractiveJob: (),
    c.SubmitAllocJob: ("interactive",),
    c.SubmitSecretJob: ("interactive", "alloc"),
    c.SubmitImageJob: ("interactive", "alloc", "secrets"),
    c.SubmitCheckpointJob: ("interactive", "alloc", "secrets", "image"),
    c.SubmitWorkflowJob: ("interactive", "alloc", "secrets", "image", "checkpoint"),
    c.SubmitJob: ("interactive", "alloc", "secrets", "workflow", "checkpoint", "image"),
}


def _submission_writer(field: str) -> Callable[[commands_pb2.Command, Any], None]:
    def write(env: commands_pb2.Command, cmd: c.SubmitJob) -> None:
        for refused in _REFUSED_BY_KIND[type(cmd)]:
            flag, error = _TRAVELS_AS[refused]
            if getattr(cmd.spec, flag):
                raise CodecError(error)
        _submission_into(getattr(env, field), cmd)
    return write


def _read_submit_job(b: commands_pb2.SubmitJob, base: _Base) -> c.Command:
    spec = job_spec_from_proto(b.spec)
    if spec.has_workflow:  # never encoded so; read it as an older replica would, a plain job
        spec = dataclasses.replace(spec, array="", array_throttle=0, after=(), singleton=False,
                                   on_unsatisfiable="", tasks_min=0, resize_interval=0.0)
    spec = _before_images(spec) if spec.mounts or spec.image_pull_timeout or spec.secrets or spec.has_alloc else spec
    spec = _before_interactive(spec)
    if spec.checkpoint != NO_CHECKPOINT:  # likewise (the test, not a copy each time: apply's hot path)
        spec = dataclasses.replace(spec, checkpoint=NO_CHECKPOINT)
    return c.SubmitJob(job_id=b.job_id, request_id=b.request_id, spec=spec, **base)


def _read_submit_workflow_job(b: commands_pb2.SubmitJob, base: _Base) -> c.Command:
    # as older replicas read it
    spec = dataclasses.replace(_before_images(job_spec_from_proto(b.spec)), checkpoint=CheckpointSpec(),
                               interactive=False)
    return c.SubmitWorkflowJob(job_id=b.job_id, request_id=b.request_id, spec=spec, **base)


def _read_submit_checkpoint_job(b: commands_pb2.SubmitJob, base: _Base) -> c.Command:
    return c.SubmitCheckpointJob(job_id=b.job_id, request_id=b.request_id,
                                 spec=_before_interactive(_before_images(job_spec_from_proto(b.spec))), **base)


def _read_submit_image_job(b: commands_pb2.SubmitJob, base: _Base) -> c.Command:
    return c.SubmitImageJob(job_id=b.job_id, request_id=b.request_id,
                            spec=_before_secrets(job_spec_from_proto(b.spec)), **base)


def _read_submit_secret_job(b: commands_pb2.SubmitJob, base: _Base) -> c.Command:
    return c.SubmitSecretJob(job_id=b.job_id, request_id=b.request_id,
                             spec=_before_alloc(job_spec_from_proto(b.spec)), **base)


def _read_submit_alloc_job(b: commands_pb2.SubmitJob, base: _Base) -> c.Command:
    return c.SubmitAllocJob(job_id=b.job_id, request_id=b.request_id,
                            spec=_before_interactive(job_spec_from_proto(b.spec)), **base)


def _write_start_step(env: commands_pb2.Command, cmd: c.StartStep) -> None:
    body = env.start_step
    body.SetInParent()
    body.alloc_id = cmd.alloc_id
    body.request_id = cmd.request_id
    job_spec_into(body.spec, cmd.spec)


def _read_start_step(b: commands_pb2.StartStep, base: _Base) -> c.Command:
    return c.StartStep(alloc_id=b.alloc_id, request_id=b.request_id, spec=job_spec_from_proto(b.spec), **base)


def _read_submit_interactive_job(b: commands_pb2.SubmitJob, base: _Base) -> c.Command:
    return c.SubmitInteractiveJob(job_id=b.job_id, request_id=b.request_id, spec=job_spec_from_proto(b.spec),
                                  held=b.held, **base)


def _write_update_job(env: commands_pb2.Command, cmd: c.UpdateJob) -> None:
    body = env.update_job
    body.SetInParent()
    body.job_id = cmd.job_id
    if cmd.priority is not None:
        body.priority = cmd.priority
    if cmd.time_limit is not None:
        body.time_limit_s = cmd.time_limit
    if cmd.queue is not None:
        body.queue = cmd.queue


def _read_update_job(b: commands_pb2.UpdateJob, base: _Base) -> c.Command:
    return c.UpdateJob(job_id=b.job_id, priority=b.priority if b.HasField("priority") else None,
                       time_limit=b.time_limit_s if b.HasField("time_limit_s") else None,
                       queue=b.queue if b.HasField("queue") else None, **base)


def _queues_body(field: str, kind: type[c.ApplyQueues]) -> tuple[type[c.Command], _Body]:
    """ApplyQueues and ApplyQueuesWithLimits: the same body; the older kind refuses what it cannot carry."""
    def build(cmd: c.ApplyQueues) -> commands_pb2.ApplyQueues:
        if kind is c.ApplyQueues and c.queues_kind(cmd.queues) is not c.ApplyQueues:
            raise CodecError("queues with per-user limits or an interactive maximum travel as ApplyQueuesWithLimits")
        return commands_pb2.ApplyQueues(queues=[queue_to_proto(q) for q in cmd.queues])

    def read(b: commands_pb2.ApplyQueues, base: _Base) -> c.Command:
        queues = tuple(queue_from_proto(q) for q in b.queues)
        if kind is c.ApplyQueues:  # as an older replica reads it
            queues = tuple(dataclasses.replace(q, user_gpu=UNLIMITED, user_jobs=UNLIMITED, interactive_max=0.0)
                           for q in queues)
        return kind(queues=queues, **base)
    return kind, _Body(field, _copied(field, build), read)


def _write_pending_reasons(env: commands_pb2.Command, cmd: c.PendingReasons) -> None:
    reasons = env.pending_reasons
    reasons.SetInParent()
    for e in cmd.entries:
        reasons.entries.add(job_id=e.job_id, attempt=e.attempt, code=e.code, message=e.message)


def _read_add_user(b: commands_pb2.AddUser, base: _Base) -> c.Command:
    try:
        role = Role(b.role)
    except ValueError:
        raise CodecError(f"add_user: unknown role {b.role!r}") from None
    return c.AddUser(name=b.name, role=role, groups=tuple(b.groups), token_hash=b.token_hash, **base)


def _read_preempt(b: commands_pb2.Preempt, base: _Base) -> c.Command:
    return c.Preempt(job_id=b.job_id, attempt=b.attempt, rule=b.rule, nodes=tuple(b.nodes), explanation=b.explanation,
                     victims=tuple(c.Victim(v.job_id, v.attempt, v.grace_s, v.notice_s) for v in b.victims), **base)


def _copied(field: str, build: Callable[[Any], Any]) -> Callable[[commands_pb2.Command, Any], None]:
    """A writer that builds the body apart and copies it into the envelope's `field`."""
    def write(env: commands_pb2.Command, cmd: c.Command) -> None:
        getattr(env, field).CopyFrom(build(cmd))
    return write


@dataclass(frozen=True, slots=True)
class _Body:
    """How one kind of command travels: the envelope's field for it, how its body is written into an
    envelope, and how a command is read from that body (with the envelope's `_Base`)."""

    field: str
    write: Callable[[commands_pb2.Command, Any], None]
    read: Callable[[Any, _Base], c.Command]


def _flat(field: str, kind: type[c.Command], message: Callable[..., Any], names: str,
          repeated: str = "", renamed: Mapping[str, str] | None = None) -> tuple[type[c.Command], _Body]:
    """A kind whose body holds its fields one for one (`names`; those in `repeated` are tuples, sent as
    lists; `renamed` maps a command field to the body's name for it)."""
    fields = tuple(names.split())
    many = frozenset(repeated.split())
    wire = {name: (renamed or {}).get(name, name) for name in fields}

    def build(cmd: c.Command) -> Any:
        return message(**{wire[n]: list(getattr(cmd, n)) if n in many else getattr(cmd, n) for n in fields})

    def read(b: Any, base: _Base) -> c.Command:
        return kind(**{n: tuple(getattr(b, wire[n])) if n in many else getattr(b, wire[n]) for n in fields}, **base)
    return kind, _Body(field, _copied(field, build), read)


def _custom(field: str, kind: type[c.Command], write: Callable[[commands_pb2.Command, Any], None],
            read: Callable[[Any, _Base], c.Command]) -> tuple[type[c.Command], _Body]:
    return kind, _Body(field, write, read)


def _submission(field: str, kind: type[c.Command],
                read: Callable[[Any, _Base], c.Command]) -> tuple[type[c.Command], _Body]:
    return kind, _Body(field, _submission_writer(field), read)


#: Each kind of command: its envelope field and how its body is written and read. The kinds a
#: submission proposes (submissions, a round's pending reasons) are written in place; the rest build
#: their body and copy it in (the same bytes, at a copy's cost).
_BODIES: Mapping[type[c.Command], _Body] = MappingProxyType(dict([
    _custom("register_node", c.RegisterNode, _copied("register_node", lambda cmd: register_node_to_proto(cmd)),
            lambda b, base: register_node_from_proto(b, base)),
    _flat("node_lost", c.NodeLost, commands_pb2.NodeDown, "node_id reason"),
    _flat("set_spares", c.SetSpares, commands_pb2.SetSpares, "node_ids reason", repeated="node_ids"),
    _flat("gpu_fault", c.GpuFault, commands_pb2.GpuFault, "node_id gpus message", repeated="gpus"),
    _flat("set_cluster_version", c.SetClusterVersion, commands_pb2.SetClusterVersion, "version"),
    _flat("drain_node", c.DrainNode, commands_pb2.DrainNode, "node_id reason cordon"),
    _flat("node_down", c.NodeDown, commands_pb2.NodeDown, "node_id reason"),
    _flat("node_up", c.NodeUp, commands_pb2.NodeUp, "node_id"),
    _flat("set_schedulable", c.SetSchedulable, commands_pb2.SetSchedulable, "node_id schedulable reason"),
    _flat("set_node_health", c.SetNodeHealth, commands_pb2.SetNodeHealth, "node_id healthy message drain"),
    _submission("submit_interactive_job", c.SubmitInteractiveJob, _read_submit_interactive_job),
    _submission("submit_alloc_job", c.SubmitAllocJob, _read_submit_alloc_job),
    _custom("start_step", c.StartStep, _write_start_step, _read_start_step),
    _submission("submit_secret_job", c.SubmitSecretJob, _read_submit_secret_job),
    _submission("submit_image_job", c.SubmitImageJob, _read_submit_image_job),
    _submission("submit_checkpoint_job", c.SubmitCheckpointJob, _read_submit_checkpoint_job),
    _submission("submit_workflow_job", c.SubmitWorkflowJob, _read_submit_workflow_job),
    _submission("submit_job", c.SubmitJob, _read_submit_job),
    _custom("commit_plan", c.CommitPlan, _copied("commit_plan", lambda cmd: commands_pb2.CommitPlan(
        job_id=cmd.job_id, attempt=cmd.attempt, placements=[placement_to_proto(p) for p in cmd.placements])),
        lambda b, base: c.CommitPlan(job_id=b.job_id, attempt=b.attempt,
                                     placements=tuple(placement_from_proto(p) for p in b.placements), **base)),
    _flat("task_started", c.TaskStarted, commands_pb2.TaskStarted, "job_id attempt index node_id"),
    _flat("task_prepared", c.TaskPrepared, commands_pb2.TaskStarted, "job_id attempt index node_id"),
    _flat("task_exited", c.TaskExited, commands_pb2.TaskExited,
          "job_id attempt index node_id exit_code reason cause node_side"),
    _flat("cancel_job", c.CancelJob, commands_pb2.CancelJob, "job_id reason"),
    _flat("fail_attempt", c.FailAttempt, commands_pb2.FailAttempt, "job_id attempt reason final cause"),
    _flat("barrier", c.Barrier, commands_pb2.Barrier, "reason"),
    _flat("archive_jobs", c.ArchiveJobs, commands_pb2.ForgetJobs, "job_ids", repeated="job_ids"),
    _flat("forget_jobs", c.ForgetJobs, commands_pb2.ForgetJobs, "job_ids", repeated="job_ids"),
    _flat("set_replica", c.SetReplica, commands_pb2.SetReplica, "id raft_address api_address removed"),
    _custom("add_user", c.AddUser, _copied("add_user", lambda cmd: commands_pb2.AddUser(
        name=cmd.name, groups=list(cmd.groups), role=cmd.role.value, token_hash=cmd.token_hash)), _read_add_user),
    _flat("set_user_token", c.SetUserToken, commands_pb2.SetUserToken, "name token_hash"),
    _flat("remove_user", c.RemoveUser, commands_pb2.RemoveUser, "name"),
    _queues_body("apply_queues", c.ApplyQueues),
    _queues_body("apply_queues_with_limits", c.ApplyQueuesWithLimits),
    _flat("delete_queue", c.DeleteQueue, commands_pb2.DeleteQueue, "name"),
    _custom("pending_reasons", c.PendingReasons, _write_pending_reasons,
            lambda b, base: c.PendingReasons(entries=tuple(c.PendingReason(e.job_id, e.attempt, e.code, e.message)
                                                           for e in b.entries), **base)),
    _flat("checkpoint_notice", c.CheckpointNotice, commands_pb2.CheckpointNotice, "job_id attempt stop_at cause"),
    _flat("record_progress", c.RecordProgress, commands_pb2.RecordProgress,
          "job_id attempt checkpoint_at checkpoint_step step problem"),
    _flat("record_exec", c.RecordExec, commands_pb2.RecordExec, "job_id attempt index command", repeated="command"),
    _flat("resize_gang", c.ResizeGang, commands_pb2.ResizeGang, "job_id attempt size reason"),
    _flat("set_array_throttle", c.SetArrayThrottle, commands_pb2.SetArrayThrottle, "job_id throttle"),
    _flat("hold_job", c.HoldJob, commands_pb2.JobRef, "job_id"),
    _flat("release_job", c.ReleaseJob, commands_pb2.JobRef, "job_id"),
    _custom("update_job", c.UpdateJob, _write_update_job, _read_update_job),
    _flat("requeue_job", c.RequeueJob, commands_pb2.RequeueJob, "job_id attempt reason"),
    _custom("preempt", c.Preempt, _copied("preempt", lambda cmd: commands_pb2.Preempt(
        job_id=cmd.job_id, attempt=cmd.attempt, rule=cmd.rule, nodes=list(cmd.nodes), explanation=cmd.explanation,
        victims=[commands_pb2.Victim(job_id=v.job_id, attempt=v.attempt, grace_s=v.grace, notice_s=v.notice)
                 for v in cmd.victims])), _read_preempt),
    _flat("create_join_token", c.CreateJoinToken, commands_pb2.CreateJoinToken,
          "token_id token_hash expires_at max_uses"),
    _flat("revoke_join_token", c.RevokeJoinToken, commands_pb2.RevokeJoinToken, "token_id"),
    _custom("join_node", c.JoinNode, _copied("join_node", lambda cmd: commands_pb2.JoinNode(
        token_id=cmd.token_id, node=register_node_to_proto(cmd.node))),
        lambda b, base: c.JoinNode(token_id=b.token_id, node=register_node_from_proto(b.node, base), **base)),
    _flat("history_exported", c.HistoryExported, commands_pb2.HistoryExported, "upto"),
    _flat("history_overflow", c.HistoryOverflow, commands_pb2.HistoryOverflow, "job_ids", repeated="job_ids"),
    _flat("set_usage_half_life", c.SetUsageHalfLife, commands_pb2.SetUsageHalfLife, "half_life",
          renamed={"half_life": "half_life_s"}),
]))
#: The same, by the envelope's field.
_BODIES_BY_FIELD: Mapping[str, _Body] = MappingProxyType({body.field: body for body in _BODIES.values()})


def _command_into(env: commands_pb2.Command, cmd: c.Command, commands: CommandSet) -> commands_pb2.Command:
    """Write `cmd` into the empty envelope `env` and return it (`_BODIES` says how)."""
    env.version = commands.version_of(cmd)
    env.at = cmd.at
    env.term = cmd.term
    env.by = cmd.by
    body = _BODIES.get(type(cmd))
    if body is None:
        raise CodecError(f"unknown command type {type(cmd).__name__}")
    body.write(env, cmd)
    return env


def command_from_proto(env: commands_pb2.Command, commands: CommandSet = CURRENT) -> c.Command:
    if env.version == 0 or env.version > commands.known:
        raise CodecError(f"command version {env.version} is not supported (this replica knows "
                         f"1..{commands.known}; body {env.WhichOneof('body') or 'unknown'})")
    cmd = _body_from_proto(env)
    needed = commands.version_of(cmd)
    if needed > commands.known:
        raise CodecError(f"{type(cmd).__name__} commands need command-set version {needed} (this replica "
                         f"knows 1..{commands.known})")
    return cmd


def _body_from_proto(env: commands_pb2.Command) -> c.Command:
    """The command in the envelope `env` (`_BODIES` says how each body is read)."""
    kind = env.WhichOneof("body")
    body = _BODIES_BY_FIELD.get(kind) if kind else None
    if body is None:
        raise CodecError(f"command has no known body (got {kind!r})")
    return body.read(getattr(env, body.field), _Base(at=env.at, term=env.term, by=env.by))


def encode_command(cmd: c.Command, commands: CommandSet = CURRENT) -> bytes:
    """The bytes that go into the Raft log for `cmd`."""
    return command_to_proto(cmd, commands).SerializeToString()


def encode_batch(cmds: list[c.Command], commands: CommandSet = CURRENT) -> bytes:
    """One log entry carrying several commands (group commit), at the highest version among them.
    Each command is written in place in the batch: built apart and copied in, a submission took
    twice the CPU to encode (bench/submit_steps.py, "proposal encode")."""
    env = commands_pb2.Command()
    batch = env.batch
    batch.SetInParent()
    version = BASE_VERSION
    for cmd in cmds:
        version = max(version, _command_into(batch.commands.add(), cmd, commands).version)
    env.version = version
    return env.SerializeToString()


def identical(a: object, b: object) -> bool:
    """Whether two values are equal and of the same types all the way down (1 and 1.0, or a list
    and a tuple, are equal to == but not here): what a decoded command must be to the command that
    was encoded, for a replica to apply either alike (synapse.master.replicated.ReplicatedState.proposing)."""
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return all(identical(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple))
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (dict, MappingProxyType)):
        assert isinstance(b, (dict, MappingProxyType))
        return a.keys() == b.keys() and all(identical(v, b[k]) for k, v in a.items())
    return a == b


def _parse(data: bytes) -> commands_pb2.Command:
    env = commands_pb2.Command()
    try:
        env.ParseFromString(data)
    except (DecodeError, TypeError, ValueError) as exc:
        raise CodecError(f"malformed command: {exc}") from exc
    return env


def decode_command(data: bytes, commands: CommandSet = CURRENT) -> c.Command:
    """The command in `data`; raises CodecError on anything malformed or unknown."""
    return command_from_proto(_parse(data), commands)


def decode_entry(data: bytes, commands: CommandSet = CURRENT) -> list[c.Command]:
    """The commands of one log entry: one, or a batch's. Raises CodecError if any of them does not
    decode (the entry is applied whole or not at all); a batch inside a batch is refused."""
    env = _parse(data)
    if env.WhichOneof("body") != "batch":
        return [command_from_proto(env, commands)]
    if env.version == 0 or env.version > commands.known:
        raise CodecError(f"command version {env.version} is not supported (this replica knows 1..{commands.known})")
    out: list[c.Command] = []
    for i, sub in enumerate(env.batch.commands):
        if sub.WhichOneof("body") == "batch":
            raise CodecError(f"batch command {i}: a batch must not contain a batch")
        try:
            out.append(command_from_proto(sub, commands))
        except CodecError as exc:
            raise CodecError(f"batch command {i}: {exc}") from exc
    return out
