"""Why a task ended (`EndReason`), and which ends count as what: a requeue, a node's fault, a
planned stop, a worker's report.
"""

from __future__ import annotations

import enum


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
    #: stopped because its owner or an admin asked to requeue its job (`synctl requeue`): the job
    #: queues again, a new attempt, not charged to max_restarts
    REQUEUED = "Requeued"


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
