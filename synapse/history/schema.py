"""The history store's schema: its tables, their migrations, and the rows a record becomes.

Six tables: `history_jobs` (one row per job, key job_id), `history_runs` (one per placed attempt,
key job_id + attempt), `history_usage_daily` (GPU- and CPU-seconds per UTC day, user and queue: what
`synctl usage` reads, kept when old rows are purged), `history_cursor` (the archive sequence
number up to which the store holds every finished job), and, from schema version 2,
`history_cluster_daily` (allocated, idle and down GPU- and CPU-seconds per UTC day, sampled by the
leader) with `history_cluster_sampled` (when the last sample was added, so that two leaders never
count the same seconds). Schema version 3 adds goodput (synapse.core.goodput): a job's GPU-seconds
held, kept and lost by cause (`GOODPUT_COLUMNS`, on `history_jobs`, and summed per day, user and
queue on `history_usage_daily`, on the day the job ended) and a run's last reported checkpoint
(`checkpoint_at`); rows written before it read 0.

Schema migrations: a versioned list run at the leader's first use (`MIGRATIONS`, recorded in
`history_schema`; synapse.history.store runs them). The schema ships inside the package and every
replica runs the same code, so Alembic's script directory, env.py and revision graph would buy
nothing a numbered list does not; each step is SQLAlchemy Core DDL, portable between the two
dialects.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from synapse.core.goodput import Goodput
from synapse.core.history import JobRecord, RunRecord, day_of, day_shares

metadata = sa.MetaData()

#: Schema version 3: where a job's GPU-seconds went (synapse.core.goodput), on history_jobs and
#: history_usage_daily; each is the Goodput field of the same name without `_gpu_seconds`.
GOODPUT_COLUMNS = ("held_gpu_seconds", "kept_gpu_seconds", "lost_failures_gpu_seconds", "lost_restarts_gpu_seconds",
                   "lost_other_gpu_seconds", "requeue_wait_gpu_seconds")


def _goodput_columns() -> list[sa.Column[float]]:
    return [sa.Column(name, sa.Double, nullable=False, server_default="0") for name in GOODPUT_COLUMNS]

jobs = sa.Table(
    "history_jobs", metadata,
    sa.Column("job_id", sa.String(300), primary_key=True),
    sa.Column("name", sa.String(300), nullable=False),
    sa.Column("user_name", sa.String(256), nullable=False),
    sa.Column("queue", sa.String(256), nullable=False),
    sa.Column("priority", sa.Integer, nullable=False),
    sa.Column("submit_at", sa.Double, nullable=False),
    sa.Column("eligible_at", sa.Double, nullable=False),
    sa.Column("start_at", sa.Double, nullable=False),  # 0: never ran
    sa.Column("end_at", sa.Double, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("reason", sa.String(32), nullable=False),
    sa.Column("detail", sa.Text, nullable=False),
    sa.Column("exit_code", sa.Integer, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("tasks", sa.Integer, nullable=False),
    sa.Column("nodes", sa.Text, nullable=False),  # comma-separated, the last run's
    sa.Column("cpu_millis", sa.BigInteger, nullable=False),  # per task
    sa.Column("memory_bytes", sa.BigInteger, nullable=False),  # per task
    sa.Column("gpus", sa.Integer, nullable=False),  # per task
    sa.Column("gpu_seconds", sa.Double, nullable=False),
    sa.Column("cpu_seconds", sa.Double, nullable=False),
    sa.Column("time_limit", sa.Double, nullable=False),
    sa.Column("cancelled_by", sa.String(256), nullable=False),
    sa.Column("preemptions", sa.Integer, nullable=False),
    sa.Column("archive_seq", sa.BigInteger, nullable=False),
    # room for job arrays and dependencies
    sa.Column("array_job", sa.String(300), nullable=True),
    sa.Column("array_index", sa.Integer, nullable=True),
    sa.Column("dependency", sa.Text, nullable=True),
    *_goodput_columns(),  # schema version 3
)
sa.Index("ix_history_jobs_end", jobs.c.end_at, jobs.c.job_id)
# each filter's index ends with the page order (end, id), so a page is read in order, never sorted
sa.Index("ix_history_jobs_user_end", jobs.c.user_name, jobs.c.end_at, jobs.c.job_id)
sa.Index("ix_history_jobs_queue_end", jobs.c.queue, jobs.c.end_at, jobs.c.job_id)
sa.Index("ix_history_jobs_state_end", jobs.c.state, jobs.c.end_at, jobs.c.job_id)

runs = sa.Table(
    "history_runs", metadata,
    sa.Column("job_id", sa.String(300), primary_key=True),
    sa.Column("attempt", sa.Integer, primary_key=True),
    sa.Column("user_name", sa.String(256), nullable=False),
    sa.Column("queue", sa.String(256), nullable=False),
    sa.Column("start_at", sa.Double, nullable=False),
    sa.Column("running_at", sa.Double, nullable=False),
    sa.Column("end_at", sa.Double, nullable=False),
    sa.Column("nodes", sa.Text, nullable=False),
    sa.Column("tasks", sa.Integer, nullable=False),
    sa.Column("cpu_millis", sa.BigInteger, nullable=False),
    sa.Column("memory_bytes", sa.BigInteger, nullable=False),
    sa.Column("gpus", sa.Integer, nullable=False),
    sa.Column("outcome", sa.String(32), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("exit_code", sa.Integer, nullable=False),
    sa.Column("gpu_seconds", sa.Double, nullable=False),
    sa.Column("cpu_seconds", sa.Double, nullable=False),
    sa.Column("checkpoint_at", sa.Double, nullable=False, server_default="0"),  # schema version 3; 0: none
)
sa.Index("ix_history_runs_end", runs.c.end_at)

usage_daily = sa.Table(
    "history_usage_daily", metadata,
    sa.Column("day", sa.String(10), primary_key=True),  # UTC, YYYY-MM-DD
    sa.Column("user_name", sa.String(256), primary_key=True),
    sa.Column("queue", sa.String(256), primary_key=True),
    sa.Column("gpu_seconds", sa.Double, nullable=False),
    sa.Column("cpu_seconds", sa.Double, nullable=False),
    sa.Column("jobs", sa.Integer, nullable=False),  # jobs that ended that day
    *_goodput_columns(),  # schema version 3: of the jobs that ended that day
)

cursor_table = sa.Table(
    "history_cursor", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("upto", sa.BigInteger, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
)

#: The seconds columns of `history_cluster_daily`, in the order reports show them.
CLUSTER_COLUMNS = ("allocated_gpu_seconds", "idle_gpu_seconds", "down_gpu_seconds",
                   "allocated_cpu_seconds", "idle_cpu_seconds", "down_cpu_seconds")

cluster_daily = sa.Table(
    "history_cluster_daily", metadata,
    sa.Column("day", sa.String(10), primary_key=True),  # UTC, YYYY-MM-DD
    *(sa.Column(name, sa.Double, nullable=False) for name in CLUSTER_COLUMNS),
)

cluster_sampled = sa.Table(
    "history_cluster_sampled", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("at", sa.Double, nullable=False),  # the end of the last sample added (0: none yet)
)

schema_table = sa.Table("history_schema", metadata, sa.Column("version", sa.Integer, primary_key=True))


def _v1(conn: Connection) -> None:
    for table in (jobs, runs, usage_daily, cursor_table):
        table.create(conn, checkfirst=True)
    conn.execute(cursor_table.insert().values(id=1, upto=0, updated_at=0.0))


def _v2(conn: Connection) -> None:
    for table in (cluster_daily, cluster_sampled):
        table.create(conn, checkfirst=True)
    conn.execute(cluster_sampled.insert().values(id=1, at=0.0))


def _v3(conn: Connection) -> None:
    """Goodput columns on tables made before them (a store created by this release has them)."""
    for table, names in ((jobs, GOODPUT_COLUMNS), (usage_daily, GOODPUT_COLUMNS), (runs, ("checkpoint_at",))):
        have = {c["name"] for c in sa.inspect(conn).get_columns(table.name)}
        for name in names:
            if name not in have:
                column = table.c[name]
                kind = column.type.compile(dialect=conn.dialect)
                conn.execute(sa.text(f"ALTER TABLE {table.name} ADD COLUMN {name} {kind} NOT NULL DEFAULT 0"))


#: Schema versions in order: (version, step). Append; never edit a released step.
MIGRATIONS = ((1, _v1), (2, _v2), (3, _v3))
SCHEMA_VERSION = MIGRATIONS[-1][0]


def job_row(r: JobRecord) -> dict[str, Any]:
    """A finished job's row of history_jobs."""
    return {"job_id": r.job_id, "name": r.name, "user_name": r.user, "queue": r.queue, "priority": r.priority,
            "submit_at": r.submit, "eligible_at": r.eligible, "start_at": r.start, "end_at": r.end,
            "state": r.state, "reason": r.reason, "detail": r.detail, "exit_code": r.exit_code,
            "attempts": r.attempts, "tasks": r.tasks, "nodes": ",".join(r.nodes), "cpu_millis": r.cpu,
            "memory_bytes": r.memory, "gpus": r.gpu, "gpu_seconds": r.gpu_seconds, "cpu_seconds": r.cpu_seconds,
            "time_limit": r.time_limit, "cancelled_by": r.cancelled_by, "preemptions": r.preemptions,
            "archive_seq": r.archive_seq, "array_job": None, "array_index": None, "dependency": None,
            **goodput_row(r.goodput)}


def goodput_row(g: Goodput) -> dict[str, float]:
    """The goodput columns (GOODPUT_COLUMNS) of a row."""
    return {"held_gpu_seconds": g.held, "kept_gpu_seconds": g.kept, "lost_failures_gpu_seconds": g.lost_failures,
            "lost_restarts_gpu_seconds": g.lost_restarts, "lost_other_gpu_seconds": g.lost_other,
            "requeue_wait_gpu_seconds": g.requeue_wait}


def goodput_of_row(row: dict[str, Any]) -> Goodput:
    """A row's goodput columns (None, as a sum over no rows gives, reads 0)."""
    held, kept, failures, restarts, other, wait = (row.get(name) or 0.0 for name in GOODPUT_COLUMNS)
    return Goodput(held, kept, failures, restarts, other, wait)


def run_row(r: RunRecord) -> dict[str, Any]:
    """A placed attempt's row of history_runs."""
    return {"job_id": r.job_id, "attempt": r.attempt, "user_name": r.user, "queue": r.queue, "start_at": r.start,
            "running_at": r.running, "end_at": r.end, "nodes": ",".join(r.nodes), "tasks": r.tasks,
            "cpu_millis": r.cpu, "memory_bytes": r.memory, "gpus": r.gpu, "outcome": r.outcome, "reason": r.reason,
            "exit_code": r.exit_code, "gpu_seconds": r.gpu_seconds, "cpu_seconds": r.cpu_seconds,
            "checkpoint_at": r.checkpoint_at}


def usage_rows(new_runs: list[RunRecord], new_jobs: list[JobRecord]) -> list[dict[str, Any]]:
    """The daily usage rows to add: each new run's seconds spread over the UTC days it ran, and one
    job on the day each new job ended (one row per key, as one upsert may touch a row only once)."""
    sums: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    spent: dict[tuple[str, str, str], Goodput] = defaultdict(Goodput)
    for run in new_runs:
        for day, share in day_shares(run.start, run.end):
            entry = sums[(day, run.user, run.queue)]
            entry[0] += run.gpu_seconds * share
            entry[1] += run.cpu_seconds * share
    for job in new_jobs:
        key = (day_of(job.end), job.user, job.queue)
        sums[key][2] += 1
        spent[key] += job.goodput
    return [{"day": d, "user_name": u, "queue": q, "gpu_seconds": g, "cpu_seconds": c, "jobs": int(n),
             **goodput_row(spent.get((d, u, q), Goodput()))}
            for (d, u, q), (g, c, n) in sorted(sums.items())]
