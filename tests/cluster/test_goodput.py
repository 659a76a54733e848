"""Goodput on a real cluster: a task writes progress and a checkpoint, its worker is killed, and describe
job, the history store and /metrics account for it; and an older history store gains the goodput
columns, on SQLite and PostgreSQL (the accounting itself is in tests/unit/test_goodput.py)."""

from __future__ import annotations

import json
import time

import pytest

from synapse.core import codec
from synapse.core.goodput import Goodput
from synapse.core.model import JobSpec, Resources
from tests.support.helpers import wait_for

#: Rank 0 writes a step, then a checkpoint (now), then garbage twice; both tasks run on.
TRAIN = ("sh", "-c", 'if [ "$RANK" = 0 ]; then echo "step=5" >> "$SYNAPSE_PROGRESS_FILE"; sleep 0.3; '
                     'echo "step=10 checkpoint=$(date +%s)" >> "$SYNAPSE_PROGRESS_FILE"; sleep 2; '
                     'echo "oops" >> "$SYNAPSE_PROGRESS_FILE"; sleep 1.5; '
                     'echo "oops again" >> "$SYNAPSE_PROGRESS_FILE"; '
                     'fi; sleep 300')


@pytest.mark.slow
def test_a_killed_worker_costs_the_work_since_the_checkpoint_a_failover_kept(make_cluster):
    cluster = make_cluster(workers=3, racks=1, gpus=8)
    spec = JobSpec(name="train", tasks=2, resources=Resources(100, 64 << 20, 8), command=TRAIN, max_restarts=0)
    job_id = cluster.client.submit(codec.job_spec_to_proto(spec))
    info = wait_for(lambda: (lambda j: j if j.checkpoint_at and j.step == 10 else None)(cluster.client.get_job(job_id)),
                    timeout=30, what="the checkpoint in describe job")
    checkpoint_at = info.checkpoint_at
    assert abs(checkpoint_at - time.time()) < 10 and info.status == "RUNNING"
    ignored = wait_for(lambda: [e for e in cluster.client.get_job(job_id).events if e.kind == "ProgressIgnored"],
                       timeout=20, what="the garbage said")
    assert "ignored: not key=value: 'oops'" in ignored[0].message
    rank0 = next(t.node_id for t in info.tasks if t.rank == 0)
    # A new leader knows the checkpoint from the log (its memory of reports starts empty).
    cluster.kill_master(cluster.wait_leader())
    cluster.wait_leader()
    assert wait_for(lambda: cluster.client.get_job(job_id).checkpoint_at == checkpoint_at, timeout=20,
                    what="the checkpoint after a failover")
    time.sleep(max(0.0, 2.0 - (time.time() - checkpoint_at)))  # the garbage is written; the checkpoint is old
    killed_at = time.time()
    cluster.kill_worker(rank0, with_tasks=True)
    again = wait_for(lambda: (lambda j: j if j.attempt == 2 and j.status == "RUNNING" else None)(
        cluster.client.get_job(job_id)), timeout=30, what="attempt 2 running")
    back_at = time.time()
    assert rank0 not in {t.node_id for t in again.tasks}
    assert [e.kind for e in again.events].count("ProgressIgnored") == 1  # said once
    g = again.goodput
    lost = g.lost_failures_gpu_s / 16  # seconds of the 2 x 8-GPU gang
    assert killed_at - checkpoint_at - 1.5 <= lost <= back_at - checkpoint_at + 1.5, (lost, g)
    assert g.kept_gpu_s / 16 == pytest.approx(checkpoint_at - info.started_at, abs=1.5)
    assert g.held_gpu_s == pytest.approx(g.kept_gpu_s + g.lost_failures_gpu_s + g.lost_restarts_gpu_s
                                         + g.lost_other_gpu_s)
    assert g.lost_other_gpu_s == 0 and g.requeue_wait_gpu_s >= 0
    from tests.support.cluster import synctl

    described = synctl(cluster, "describe", "job", job_id)
    assert "Goodput:" in described.output and "Progress:" in described.output, described.output
    # The history store has the columns; /metrics exports the queue's goodput.
    cluster.client.cancel(job_id)
    row = wait_for(lambda: _history_row(cluster, job_id), timeout=30, what="the job in the history store")
    assert row["lost_failures_gpu_seconds"] == pytest.approx(g.lost_failures_gpu_s, abs=1.0)
    assert row["held_gpu_seconds"] > row["kept_gpu_seconds"] > 0
    usage = json.loads(synctl(cluster, "usage", "--by", "queue", "--goodput", "-o", "json").output)["usage"]
    assert usage[0]["goodput"]["lost_failures_gpu_hours"] > 0
    assert "LOST:FAILURES" in synctl(cluster, "usage", "--by", "queue", "--goodput").output
    from tests.support.http import get

    leader = cluster.wait_leader()  # (the first master may be the one killed above)
    http = next(m["http_address"] for m in cluster.state["masters"] if m["id"] == leader)
    status, text = get(http, "/metrics", ca=cluster.state["ca"])
    assert status == 200 and 'synapse_goodput{queue="default"}' in text
    assert 'synapse_goodput_gpu_hours{part="lost_failures",queue="default"}' in text


def _history_row(cluster, job_id: str) -> dict | None:
    import sqlalchemy as sa

    engine = sa.create_engine(f"sqlite:///{cluster.data_dir / 'history.sqlite'}")
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("select * from history_jobs where job_id = :j"), {"j": job_id})
            row = rows.mappings().first()
            return dict(row) if row else None
    except sa.exc.OperationalError:
        return None
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.sqlite'}"
    return request.getfixturevalue("postgres").create(f"g{int(time.time() * 1000)}")


def _version_2_store(url: str) -> None:
    """The tables as schema version 2 made them: without the goodput columns."""
    import sqlalchemy as sa

    from synapse.history import schema

    old = sa.MetaData()
    added = {*schema.GOODPUT_COLUMNS, "checkpoint_at"}
    for table in (schema.jobs, schema.runs, schema.usage_daily, schema.cursor_table, schema.cluster_daily,
                  schema.cluster_sampled, schema.schema_table):
        sa.Table(table.name, old, *(col._copy() for col in table.c if col.name not in added))
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        old.create_all(conn)
        conn.execute(old.tables["history_cursor"].insert().values(id=1, upto=0, updated_at=0.0))
        conn.execute(old.tables["history_cluster_sampled"].insert().values(id=1, at=0.0))
        conn.execute(old.tables["history_schema"].insert(), [{"version": 1}, {"version": 2}])
        conn.execute(old.tables["history_usage_daily"].insert().values(
            day="2023-11-14", user_name="u", queue="default", gpu_seconds=3600.0, cpu_seconds=0.0, jobs=1))
    engine.dispose()


def test_a_version_2_store_gains_the_goodput_columns_and_old_rows_read_zero(store_url):
    from synapse.core import history
    from synapse.history.schema import SCHEMA_VERSION, goodput_of_row
    from synapse.history.store import HistoryStore, JobQuery
    from tests.support.core import scenario

    _version_2_store(store_url)
    store = HistoryStore(store_url)
    try:
        assert store.migrate() == 2 and SCHEMA_VERSION == 3
        assert store.migrate() == 3  # once only
        [old] = store.usage("day", 0, 0)
        assert goodput_of_row(old) == Goodput()  # written before version 3: zeros
        batch = history.export_batch(scenario(), 0)
        assert store.export(batch.records, expected=0, upto=batch.upto, at=1.0) == len(batch.records)
        rows, _ = store.jobs(JobQuery(limit=5000))
        by_id = {r["job_id"]: r for r in rows}
        for record in batch.records:
            assert goodput_of_row(by_id[record.job_id]) == record.goodput
            assert [r["checkpoint_at"] for r in by_id[record.job_id]["runs"]] == [r.checkpoint_at for r in record.runs]
        held = sum(goodput_of_row(r).held for r in store.usage("queue", 0, 0))
        assert held == pytest.approx(sum(r.goodput.held for r in batch.records)) and held > 0
    finally:
        store.close()
