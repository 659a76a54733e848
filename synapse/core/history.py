"""The accounting record of finished jobs, and what the history exporter must write next. Pure.

The replicated state numbers jobs in the order they finish (`Job.archive_seq`, given in apply), and
remembers up to which number the history store holds them (`ClusterState.archived_upto`, moved by
the HistoryExported command). The store keeps its own cursor, committed in the same transaction as
the rows; `export_batch` reads the state and that cursor and says which records to write and which
cursor comes after them. Rows are upserted on their natural keys (job id; job id and attempt), so
writing a batch twice (a leader that died between the store's commit and its proposal) changes
nothing. synapse.history.exporter carries it out; nothing here does I/O.

Cluster utilisation (as Slurm's `sreport cluster utilization`) is not in the log: the leader samples
the nodes every `UTILIZATION_EVERY_S` (`cluster_sample`) and adds the time since the store's last
sample, at most `UTILIZATION_MAX_GAP_S`, times each state's GPUs and CPUs to the UTC days it spans
(`utilization_rows`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from synapse.core import goodput
from synapse.core.goodput import Goodput
from synapse.core.model import NEVER_RAN, EndReason, Job, JobStatus, Node, NodeStatus, Run

#: Records written per store transaction, at most.
EXPORT_BATCH = 2000
#: How often the leader samples the cluster's utilisation.
UTILIZATION_EVERY_S = 30.0
#: The longest time one sample counts for: a longer gap (no leader, a store down) is not counted.
UTILIZATION_MAX_GAP_S = 3 * UTILIZATION_EVERY_S


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One placed attempt of a finished job: a row of the `runs` table."""

    job_id: str
    attempt: int
    user: str
    queue: str
    start: float  #: placed (resources allocated)
    running: float  #: every task started (0: never)
    end: float
    nodes: tuple[str, ...]  #: the distinct nodes, in task order
    tasks: int
    cpu: int  #: per task, millicores
    memory: int  #: per task, bytes
    gpu: int  #: per task
    outcome: str  #: an EndReason
    reason: str
    exit_code: int  #: 0 when its command never ran (outcome in model.NEVER_RAN): no exit code
    gpu_seconds: float
    cpu_seconds: float
    checkpoint_at: float = 0.0  #: its last checkpoint as its tasks reported it (0: none)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A finished job: a row of the `jobs` table, with its runs."""

    job_id: str
    name: str
    user: str
    queue: str
    priority: int
    submit: float
    eligible: float  #: when it could first start (its submission, until dependencies exist)
    start: float  #: its first placement (0: it never ran)
    end: float
    state: str  #: SUCCEEDED, FAILED or CANCELLED
    #: the typed reason of its end: an EndReason of its last run, Cancelled, or for a job that never
    #: ran and failed, the cluster's cause (DependencyNeverSatisfied)
    reason: str
    detail: str  #: why it ended, for people
    exit_code: int  #: its last run's (0 when its command never ran: no exit code)
    attempts: int
    tasks: int  #: its last run's (an elastic gang's size as it ran); the spec's when it never ran
    nodes: tuple[str, ...]  #: the distinct nodes of its last run
    cpu: int  #: per task, millicores
    memory: int  #: per task, bytes
    gpu: int  #: per task
    gpu_seconds: float  #: over every run
    cpu_seconds: float
    time_limit: float
    cancelled_by: str
    preemptions: int
    archive_seq: int
    runs: tuple[RunRecord, ...]
    goodput: Goodput = Goodput()  #: where its GPU time went (synapse.core.goodput), in GPU-seconds

    @property
    def elapsed(self) -> float:
        return max(0.0, self.end - self.start) if self.start else 0.0

    @property
    def wait(self) -> float:
        return max(0.0, (self.start or self.end) - self.eligible)


@dataclass(frozen=True, slots=True)
class ExportBatch:
    """What the exporter does next: write `records` and move the store's cursor to `upto`, then
    propose HistoryExported(upto). With no records and `upto` above the state's cursor, the store
    already holds them (the proposal was lost): only propose. `problem`: write nothing, say why."""

    records: tuple[JobRecord, ...] = ()
    upto: int = 0
    more: bool = False  #: more finished jobs wait beyond this batch
    problem: str = ""


def _distinct(nodes: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(nodes))


def run_record(job: Job, run: Run) -> RunRecord:
    """The record of one run; one that ended before its command ran (model.NEVER_RAN) has no exit
    code: 0 here, as for a job that never ran, and readers show none (an older replica's state
    holds the worker's 127 in its place)."""
    return RunRecord(job_id=job.id, attempt=run.attempt, user=job.user, queue=job.spec.queue or "default",
                     start=run.placed_at, running=run.started_at, end=run.ended_at, nodes=_distinct(run.nodes),
                     tasks=len(run.nodes), cpu=run.resources.cpu, memory=run.resources.memory,
                     gpu=run.resources.gpu, outcome=run.outcome, reason=run.reason,
                     exit_code=0 if run.outcome in NEVER_RAN else run.exit_code,
                     gpu_seconds=run.gpu_seconds, cpu_seconds=run.cpu_seconds, checkpoint_at=run.checkpoint_at)


def job_record(job: Job) -> JobRecord:
    """The accounting record of a finished job (from the replicated state alone)."""
    runs = tuple(run_record(job, r) for r in job.runs)
    last = runs[-1] if runs else None
    if job.status is JobStatus.CANCELLED:
        reason = EndReason.CANCELLED
    elif last is not None:
        reason = last.outcome
    elif job.failure_cause:  # failed before it ever ran: a dependency that can never be met
        reason = job.failure_cause
    else:
        reason = EndReason.COMPLETED if job.status is JobStatus.SUCCEEDED else EndReason.ERROR
    detail = job.events[-1].message if job.events else ""
    spec = job.spec
    return JobRecord(
        job_id=job.id, name=spec.name, user=job.user, queue=spec.queue or "default", priority=spec.priority,
        submit=job.submitted_at, eligible=job.submitted_at, start=job.runs[0].placed_at if job.runs else 0.0,
        end=job.finished_at, state=job.status.value, reason=str(reason), detail=detail,
        exit_code=last.exit_code if last else 0, attempts=job.attempt, tasks=last.tasks if last else spec.tasks,
        nodes=_distinct(last.nodes) if last else (), cpu=spec.resources.cpu, memory=spec.resources.memory,
        gpu=spec.resources.gpu, gpu_seconds=sum(r.gpu_seconds for r in runs),
        cpu_seconds=sum(r.cpu_seconds for r in runs), time_limit=spec.time_limit,
        cancelled_by=job.cancelled_by, preemptions=job.preemptions, archive_seq=job.archive_seq, runs=runs,
        goodput=goodput.of_job(job, job.finished_at))


def export_batch(state: Any, store_cursor: int, limit: int = EXPORT_BATCH) -> ExportBatch:
    """The next batch for a store whose cursor is `store_cursor` (call under the state's lock)."""
    if store_cursor > state.archive_seq:
        return ExportBatch(problem=f"the store's cursor ({store_cursor}) is ahead of the cluster's last finished "
                                   f"job ({state.archive_seq}): is this store another cluster's?")
    records: list[JobRecord] = []
    upto = max(store_cursor, state.archived_upto)
    for seq, job_id in state.unarchived.items():
        if seq <= store_cursor:
            continue
        if len(records) == limit:
            return ExportBatch(tuple(records), upto, more=True)
        records.append(job_record(state.jobs[job_id]))
        upto = seq
    return ExportBatch(tuple(records), upto)


def day_shares(start: float, end: float) -> list[tuple[str, float]]:
    """The UTC days an interval covers, each with the fraction of the interval inside it."""
    if end <= start:
        return [(datetime.fromtimestamp(end, UTC).date().isoformat(), 1.0)]
    out = []
    t = start
    while t < end:
        day = datetime.fromtimestamp(t, UTC).date()
        next_day = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() + 86400
        stop = min(end, next_day)
        out.append((day.isoformat(), (stop - t) / (end - start)))
        t = stop
    return out


def day_of(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).date().isoformat()



@dataclass(frozen=True, slots=True)
class ClusterSample:
    """The cluster's GPUs and CPUs (millicores) by state at one instant."""

    allocated_gpus: int = 0  #: given to tasks, on any node still up
    idle_gpus: int = 0  #: free on nodes that accept work
    down_gpus: int = 0  #: on DOWN nodes, and free on cordoned or draining ones
    allocated_cpu: int = 0
    idle_cpu: int = 0
    down_cpu: int = 0


def cluster_sample(nodes: Iterable[Node]) -> ClusterSample:
    """Allocated, idle and down GPUs and CPUs of these nodes (call under the state's lock)."""
    alloc_g = idle_g = down_g = alloc_c = idle_c = down_c = 0
    for node in nodes:
        cap, used = node.capacity, node.used
        if node.status is NodeStatus.DOWN:
            down_g += cap.gpu
            down_c += cap.cpu
            continue
        alloc_g += min(used.gpu, cap.gpu)
        alloc_c += min(used.cpu, cap.cpu)
        free_g, free_c = max(0, cap.gpu - used.gpu), max(0, cap.cpu - used.cpu)
        if node.schedulable:
            idle_g += free_g
            idle_c += free_c
        else:
            down_g += free_g
            down_c += free_c
    return ClusterSample(alloc_g, idle_g, down_g, alloc_c, idle_c, down_c)


def utilization_rows(sample: ClusterSample, last: float, now: float,
                     max_gap: float = UTILIZATION_MAX_GAP_S) -> list[dict[str, Any]]:
    """GPU- and CPU-seconds (CPU in core-seconds) to add per UTC day for `sample` held from the
    last sample at `last` until `now`, counting at most `max_gap` back from now; [] if none
    (`last` 0: no sample before, the time before is unknown)."""
    start = max(last, now - max_gap)
    if not last or now <= start:
        return []
    rows = []
    for day, share in day_shares(start, now):
        seconds = (now - start) * share
        rows.append({"day": day, "allocated_gpu_seconds": sample.allocated_gpus * seconds,
                     "idle_gpu_seconds": sample.idle_gpus * seconds, "down_gpu_seconds": sample.down_gpus * seconds,
                     "allocated_cpu_seconds": sample.allocated_cpu / 1000 * seconds,
                     "idle_cpu_seconds": sample.idle_cpu / 1000 * seconds,
                     "down_cpu_seconds": sample.down_cpu / 1000 * seconds})
    return rows
