"""The leader's monitor pass over jobs: attempts past their time limit (a job with a checkpoint
notice gets its notice first: `CheckpointNotice` `notice` seconds before the limit, and the stop at
the limit, or `notice` after a notice that went out late), gangs whose image did not arrive in time,
and finished jobs past their retention, which are forgotten (with a history store: counted from when
the store held them, and never before, unless the unarchived jobs outgrow their cap: then the oldest
go with HistoryOverflow, a Warning event)."""

from __future__ import annotations

import itertools
import logging
import math

from synapse.core import commands as c
from synapse.core import versions
from synapse.core.brain.config import LeaderConfig
from synapse.core.brain.inflight import InFlight
from synapse.core.brain.stimuli import Instruction, MonitorDue, Propose
from synapse.core.model import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_IMAGE_PULL_TIMEOUT_S,
    EndReason,
    Job,
    JobStatus,
    gang_unprepared,
)
from synapse.core.state.fsm import ClusterState

log = logging.getLogger(__name__)

#: How often finished jobs past their retention are forgotten, and how many per command.
RETENTION_SWEEP_S = 10.0
FORGET_CHUNK = 500


def cluster_version(state: ClusterState, s: MonitorDue) -> list[Instruction]:
    """Record the command-set version every member knows once it rose, so that a member down later
    holds nothing back."""
    if s.cluster_version > state.cluster_version >= versions.BASE_VERSION \
            and versions.may_propose(c.SetClusterVersion, s.cluster_version):
        return [Propose(c.SetClusterVersion(at=s.at, version=s.cluster_version))]
    return []


def limits(state: ClusterState, s: MonitorDue, inflight: InFlight) -> list[Instruction]:
    """Running attempts past their time limit, and placed gangs whose image did not arrive in time."""
    noticeable = versions.may_propose(c.CheckpointNotice, s.cluster_version)
    preparing = versions.may_propose(c.TaskPrepared, s.cluster_version)
    out: list[Instruction] = []
    for job in state.jobs.values():
        if job.status is JobStatus.RUNNING and job.spec.alloc and job.idle_since:
            out += idle_timeout(job, s.at, inflight)
        if job.status is JobStatus.RUNNING and job.spec.time_limit:
            out += time_limit(state, job, s.at, noticeable, inflight)
        elif job.status is JobStatus.SCHEDULED and job.spec.image and preparing:
            out += pull_timeout(job, s.at)
    return out


def idle_timeout(job: Job, now: float, inflight: InFlight) -> list[Instruction]:
    """An allocation with no step running for its idle timeout (`idle_since` is 0 while one runs):
    cancelled by the cluster, saying so (its holder's `synctl alloc` then ends its command)."""
    timeout = job.spec.idle_timeout or DEFAULT_IDLE_TIMEOUT_S
    if now - job.idle_since < timeout or inflight.holds("idle", job.id):
        return []
    log.info("allocation idle job=%s idle_s=%.0f timeout_s=%g", job.id, now - job.idle_since, timeout)
    return [inflight.propose(c.CancelJob(at=now, job_id=job.id, reason=f"idle: no step ran for {timeout:g}s "
                                                                       "(its idle_timeout)"))]


def pull_timeout(job: Job, now: float) -> list[Instruction]:
    """A gang whose image is not on all its nodes `image_pull_timeout` after it was placed: the
    attempt ends ImagePullFailed naming the nodes not ready, and requeues (a cause in the nodes,
    uncharged; fsm `_maybe_end_attempt`)."""
    waiting = gang_unprepared(job)
    timeout = job.spec.image_pull_timeout or DEFAULT_IMAGE_PULL_TIMEOUT_S
    if not waiting or now - job.placed_at <= timeout:
        return []
    nodes = ", ".join(sorted({t.node_id for t in waiting}))
    log.info("image pull timed out job=%s attempt=%d nodes=%s", job.id, job.attempt, nodes)
    return [Propose(c.FailAttempt(at=now, job_id=job.id, attempt=job.attempt, cause=EndReason.IMAGE_PULL_FAILED,
                                  reason=f"TIMEOUT: image {job.spec.image} not ready after {timeout:g}s "
                                         f"on node(s) {nodes}"))]


def time_limit(state: ClusterState, job: Job, now: float, noticeable: bool, inflight: InFlight) -> list[Instruction]:
    """A running attempt's time limit: its checkpoint notice `notice` before the limit, then the
    stop (a final FailAttempt, cause TimeLimit) at the limit, or `notice` after the notice if it
    went out late (a new leader, a slow monitor pass): the tasks always get all of their notice.
    Below command-set version 3 (never, with such a job in the state: only a version-3 kind
    submits one) the stop comes at the limit and gives the notice itself, as other stops do."""
    limit = job.spec.time_limit
    limit_at = job.started_at + limit
    notice = state.notice_of(job) if noticeable else 0.0
    if notice and not job.notice_at:
        if now >= limit_at - notice and not inflight.holds("notice", (job.id, job.attempt)):
            stop_at = max(limit_at, now + notice)
            log.info("checkpoint notice job=%s attempt=%d notice_s=%g stop_in_s=%.1f", job.id, job.attempt,
                     notice, stop_at - now)
            return [inflight.propose(c.CheckpointNotice(at=now, job_id=job.id, attempt=job.attempt,
                                                        stop_at=stop_at, cause=EndReason.TIME_LIMIT))]
        return []
    stop_at = max(limit_at, job.notice_at + notice) if job.notice_at else limit_at
    if now <= stop_at:
        return []
    log.info("time limit reached job=%s attempt=%d limit_s=%.0f", job.id, job.attempt, limit)
    return [Propose(c.FailAttempt(at=now, job_id=job.id, attempt=job.attempt,
                                  reason=f"time limit of {limit:.0f}s exceeded", final=True,
                                  cause=EndReason.TIME_LIMIT))]


class Retention:
    """Forgets finished jobs past their retention (Slurm's MinJobAge)."""

    def __init__(self, config: LeaderConfig) -> None:
        self.config = config  #: fixed for the term
        self.last_sweep = -math.inf  #: monotonic time of the last retention sweep; handle only

    def sweep(self, state: ClusterState, s: MonitorDue) -> list[Instruction]:
        """Forget finished jobs older than the retention period (Slurm's MinJobAge); with a history
        store, only those it holds, counted from when it held them, unless the unarchived outgrow their cap.

        Once every member applies version 2, as ArchiveJobs (final states kept for dependencies,
        arrays too); before, as the version-1 ForgetJobs every release applies, and only plain jobs
        (arrays and their elements exist only once the cluster is at version 2: they wait for it)."""
        retention, history = self.config.job_retention, self.config.history
        if not (retention or history) or s.mono - self.last_sweep < RETENTION_SWEEP_S:
            return []
        self.last_sweep = s.mono
        out: list[Instruction] = []
        archive = versions.may_propose(c.ArchiveJobs, s.cluster_version)
        if history:
            overflow = len(state.unarchived) - self.config.max_unarchived
            if overflow > 0:
                oldest = list(itertools.islice(state.unarchived.values(), overflow))
                log.warning("history cap reached unarchived=%d cap=%d; forgetting the oldest %d unarchived",
                            len(state.unarchived), self.config.max_unarchived, overflow)
                out += [Propose(c.HistoryOverflow(at=s.at, job_ids=tuple(oldest[i:i + FORGET_CHUNK])))
                        for i in range(0, len(oldest), FORGET_CHUNK)]
            expired = [j.id for j in state.jobs.values()
                       if j.status.terminal and j.archived_at and s.at - j.archived_at > retention
                       and (archive or not j.array_id)] if retention else []
        else:
            expired = [j.id for j in state.jobs.values()
                       if j.status.terminal and s.at - j.finished_at > retention and (archive or not j.array_id)]
        if archive and retention:
            expired += [a.id for a in state.arrays.values() if a.done and s.at - a.finished_at > retention]
        kind = c.ArchiveJobs if archive else c.ForgetJobs
        return out + [Propose(kind(at=s.at, job_ids=tuple(expired[i:i + FORGET_CHUNK])))
                      for i in range(0, len(expired), FORGET_CHUNK)]
