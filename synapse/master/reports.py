"""A node's report of its tasks' events (started, prepared, ended, progress), as the leader takes it:
by the ReportTaskEvents call (synapse.master.api.workers) or by datagram (synapse.master.beats)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from synapse.core import commands as c
from synapse.core.brain.stimuli import ProgressReport
from synapse.core.versions import admits
from synapse.proto import api_pb2

if TYPE_CHECKING:
    from synapse.master.replica import Master

#: Task events one report may carry.
MAX_REPORTED = 10_000


def take_reports(m: Master, request: api_pb2.ReportTaskEventsRequest) -> tuple[list[c.Command], int]:
    """(the leader) The progress events handed to the leader's loops, and the commands the others
    make; returns those commands (to propose as one entry) and how many progress events there were."""
    now = m.now()
    version = m.raft.cluster_version()
    progress = [progress_report(e, request.node_id, now) for e in request.events if e.progress]
    loops = m.leader_loops
    if progress and loops is not None and loops.ready.is_set():
        loops.progress(progress)  # best effort: the next report says it again
    preparing = admits(version, c.TaskPrepared)
    cmds: list[c.Command]
    cmds = [c.TaskStarted(at=now, job_id=e.job_id, attempt=e.attempt, index=e.index, node_id=request.node_id)
            if e.started else
            c.TaskPrepared(at=now, job_id=e.job_id, attempt=e.attempt, index=e.index, node_id=request.node_id)
            if e.prepared else
            c.TaskExited(at=now, job_id=e.job_id, attempt=e.attempt, index=e.index, node_id=request.node_id,
                         exit_code=e.exit_code, reason=e.reason[:512],
                         cause=e.cause[:32] if admits(version, c.TaskExited, e.cause) else "",
                         node_side=e.node_side)
            for e in request.events if not e.progress and (preparing or not e.prepared)]
    return cmds, len(progress)


def progress_report(e: api_pb2.TaskEvent, node_id: str, now: float) -> ProgressReport:
    """A worker's progress event (an api_pb2.TaskEvent) as the leader's stimulus: a checkpoint time
    in the future is read as now (a task's clock is not the cluster's)."""
    at = e.checkpoint_at if math.isfinite(e.checkpoint_at) and e.checkpoint_at > 0 else 0.0
    return ProgressReport(job_id=e.job_id, attempt=e.attempt, index=e.index, node_id=node_id, at=now,
                          step=max(-1, e.step),
                          checkpoint_at=min(at, now), checkpoint_step=max(-1, e.checkpoint_step),
                          problem=e.progress_problem[:200])
