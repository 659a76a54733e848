"""The API's messages to and from the domain: flat `x_to_proto` / `x_from_proto` pairs for what the
masters' gRPC API shows and takes (api.proto). The core never imports the API's messages: what a
Raft log entry holds is encoded by synapse.core.codec; the conversions both share (a spec,
resources, mounts) are synapse.core.jobs.wire's, which these build on. The master, the worker, the
client and synctl use them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from synapse.core.goodput import Goodput
from synapse.core.jobs.arrays import JobArray
from synapse.core.jobs.dependencies import Resolved
from synapse.core.jobs.wire import (
    job_spec_to_proto,
    mounts_from_proto,
    mounts_to_proto,
    resources_from_proto,
    resources_to_proto,
)
from synapse.core.model import Assignment, Job, JobSpec, JoinToken, Node, Progress, User
from synapse.proto import api_pb2, types_pb2

if TYPE_CHECKING:  # the brain imports every command of the log: a client converting a job needs none
    from synapse.core.brain.heartbeat import GpuErrorReport


def join_token_to_proto(t: JoinToken) -> api_pb2.JoinTokenInfo:
    return api_pb2.JoinTokenInfo(id=t.id, created_at=t.created_at, created_by=t.created_by, expires_at=t.expires_at,
                                 max_uses=t.max_uses, uses=t.uses, nodes=list(t.nodes))


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
        restarts_used=job.restarts_used(),
        requeues=job.preemptions + job.resizes + job.requeues + job.manual_requeues,
        excluded_nodes=list(job.excluded_nodes), alloc_id=job.alloc_id, step_count=job.step_count,
        idle_since=job.idle_since, held_by=job.held_by)


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
    from synapse.core.brain.heartbeat import GpuErrorReport

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
