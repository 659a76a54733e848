"""Job events: a job's own record of what happened to it, each also a cluster event (ClusterTables.emit).

Every table's handlers write job events through `job_event`; the map below gives each job event kind
the stable reason and severity of the cluster event it makes.
"""

from __future__ import annotations

from synapse.core.model import Event, Job
from synapse.core.state.tables import ClusterTables

#: Events kept per job; older ones are dropped (the first, "submitted", is always kept).
MAX_EVENTS_PER_JOB = 200
#: A job event's kind -> the stable reason of the cluster event it also makes, and its type.
JOB_REASONS = {
    "Submitted": ("JobSubmitted", "Normal"), "Scheduled": ("GangPlaced", "Normal"),
    "Running": ("GangRunning", "Normal"), "Stopping": ("GangStopping", "Warning"),
    "Requeued": ("GangRestarting", "Warning"), "Succeeded": ("JobSucceeded", "Normal"),
    "Failed": ("JobFailed", "Warning"), "Cancelled": ("JobCancelled", "Normal"),
    "Preempted": ("Preempted", "Warning"), "Preempting": ("Preempting", "Normal"),
    "Notice": ("CheckpointNotice", "Normal"), "ProgressIgnored": ("ProgressIgnored", "Warning"),
    "Exec": ("TaskExec", "Normal"),
    "Held": ("JobHeld", "Normal"), "Released": ("JobReleased", "Normal"), "Updated": ("JobUpdated", "Normal"),
}


def job_event(state: ClusterTables, job: Job, at: float, kind: str, message: str) -> None:
    """Record an event in the job's own list (bounded, the first kept) and as a cluster event."""
    job.events.append(Event(at, kind, message))
    if len(job.events) > MAX_EVENTS_PER_JOB:
        del job.events[1]
    reason, severity = JOB_REASONS.get(kind, (kind, "Normal"))
    state.emit(at, severity, "job", reason, job.id, message)
