"""The history store against both real backends: SQLite, and a PostgreSQL server the tests start."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import sqlalchemy as sa

from synapse.core import history
from synapse.history import store as store_module
from synapse.history.schema import MIGRATIONS, SCHEMA_VERSION, jobs, runs, schema_table, usage_daily
from synapse.history.store import CursorMoved, HistoryStore, JobQuery, StoreError, check_url
from tests.support.core import scenario

_names = itertools.count()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    else:
        url = request.getfixturevalue("postgres").create(f"h{next(_names)}")
    s = HistoryStore(url)
    s.migrate()
    yield s
    s.close()


def records() -> tuple[history.JobRecord, ...]:
    return history.export_batch(scenario(), 0).records


def counts(store: HistoryStore) -> tuple[int, int, float, int]:
    with store.engine.connect() as conn:
        return (conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar(),
                conn.execute(sa.select(sa.func.count()).select_from(runs)).scalar(),
                conn.execute(sa.select(sa.func.sum(usage_daily.c.gpu_seconds))).scalar() or 0.0,
                conn.execute(sa.select(sa.func.sum(usage_daily.c.jobs))).scalar() or 0)


def test_migrating_twice_is_harmless(store):
    assert store.migrate() == SCHEMA_VERSION == 3 and store.cursor() == 0


def test_an_export_written_twice_writes_each_row_once(store):
    batch = records()
    assert store.export(batch, expected=0, upto=3, at=1.0) == 3
    once = counts(store)
    assert once == (3, 3, 8 * 11 * 2 + 8 * 11 * 2, 3)  # ok: 2 tasks; bad: two runs of one task
    # a new leader that never saw the HistoryExported proposal writes the same jobs again
    assert store.export(batch, expected=3, upto=3, at=2.0) == 0
    assert counts(store) == once and store.cursor() == 3


def test_the_cursor_moves_only_from_the_one_the_batch_was_computed_against(store):
    batch = records()
    store.export(batch[:1], expected=0, upto=1, at=1.0)
    with pytest.raises(CursorMoved):
        store.export(batch[1:], expected=0, upto=3, at=2.0)  # a deposed leader's stale batch
    assert store.cursor() == 1 and counts(store)[0] == 1


def test_a_failed_transaction_moves_nothing(store):
    good, broken = records()[0], dataclasses.replace(records()[1], name=None)  # NOT NULL violated
    with pytest.raises(StoreError):
        store.export([good, broken], expected=0, upto=2, at=1.0)
    assert store.cursor() == 0 and counts(store) == (0, 0, 0.0, 0)


def test_queries_filter_page_and_carry_runs(store):
    store.export(records(), expected=0, upto=3, at=1.0)
    rows, more = store.jobs(JobQuery(state="FAILED"))
    assert [r["job_id"] for r in rows] == ["bad"] and not more
    assert [(r["attempt"], r["outcome"], r["exit_code"]) for r in rows[0]["runs"]] == [
        (1, "Error", 3), (2, "OOMKilled", 137)]
    assert [r["job_id"] for r in store.jobs(JobQuery(since=300, until=400))[0]] == ["bad"]
    first, more = store.jobs(JobQuery(limit=2))
    assert [r["job_id"] for r in first] == ["ok", "bad"] and more
    rest, more = store.jobs(JobQuery(limit=2, after_end=first[-1]["end_at"], after_id=first[-1]["job_id"]))
    assert [r["job_id"] for r in rest] == ["never"] and not more
    assert store.jobs(JobQuery(user="nobody"))[0] == []


def test_usage_sums_gpu_time_per_user_queue_and_day(store):
    store.export(records(), expected=0, upto=3, at=1.0)
    (by_queue,) = store.usage("queue", 0, 0)
    assert by_queue["key"] == "default" and by_queue["gpu_seconds"] == pytest.approx(352.0)
    assert by_queue["jobs"] == 3
    assert [row["key"] for row in store.usage("day", 0, 0)] == ["1970-01-01"]
    assert store.usage("user", 10 * 86400, 0) == []


def test_purging_old_rows_keeps_the_daily_usage(store):
    store.export(records(), expected=0, upto=3, at=1.0)
    assert store.purge(before=350) == 2  # ok and bad ended before 350; never at 410
    assert counts(store)[:2] == (1, 0) and counts(store)[2] == pytest.approx(352.0)


def test_an_unreachable_store_says_why():
    with pytest.raises(StoreError, match="OperationalError"):
        HistoryStore("postgresql+psycopg://nobody@127.0.0.1:1/none", connect_timeout=1).migrate()


@pytest.mark.parametrize(("url", "why"), [
    ("mysql://x@h/db", "unsupported database 'mysql'"), ("not a url", "not a database URL"),
    ("sqlite://", "needs a file"), ("postgresql://u@h", "needs a database name")])
def test_a_malformed_url_is_refused_saying_why(url, why):
    with pytest.raises(ValueError, match=why):
        check_url(url)
    assert check_url("postgresql://u:p@h/db") == "postgresql+psycopg://u:p@h/db"


def test_the_cluster_file_refuses_a_malformed_history_url_naming_the_field():
    from synapse.master.config import ConfigError, parse_cluster_config

    base = {"raft_password": "pw", "replicas": [{"id": "m1", "raft": "127.0.0.1:1", "api": "127.0.0.1:2"}]}
    with pytest.raises(ConfigError, match=r"^history\.url: unsupported database 'mysql'"):
        parse_cluster_config({**base, "history": {"url": "mysql://u@h/db"}})
    with pytest.raises(ConfigError, match=r"^history\.retention:"):
        parse_cluster_config({**base, "history": {"url": "sqlite:////tmp/h.sqlite", "retention": "soon"}})
    config = parse_cluster_config({**base, "history": {"url": "postgresql://u@h/db", "retention": "90d"}})
    assert config.history.url == "postgresql+psycopg://u@h/db" and config.history.retention == 90 * 86400
    assert parse_cluster_config(base).history is None


def history_jobs(store: HistoryStore, **query) -> list:
    import asyncio

    from synapse.master.api import history as history_api
    from synapse.proto import api_pb2

    class Holder:
        pass

    holder = Holder()
    holder.store = store
    return list(asyncio.run(history_api.list_history(holder, api_pb2.ListHistoryRequest(**query))).jobs)


def test_sacct_output_imports_into_the_simulator(store):
    from synapse.client.accounting import SACCT_FIELDS, sacct_lines
    from synapse.sim.sacct import parse

    store.export(records(), expected=0, upto=3, at=1.0)
    lines = sacct_lines(history_jobs(store), "prod")
    assert lines[0].split("|") == list(SACCT_FIELDS) and len(lines) == 4
    row = dict(zip(SACCT_FIELDS, lines[2].split("|"), strict=True))  # bad: its last run
    assert (row["JobID"], row["State"], row["ExitCode"], row["Elapsed"], row["AllocTRES"], row["NodeList"]) == (
        "bad", "OUT_OF_MEMORY", "0:9", "00:00:11", "cpu=1,mem=1024M,node=1,gres/gpu=8", "r0-n1")
    assert dict(zip(SACCT_FIELDS, lines[3].split("|"), strict=True))["Start"] == "None"  # cancelled pending
    trace, skipped = parse("\n".join(lines))
    assert skipped["never started"] == 1
    assert [(j.id, j.gpus, j.nodes, j.duration, j.exit_code) for j in trace.jobs] == [
        ("ok", 16, 2, 11.0, 0), ("bad", 8, 1, 11.0, 1)]
    assert [j.submit for j in trace.jobs] == [0.0, 100.0]  # from the ok job's submission
    with_runs = sacct_lines(history_jobs(store, job_id="bad"), "prod", header=False, duplicates=True)
    assert [line.split("|")[15] for line in with_runs] == ["REQUEUED", "OUT_OF_MEMORY"]


def test_a_history_request_with_a_bad_field_is_refused_naming_it(store):
    import asyncio

    from synapse.master.api import history as history_api
    from synapse.proto import api_pb2

    with pytest.raises(history_api.BadRequest, match="^state: must be one of"):
        history_jobs(store, state="DONE")
    with pytest.raises(history_api.BadRequest, match="^by: must be one of"):
        asyncio.run(history_api.usage(None, api_pb2.GetUsageRequest(by="team")))


def test_times_are_durations_back_from_now_or_utc_dates():
    from synapse.client.accounting import TimeError, parse_time

    assert parse_time("7d", "--since", now=1_000_000.0) == 1_000_000.0 - 7 * 86400
    assert parse_time("2023-11-15", "--since", now=0) == 1_700_006_400.0
    assert parse_time("2023-11-15T01:00", "--until", now=0) == 1_700_006_400.0 + 3600
    assert parse_time("", "--since", now=5) == 0.0
    for bad in ("yesterday", "2023-13-40", "-3d"):
        with pytest.raises(TimeError, match=r"^--since: .* is neither a duration"):
            parse_time(bad, "--since", now=0)


DAY = 1_700_006_400.0  # 2023-11-15T00:00:00Z


def test_a_version_1_store_migrates_to_the_cluster_tables(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    with HistoryStore(url).engine.begin() as conn:  # as the release before wrote it
        schema_table.create(conn)
        MIGRATIONS[0][1](conn)
        conn.execute(schema_table.insert().values(version=1))
    old = HistoryStore(url)
    assert old.migrate() == 1 and old.cursor() == 0
    assert old.add_utilization(history.ClusterSample(idle_gpus=8), DAY) == 0.0  # starts the clock
    assert old.add_utilization(history.ClusterSample(idle_gpus=8), DAY + 30) == 30.0
    assert [d["idle_gpu_seconds"] for d in old.cluster_usage(0, 0)] == [240.0]
    old.close()


def test_cluster_utilization_adds_each_sample_to_its_days_once(store):
    sample = history.ClusterSample(allocated_gpus=6, idle_gpus=2, down_gpus=8, allocated_cpu=4000, idle_cpu=1000)
    assert store.add_utilization(sample, DAY - 40) == 0.0  # the first sample only starts the clock
    assert store.add_utilization(sample, DAY - 10) == 30.0
    assert store.add_utilization(sample, DAY + 20) == 30.0  # split at midnight: 10 s and 20 s
    assert store.add_utilization(sample, DAY + 20) == 0.0  # another leader at the same instant: nothing twice
    assert store.add_utilization(sample, DAY + 15) == 0.0  # a deposed leader's late sample: nothing
    assert store.add_utilization(history.ClusterSample(down_gpus=16), DAY + 10_000, max_gap=90) == 90.0
    days = store.cluster_usage(0, 0)
    assert [d["day"] for d in days] == ["2023-11-14", "2023-11-15"]
    assert [(d["allocated_gpu_seconds"], d["idle_gpu_seconds"], d["down_gpu_seconds"]) for d in days] == [
        (6 * 40, 2 * 40, 8 * 40), (6 * 20, 2 * 20, 8 * 20 + 16 * 90)]
    assert [(d["allocated_cpu_seconds"], d["idle_cpu_seconds"], d["down_cpu_seconds"]) for d in days] == [
        (4 * 40, 40, 0), (4 * 20, 20, 0)]
    assert [d["day"] for d in store.cluster_usage(DAY, 0)] == ["2023-11-15"]
    assert store.cluster_usage(0, DAY - 1) == days[:1]


def test_get_usage_carries_the_cluster_days_and_their_total(store):
    import asyncio

    from synapse.master.api import history as history_api
    from synapse.proto import api_pb2

    class Holder:
        pass

    holder = Holder()
    holder.store = store
    store.add_utilization(history.ClusterSample(allocated_gpus=2), DAY - 3600)
    store.add_utilization(history.ClusterSample(allocated_gpus=2, idle_gpus=6), DAY + 36, max_gap=7200)
    reply = asyncio.run(history_api.usage(holder, api_pb2.GetUsageRequest(by="day")))
    assert [(d.day, d.allocated_gpu_hours, d.idle_gpu_hours) for d in reply.cluster_days] == [
        ("2023-11-14", 2.0, 6.0), ("2023-11-15", 0.02, pytest.approx(0.06))]
    total = reply.cluster_total
    assert (total.day, total.allocated_gpu_hours, total.idle_gpu_hours, total.down_gpu_hours) == (
        "", 2.02, pytest.approx(6.06), 0.0)


@pytest.mark.parametrize("n", [1, 127, 128, 129, 300])
def test_a_batch_of_any_size_writes_every_row_with_its_own_values(store, n):
    """Rows go as multi-row statements of 128, 64, ... 1 rows (ROWS_PER_STATEMENT): each row's
    values land on its own row whatever the batch's size, and the usage sums count each once."""
    template = records()[0]  # "ok": one run on 2 tasks
    batch = [dataclasses.replace(template, job_id=f"j{i:04d}", name=f"name-{i}", priority=i, archive_seq=i + 1,
                                 runs=tuple(dataclasses.replace(r, job_id=f"j{i:04d}", exit_code=i % 7)
                                            for r in template.runs))
             for i in range(n)]
    assert store.export(batch, expected=0, upto=n, at=1.0) == n
    with store.engine.connect() as conn:
        got = {row.job_id: (row.name, row.priority, row.archive_seq)
               for row in conn.execute(sa.select(jobs.c.job_id, jobs.c.name, jobs.c.priority, jobs.c.archive_seq))}
        exits = {job_id: code for job_id, code in conn.execute(sa.select(runs.c.job_id, runs.c.exit_code))}
    assert got == {f"j{i:04d}": (f"name-{i}", i, i + 1) for i in range(n)}
    assert exits == {f"j{i:04d}": i % 7 for i in range(n)}
    per_job = sum(r.gpu_seconds for r in template.runs)
    assert counts(store) == (n, n * len(template.runs), pytest.approx(n * per_job), n)
    assert store.export(batch, expected=n, upto=n, at=2.0) == 0  # written again: nothing changes
    assert counts(store) == (n, n * len(template.runs), pytest.approx(n * per_job), n)


def test_an_older_sqlite_library_gets_statements_within_its_999_values(tmp_path, monkeypatch):
    """SQLite before 3.32 binds at most 999 values a statement: 28 rows of history_jobs' 35 columns."""
    monkeypatch.setattr(store_module, "SQLITE_MAX_PARAMS", 999)
    old = HistoryStore(f"sqlite:///{tmp_path / 'history.sqlite'}")
    old.migrate()
    upserts = old._upserts()
    assert upserts.jobs.sizes == (16, 8, 4, 2, 1) and max(upserts.jobs.sizes) * len(jobs.c) <= 999
    template = records()[0]
    batch = [dataclasses.replace(template, job_id=f"j{i:03d}", archive_seq=i + 1,
                                 runs=tuple(dataclasses.replace(r, job_id=f"j{i:03d}") for r in template.runs))
             for i in range(100)]
    assert old.export(batch, expected=0, upto=100, at=1.0) == 100
    assert counts(old)[:2] == (100, 100 * len(template.runs))
    old.close()
