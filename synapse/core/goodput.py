"""Goodput: how much of the GPU time a job held became training progress that was kept. Pure.

One definition for the leader's accounting (`describe job`, `synctl usage`, the history store,
Prometheus) and the simulator's (synapse.sim.metrics), over the attempts of a job:

* **held**: every attempt's GPUs from its placement to its end (or to now, while it holds them).
* An attempt that a requeue ended (its node lost, drained, preempted, resized, or a failure the job
  retries), or a node-side cause ended for good, keeps what its **last reported checkpoint**
  saved: its run from when it was running to that checkpoint. The rest of what it held is
  **lost**: to **failures** when the cause was the node's (model.NODE_SIDE_CAUSES: the node lost,
  a failing health check's drain), to **other stops** otherwise (a preemption or a drain without a
  checkpoint after its notice, the job's own crash). Its restart, if it was one, is in that loss:
  it bought nothing.
* Any other attempt (the job's last, or one still running) keeps all of its run except its
  **restart**: the time from its placement until every task ran, for an attempt after a requeue
  (the first attempt's start-up is the job's own, not a loss).
* **requeue wait**: the GPUs of the gang times the time it waited in the queue after a requeue. It
  is not held (nothing was allocated), so it is outside the ratio; it is what spares and a
  head-of-queue restart remove.
* **goodput** = kept / held (nan while nothing was held).

Detection (a node silent until its heartbeat timeout) is held by the attempt that the loss ends, so
it counts in the failure's loss; detection + requeue wait + restart is "from the failure to running
again". What failures cost a job in all is the three together, the work lost, the restart and the
wait (the simulator's `failure_lost_gpu_hours`, synapse.sim.metrics): the work is what checkpoints
bound, the wait and the restart are what recovery (spares, a head-of-queue restart) changes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from synapse.core.model import NODE_SIDE_CAUSES, EndReason, Job, JobStatus, Run

#: How an attempt ended, for the accounting.
FINISHED = "finished"  #: the job's last attempt (or one still running): all but its restart kept
FAILURE = "failure"  #: a node-side cause requeued it: what its checkpoint did not save is lost to failures
OTHER = "other"  #: any other requeue: what its checkpoint did not save is lost to other stops
ENDS = (FINISHED, FAILURE, OTHER)

@dataclass(frozen=True, slots=True)
class Attempt:
    """What the accounting needs of one attempt (seconds; `gpus` of its whole gang)."""

    gpus: float
    held_s: float  #: placement to end (or now)
    ended: str = FINISHED  #: one of ENDS
    restart_s: float = 0.0  #: of held, placement until every task ran, for an attempt after a requeue
    kept_s: float = 0.0  #: FAILURE and OTHER: of held, what its last checkpoint saved
    wait_s: float = 0.0  #: pending between the requeue before it and its placement


@dataclass(frozen=True, slots=True)
class Goodput:
    """A job's (or a queue's: they add up) GPU-seconds by where they went."""

    held: float = 0.0
    kept: float = 0.0
    lost_failures: float = 0.0
    lost_restarts: float = 0.0
    lost_other: float = 0.0
    requeue_wait: float = 0.0  #: not held: the gang's GPUs times its waits after requeues

    @property
    def goodput(self) -> float:
        """kept / held; nan while nothing was held."""
        return self.kept / self.held if self.held > 0 else math.nan

    def __add__(self, other: Goodput) -> Goodput:
        return Goodput(self.held + other.held, self.kept + other.kept, self.lost_failures + other.lost_failures,
                       self.lost_restarts + other.lost_restarts, self.lost_other + other.lost_other,
                       self.requeue_wait + other.requeue_wait)

    def hours(self) -> dict[str, float]:
        """GPU-hours of each figure, and the goodput (for reports and JSON)."""
        return {"held_gpu_hours": self.held / 3600, "kept_gpu_hours": self.kept / 3600,
                "lost_failures_gpu_hours": self.lost_failures / 3600,
                "lost_restarts_gpu_hours": self.lost_restarts / 3600,
                "lost_other_gpu_hours": self.lost_other / 3600,
                "requeue_wait_gpu_hours": self.requeue_wait / 3600, "goodput": self.goodput}


def account(attempts: Iterable[Attempt]) -> Goodput:
    """The GPU-seconds of `attempts` by where they went (the module's docstring)."""
    held = kept = failures = restarts = other = wait = 0.0
    for a in attempts:
        h = max(0.0, a.held_s) * a.gpus
        held += h
        wait += max(0.0, a.wait_s) * a.gpus
        if a.ended == FINISHED:
            r = min(max(0.0, a.restart_s) * a.gpus, h)
            restarts += r
            kept += h - r
        else:
            k = min(max(0.0, a.kept_s) * a.gpus, h)
            kept += k
            if a.ended == FAILURE:
                failures += h - k
            else:
                other += h - k
    return Goodput(held, kept, failures, restarts, other, wait)


def _node_side(job: Job, run: Run) -> bool:
    """True when a node-side cause ended the run (model.NODE_SIDE_CAUSES): its node lost; or a drain
    of one of its nodes that the job now excludes (only a lost node and a failing health check's
    drain exclude a node, and no later attempt is placed on an excluded node while the others can
    hold it)."""
    if run.outcome in NODE_SIDE_CAUSES:
        return True
    return run.outcome == EndReason.DRAINED and any(n in job.excluded_nodes for n in run.nodes)


def job_attempts(job: Job, now: float) -> list[Attempt]:
    """The accounting of a job's attempts: its ended runs, and its current one while it holds a
    gang (to `now`). An ended run was requeued unless it is the final one of a finished job."""
    out: list[Attempt] = []
    runs = sorted(job.runs, key=lambda r: r.attempt)
    previous_end: float | None = None
    final = runs[-1].attempt if runs and job.status.terminal else None
    for run in runs:
        gpus = float(len(run.nodes) * run.resources.gpu)
        wait = run.placed_at - previous_end if previous_end is not None else 0.0
        restarted = previous_end is not None
        running_at = run.started_at or run.ended_at
        restart = running_at - run.placed_at if restarted else 0.0
        held = run.ended_at - run.placed_at
        node_side = _node_side(job, run)
        if run.attempt == final and not node_side:
            out.append(Attempt(gpus, held, FINISHED, restart_s=restart, wait_s=wait))
        else:
            kept = max(0.0, min(run.checkpoint_at, run.ended_at) - running_at) if run.checkpoint_at else 0.0
            out.append(Attempt(gpus, held, FAILURE if node_side else OTHER, kept_s=kept, wait_s=wait))
        previous_end = run.ended_at
    if job.status.has_gang and job.tasks and job.placed_at:
        gpus = float(len(job.tasks) * job.spec.resources.gpu)
        restarted = previous_end is not None
        running_at = job.started_at or now
        wait = job.placed_at - previous_end if previous_end is not None else 0.0
        out.append(Attempt(gpus, now - job.placed_at, FINISHED,
                           restart_s=running_at - job.placed_at if restarted else 0.0, wait_s=wait))
    elif job.status is JobStatus.PENDING and previous_end is not None:
        gpus = float(job.spec.tasks * job.spec.resources.gpu)
        out.append(Attempt(gpus, 0.0, FINISHED, wait_s=now - job.pending_since))
    return out


def of_job(job: Job, now: float) -> Goodput:
    """A job's goodput accounting as of `now`."""
    return account(job_attempts(job, now))
