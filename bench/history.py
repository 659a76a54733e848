"""The history store: export throughput, and query latency over a large table, on both backends.

    python bench/history.py              # 20,000 jobs exported; queries over 1,000,000 stored jobs
    python bench/history.py --quick      # small sizes, the same code paths (CI)
    python bench/history.py --json

Export: jobs run through the replicated state machine (submit, place, start, exit), then the
exporter's own steps run back to back as on the master that writes (a follower;
synapse.history.exporter): `export_batch` picks the next 2,000 finished jobs from the state and
builds their records, `HistoryStore.export` upserts them with their runs and daily usage and moves
the cursor in one transaction. Reported: finished jobs archived per second
(target: at least 2,000/s on both backends).

Queries: the store is filled with synthetic finished jobs (one run each) spread over 90 days, 100
users and 10 queues, then `synctl history --user U --since 30d` (the store's query: that user's
jobs of the last 30 days, the first page of 1,000) and `synctl usage --by queue --since 30d` run
with random users; p50 and p99 are the store call's own time, without gRPC (target: p99 <= 200 ms
over 1,000,000 jobs).

SQLite is a file in a temporary directory; PostgreSQL is a throwaway server (synapse/local/postgres.py),
or skipped, saying why, where it cannot run.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from support.measure import percentile  # noqa: E402

from synapse.core import commands as c  # noqa: E402
from synapse.core.history import JobRecord, RunRecord, export_batch  # noqa: E402
from synapse.core.model import JobSpec, Placement, Resources  # noqa: E402
from synapse.core.state.fsm import ClusterState  # noqa: E402
from synapse.history.schema import job_row, jobs, run_row, runs, usage_daily, usage_rows  # noqa: E402
from synapse.history.store import HistoryStore, JobQuery  # noqa: E402
from synapse.local.postgres import PostgresServer, unavailable  # noqa: E402

DAY = 86400.0
NOW = 1_790_000_000.0


def finished_state(n: int) -> ClusterState:
    """A state with `n` finished one-task jobs on 64 nodes, through apply as a cluster runs them."""
    state = ClusterState()
    for i in range(64):
        state.apply(c.RegisterNode(at=0, node_id=f"n{i}", address=f"h{i}:1", topology=("z", "b", f"r{i // 16}"),
                                   capacity=Resources(64_000, 512 << 30, 8)))
    spec = JobSpec(name="bench", tasks=1, resources=Resources(4000, 16 << 30, 8), command=("true",))
    for i in range(n):
        job_id, node, t = f"job-{i:07d}", f"n{i % 64}", float(i)
        state.apply(c.SubmitJob(at=t, by=f"u{i % 100}", job_id=job_id, request_id=job_id, spec=spec))
        state.apply(c.CommitPlan(at=t + 1, job_id=job_id, attempt=1,
                                 placements=(Placement(0, node, tuple(range(8)), 0),)))
        state.apply(c.TaskStarted(at=t + 2, job_id=job_id, attempt=1, index=0, node_id=node))
        state.apply(c.TaskExited(at=t + 60, job_id=job_id, attempt=1, index=0, node_id=node,
                                 exit_code=1 if i % 7 == 0 else 0))
    return state


def export_rate(store: HistoryStore, state: ClusterState) -> dict:
    """Archive every finished job of `state` the way the exporter does; jobs per second."""
    store.migrate()
    cursor, exported = store.cursor(), 0
    started = time.perf_counter()
    while True:
        batch = export_batch(state, cursor)
        if not batch.records:
            break
        store.export(batch.records, cursor, batch.upto, time.time())
        cursor, exported = batch.upto, exported + len(batch.records)
    seconds = time.perf_counter() - started
    again = time.perf_counter()
    store.export(export_batch(state, 0, limit=2000).records, cursor, cursor, time.time())  # a retried batch
    return {"jobs": exported, "seconds": round(seconds, 3), "jobs_per_s": round(exported / seconds),
            "retried_batch_s": round(time.perf_counter() - again, 3)}


def synthetic(i: int, rng: random.Random) -> JobRecord:
    end = NOW - rng.uniform(0, 90 * DAY)
    start = end - rng.uniform(60, 8 * 3600)
    user, queue, gpus = f"u{rng.randrange(100)}", f"q{rng.randrange(10)}", rng.choice((1, 2, 4, 8))
    job_id = f"syn-{i:08d}"
    run = RunRecord(job_id=job_id, attempt=1, user=user, queue=queue, start=start, running=start + 5, end=end,
                    nodes=("n1",), tasks=1, cpu=8000, memory=64 << 30, gpu=gpus, outcome="Completed", reason="",
                    exit_code=0, gpu_seconds=gpus * (end - start), cpu_seconds=8 * (end - start))
    return JobRecord(job_id=job_id, name="syn", user=user, queue=queue, priority=0, submit=start - 30,
                     eligible=start - 30, start=start, end=end, state="SUCCEEDED", reason="Completed", detail="",
                     exit_code=0, attempts=1, tasks=1, nodes=("n1",), cpu=8000, memory=64 << 30, gpu=gpus,
                     gpu_seconds=run.gpu_seconds, cpu_seconds=run.cpu_seconds, time_limit=0.0, cancelled_by="",
                     preemptions=0, archive_seq=i + 1, runs=(run,))


def fill(store: HistoryStore, n: int) -> float:
    """Insert `n` synthetic jobs (bulk, 10,000 a transaction); seconds taken."""
    store.migrate()
    rng = random.Random(7)
    started = time.perf_counter()
    for first in range(0, n, 10_000):
        batch = [synthetic(i, rng) for i in range(first, min(n, first + 10_000))]
        with store.engine.begin() as conn:
            conn.execute(jobs.insert(), [job_row(r) for r in batch])
            conn.execute(runs.insert(), [run_row(r.runs[0]) for r in batch])
            # one usage row per key per batch, added to what earlier batches wrote
            insert = store._insert(usage_daily)
            conn.execute(insert.on_conflict_do_update(
                index_elements=[usage_daily.c.day, usage_daily.c.user_name, usage_daily.c.queue],
                set_={"gpu_seconds": usage_daily.c.gpu_seconds + insert.excluded.gpu_seconds,
                      "cpu_seconds": usage_daily.c.cpu_seconds + insert.excluded.cpu_seconds,
                      "jobs": usage_daily.c.jobs + insert.excluded.jobs}),
                [*usage_rows([r.runs[0] for r in batch], batch)])
    if store.dialect == "postgresql":
        with store.engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
    return time.perf_counter() - started


def query_latency(store: HistoryStore, trials: int) -> dict:
    rng = random.Random(11)
    since = NOW - 30 * DAY
    hist, usage, rows = [], [], []
    for _ in range(trials):
        t = time.perf_counter()
        found, _more = store.jobs(JobQuery(user=f"u{rng.randrange(100)}", since=since, limit=1000))
        hist.append(time.perf_counter() - t)
        rows.append(len(found))
        t = time.perf_counter()
        store.usage("queue", since, NOW)
        usage.append(time.perf_counter() - t)
    ms = lambda xs, q: round(percentile(xs, q / 100) * 1000, 1)  # noqa: E731
    return {"history_user_30d_p50_ms": ms(hist, 50), "history_user_30d_p99_ms": ms(hist, 99),
            "history_rows_per_query": round(sum(rows) / len(rows)),
            "usage_queue_30d_p50_ms": ms(usage, 50), "usage_queue_30d_p99_ms": ms(usage, 99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--export-jobs", type=int, default=None)
    parser.add_argument("--stored-jobs", type=int, default=None)
    args = parser.parse_args()
    n_export = args.export_jobs or (2_000 if args.quick else 20_000)
    n_stored = args.stored_jobs or (20_000 if args.quick else 1_000_000)
    trials = 30 if args.quick else 200
    state = finished_state(n_export)
    results: dict = {"export_jobs": n_export, "stored_jobs": n_stored, "backends": {}}
    why = unavailable()
    server = PostgresServer() if not why else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            urls = {"sqlite": (f"sqlite:///{tmp}/export.sqlite", f"sqlite:///{tmp}/query.sqlite")}
            if server is not None:
                urls["postgresql"] = (server.create("export"), server.create("query"))
            for backend, (export_url, query_url) in urls.items():
                out: dict = {}
                store = HistoryStore(export_url)
                out["export"] = export_rate(store, state)
                store.close()
                store = HistoryStore(query_url)
                out["fill_s"] = round(fill(store, n_stored), 1)
                out["queries"] = query_latency(store, trials)
                store.close()
                results["backends"][backend] = out
    finally:
        if server is not None:
            server.destroy()
    if why:
        results["backends"]["postgresql"] = {"skipped": why}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"history store: {n_export:,} jobs exported, queries over {n_stored:,} stored jobs")
    for backend, out in results["backends"].items():
        if "skipped" in out:
            print(f"  {backend:10s} skipped: {out['skipped']}")
            continue
        e, q = out["export"], out["queries"]
        print(f"  {backend:10s} export {e['jobs_per_s']:>7,} jobs/s ({e['jobs']:,} in {e['seconds']} s; a retried "
              f"batch of 2,000: {e['retried_batch_s']} s)")
        print(f"  {'':10s} history --user U --since 30d: p50 {q['history_user_30d_p50_ms']} ms, p99 "
              f"{q['history_user_30d_p99_ms']} ms ({q['history_rows_per_query']} rows); usage --by queue "
              f"--since 30d: p50 {q['usage_queue_30d_p50_ms']} ms, p99 {q['usage_queue_30d_p99_ms']} ms "
              f"(filled in {out['fill_s']} s)")


if __name__ == "__main__":
    main()
