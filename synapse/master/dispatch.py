"""Desired state per node: what the leader tells each worker to run. A pure read of the state.

Dispatch is level-triggered: a worker receives the whole list for its node, starts what is listed
and not running, and stops what it runs that is not listed or is listed with `stop`. Losing a
message, or a leader, therefore loses nothing: the next list says everything again.

The checkpoint notice rides on the same lists: a task of a running attempt that has had its notice
(CheckpointNotice, ahead of its time limit) is listed with `notice_signal`, and so is a task whose
attempt a planned stop ends (`stop`, with `notice`: the seconds from the signal to SIGTERM). The
worker gives each task the signal once (synapse.worker.state).

A job's secrets join its tasks' environment here, opened by the `unseal` the replica gives (its
SecretSeal): the only place they are ever in the clear on a master, on their way to the worker
over its TLS link. A secret that does not open (sealed under another Raft password) is left out
and logged by name, and the task starts without it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from synapse.core import commands as c
from synapse.core import versions
from synapse.core.model import DEFAULT_GRACE_S, Assignment, EndReason, Job, JobStatus, Secret, gang_unprepared
from synapse.core.rendezvous import MASTER_PORTS, master_port
from synapse.core.schedule.elastic import is_elastic
from synapse.core.state.fsm import ClusterState

log = logging.getLogger(__name__)

#: Opens a job's sealed secret (synapse.master.cipher.SecretSeal.open); raises ValueError if it cannot.
Unseal = Callable[[Secret], str]


def host_of(address: str) -> str:
    host = address.rpartition(":")[0] if ":" in address else address
    return host.strip("[]") or address


def assignments_for_node(state: ClusterState, node_id: str, unseal: Unseal | None = None,
                         ports: range = MASTER_PORTS) -> list[Assignment]:
    """Every live task on the node with its torch.distributed environment and (with `unseal`) its
    job's secrets, in key order; `ports`: the cluster file's rendezvous_ports (synapse.core.rendezvous)."""
    out = []
    for task, wanted in state.tasks_on_node(node_id):
        job = state.jobs[task.job_id]
        if job.spec.alloc:
            continue  # an allocation's task runs nothing: it holds what its steps' tasks run on
        secrets = _opened(job, unseal) if wanted and job.spec.secrets and unseal is not None else ()
        out.append(_assignment(state, job, task.index, node_id, stop=not wanted, secrets=secrets, ports=ports))
    return out


def _opened(job: Job, unseal: Unseal) -> tuple[tuple[str, str], ...]:
    """A job's secrets in the clear, as (name, value), leaving out (and logging) one that does not open."""
    out = []
    for secret in job.spec.secrets:
        try:
            out.append((secret.name, unseal(secret)))
        except ValueError:
            log.error("secret does not open job=%s secret=%s; the task starts without it", job.id, secret.name)
    return tuple(out)


def nodes_relisted(state: ClusterState, cmds: Iterable[c.Command], watched: Iterable[str]) -> set[str]:
    """The nodes whose lists `cmds` may have changed, read from the state after they were applied
    (or later: a later command reports what it changed itself). `watched`: every node whose list
    is watched here; a node-wide stop (its gangs stop everywhere) returns all of them. A
    submission changes nothing (a new job has no tasks yet).

    A gang's own reports change its lists at two moments only, and the others wake nobody (each
    wake builds the list of every watched node of the gang: n reports made n x n lists, and the
    release queued behind them, bench/images.py). A TaskPrepared can change a hold and nothing
    else: one after which its gang is still held released nothing. A TaskStarted of a prepared
    task, or of any task of a job not in an image, changes no hold (its node already counted as
    holding the image, or the job has none), and nothing else a list holds unless it made the job
    RUNNING with a checkpoint notice given (the notice then joins the list; CheckpointNotice takes
    a running attempt only, so this is a guard): a gang's n start reports wake none of its
    watchers, where each woke all n (each wake builds and compares n lists, and the leader sent the
    followers each report's commit at once for them). Likewise a task's clean end that leaves its
    gang running changes its own node's list alone: a gang whose n tasks end together wakes n
    watchers and then every one once, not n x n."""
    touched: set[str] = set()
    for cmd in cmds:
        if isinstance(cmd, c.SubmitJob):
            continue
        if isinstance(cmd, c.StartStep):  # the step's nodes are among its allocation's
            alloc = state.jobs.get(cmd.alloc_id)
            if alloc is not None:
                touched.update(t.node_id for t in alloc.tasks)
            continue
        if isinstance(cmd, c.NodeDown | c.DrainNode | c.GpuFault) or (isinstance(cmd, c.SetNodeHealth) and cmd.drain):
            return set(watched)
        job = state.jobs.get(cmd.job_id) if hasattr(cmd, "job_id") else None
        if job is not None and _changes_no_list(state, job, cmd):
            continue
        if job is not None and not _ends_alone(job, cmd):
            touched.update(t.node_id for t in job.tasks)
        if hasattr(cmd, "node_id"):
            touched.add(cmd.node_id)
        if isinstance(cmd, c.CommitPlan):
            touched.update(p.node_id for p in cmd.placements)
    return touched


def relists_any(state: ClusterState, cmds: Iterable[c.Command]) -> bool:
    """Whether `cmds` may have changed any node's list (nodes_relisted, every node watched)."""
    return bool(nodes_relisted(state, cmds, ("*",)))  # a node-wide stop returns the watched: not empty


def _changes_no_list(state: ClusterState, job: Job, cmd: c.Command) -> bool:
    """True for a gang's report that cannot have changed any of its lists (nodes_relisted)."""
    if not isinstance(cmd, c.TaskPrepared | c.TaskStarted) or cmd.attempt != job.attempt:
        return False
    if isinstance(cmd, c.TaskPrepared):
        return held(state, job)
    return (cmd.index < len(job.tasks) and (job.tasks[cmd.index].prepared or not job.spec.image)
            and not (job.status is JobStatus.RUNNING and job.notice_at))


def _ends_alone(job: Job, cmd: c.Command) -> bool:
    """True for a task's clean end after which its gang still runs (nodes_relisted): nothing was
    stopped (a stop makes the job STOPPING) and the attempt goes on, so no other list changed."""
    return (isinstance(cmd, c.TaskExited) and cmd.attempt == job.attempt and cmd.exit_code == 0
            and cmd.cause in ("", EndReason.COMPLETED) and job.status in (JobStatus.SCHEDULED, JobStatus.RUNNING))


def _assignment(state: ClusterState, job: Job, index: int, node_id: str, stop: bool,
                secrets: tuple[tuple[str, str], ...] = (), ports: range = MASTER_PORTS) -> Assignment:
    by_rank = sorted(job.tasks, key=lambda t: t.rank)
    task = job.tasks[index]
    node_order: list[str] = []
    for t in by_rank:
        if t.node_id not in node_order:
            node_order.append(t.node_id)
    local = [t for t in by_rank if t.node_id == node_id]
    rank0 = state.nodes.get(by_rank[0].node_id)
    signal, notice = _notice(state, job, stop)
    return Assignment(
        job_id=job.id, attempt=job.attempt, index=task.index, rank=task.rank, world_size=len(job.tasks),
        local_rank=local.index(task), local_world_size=len(local), node_rank=node_order.index(node_id),
        master_addr=host_of(rank0.address) if rank0 else "", master_port=master_port(job.id, job.attempt, ports),
        gpus=task.gpus, command=job.spec.command, image=job.spec.image, mounts=job.spec.mounts, stop=stop,
        hold=not stop and held(state, job),
        grace=job.stop_grace if stop else 0.0, resources=task.resources, notice_signal=signal, notice=notice,
        # The task learns its grace at start: after a SIGTERM for preemption it has this long.
        env=tuple(sorted((*job.spec.env, *secrets, ("SYNAPSE_GRACE_S", f"{job.spec.grace or DEFAULT_GRACE_S:g}"),
                          ("SYNAPSE_RESTART_REASON", restart_reason(job)), *_checkpoint_env(state, job),
                          *_array_env(state, job), *_elastic_env(job), *_step_env(job)))))


def held(state: ClusterState, job: Job) -> bool:
    """True while a gang in an image waits for some node to hold it: its tasks pull and report
    prepared, and start only once every task is (TaskPrepared, version 4: before every replica
    knows it, nothing would ever release them, so nothing is held). A job of one task is never
    held: it has nothing to start together with, and the gate would add a report, a commit and a
    listing to its start (bench/images.py measures it)."""
    return (versions.may_propose(c.TaskPrepared, state.cluster_version) and len(job.tasks) > 1
            and bool(gang_unprepared(job)))


def _notice(state: ClusterState, job: Job, stop: bool) -> tuple[str, float]:
    """The notice a task is listed with: (signal, seconds from it to SIGTERM), or ("", 0.0)."""
    if stop:
        return (job.spec.checkpoint.signal, job.stop_notice) if job.stop_notice else ("", 0.0)
    if job.notice_at and job.status is JobStatus.RUNNING:
        return job.spec.checkpoint.signal, state.notice_of(job)
    return "", 0.0


def restart_reason(job: Job) -> str:
    """Why the job's previous attempt ended (an EndReason: NodeLost, Drained, Preempted, Resized,
    Error…), as its accounting record says; "" for the first attempt."""
    return next((r.outcome for r in reversed(job.runs) if r.attempt == job.attempt - 1), "")


def _checkpoint_env(state: ClusterState, job: Job) -> tuple[tuple[str, str], ...]:
    """A job with a checkpoint notice: the signal its tasks trap and how long they have after it."""
    if not job.spec.has_checkpoint:
        return ()
    return (("SYNAPSE_CHECKPOINT_SIGNAL", job.spec.checkpoint.signal),
            ("SYNAPSE_CHECKPOINT_NOTICE_S", f"{state.notice_of(job):g}"))


def _elastic_env(job: Job) -> tuple[tuple[str, str], ...]:
    """An elastic gang's bounds and a rendezvous id that stays the same across its attempts, so
    `torchrun --nnodes=$SYNAPSE_TASKS_MIN:$SYNAPSE_TASKS_MAX --rdzv-id=$SYNAPSE_RDZV_ID` follows it."""
    if not is_elastic(job.spec):
        return ()
    return (("SYNAPSE_TASKS_MIN", str(job.spec.tasks_min)), ("SYNAPSE_TASKS_MAX", str(job.spec.tasks)),
            ("SYNAPSE_RDZV_ID", job.id))


def _step_env(job: Job) -> tuple[tuple[str, str], ...]:
    """A step's allocation, as `synctl alloc` names it to its command (Slurm's SLURM_JOB_ID in a
    step; the step's own id is SYNAPSE_JOB_ID)."""
    return (("SYNAPSE_ALLOC", job.alloc_id),) if job.alloc_id else ()


def _array_env(state: ClusterState, job: Job) -> tuple[tuple[str, str], ...]:
    """An array element's ids, as Slurm's SLURM_ARRAY_* name them."""
    array = state.arrays.get(job.array_id) if job.array_id else None
    if array is None:
        return ()
    return (("SYNAPSE_ARRAY_JOB_ID", array.id), ("SYNAPSE_ARRAY_TASK_ID", str(job.array_index)),
            ("SYNAPSE_ARRAY_TASK_COUNT", str(array.count)))
