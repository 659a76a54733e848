"""Node faults: a failing health check, a drain, a GPU error, and the record of node-side ends that
cordons a suspect node ("black hole") and makes jobs avoid the nodes that ended their attempts.

State: the nodes' health, cordon, `failures`, `gpu_error`; the jobs' `excluded_nodes`. Commands:
SetNodeHealth, DrainNode, GpuFault.
"""

from __future__ import annotations

from synapse.core import commands as c
from synapse.core.commands import Result
from synapse.core.model import DEFAULT_GRACE_S, HEALTH_CHECK_FAILED, EndReason, JobStatus, Node, gpu_fault_hits
from synapse.core.schedule import elastic
from synapse.core.state.events import job_event
from synapse.core.state.tables import ClusterTables
from synapse.core.state.transitions import stop_attempt
from synapse.core.state.usage import release_hold

#: Nodes a job remembers as having ended an attempt of its (lost, or drained by a failing health
#: check): its later attempts avoid the latest this many (Slurm's --exclude, kept for the user).
MAX_EXCLUDED_NODES = 8
#: A node on which gangs of SUSPECT_JOBS different jobs ended by a node-side cause (model.NODE_SIDE_CAUSES)
#: within this many seconds, by the commands' own `at`, is cordoned as a suspect: a "black hole"
#: that fails every gang placed on it would otherwise drain the queue through it.
SUSPECT_WINDOW_S = 86400.0
SUSPECT_JOBS = 2
#: Node-side ends remembered per node (the oldest beyond it are dropped).
MAX_NODE_FAILURES = 8


def note_node_failures(state: ClusterTables, node: Node, job_ids: list[str], cause: str, at: float) -> None:
    """Gangs of `job_ids` ended on `node` by a node-side `cause`: each job excludes the node from
    its later attempts, and the node's record of such ends grows; with ends of SUSPECT_JOBS
    different jobs within SUSPECT_WINDOW_S of `at`, the node is cordoned as a suspect. Only
    version-3 commands (NodeLost, a health check's DrainNode) and a GpuFault (4) call this."""
    if not job_ids:
        return
    for job_id in job_ids:
        job = state.jobs[job_id]
        job.excluded_nodes = (*(n for n in job.excluded_nodes if n != node.id), node.id)[-MAX_EXCLUDED_NODES:]
    recent = [f for f in node.failures if at - f[0] < SUSPECT_WINDOW_S]
    node.failures = tuple([*recent, *((at, job_id, cause) for job_id in job_ids)][-MAX_NODE_FAILURES:])
    jobs = list(dict.fromkeys(job_id for _, job_id, _ in node.failures))
    if len(jobs) < SUSPECT_JOBS or node.suspect:
        return
    causes = "/".join(sorted({f[2] for f in node.failures}))
    node.schedulable, node.health_cordon, node.suspect = False, False, True
    node.cordon_reason = (f"suspect: tasks of jobs {', '.join(jobs)} ended {causes} here within "
                          f"{SUSPECT_WINDOW_S / 3600:g}h")
    state.emit(at, "Warning", "node", "NodeSuspect", node.id, node.cordon_reason)
    state.index.update(node)


def set_node_health(state: ClusterTables, cmd: c.SetNodeHealth) -> Result:
    """Cordon a failing node (and with `drain` stop its gangs); uncordon a passing one only if
    its health check was what cordoned it."""
    node = state.nodes.get(cmd.node_id)
    if node is None:
        return Result.not_found(f"unknown node {cmd.node_id}")
    if cmd.healthy:
        if not node.health and not node.health_cordon:
            return Result(True, value="already healthy")
        node.health = ""
        state.emit(cmd.at, "Normal", "node", "NodeHealthy", node.id, "health check passes again")
        if node.health_cordon:
            node.schedulable, node.cordon_reason, node.health_cordon = True, "", False
            state.emit(cmd.at, "Normal", "node", "NodeUncordoned", node.id, "uncordoned: health check passes")
            state.index.update(node)
        return Result(True)
    message = cmd.message or "health check failed"
    if node.health != message:
        state.emit(cmd.at, "Warning", "node", "NodeUnhealthy", node.id, f"health check failed: {message}")
    node.health = message
    if node.schedulable or node.health_cordon:
        node.schedulable, node.health_cordon = False, True
        node.cordon_reason = f"health check failed: {message}"
        state.emit(cmd.at, "Warning", "node", "NodeCordoned", node.id, node.cordon_reason)
        state.index.update(node)
    if cmd.drain:
        for task, wanted in state.tasks_on_node(node.id):
            job = state.jobs[task.job_id]
            if wanted:
                stop_attempt(state, job, f"failed: node {node.id} unhealthy ({message})", cmd.at,
                             failure=f"node {node.id} of task {task.index} unhealthy: {message}")
    return Result(True)


def drain_node(state: ClusterTables, cmd: c.DrainNode) -> Result:
    """Cordon the node (with `cordon`) and stop every gang with a wanted task on it, each with
    its grace: it requeues at its place without using up a restart, or, an elastic gang that
    keeps its minimum without the node, shrinks. Returns the ids of the gangs stopped."""
    node = state.nodes.get(cmd.node_id)
    if node is None:
        return Result.not_found(f"unknown node {cmd.node_id}")
    holder = state.held_nodes.get(node.id)
    if holder is not None:
        release_hold(state, holder)  # the preemptor's plan lapses with the node: it is planned afresh
    by = f" by {cmd.by}" if cmd.by else ""
    reason = f"node {node.id} drained{by}" + (f": {cmd.reason}" if cmd.reason else "")
    #: a failing health check's drain (only it leaves the cordon to its SetNodeHealth): the node,
    #: not the job, ended the gangs
    health_drain = not cmd.cordon
    if cmd.cordon:
        if node.schedulable or node.health_cordon or node.suspect:
            state.emit(cmd.at, "Normal", "node", "NodeCordoned", node.id, f"draining{by}")
        node.schedulable, node.cordon_reason, node.health_cordon, node.suspect = False, f"drained{by}", False, False
        state.index.update(node)
    stopped = []
    for job_id in sorted({t.job_id for t, wanted in state.tasks_on_node(node.id) if wanted}):
        job = state.jobs[job_id]
        if job.status not in (JobStatus.SCHEDULED, JobStatus.RUNNING):
            continue
        job.stop_grace = job.spec.grace or DEFAULT_GRACE_S
        kept = sum(1 for t in job.tasks if t.node_id != node.id)
        if elastic.is_elastic(job.spec) and kept >= job.spec.tasks_min:
            stop_attempt(state, job, f"shrinking from {len(job.tasks)} to {kept} task(s): {reason}", cmd.at,
                         cause=EndReason.RESIZED)
            job_event(state, job, cmd.at, "Shrinking", f"{reason}: {len(job.tasks)} -> {kept} task(s); "
                                                       f"grace {job.stop_grace:g}s")
        else:
            stop_attempt(state, job, reason, cmd.at, cause=EndReason.DRAINED)
        stopped.append(job_id)
    state.emit(cmd.at, "Normal", "node", "NodeDrained", node.id,
               reason + (f"; stopping {', '.join(stopped)}" if stopped else "; no gang to stop"))
    if health_drain:
        note_node_failures(state, node, stopped, HEALTH_CHECK_FAILED, cmd.at)
    return Result(True, value=",".join(stopped))


def gpu_fault(state: ClusterTables, cmd: c.GpuFault) -> Result:
    """A worker's GPU error: stop every gang with a wanted task on the failed GPUs (each requeues at
    its place uncharged and excludes the node: a node-side end, as a lost node's), and cordon the
    node with the error until an admin uncordons it. The whole node, not the GPU alone: a GPU
    that failed this way needs a reset or a reboot, which takes the node's other tasks down too.
    Returns the ids of the gangs stopped."""
    node = state.nodes.get(cmd.node_id)
    if node is None:
        return Result.not_found(f"unknown node {cmd.node_id}")
    message = cmd.message or "GPU error"
    reason = f"GPU error: {message}"
    hit = sorted({t.job_id for t, wanted in state.tasks_on_node(node.id)
                  if wanted and gpu_fault_hits(t.gpus, cmd.gpus)})
    for job_id in hit:
        stop_attempt(state, state.jobs[job_id], f"GPU error on node {node.id}: {message}", cmd.at,
                     cause=EndReason.GPU_ERROR)
    if node.gpu_error != message or hit:
        state.emit(cmd.at, "Warning", "node", "NodeGpuError", node.id,
                   reason + (f"; stopping {', '.join(hit)}" if hit else "; no gang on those GPUs"))
    note_node_failures(state, node, hit, EndReason.GPU_ERROR.value, cmd.at)
    if node.schedulable or node.cordon_reason != reason:
        state.emit(cmd.at, "Warning", "node", "NodeCordoned", node.id, reason)
    # The GPU's error is the reason to give, even on a suspect (which stays one): it says what to repair.
    node.schedulable, node.health_cordon, node.cordon_reason, node.gpu_error = False, False, reason, message
    state.index.update(node)
    return Result(True, value=",".join(hit))
