"""synctl against a real 3-master cluster, and its TLS failures against a real server (its error paths
that need no server are in tests/unit/test_synctl.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent import futures

import grpc
import pytest
from click.testing import CliRunner

from synapse.client.cli.main import main
from synapse.common.tls import generate
from synapse.core import versions
from tests.support.cli import timed
from tests.support.cluster import AS_FROM_A_TERMINAL, register, synctl, wait_status, wait_waiting
from tests.support.paths import ROOT

JOB = """\
name: train
tasks: 2
resources: {cpu: 2, memory: 4Gi, gpu: 4}
command: ["python", "-c", "print('hi')"]
topology: {pack: rack, mode: required}
max_restarts: 1
"""


@pytest.mark.slow
def test_synctl_end_to_end(make_cluster, tmp_path):
    cluster = make_cluster()
    register(cluster, "n1", rack="r1")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(JOB)
    out = synctl(cluster, "submit", str(job_file), "--request-id", "fixed", "-o", "json")
    assert out.exit_code == 0, out.output
    job_id = json.loads(out.output)["id"]
    again = synctl(cluster, "submit", str(job_file), "--request-id", "fixed")
    assert again.output.strip() == job_id  # the same request id is the same job

    wait_status(cluster.client, job_id, {"SCHEDULED"})
    described = json.loads(synctl(cluster, "describe", "job", job_id, "-o", "json").output)
    assert described["status"] == "SCHEDULED" and described["attempt"] == 1
    assert [(t["index"], t["node"], t["gpus"]) for t in described["tasks"]] == [(0, "n1", [0, 1, 2, 3]),
                                                                                  (1, "n1", [4, 5, 6, 7])]
    table = synctl(cluster, "describe", "job", job_id).output
    assert "Attempt:    1 (restarts used 0 of max_restarts 1)" in table and "Scheduled" in table

    big = synctl(cluster, "submit", "--tasks", "3", "--gpu", "8", "--name", "big", "--", "sleep", "1")
    wait_waiting(cluster.client, big.output.strip())
    pending = synctl(cluster, "describe", "job", big.output.strip()).output
    assert "Waiting:" in pending and "short of gpu" in pending

    nodes = json.loads(synctl(cluster, "get", "nodes", "-o", "json").output)
    assert [(n["id"], n["status"], n["gpus_used"]) for n in nodes] == [("n1", "READY", 8)]
    jobs = json.loads(synctl(cluster, "get", "jobs", "-o", "json").output)
    assert [j["id"] for j in jobs] == [job_id, big.output.strip()]
    status = json.loads(synctl(cluster, "cluster", "status", "-o", "json").output)
    assert status["leader"]["id"] == cluster.wait_leader() and len(status["replicas"]) == 3
    deadline = time.monotonic() + 10  # the leader hears each member's version with its Raft traffic
    while status["cluster_version"] != versions.COMMAND_VERSION and time.monotonic() < deadline:
        time.sleep(0.2)
        status = json.loads(synctl(cluster, "cluster", "status", "-o", "json").output)
    assert status["cluster_version"] == versions.COMMAND_VERSION
    assert {r["command_version"] for r in status["replicas"]} == {versions.COMMAND_VERSION}
    # The leader's match index for each follower (none for itself), at most its own log's end.
    followers = [r for r in status["replicas"] if r["state"] == "follower"]
    assert len(followers) == 2 and all(0 < r["matched_index"] for r in followers), status
    assert "matched_index" not in next(r for r in status["replicas"] if r["state"] == "leader")
    assert synctl(cluster, "cordon", "n1").exit_code == 0
    assert json.loads(synctl(cluster, "get", "nodes", "-o", "json").output)[0]["schedulable"] is False
    assert synctl(cluster, "uncordon", "n1").exit_code == 0
    cancelled = synctl(cluster, "cancel", job_id)
    assert cancelled.output.strip() == f"{job_id}: STOPPING"  # resources return when the tasks are gone

    unknown = synctl(cluster, "describe", "job", "no-such-job")
    assert unknown.exit_code == 2 and "not found: unknown job no-such-job" in unknown.output
    bad_token = CliRunner().invoke(main, ["get", "jobs"], env={**cluster.env, "SYNAPSE_MASTERS": cluster.addresses[0],
                                                               "SYNAPSE_TOKEN": "wrong"})
    assert bad_token.exit_code == 4 and "authentication failed" in bad_token.output
    impossible = synctl(cluster, "submit", "--gpu", "64", "--", "x")
    assert impossible.exit_code == 2 and "no node can hold one task" in impossible.output


def interrupted(cluster, *args, ready):
    """Run synctl ARGS in a process of its own, as from a terminal; Ctrl-C it once `ready(a line it
    printed)` is true. Its exit code, stdout and stderr."""
    env = {**os.environ, **cluster.env}
    proc = subprocess.Popen([*AS_FROM_A_TERMINAL, sys.executable, "-m", "synapse.client.cli", *args], cwd=ROOT,
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        printed = ""
        while not printed.endswith("\n") or not ready(printed.splitlines()[-1]):
            line = proc.stdout.readline()
            assert line, f"synctl ended ({proc.wait()}) before it was ready: {printed}{proc.stderr.read()}"
            printed += line
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, printed + out, err


@pytest.mark.slow
def test_following_a_job_ends_with_its_outcome_and_ctrl_c_leaves_it_running(make_cluster):
    cluster = make_cluster(workers=1, racks=1)  # one node of 8 GPUs
    started = time.monotonic()
    never = synctl(cluster, "submit", "--wait", "--tasks", "2", "--gpu", "8", "--", "true")
    assert never.exit_code == 2 and time.monotonic() - started < 10, never.output
    assert "can never start: can never fit" in never.output
    never_id = never.output.splitlines()[0]
    assert synctl(cluster, "wait", never_id).exit_code == 2

    ok = synctl(cluster, "submit", "--wait", "--", "hostname")  # the command, not a job file named hostname
    job_id = ok.output.splitlines()[0]
    assert ok.exit_code == 0 and "Succeeded" in ok.output, ok.output
    assert json.loads(synctl(cluster, "describe", "job", job_id, "-o", "json").output)["command"] == ["hostname"]
    again = synctl(cluster, "wait", job_id)  # an ended job: its events, and its outcome's code
    assert again.exit_code == 0 and again.output == ok.output.split("\n", 1)[1]
    assert synctl(cluster, "submit", "--wait", "--", "false").exit_code == 1

    code, out, err = interrupted(cluster, "submit", "--wait", "--", "sh", "-c", "echo up; sleep 60",
                                 ready=lambda line: "Running" in line)
    sleeper = out.splitlines()[0]
    assert code == 130 and "Aborted" not in err, (out, err)
    assert err == (f"synctl: interrupted; job {sleeper} goes on (RUNNING): `synctl wait {sleeper}` follows it "
                   f"again, `synctl cancel {sleeper}` cancels it\n")
    assert cluster.client.get_job(sleeper).status == "RUNNING"
    code, _, err = interrupted(cluster, "logs", "-f", sleeper, ready=lambda line: line == "up")
    assert code == 130 and f"`synctl logs -f {sleeper}` follows it again" in err, err
    code, _, err = interrupted(cluster, "get", "events", "--watch", ready=lambda line: True)
    assert (code, err) == (130, "")
    assert synctl(cluster, "cancel", sleeper).exit_code == 0
    assert synctl(cluster, "wait", sleeper).exit_code == 1


@pytest.mark.slow
def test_request_ids_array_cancel_queue_warnings_and_an_election_that_takes_the_timeout(make_cluster, tmp_path):
    cluster = make_cluster()
    for i in range(2):
        register(cluster, f"n{i}", rack=f"r{i}")  # 16 GPUs; no workers: placed gangs stay SCHEDULED
    first = synctl(cluster, "submit", "--request-id", "r1", "--gpu", "1", "--", "sleep", "1")
    assert synctl(cluster, "submit", "--request-id", "r1", "--gpu", "1", "--", "sleep", "1").output == first.output
    reused = synctl(cluster, "submit", "--request-id", "r1", "--gpu", "2", "--", "sleep", "1")
    assert reused.exit_code == 2 and reused.output == (
        f"synctl: refused: request id r1 already made job {first.output.strip()}, from another spec: a new job "
        "needs a new request id\n")

    array = synctl(cluster, "submit", "--gpu", "4", "--array", "0-5", "--", "sleep", "60").output.strip()
    wait_status(cluster.client, f"{array}_2", {"SCHEDULED"})  # three placed beside r1's job, three waiting
    assert synctl(cluster, "cancel", array).output == f"{array}: STOPPING\n"  # its placed elements stop

    queues = tmp_path / "queues.yaml"
    queues.write_text("queues:\n  - name: research\n    guaranteed: {gpu: 1000}\n")
    applied = CliRunner().invoke(main, ["apply", str(queues)], env=cluster.env)
    assert applied.exit_code == 0 and applied.stdout == "queue/research created\n"
    assert applied.stderr == "synctl: warning: queue/research guarantees gpu 1000, but the cluster has 16 (2 node(s))\n"

    # Only one master left: it accepts connections but elects no leader, so synctl keeps trying
    # for its whole --timeout, even with a master address beside it that refuses.
    survivor = cluster.wait_leader()
    for m in cluster.state["masters"]:
        if m["id"] != survivor:
            cluster.kill_master(m["id"])
    started = time.monotonic()
    out = CliRunner().invoke(main, ["--masters", f"{cluster.master(survivor)['api_address']},127.0.0.1:1",
                                    "--timeout", "3", "get", "jobs"], env=cluster.env)
    assert out.exit_code == 3 and time.monotonic() - started > 2.5, out.output
    assert "no master answered within the deadline" in out.output


def test_tls_failures_exit_4_at_once(tmp_path):
    out, took = timed("--masters", "127.0.0.1:1", "--ca", str(tmp_path / "missing.pem"), "get", "jobs")
    assert out.exit_code == 4 and took < 1 and "TLS failed: cannot read" in out.output, out.output
    generate(tmp_path / "theirs", ["127.0.0.1"], [])
    generate(tmp_path / "ours", ["127.0.0.1"], [])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    theirs = tmp_path / "theirs"
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(
        [((theirs / "server-key.pem").read_bytes(), (theirs / "server.pem").read_bytes())]))
    server.start()
    try:  # a server whose certificate our CA did not sign
        out, took = timed("--masters", f"127.0.0.1:{port}", "--ca", str(tmp_path / "ours" / "ca.pem"), "get", "jobs")
    finally:
        server.stop(None)
    assert out.exit_code == 4 and took < 2 and "TLS failed" in out.output, (took, out.output)
