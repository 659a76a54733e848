"""What a site runs, run as a site runs it (issue 33): `synapse-local up` from a shell that holds
another cluster's credentials, TLS on, real workers; operations that are not the job's fault
(drain, a worker killed) requeue a gang that has no restarts; secrets are not world-readable."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from synapse.client.cli.main import main as synctl
from synapse.client.master_client import MasterClient
from synapse.common.tls import http_base, issue
from synapse.core import codec
from synapse.local import cluster as local
from synapse.local.main import main as local_main
from tests.support.helpers import spec, wait_for

pytestmark = pytest.mark.slow

GANG = """\
name: survivor
tasks: 2
resources: {cpu: 1, memory: 1Gi, gpu: 8}
max_restarts: 0
command: ["sh", "-c", "echo attempt $SYNAPSE_ATTEMPT rank $RANK; sleep $SLEEP"]
env: {SLEEP: "%s"}
"""


def run_cli(*argv: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], env=env, capture_output=True, text=True, timeout=timeout)


def test_up_from_a_shell_with_another_clusters_credentials_runs_a_gang_over_tls(tmp_path):
    """`SYNAPSE_TOKEN=x synapse-local up`: the workers register with their join token, not the
    stray token; the cluster is TLS; a 2-task gang succeeds and no node goes DOWN meanwhile."""
    data_dir = tmp_path / "site"
    stray = {**os.environ, "SYNAPSE_TOKEN": "a-token-of-another-cluster", "SYNAPSE_CA": str(tmp_path / "no-ca.pem"),
             "SYNAPSE_MASTERS": "127.0.0.1:1"}
    base = local.free_base_port(3)
    up = run_cli("synapse.local.main", "up", "--data-dir", str(data_dir), "--workers", "2", "--base-port", str(base),
                 env=stray)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "dashboard: https://" in up.stdout
        exported = next(line for line in up.stdout.splitlines() if line.startswith("export "))
        env = {**os.environ, **dict(kv.split("=", 1) for kv in exported.split()[1:])}
        assert env["SYNAPSE_CA"].endswith("ca.pem")

        job_file = tmp_path / "gang.yaml"
        job_file.write_text(GANG % "1")
        submitted = run_cli("synapse.client.cli", "submit", "--wait", str(job_file), env=env)
        assert submitted.returncode == 0 and "Succeeded" in submitted.stdout, submitted.stdout + submitted.stderr

        # Every node stays READY (the followers' liveness digests reach the TLS leader).
        state = json.loads((data_dir / "cluster.json").read_text())
        with MasterClient([m["api_address"] for m in state["masters"]], state["token"],
                                tls=local.client_tls(state)) as client:
            end = time.monotonic() + 15
            while time.monotonic() < end:
                assert {n.id: n.status for n in client.list_nodes()} == {"w1": "READY", "w2": "READY"}
                time.sleep(1)

        # Secrets are the owner's alone.
        for path in [data_dir / "cluster.json", *(data_dir / "secrets").iterdir(), *(data_dir / "tls").glob("*key*")]:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode & 0o077 == 0, f"{path.name} is readable by others: {oct(mode)}"
    finally:
        down = run_cli("synapse.local.main", "down", "--data-dir", str(data_dir), env=stray)
        assert down.returncode == 0, down.stdout + down.stderr


def test_a_worker_given_a_token_and_a_join_token_refuses_to_start(tmp_path):
    join = tmp_path / "join-token"
    join.write_text("synjoin_x\n")
    out = run_cli("synapse.worker", "--masters", "127.0.0.1:1", "--data-dir", str(tmp_path / "w"),
                  "--join-token-file", str(join), env={**os.environ, "SYNAPSE_TOKEN": "stray"}, timeout=30)
    assert out.returncode == 2
    assert "--join-token-file" in out.stderr and "SYNAPSE_TOKEN" in out.stderr, out.stderr


def test_a_gang_without_restarts_survives_a_drain_and_a_killed_worker(make_cluster, tmp_path):
    """Done when (issue 33): max_restarts 0, a drain of one of its nodes, then kill -9 of another
    worker under it: SUCCEEDED at attempt 3, with no restart charged and one Requeued event each."""
    cluster = make_cluster(workers=4, racks=2)
    job_file = tmp_path / "gang.yaml"
    job_file.write_text(GANG % "6")

    def synctl_ok(*args: str) -> str:
        out = CliRunner().invoke(synctl, list(args), env=cluster.env, catch_exceptions=False)
        assert out.exit_code == 0, out.output
        return out.output

    job_id = synctl_ok("submit", str(job_file)).strip()

    def running(attempt: int):
        job = cluster.client.get_job(job_id)
        return job if job.status == "RUNNING" and job.attempt == attempt else None

    first = wait_for(lambda: running(1), what="attempt 1 to run")
    synctl_ok("drain", first.tasks[0].node_id)
    second = wait_for(lambda: running(2), what="attempt 2 to run after the drain")
    victim = next(t.node_id for t in second.tasks if t.node_id != first.tasks[0].node_id)
    cluster.kill_worker(victim, with_tasks=True)
    wait_for(lambda: running(3), what="attempt 3 to run after the worker was killed")
    done = wait_for(lambda: (j := cluster.client.get_job(job_id)).status in ("SUCCEEDED", "FAILED") and j,
                    what="the job to end")
    assert (done.status, done.attempt) == ("SUCCEEDED", 3), [e.message for e in done.events]
    events = [(e.kind, e.message) for e in done.events]
    requeued = [m for k, m in events if k == "Requeued"]
    assert len(requeued) == 2 and all("not charged to max_restarts" in m for m in requeued), requeued
    assert "drained" in requeued[0] and "lost" in requeued[1], requeued
    assert not any(k == "Failed" for k, _ in events), events
    described = synctl_ok("describe", "job", job_id)
    assert "not charged to max_restarts" in described
    log = Path(cluster.worker_dir(done.tasks[0].node_id)) / "logs" / job_id / "attempt-3" / "task-0.log"
    assert wait_for(lambda: log.exists() and "attempt 3 rank" in log.read_text(), what="attempt 3's log")


def readyz(cluster, replica_id: str) -> tuple[int, str]:
    base, context = http_base(cluster.master(replica_id)["http_address"], cluster.state["ca"])
    try:
        with urllib.request.urlopen(f"{base}/readyz?verbose", timeout=5, context=context) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_readyz_tells_the_truth_when_digests_fail_and_when_most_nodes_are_down(make_cluster):
    """The TLS cluster of the issue: a follower whose certificate may not call the leader. Every
    process answers, yet the leader's /readyz fails naming that replica, and `status` says so; with
    most nodes DOWN it fails too, and a gang waits for them rather than 'can never fit'."""
    cluster = make_cluster(workers=2, racks=1)
    leader = cluster.wait_leader()
    follower = next(m["id"] for m in cluster.state["masters"] if m["id"] != leader)
    assert wait_for(lambda: readyz(cluster, leader)[0] == 200, what="a ready leader")
    tls_dir = Path(cluster.state["ca"]).parent
    cluster.kill_master(follower)
    issue(tls_dir, "server", "127.0.0.1", ("server",), ["127.0.0.1", "localhost"])  # server-only, as once
    cluster.restart_master(follower)
    code, body = wait_for(lambda: (r := readyz(cluster, cluster.wait_leader()))[0] == 503 and r,
                          what="the leader's /readyz to fail", timeout=30)
    follower_api = cluster.master(follower)["api_address"]
    assert f"[-]link-shards failed: no liveness digest from replica {follower_api}" in body, body
    status = CliRunner().invoke(local_main, ["status", "--data-dir", str(cluster.data_dir)])
    assert "NOT READY: link-shards" in status.output, status.output

    for worker in ("w1", "w2"):
        cluster.kill_worker(worker, with_tasks=True)
    code, body = wait_for(lambda: "nodes are DOWN" in (r := readyz(cluster, cluster.wait_leader()))[1] and r,
                          what="most nodes DOWN to show", timeout=30)
    assert code == 503 and "[-]nodes failed: 2 of 2 nodes are DOWN" in body, body
    job_id = cluster.client.submit(codec.job_spec_to_proto(spec(tasks=1, gpu=1)))
    waiting = wait_for(lambda: cluster.client.get_job(job_id).waiting, what="a pending reason")
    assert "2 DOWN of 2 node(s)" in waiting and "can never fit" not in waiting, waiting


def test_plain_mode_is_an_opt_out_that_says_so(tmp_path):
    """`up --insecure`: plaintext, loudly; clients need no CA and a gang runs (plain mode's own test)."""
    data_dir = tmp_path / "plain"
    base = local.free_base_port(3)
    up = run_cli("synapse.local.main", "up", "--insecure", "--data-dir", str(data_dir), "--workers", "1",
                 "--base-port", str(base), env=dict(os.environ))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "WARNING: --insecure" in up.stderr and "dashboard: http://" in up.stdout
        exported = next(line for line in up.stdout.splitlines() if line.startswith("export "))
        assert "SYNAPSE_CA" not in exported
        env = {**os.environ, **dict(kv.split("=", 1) for kv in exported.split()[1:])}
        ran = run_cli("synapse.client.cli", "submit", "--wait", "--gpu", "1", "--", "true", env=env)
        assert ran.returncode == 0 and "Succeeded" in ran.stdout, ran.stdout + ran.stderr
    finally:
        run_cli("synapse.local.main", "down", "--data-dir", str(data_dir), env=dict(os.environ))
