"""Conversions between domain objects and protobuf messages: flat `x_to_proto` / `x_from_proto` pairs.

This is the only module that knows both worlds. Decoding never trusts its input: a malformed or
unknown command raises `CodecError`. Coming from the Raft log, such an entry stops the replica
(synapse.master.raft.ReplicatedState): written by code that knows more than this replica's, it
cannot be skipped without this replica's state parting from its peers'.

Each log entry carries the command-set version of its kind (synapse.core.versions): a replica
refuses an entry of a version it does not know.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypedDict

from google.protobuf.message import DecodeError

from synapse.core import commands as c
from synapse.core.arrays import JobArray
from synapse.core.brain.heartbeat import GpuErrorReport
from synapse.core.dependencies import Resolved
from synapse.core.goodput import Goodput
from synapse.core.model import (
    Assignment,
    CheckpointSpec,
    Job,
    JobSpec,
    JoinToken,
    Node,
    PackMode,
    Placement,
    Progress,
    Queue,
    Resources,
    Role,
    Secret,
    TopologySpec,
    User,
)
from synapse.core.versions import BASE_VERSION, COMMAND_VERSION, KIND_VERSIONS
from synapse.proto import api_pb2, commands_pb2, types_pb2


class CodecError(ValueError):
    """Bytes that are not a command this version understands."""


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


def resources_to_proto(r: Resources) -> types_pb2.Resources:
    return types_pb2.Resources(cpu_millis=r.cpu, memory_bytes=r.memory, gpu=r.gpu)


def resources_from_proto(p: types_pb2.Resources) -> Resources:
    return Resources(cpu=p.cpu_millis, memory=p.memory_bytes, gpu=p.gpu)


def job_spec_to_proto(spec: JobSpec) -> types_pb2.JobSpec:
    return job_spec_into(types_pb2.JobSpec(), spec)


def job_spec_into(p: types_pb2.JobSpec, spec: JobSpec) -> types_pb2.JobSpec:
    """Write `spec` into the empty message `p` and return it: in place, as a proposal's encode does
    for each submission (nested messages built apart and copied in took twice the CPU). The bytes
    are those of a message built from keyword arguments: resources and topology always present,
    a checkpoint only when the spec asks for a notice (tests/test_codec.py pins them)."""
    p.SetInParent()  # a field of an envelope: present even if every value is a default
    p.name = spec.name
    p.tasks = spec.tasks
    resources = p.resources
    resources.SetInParent()
    resources.cpu_millis = spec.resources.cpu
    resources.memory_bytes = spec.resources.memory
    resources.gpu = spec.resources.gpu
    p.command.extend(spec.command)
    if spec.env:
        p.env.update(spec.env)
    topology = p.topology  # present: a mode is never empty
    topology.pack = spec.topology.pack
    topology.mode = spec.topology.mode.value
    p.priority = spec.priority
    p.max_restarts = spec.max_restarts
    p.time_limit_s = spec.time_limit
    p.image = spec.image
    p.queue = spec.queue
    p.grace_s = spec.grace
    p.gpu_model = spec.gpu_model
    p.array = spec.array
    p.array_throttle = spec.array_throttle
    for kind, job_id in spec.after:
        p.after.add(kind=kind, job_id=job_id)
    p.singleton = spec.singleton
    p.on_unsatisfiable = spec.on_unsatisfiable
    p.tasks_min = spec.tasks_min
    p.resize_interval_s = spec.resize_interval
    if spec.has_checkpoint:
        p.checkpoint.signal = spec.checkpoint.signal
        p.checkpoint.notice_s = spec.checkpoint.notice
    for source, target, readonly in spec.mounts:
        p.mounts.add(source=source, target=target, readonly=readonly)
    p.image_pull_timeout_s = spec.image_pull_timeout
    for secret in spec.secrets:
        p.secrets.add(name=secret.name, fingerprint=secret.fingerprint, sealed=secret.sealed)
    return p


def _before_images(spec: JobSpec) -> JobSpec:
    """A spec as a replica before command-set version 4 reads it: no mounts, no pull timeout (and
    no secrets, which came later still)."""
    return dataclasses.replace(spec, mounts=(), image_pull_timeout=0.0, secrets=())


def _before_secrets(spec: JobSpec) -> JobSpec:
    """A spec as a replica before command-set version 6 reads it: no secrets."""
    return dataclasses.replace(spec, secrets=()) if spec.secrets else spec


def mounts_to_proto(mounts: tuple[tuple[str, str, bool], ...]) -> list[types_pb2.Mount]:
    return [types_pb2.Mount(source=s, target=t, readonly=ro) for s, t, ro in mounts]


def mounts_from_proto(mounts: Iterable[types_pb2.Mount]) -> tuple[tuple[str, str, bool], ...]:
    return tuple((m.source, m.target, m.readonly) for m in mounts)


_NO_CHECKPOINT = CheckpointSpec()
_DEFAULT_TOPOLOGY = TopologySpec()


def job_spec_from_proto(p: types_pb2.JobSpec, default_queue: str = "") -> JobSpec:
    """The spec a message carries; `default_queue` names the queue when it names none (the API's
    submission path fills it in here rather than copying the spec again). Every replica decodes
    every submission's spec in apply, so the common empty parts are shared constants, not built."""
    topology, checkpoint = p.topology, p.checkpoint  # (reading a field absent returns its defaults)
    if not topology.pack and not topology.mode:
        pack = _DEFAULT_TOPOLOGY
    else:
        try:
            pack = TopologySpec(pack=topology.pack, mode=PackMode(topology.mode or PackMode.PREFERRED.value))
        except ValueError as exc:
            raise CodecError(f"topology.mode must be preferred or required, not {topology.mode!r}") from exc
    return JobSpec(
        name=p.name, tasks=p.tasks, resources=resources_from_proto(p.resources),
        command=tuple(p.command), env=tuple(sorted(p.env.items())) if p.env else (),
        topology=pack, priority=p.priority,
        max_restarts=p.max_restarts, time_limit=p.time_limit_s, image=p.image, queue=p.queue or default_queue,
        grace=p.grace_s,
        gpu_model=p.gpu_model, array=p.array, array_throttle=p.array_throttle,
        after=tuple((d.kind, d.job_id) for d in p.after) if p.after else (), singleton=p.singleton,
        on_unsatisfiable=p.on_unsatisfiable, tasks_min=p.tasks_min, resize_interval=p.resize_interval_s,
        checkpoint=CheckpointSpec(signal=checkpoint.signal, notice=checkpoint.notice_s)
        if p.HasField("checkpoint") else _NO_CHECKPOINT,
        mounts=mounts_from_proto(p.mounts) if p.mounts else (), image_pull_timeout=p.image_pull_timeout_s,
        secrets=tuple(Secret(x.name, x.fingerprint, x.sealed) for x in p.secrets) if p.secrets else ())


def queue_to_proto(q: Queue) -> types_pb2.QueueSpec:
    return types_pb2.QueueSpec(
        name=q.name, parent=q.parent, weight=q.weight, guaranteed=resources_to_proto(q.guaranteed),
        max=resources_to_proto(q.max), lending_limit=resources_to_proto(q.lending_limit), users=list(q.users),
        groups=list(q.groups), preemption_rules=list(q.preemption_rules), min_runtime_s=q.min_runtime,
        max_grace_s=q.max_grace)


def queue_from_proto(p: types_pb2.QueueSpec) -> Queue:
    """A queue as sent; its validity is checked by synapse.core.queues, not here."""
    return Queue(name=p.name, parent=p.parent, weight=p.weight or 1.0, guaranteed=resources_from_proto(p.guaranteed),
                 max=resources_from_proto(p.max), lending_limit=resources_from_proto(p.lending_limit),
                 users=tuple(p.users), groups=tuple(p.groups), preemption_rules=tuple(p.preemption_rules),
                 min_runtime=p.min_runtime_s, max_grace=p.max_grace_s)


def join_token_to_proto(t: JoinToken) -> api_pb2.JoinTokenInfo:
    return api_pb2.JoinTokenInfo(id=t.id, created_at=t.created_at, created_by=t.created_by, expires_at=t.expires_at,
                                 max_uses=t.max_uses, uses=t.uses, nodes=list(t.nodes))


def placement_to_proto(pl: Placement) -> types_pb2.Placement:
    return types_pb2.Placement(index=pl.index, node_id=pl.node_id, gpus=list(pl.gpus), rank=pl.rank)


def placement_from_proto(p: types_pb2.Placement) -> Placement:
    return Placement(index=p.index, node_id=p.node_id, gpus=tuple(p.gpus), rank=p.rank)


def command_to_proto(cmd: c.Command, commands: CommandSet = CURRENT) -> commands_pb2.Command:
    return _command_into(commands_pb2.Command(), cmd, commands)


def _submission_into(body: commands_pb2.SubmitJob, cmd: c.SubmitJob) -> None:
    body.SetInParent()
    body.job_id = cmd.job_id
    body.request_id = cmd.request_id
    job_spec_into(body.spec, cmd.spec)


def _command_into(env: commands_pb2.Command, cmd: c.Command, commands: CommandSet) -> commands_pb2.Command:
    """Write `cmd` into the empty envelope `env` and return it. The kinds a submission proposes
    (submissions, a round's pending reasons) are written in place; the rest build their body and
    copy it in (the same bytes, at a copy's cost)."""
    env.version = commands.version_of(cmd)
    env.at = cmd.at
    env.term = cmd.term
    env.by = cmd.by
    match cmd:
        case c.RegisterNode():
            env.register_node.CopyFrom(register_node_to_proto(cmd))
        case c.NodeLost():
            env.node_lost.CopyFrom(commands_pb2.NodeDown(node_id=cmd.node_id, reason=cmd.reason))
        case c.SetSpares():
            env.set_spares.CopyFrom(commands_pb2.SetSpares(node_ids=list(cmd.node_ids), reason=cmd.reason))
        case c.GpuFault():
            env.gpu_fault.CopyFrom(commands_pb2.GpuFault(node_id=cmd.node_id, gpus=list(cmd.gpus), message=cmd.message))
        case c.SetClusterVersion():
            env.set_cluster_version.CopyFrom(commands_pb2.SetClusterVersion(version=cmd.version))
        case c.DrainNode():
            env.drain_node.CopyFrom(commands_pb2.DrainNode(node_id=cmd.node_id, reason=cmd.reason, cordon=cmd.cordon))
        case c.NodeDown():
            env.node_down.CopyFrom(commands_pb2.NodeDown(node_id=cmd.node_id, reason=cmd.reason))
        case c.NodeUp():
            env.node_up.CopyFrom(commands_pb2.NodeUp(node_id=cmd.node_id))
        case c.SetSchedulable():
            env.set_schedulable.CopyFrom(commands_pb2.SetSchedulable(
                node_id=cmd.node_id, schedulable=cmd.schedulable, reason=cmd.reason))
        case c.SetNodeHealth():
            env.set_node_health.CopyFrom(commands_pb2.SetNodeHealth(
                node_id=cmd.node_id, healthy=cmd.healthy, message=cmd.message, drain=cmd.drain))
        case c.SubmitSecretJob():
            _submission_into(env.submit_secret_job, cmd)
        case c.SubmitImageJob():
            if cmd.spec.has_secrets:  # an older replica would drop them and run the job without them
                raise CodecError("a spec with secrets travels as SubmitSecretJob")
            _submission_into(env.submit_image_job, cmd)
        case c.SubmitCheckpointJob():
            if cmd.spec.has_secrets:
                raise CodecError("a spec with secrets travels as SubmitSecretJob")
            if cmd.spec.has_image_run:  # an older replica would drop the mounts or refuse the spec
                raise CodecError("a spec with mounts or without a command travels as SubmitImageJob")
            _submission_into(env.submit_checkpoint_job, cmd)
        case c.SubmitWorkflowJob():
            if cmd.spec.has_secrets:
                raise CodecError("a spec with secrets travels as SubmitSecretJob")
            if cmd.spec.has_image_run:
                raise CodecError("a spec with mounts or without a command travels as SubmitImageJob")
            if cmd.spec.has_checkpoint:  # an older replica would drop the notice and apply another job
                raise CodecError("a spec with a checkpoint notice travels as SubmitCheckpointJob")
            _submission_into(env.submit_workflow_job, cmd)
        case c.SubmitJob():
            if cmd.spec.has_secrets:
                raise CodecError("a spec with secrets travels as SubmitSecretJob")
            if cmd.spec.has_workflow:  # an older replica would drop those fields and apply another job
                raise CodecError("a spec with an array or dependencies travels as SubmitWorkflowJob")
            if cmd.spec.has_checkpoint:
                raise CodecError("a spec with a checkpoint notice travels as SubmitCheckpointJob")
            if cmd.spec.has_image_run:
                raise CodecError("a spec with mounts or without a command travels as SubmitImageJob")
            _submission_into(env.submit_job, cmd)
        case c.CommitPlan():
            env.commit_plan.CopyFrom(commands_pb2.CommitPlan(
                job_id=cmd.job_id, attempt=cmd.attempt,
                placements=[placement_to_proto(p) for p in cmd.placements]))
        case c.TaskStarted():
            env.task_started.CopyFrom(commands_pb2.TaskStarted(
                job_id=cmd.job_id, attempt=cmd.attempt, index=cmd.index, node_id=cmd.node_id))
        case c.TaskPrepared():
            env.task_prepared.CopyFrom(commands_pb2.TaskStarted(
                job_id=cmd.job_id, attempt=cmd.attempt, index=cmd.index, node_id=cmd.node_id))
        case c.TaskExited():
            env.task_exited.CopyFrom(commands_pb2.TaskExited(
                job_id=cmd.job_id, attempt=cmd.attempt, index=cmd.index, node_id=cmd.node_id,
                exit_code=cmd.exit_code, reason=cmd.reason, cause=cmd.cause, node_side=cmd.node_side))
        case c.CancelJob():
            env.cancel_job.CopyFrom(commands_pb2.CancelJob(job_id=cmd.job_id, reason=cmd.reason))
        case c.FailAttempt():
            env.fail_attempt.CopyFrom(commands_pb2.FailAttempt(
                job_id=cmd.job_id, attempt=cmd.attempt, reason=cmd.reason, final=cmd.final, cause=cmd.cause))
        case c.Barrier():
            env.barrier.CopyFrom(commands_pb2.Barrier(reason=cmd.reason))
        case c.ArchiveJobs():
            env.archive_jobs.CopyFrom(commands_pb2.ForgetJobs(job_ids=list(cmd.job_ids)))
        case c.ForgetJobs():
            env.forget_jobs.CopyFrom(commands_pb2.ForgetJobs(job_ids=list(cmd.job_ids)))
        case c.SetReplica():
            env.set_replica.CopyFrom(commands_pb2.SetReplica(id=cmd.id, raft_address=cmd.raft_address,
                                                             api_address=cmd.api_address, removed=cmd.removed))
        case c.AddUser():
            env.add_user.CopyFrom(commands_pb2.AddUser(name=cmd.name, groups=list(cmd.groups), role=cmd.role.value,
                                                       token_hash=cmd.token_hash))
        case c.SetUserToken():
            env.set_user_token.CopyFrom(commands_pb2.SetUserToken(name=cmd.name, token_hash=cmd.token_hash))
        case c.RemoveUser():
            env.remove_user.CopyFrom(commands_pb2.RemoveUser(name=cmd.name))
        case c.ApplyQueues():
            env.apply_queues.CopyFrom(commands_pb2.ApplyQueues(queues=[queue_to_proto(q) for q in cmd.queues]))
        case c.DeleteQueue():
            env.delete_queue.CopyFrom(commands_pb2.DeleteQueue(name=cmd.name))
        case c.PendingReasons():
            reasons = env.pending_reasons
            reasons.SetInParent()
            for e in cmd.entries:
                reasons.entries.add(job_id=e.job_id, attempt=e.attempt, code=e.code, message=e.message)
        case c.CheckpointNotice():
            env.checkpoint_notice.CopyFrom(commands_pb2.CheckpointNotice(
                job_id=cmd.job_id, attempt=cmd.attempt, stop_at=cmd.stop_at, cause=cmd.cause))
        case c.RecordProgress():
            env.record_progress.CopyFrom(commands_pb2.RecordProgress(
                job_id=cmd.job_id, attempt=cmd.attempt, checkpoint_at=cmd.checkpoint_at,
                checkpoint_step=cmd.checkpoint_step, step=cmd.step, problem=cmd.problem))
        case c.ResizeGang():
            env.resize_gang.CopyFrom(commands_pb2.ResizeGang(job_id=cmd.job_id, attempt=cmd.attempt, size=cmd.size,
                                                             reason=cmd.reason))
        case c.SetArrayThrottle():
            env.set_array_throttle.CopyFrom(commands_pb2.SetArrayThrottle(job_id=cmd.job_id, throttle=cmd.throttle))
        case c.Preempt():
            env.preempt.CopyFrom(commands_pb2.Preempt(
                job_id=cmd.job_id, attempt=cmd.attempt, rule=cmd.rule, nodes=list(cmd.nodes),
                explanation=cmd.explanation,
                victims=[commands_pb2.Victim(job_id=v.job_id, attempt=v.attempt, grace_s=v.grace, notice_s=v.notice)
                         for v in cmd.victims]))
        case c.CreateJoinToken():
            env.create_join_token.CopyFrom(commands_pb2.CreateJoinToken(
                token_id=cmd.token_id, token_hash=cmd.token_hash, expires_at=cmd.expires_at, max_uses=cmd.max_uses))
        case c.RevokeJoinToken():
            env.revoke_join_token.CopyFrom(commands_pb2.RevokeJoinToken(token_id=cmd.token_id))
        case c.JoinNode():
            env.join_node.CopyFrom(commands_pb2.JoinNode(token_id=cmd.token_id, node=register_node_to_proto(cmd.node)))
        case c.HistoryExported():
            env.history_exported.CopyFrom(commands_pb2.HistoryExported(upto=cmd.upto))
        case c.HistoryOverflow():
            env.history_overflow.CopyFrom(commands_pb2.HistoryOverflow(job_ids=list(cmd.job_ids)))
        case c.SetUsageHalfLife():
            env.set_usage_half_life.CopyFrom(commands_pb2.SetUsageHalfLife(half_life_s=cmd.half_life))
        case _:
            raise CodecError(f"unknown command type {type(cmd).__name__}")
    return env


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
    kind = env.WhichOneof("body")
    base = _Base(at=env.at, term=env.term, by=env.by)
    match kind:
        case "register_node":
            return register_node_from_proto(env.register_node, base)
        case "node_down":
            return c.NodeDown(node_id=env.node_down.node_id, reason=env.node_down.reason, **base)
        case "node_lost":
            return c.NodeLost(node_id=env.node_lost.node_id, reason=env.node_lost.reason, **base)
        case "set_spares":
            return c.SetSpares(node_ids=tuple(env.set_spares.node_ids), reason=env.set_spares.reason, **base)
        case "gpu_fault":
            b = env.gpu_fault
            return c.GpuFault(node_id=b.node_id, gpus=tuple(b.gpus), message=b.message, **base)
        case "set_cluster_version":
            return c.SetClusterVersion(version=env.set_cluster_version.version, **base)
        case "drain_node":
            b = env.drain_node
            return c.DrainNode(node_id=b.node_id, reason=b.reason, cordon=b.cordon, **base)
        case "node_up":
            return c.NodeUp(node_id=env.node_up.node_id, **base)
        case "set_schedulable":
            b = env.set_schedulable
            return c.SetSchedulable(node_id=b.node_id, schedulable=b.schedulable, reason=b.reason, **base)
        case "set_node_health":
            b = env.set_node_health
            return c.SetNodeHealth(node_id=b.node_id, healthy=b.healthy, message=b.message, drain=b.drain, **base)
        case "submit_job":
            b = env.submit_job
            spec = job_spec_from_proto(b.spec)
            if spec.has_workflow:  # never encoded so; read it as an older replica would, a plain job
                spec = dataclasses.replace(spec, array="", array_throttle=0, after=(), singleton=False,
                                           on_unsatisfiable="", tasks_min=0, resize_interval=0.0)
            spec = _before_images(spec) if spec.mounts or spec.image_pull_timeout or spec.secrets else spec
            if spec.checkpoint != _NO_CHECKPOINT:  # likewise (the test, not a copy each time: apply's hot path)
                spec = dataclasses.replace(spec, checkpoint=_NO_CHECKPOINT)
            return c.SubmitJob(job_id=b.job_id, request_id=b.request_id, spec=spec, **base)
        case "submit_workflow_job":
            b = env.submit_workflow_job
            # as older replicas read it
            spec = dataclasses.replace(_before_images(job_spec_from_proto(b.spec)), checkpoint=CheckpointSpec())
            return c.SubmitWorkflowJob(job_id=b.job_id, request_id=b.request_id, spec=spec, **base)
        case "submit_checkpoint_job":
            b = env.submit_checkpoint_job
            return c.SubmitCheckpointJob(job_id=b.job_id, request_id=b.request_id,
                                         spec=_before_images(job_spec_from_proto(b.spec)), **base)
        case "submit_image_job":
            b = env.submit_image_job
            return c.SubmitImageJob(job_id=b.job_id, request_id=b.request_id,
                                    spec=_before_secrets(job_spec_from_proto(b.spec)), **base)
        case "submit_secret_job":
            b = env.submit_secret_job
            return c.SubmitSecretJob(job_id=b.job_id, request_id=b.request_id, spec=job_spec_from_proto(b.spec),
                                     **base)
        case "checkpoint_notice":
            b = env.checkpoint_notice
            return c.CheckpointNotice(job_id=b.job_id, attempt=b.attempt, stop_at=b.stop_at, cause=b.cause, **base)
        case "record_progress":
            b = env.record_progress
            return c.RecordProgress(job_id=b.job_id, attempt=b.attempt, checkpoint_at=b.checkpoint_at,
                                    checkpoint_step=b.checkpoint_step, step=b.step, problem=b.problem, **base)
        case "resize_gang":
            b = env.resize_gang
            return c.ResizeGang(job_id=b.job_id, attempt=b.attempt, size=b.size, reason=b.reason, **base)
        case "set_array_throttle":
            b = env.set_array_throttle
            return c.SetArrayThrottle(job_id=b.job_id, throttle=b.throttle, **base)
        case "commit_plan":
            b = env.commit_plan
            return c.CommitPlan(job_id=b.job_id, attempt=b.attempt,
                                placements=tuple(placement_from_proto(p) for p in b.placements), **base)
        case "task_started":
            b = env.task_started
            return c.TaskStarted(job_id=b.job_id, attempt=b.attempt, index=b.index,
                                 node_id=b.node_id, **base)
        case "task_prepared":
            b = env.task_prepared
            return c.TaskPrepared(job_id=b.job_id, attempt=b.attempt, index=b.index, node_id=b.node_id, **base)
        case "task_exited":
            b = env.task_exited
            return c.TaskExited(job_id=b.job_id, attempt=b.attempt, index=b.index, node_id=b.node_id,
                                exit_code=b.exit_code, reason=b.reason, cause=b.cause, node_side=b.node_side, **base)
        case "cancel_job":
            return c.CancelJob(job_id=env.cancel_job.job_id, reason=env.cancel_job.reason, **base)
        case "fail_attempt":
            b = env.fail_attempt
            return c.FailAttempt(job_id=b.job_id, attempt=b.attempt, reason=b.reason,
                                 final=b.final, cause=b.cause, **base)
        case "barrier":
            return c.Barrier(reason=env.barrier.reason, **base)
        case "forget_jobs":
            return c.ForgetJobs(job_ids=tuple(env.forget_jobs.job_ids), **base)
        case "archive_jobs":
            return c.ArchiveJobs(job_ids=tuple(env.archive_jobs.job_ids), **base)
        case "set_replica":
            b = env.set_replica
            return c.SetReplica(id=b.id, raft_address=b.raft_address, api_address=b.api_address,
                                removed=b.removed, **base)
        case "add_user":
            b = env.add_user
            try:
                role = Role(b.role)
            except ValueError:
                raise CodecError(f"add_user: unknown role {b.role!r}") from None
            return c.AddUser(name=b.name, role=role, groups=tuple(b.groups), token_hash=b.token_hash, **base)
        case "set_user_token":
            return c.SetUserToken(name=env.set_user_token.name, token_hash=env.set_user_token.token_hash, **base)
        case "remove_user":
            return c.RemoveUser(name=env.remove_user.name, **base)
        case "apply_queues":
            return c.ApplyQueues(queues=tuple(queue_from_proto(q) for q in env.apply_queues.queues), **base)
        case "delete_queue":
            return c.DeleteQueue(name=env.delete_queue.name, **base)
        case "pending_reasons":
            return c.PendingReasons(entries=tuple(c.PendingReason(e.job_id, e.attempt, e.code, e.message)
                                                  for e in env.pending_reasons.entries), **base)
        case "preempt":
            b = env.preempt
            return c.Preempt(job_id=b.job_id, attempt=b.attempt, rule=b.rule, nodes=tuple(b.nodes),
                             explanation=b.explanation,
                             victims=tuple(c.Victim(v.job_id, v.attempt, v.grace_s, v.notice_s) for v in b.victims),
                             **base)
        case "create_join_token":
            b = env.create_join_token
            return c.CreateJoinToken(token_id=b.token_id, token_hash=b.token_hash, expires_at=b.expires_at,
                                     max_uses=b.max_uses, **base)
        case "revoke_join_token":
            return c.RevokeJoinToken(token_id=env.revoke_join_token.token_id, **base)
        case "join_node":
            b = env.join_node
            return c.JoinNode(token_id=b.token_id, node=register_node_from_proto(b.node, base), **base)
        case "history_exported":
            return c.HistoryExported(upto=env.history_exported.upto, **base)
        case "history_overflow":
            return c.HistoryOverflow(job_ids=tuple(env.history_overflow.job_ids), **base)
        case "set_usage_half_life":
            return c.SetUsageHalfLife(half_life=env.set_usage_half_life.half_life_s, **base)
        case _:
            raise CodecError(f"command has no known body (got {kind!r})")


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
    was encoded, for a replica to apply either alike (synapse.master.raft.ReplicatedState.proposing)."""
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


# ---- API messages (read side) -------------------------------------------------------------------


#: What the API shows for each env value of a job to a caller who is neither its owner nor an admin.
HIDDEN_VALUE = "(hidden)"


def shown_spec_to_proto(spec: JobSpec, env_shown: bool) -> types_pb2.JobSpec:
    """A spec as the API shows it: its secrets by name alone, never sealed nor fingerprinted; with
    `env_shown` False (a caller who is neither the job's owner nor an admin) its env values hidden."""
    p = job_spec_to_proto(spec)
    for secret in p.secrets:
        secret.ClearField("fingerprint")
        secret.ClearField("sealed")
    if not env_shown:
        for key in p.env:
            p.env[key] = HIDDEN_VALUE
    return p


def job_to_info(job: Job, waiting: str = "", shortfalls: tuple[str, ...] = (),
                reservation: str = "", waiting_code: str = "", env_shown: bool = False) -> api_pb2.JobInfo:
    """A job as the API shows it; `env_shown` only to its owner and admins (shown_spec_to_proto)."""
    return api_pb2.JobInfo(
        id=job.id, spec=shown_spec_to_proto(job.spec, env_shown), status=job.status.value, attempt=job.attempt,
        request_id=job.request_id, submitted_at=job.submitted_at, started_at=job.started_at,
        finished_at=job.finished_at, waiting=waiting, shortfalls=list(shortfalls), reservation=reservation,
        tasks=[api_pb2.TaskInfo(index=t.index, rank=t.rank, node_id=t.node_id, gpus=list(t.gpus),
                                state=t.state.value, exit_code=t.exit_code or 0,
                                has_exit_code=t.exit_code is not None, attempt=t.attempt, reason=t.reason,
                                reason_message=t.reason_message, prepared=t.prepared) for t in job.tasks],
        events=[api_pb2.JobEvent(at=e.at, kind=e.kind, message=e.message) for e in job.events],
        attempts=[api_pb2.AttemptPlacement(attempt=a, nodes=list(nodes))
                  for a, nodes in sorted(job.placements.items())],
        user=job.user, cancelled_by=job.cancelled_by, failure=job.failure, array_id=job.array_id,
        array_index=job.array_index, failure_cause=job.failure_cause, waiting_code=waiting_code,
        restarts_used=job.restarts_used(), requeues=job.preemptions + job.resizes + job.requeues,
        excluded_nodes=list(job.excluded_nodes))


def goodput_to_proto(g: Goodput) -> api_pb2.Goodput:
    return api_pb2.Goodput(held_gpu_s=g.held, kept_gpu_s=g.kept, lost_failures_gpu_s=g.lost_failures,
                           lost_restarts_gpu_s=g.lost_restarts, lost_other_gpu_s=g.lost_other,
                           requeue_wait_gpu_s=g.requeue_wait)


def goodput_from_proto(p: api_pb2.Goodput) -> Goodput:
    return Goodput(p.held_gpu_s, p.kept_gpu_s, p.lost_failures_gpu_s, p.lost_restarts_gpu_s, p.lost_other_gpu_s,
                   p.requeue_wait_gpu_s)


def progress_to_info(info: api_pb2.JobInfo, progress: Progress | None) -> None:
    """Put a job's progress (model.Progress) into its JobInfo."""
    if progress is None:
        info.checkpoint_step = info.step = -1
        return
    info.checkpoint_at, info.checkpoint_step = progress.checkpoint_at, progress.checkpoint_step
    info.step, info.progress_at = progress.step, progress.at


def array_counts_to_proto(array: JobArray, running: int) -> api_pb2.ArrayCounts:
    waiting = array.remaining() + (1 if array.rep else 0)
    return api_pb2.ArrayCounts(total=array.count, throttle=array.throttle, waiting=waiting, running=running,
                               succeeded=array.succeeded, failed=array.failed, cancelled=array.cancelled_count)


def dependencies_to_proto(resolved: list[Resolved]) -> list[api_pb2.DependencyInfo]:
    return [api_pb2.DependencyInfo(kind=r.kind, job_id=r.upstream, upstream_status=r.upstream_status,
                                   state=r.state.value) for r in resolved]


def user_to_info(user: User) -> api_pb2.UserInfo:
    return api_pb2.UserInfo(name=user.name, groups=list(user.groups), role=user.role.value,
                            created_at=user.created_at, created_by=user.created_by, token_set_at=user.token_set_at)


def node_to_info(node: Node, live_tasks: int, images: Iterable[str] = ()) -> api_pb2.NodeInfo:
    return api_pb2.NodeInfo(images=list(images),
        id=node.id, address=node.address, topology=list(node.topology),
        capacity=resources_to_proto(node.capacity), used=resources_to_proto(node.used),
        gpus_in_use=sorted(node.gpus_in_use), status=node.status.value, schedulable=node.schedulable,
        live_tasks=live_tasks, labels=dict(node.labels), isolation=node.isolation, cordon_reason=node.cordon_reason,
        health=node.health, spare=node.spare)


def gpu_errors_to_proto(errors: tuple[GpuErrorReport, ...]) -> list[api_pb2.GpuErrorReport]:
    return [api_pb2.GpuErrorReport(gpu=e.gpu, message=e.message) for e in errors]


def gpu_errors_from_proto(request: api_pb2.HeartbeatRequest) -> tuple[GpuErrorReport, ...]:
    """A heartbeat's GPU errors (its sender's word: synapse.core.brain.heartbeat.gpu_fault_change bounds them)."""
    return tuple(GpuErrorReport(e.gpu, e.message) for e in request.gpu_errors)


def assignment_to_proto(a: Assignment) -> api_pb2.Assignment:
    return api_pb2.Assignment(
        job_id=a.job_id, attempt=a.attempt, index=a.index, rank=a.rank, world_size=a.world_size,
        local_rank=a.local_rank, local_world_size=a.local_world_size, node_rank=a.node_rank,
        master_addr=a.master_addr, master_port=a.master_port, gpus=list(a.gpus), command=list(a.command),
        env=dict(a.env), image=a.image, stop=a.stop, grace_s=a.grace, resources=resources_to_proto(a.resources),
        notice_signal=a.notice_signal, notice_s=a.notice, mounts=mounts_to_proto(a.mounts), hold=a.hold)


def assignment_from_proto(p: api_pb2.Assignment) -> Assignment:
    return Assignment(
        job_id=p.job_id, attempt=p.attempt, index=p.index, rank=p.rank, world_size=p.world_size,
        local_rank=p.local_rank, local_world_size=p.local_world_size, node_rank=p.node_rank,
        master_addr=p.master_addr, master_port=p.master_port, gpus=tuple(p.gpus), command=tuple(p.command),
        env=tuple(sorted(p.env.items())), image=p.image, stop=p.stop, grace=p.grace_s,
        resources=resources_from_proto(p.resources), notice_signal=p.notice_signal, notice=p.notice_s,
        mounts=mounts_from_proto(p.mounts), hold=p.hold)
