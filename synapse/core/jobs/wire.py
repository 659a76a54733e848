"""A job's spec, its resources and a queue to and from their messages in types.proto: what the Raft
log (synapse.core.codec) and the API's clients share. Apart from the codec so that a client (synctl
run, get, describe) converts a spec without importing every command of the log (a fifth of synctl's
start). Decoding never trusts its input: a malformed spec raises `CodecError`.
"""

from __future__ import annotations

from collections.abc import Iterable

from synapse.core.model import UNLIMITED, CheckpointSpec, JobSpec, PackMode, Queue, Resources, Secret, TopologySpec
from synapse.proto import types_pb2


class CodecError(ValueError):
    """Bytes that are not a command this version understands."""


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
    a checkpoint only when the spec asks for a notice (tests/unit/test_codec.py pins them)."""
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
    if spec.has_alloc:
        p.alloc = spec.alloc
        p.idle_timeout_s = spec.idle_timeout
    p.interactive = spec.interactive
    return p


def mounts_to_proto(mounts: tuple[tuple[str, str, bool], ...]) -> list[types_pb2.Mount]:
    return [types_pb2.Mount(source=s, target=t, readonly=ro) for s, t, ro in mounts]


def mounts_from_proto(mounts: Iterable[types_pb2.Mount]) -> tuple[tuple[str, str, bool], ...]:
    return tuple((m.source, m.target, m.readonly) for m in mounts)


#: the spec of a job that asks for no checkpoint notice (shared, not built per decode)
NO_CHECKPOINT = CheckpointSpec()
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
        if p.HasField("checkpoint") else NO_CHECKPOINT,
        mounts=mounts_from_proto(p.mounts) if p.mounts else (), image_pull_timeout=p.image_pull_timeout_s,
        secrets=tuple(Secret(x.name, x.fingerprint, x.sealed) for x in p.secrets) if p.secrets else (),
        alloc=p.alloc, idle_timeout=p.idle_timeout_s, interactive=p.interactive)


def queue_to_proto(q: Queue) -> types_pb2.QueueSpec:
    return types_pb2.QueueSpec(
        name=q.name, parent=q.parent, weight=q.weight, guaranteed=resources_to_proto(q.guaranteed),
        max=resources_to_proto(q.max), lending_limit=resources_to_proto(q.lending_limit), users=list(q.users),
        groups=list(q.groups), preemption_rules=list(q.preemption_rules), min_runtime_s=q.min_runtime,
        max_grace_s=q.max_grace, max_per_user_gpu=_limit_to_wire(q.user_gpu),
        max_per_user_jobs=_limit_to_wire(q.user_jobs), interactive_max_duration_s=q.interactive_max)


def _limit_to_wire(limit: int) -> int:
    """A per-user limit as QueueSpec carries it: 0 is no limit (what a message without it says)."""
    return 0 if limit == UNLIMITED else limit


def _limit_from_wire(value: int) -> int:
    return UNLIMITED if value <= 0 else value


def queue_from_proto(p: types_pb2.QueueSpec) -> Queue:
    """A queue as sent; its validity is checked by synapse.core.queues, not here."""
    return Queue(name=p.name, parent=p.parent, weight=p.weight or 1.0, guaranteed=resources_from_proto(p.guaranteed),
                 max=resources_from_proto(p.max), lending_limit=resources_from_proto(p.lending_limit),
                 users=tuple(p.users), groups=tuple(p.groups), preemption_rules=tuple(p.preemption_rules),
                 min_runtime=p.min_runtime_s, max_grace=p.max_grace_s, user_gpu=_limit_from_wire(p.max_per_user_gpu),
                 user_jobs=_limit_from_wire(p.max_per_user_jobs), interactive_max=p.interactive_max_duration_s)
