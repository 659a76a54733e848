"""What tasks report of their progress: the leader keeps each job's latest in memory (describe job
reads it) and puts an attempt's last checkpoint into the log (`RecordProgress`, command-set version
4) so that a new leader accounts goodput the same: only when the checkpoint changed, the attempt's
first at once and then at most one per job every `checkpoint_record_interval` (a stopping attempt's,
and every pending one before a node is declared DOWN, at once), never one per report; a progress
file's garbage once per attempt."""

from __future__ import annotations

from synapse.core import commands as c
from synapse.core import versions
from synapse.core.brain.inflight import InFlight
from synapse.core.brain.stimuli import Instruction, ProgressReport
from synapse.core.model import Job, JobStatus, Progress
from synapse.core.state.fsm import ClusterState


class ProgressBook:
    """Each job's latest progress, and the RecordProgress commands it calls for."""

    def __init__(self, interval: float, inflight: InFlight) -> None:
        self.interval = interval  #: a changed checkpoint goes into the log at most this often; fixed
        self.inflight = inflight  #: the leader's ledger of proposals on their way (shared)
        #: each job's latest reported progress (its current attempt's); handle only; readers only
        #: `get` an entry, and entries are replaced whole
        self.latest: dict[str, Progress] = {}
        #: (job, attempt) -> when its last RecordProgress was proposed (the rate limit); handle only
        self.recorded: dict[tuple[str, int], float] = {}
        #: (job, attempt) -> a progress file's garbage not yet put into the log; handle only
        self.problems: dict[tuple[str, int], str] = {}
        #: (job, attempt) whose garbage was said already (once per attempt); handle only
        self.said: set[tuple[str, int]] = set()

    def report(self, state: ClusterState, s: ProgressReport, version: int) -> list[Instruction]:
        """Keep the job's latest progress (a checkpoint never goes back); put it into the log when
        the rate limit allows (`record`)."""
        job = state.jobs.get(s.job_id)
        if job is None or job.attempt != s.attempt or not job.status.has_gang \
                or not 0 <= s.index < len(job.tasks) or job.tasks[s.index].node_id != s.node_id:
            return []
        key = (job.id, job.attempt)
        old = self.latest.get(job.id)
        if old is not None and old.attempt != job.attempt:
            old = None
        checkpoint_at, checkpoint_step = s.checkpoint_at, s.checkpoint_step
        if old is not None and old.checkpoint_at >= checkpoint_at:
            checkpoint_at, checkpoint_step = old.checkpoint_at, old.checkpoint_step
        step = s.step if s.step >= 0 or old is None else old.step
        self.latest[job.id] = Progress(job.attempt, checkpoint_at, checkpoint_step, step, s.at)
        if s.problem and key not in self.said:
            self.said.add(key)
            self.problems[key] = f"progress file of task {s.index} ignored: {s.problem}"
        return self.record(state, job, s.at, version)

    def record(self, state: ClusterState, job: Job, now: float, version: int, force: bool = False) -> list[Instruction]:
        """A RecordProgress for the job's attempt when its checkpoint differs from the log's (or it
        has garbage to say): the attempt's first at once, later ones at most every `interval`, a
        stopping attempt's (it saves on its notice) or a forced one at once; one in flight at a
        time. Below command-set version 4, nothing: memory only."""
        key = (job.id, job.attempt)
        mine = self.latest.get(job.id)
        if self.inflight.holds("progress", key) or mine is None or mine.attempt != job.attempt \
                or not versions.may_propose(c.RecordProgress, version):
            return []
        logged = job.progress if job.progress is not None and job.progress.attempt == job.attempt else None
        changed = bool(mine.checkpoint_at) and (logged is None or logged.checkpoint_at != mine.checkpoint_at)
        problem = self.problems.get(key, "")
        if not (changed or problem):
            return []
        last = self.recorded.get(key)
        if not (problem or force or last is None or job.status is JobStatus.STOPPING
                or now - last >= self.interval):
            return []
        self.recorded[key] = now
        self.problems.pop(key, None)
        return [self.inflight.propose(c.RecordProgress(
            at=now, job_id=job.id, attempt=job.attempt, checkpoint_at=mine.checkpoint_at,
            checkpoint_step=mine.checkpoint_step, step=mine.step, problem=problem))]

    def due(self, state: ClusterState, now: float, version: int, force: bool) -> list[Instruction]:
        """The RecordProgress commands the rate limit held back and now allows (all of them when
        `force`); the memory of jobs no longer holding that attempt's gang is dropped."""
        out: list[Instruction] = []
        for job_id, mine in list(self.latest.items()):
            job = state.jobs.get(job_id)
            if job is None or job.attempt != mine.attempt or not job.status.has_gang:
                del self.latest[job_id]
                continue
            out += self.record(state, job, now, version, force)
        live = {(j, p.attempt) for j, p in self.latest.items()}
        recording = self.inflight.keys("progress")
        for memo in (self.recorded, self.problems):
            for key in [k for k in memo if k not in live and k not in recording]:
                del memo[key]
        self.said &= live | recording
        return out

    def validate(self) -> None:
        """Raise AssertionError if the book contradicts itself or the ledger."""
        assert self.inflight.keys("progress") <= set(self.recorded), "a RecordProgress in flight, not recorded"
        assert set(self.problems) <= self.said, "garbage to say that was not said once"
