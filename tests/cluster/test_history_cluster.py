"""Job history on a real cluster: three masters and two workers on loopback, with the default SQLite
store in the data dir and with a PostgreSQL server of the tests' own. Jobs that succeed, fail and
are cancelled appear in `synctl history` exactly once, also when the leader is killed with SIGKILL
while jobs finish; a job past its retention still answers `describe`; `-o sacct` imports into the
simulator; `usage` sums the GPU-hours and reports the cluster's utilisation, sampled by the leader."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from synapse.client.master_client import ClientError
from synapse.core import codec
from synapse.core.model import JobSpec, Resources
from synapse.sim.main import main as sim_main
from tests.support.cluster import archived_ids, history, synctl
from tests.support.helpers import wait_for
from tests.support.http import fetch, get


def submit(cluster, name: str, command: list[str], gpu: int = 1) -> str:
    spec = JobSpec(name=name, tasks=1, resources=Resources(100, 64 << 20, gpu), command=tuple(command))
    return cluster.client.submit(codec.job_spec_to_proto(spec))


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request) -> str:
    """The history store of a cluster: '' (synapse-local's SQLite default) or a PostgreSQL database."""
    if request.param == "sqlite":
        return ""
    return request.getfixturevalue("postgres").create(f"c{int(time.time() * 1000)}")


def stored_rows(cluster, url: str) -> list[tuple[str, int]]:
    """(job id, rows) of the store's jobs table."""
    import sqlalchemy as sa

    engine = sa.create_engine(url or f"sqlite:///{cluster.data_dir / 'history.sqlite'}")
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("select job_id, count(*) from history_jobs group by job_id"))
            return [tuple(r) for r in rows]
    finally:
        engine.dispose()


@pytest.mark.slow
def test_finished_jobs_are_archived_exactly_once_across_a_leader_kill(make_cluster, tmp_path, store_url):
    begun = time.time()
    cluster = make_cluster(masters=3, workers=2, gpus=2, job_retention="2s", history=store_url)
    expected = {submit(cluster, "ok", ["true"]): "SUCCEEDED", submit(cluster, "bad", ["sh", "-c", "exit 3"]): "FAILED"}
    long = submit(cluster, "long", ["sleep", "60"])
    wait_for(lambda: cluster.client.get_job(long).status == "RUNNING", what="the long job to run")
    cluster.client.cancel(long)
    expected[long] = "CANCELLED"
    # jobs finishing while the leader dies: some end before the kill, some after
    for i in range(8):
        expected[submit(cluster, f"brief{i}", ["sleep", str(0.2 * (i % 4))])] = "SUCCEEDED"
    time.sleep(0.5)
    leader = cluster.wait_leader()
    cluster.kill_master(leader)
    cluster.wait_leader(exclude=leader)
    cluster.restart_master(leader)

    def archived() -> dict[str, str]:
        return {j["id"]: j["state"] for j in history(cluster)}

    wait_for(lambda: set(archived()) >= set(expected), timeout=60, what="every job in history")
    assert {k: v for k, v in archived().items() if k in expected} == expected
    rows = stored_rows(cluster, store_url)
    assert sorted(job_id for job_id, _ in rows) == sorted(expected) and all(n == 1 for _, n in rows)
    bad = next(j for j in history(cluster, "--state", "failed"))
    assert (bad["reason"], bad["exit_code"], bad["attempts"], len(bad["runs"])) == ("Error", 3, 1, 1)
    cancelled = history(cluster, "--job", long)[0]
    assert cancelled["reason"] == "Cancelled" and cancelled["cancelled_by"] == "admin"

    # past its retention (2 s from the archive; swept every 10 s) the state forgets it; describe still answers
    ok = next(job_id for job_id, state in expected.items() if state == "SUCCEEDED")

    def forgotten() -> bool:
        try:
            cluster.client.get_job(ok)
        except ClientError:
            return True
        return False

    wait_for(forgotten, timeout=40, what="the job to be forgotten")
    described = synctl(cluster, "describe", "job", ok)
    assert described.exit_code == 0 and "from history: SUCCEEDED (Completed)" in described.output, described.output
    assert synctl(cluster, "describe", "job", "no-such-job").exit_code == 2

    sacct = tmp_path / "month.txt"
    out = synctl(cluster, "history", "-o", "sacct", "--since", "1d")
    assert out.exit_code == 0, out.output
    sacct.write_text(out.output)
    imported = CliRunner().invoke(sim_main, ["import-sacct", str(sacct), "-o", str(tmp_path / "t.csv")])
    assert imported.exit_code == 0, imported.output
    trace_rows = (tmp_path / "t.csv").read_text().strip().splitlines()
    assert len([r for r in trace_rows if r and not r.startswith("#")]) - 1 == len(expected)  # all ran on a GPU

    report = json.loads(synctl(cluster, "usage", "--by", "queue", "--since", "1d", "-o", "json").output)
    usage = report["usage"]
    assert [u["key"] for u in usage] == ["default"] and usage[0]["jobs"] == len(expected)
    assert usage[0]["gpu_hours"] > 0
    def utilisation() -> dict | None:  # the leader samples every 30 s; the first only starts the clock
        total = json.loads(synctl(cluster, "usage", "-o", "json").output)["cluster"]["total"]
        return total if sum(v for k, v in total["gpu"].items() if k.endswith("_hours")) > 0 else None

    total = wait_for(utilisation, timeout=75, what="a cluster utilisation sample", every=1.0)
    gpu_hours = sum(v for k, v in total["gpu"].items() if k.endswith("_hours"))
    # two workers of 2 GPUs, never counted before the first sample nor twice across the leader kill
    assert gpu_hours <= (time.time() - begun) * 4 / 3600, total
    http = cluster.master(cluster.wait_leader())["http_address"]
    status, _, page = fetch(http, "/history?state=FAILED", cluster.token, ca=cluster.state["ca"])
    assert status == 200 and bad["id"] in page and ok not in page and "<script" not in page
    status, _, page = fetch(http, "/history?sort=user&order=asc&days=1", cluster.token, ca=cluster.state["ca"])
    assert status == 200 and all(job_id in page for job_id in expected)
    status, _, page = fetch(http, f"/jobs/{ok}", cluster.token, ca=cluster.state["ca"])
    assert status == 200 and "Past its retention" in page and "SUCCEEDED (Completed)" in page, page
    status, _, page = fetch(http, "/usage?days=2", cluster.token, ca=cluster.state["ca"])
    assert status == 200 and '<rect class="bar"' in page and "GPU-hours</title>" in page and "default" in page
    assert synctl(cluster, "history", "--since", "last week").exit_code == 2
    assert "--state: must be one of" in synctl(cluster, "history", "--state", "done").output


@pytest.mark.slow
def test_a_postgres_store_down_at_start_and_restarted_mid_run_loses_and_doubles_nothing(make_cluster, postgres):
    import sqlalchemy as sa

    url = postgres.create("cluster_history")
    postgres.stop()  # unreachable when the masters start: they start, serve and schedule all the same
    try:
        cluster = make_cluster(masters=3, workers=1, gpus=4, history=url)
        first = [submit(cluster, f"early{i}", ["true"]) for i in range(4)]
        wait_for(lambda: all(cluster.client.get_job(j).status == "SUCCEEDED" for j in first), timeout=30,
                 what="jobs to finish with the store down")
        leader = cluster.master(cluster.wait_leader())
        status, body = get(leader["http_address"], "/readyz?verbose", ca=cluster.state["ca"])
        assert status == 200 and "[+]history ok (lagging: history store" in body, body
        assert "synapse_history_store_failing 1.0" in get(leader["http_address"], "/metrics", ca=cluster.state["ca"])[1]
        down = synctl(cluster, "history")
        assert down.exit_code == 2 and "history store unavailable" in down.output, down.output
        assert "Connection refused" in down.output, down.output
        postgres.start()
        wait_for(lambda: archived_ids(cluster) >= set(first), timeout=60, what="the backlog archived")
        second = [submit(cluster, f"late{i}", ["sleep", "0.5"]) for i in range(4)]
        postgres.stop()  # the database restarts while these finish
        wait_for(lambda: all(cluster.client.get_job(j).status == "SUCCEEDED" for j in second), timeout=30,
                 what="jobs to finish during the restart")
        postgres.start()
        wait_for(lambda: archived_ids(cluster) >= set(first + second), timeout=60,
                 what="every job archived")
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            rows = conn.execute(sa.text("select job_id, count(*) from history_jobs group by job_id")).fetchall()
            cursor = conn.execute(sa.text("select upto from history_cursor")).scalar()
        engine.dispose()
        assert sorted(r[0] for r in rows) == sorted(first + second) and all(r[1] == 1 for r in rows)
        assert cursor == len(first + second)
        wait_for(lambda: "synapse_history_unarchived_jobs 0.0" in get(leader["http_address"], "/metrics",
                                                                      ca=cluster.state["ca"])[1],
                 what="nothing left unarchived")
    finally:
        postgres.start()


def exported(cluster, replica_id: str) -> float:
    """synapse_history_exported_jobs_total of one master: the job rows its process wrote (-1 while
    it does not answer)."""
    try:
        _, body = get(cluster.master(replica_id)["http_address"], "/metrics", ca=cluster.state["ca"])
    except OSError:
        return -1.0
    line = next(x for x in body.splitlines() if x.startswith("synapse_history_exported_jobs_total "))
    return float(line.split()[1])


@pytest.mark.slow
def test_a_follower_writes_the_rows_and_the_leader_takes_over_when_it_dies(make_cluster):
    """The leader's process spends nothing on the store's writes: the first follower by Raft
    address exports, the leader proposes the store's cursor. Once that follower is killed, the
    leader exports itself; back, the follower takes over again. Every job is stored once, and the
    state archives them all."""
    from synapse.history.exporter import TAKEOVER_S

    cluster = make_cluster(masters=3, workers=1, gpus=2, history="")
    leader = cluster.wait_leader()
    first = {submit(cluster, f"a{i}", ["true"], gpu=0) for i in range(4)}
    wait_for(lambda: archived_ids(cluster) >= first, timeout=30, what="the first jobs in history")
    ids = [m["id"] for m in cluster.state["masters"]]
    wait_for(lambda: sum(exported(cluster, i) for i in ids) >= len(first), what="the rows counted")
    writers = {i: exported(cluster, i) for i in ids}
    assert writers[leader] == 0 and sum(1 for n in writers.values() if n) == 1, writers
    follower = next(i for i, n in writers.items() if n)

    cluster.kill_master(follower)
    second = {submit(cluster, f"b{i}", ["true"], gpu=0) for i in range(4)}
    # the leader hears the follower gone (its link drops) and exports without waiting TAKEOVER_S
    wait_for(lambda: archived_ids(cluster) >= second, timeout=TAKEOVER_S, what="the leader to take over")
    assert exported(cluster, leader) >= len(second)

    cluster.restart_master(follower)
    wait_for(lambda: exported(cluster, follower) == 0, what="the follower back")  # a new process
    # Until the leader hears the new process (its link, then its version), the leader goes on
    # exporting: finished jobs go to whichever of them the leader deems the exporter.
    third: set[str] = set()
    deadline = time.monotonic() + 30
    while exported(cluster, follower) <= 0:
        assert time.monotonic() < deadline, "the follower did not export again"
        third.add(submit(cluster, f"c{len(third)}", ["true"], gpu=0))
        time.sleep(0.5)
    wait_for(lambda: archived_ids(cluster) >= third, timeout=30, what="the last jobs in history")
    rows = stored_rows(cluster, "")
    assert sorted(job_id for job_id, _ in rows) == sorted(first | second | third) and all(n == 1 for _, n in rows)
    http = cluster.master(cluster.wait_leader())["http_address"]
    wait_for(lambda: "synapse_history_unarchived_jobs 0.0" in get(http, "/metrics", ca=cluster.state["ca"])[1],
             timeout=30, what="every finished job archived in the state")
