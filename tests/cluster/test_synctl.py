"""synctl against a real 3-master cluster, and its error paths."""

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
from synapse.client.cli.queues import guarantee_warnings
from synapse.client.jobfile import load_job_file
from synapse.common.tls import generate
from synapse.core import versions
from synapse.core.model import Queue, Resources
from tests.support.cluster import AS_FROM_A_TERMINAL, register, synctl, wait_status, wait_waiting
from tests.support.helpers import GI
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


def test_unreachable_cluster_is_one_line_and_exit_3():
    out = CliRunner().invoke(main, ["--masters", "127.0.0.1:1", "--timeout", "1", "get", "jobs"])
    assert out.exit_code == 3 and out.output.startswith("synctl: cluster unreachable")


def timed(*args, env=None):
    started = time.monotonic()
    out = CliRunner().invoke(main, list(args), env={"SYNAPSE_MASTERS": "", "SYNAPSE_CA": "", **(env or {})})
    return out, time.monotonic() - started


def test_no_master_listening_fails_within_2_s_not_after_the_timeout():
    out, took = timed("--masters", "127.0.0.1:1,127.0.0.1:2", "get", "jobs")  # --timeout: 30 s
    assert out.exit_code == 3 and took < 2, (took, out.output)
    assert "no master accepts connections" in out.output and "127.0.0.1:2 refused" in out.output


@pytest.mark.parametrize("address,why", [
    ("garbage", "expected host:port"), ("127.0.0.1:", "the port must be"), ("h:99999", "the port must be"),
    ("bad host:7000", "is not a host name"), ("127.0.0.1:1,:7000", "expected host:port"),
])
def test_a_malformed_master_address_exits_2_at_once(address, why):
    out, took = timed("--masters", address, "get", "jobs")
    assert out.exit_code == 2 and why in out.output and took < 1, (took, out.output)
    assert out.output.startswith("synctl: bad master address")


def test_a_host_that_does_not_resolve_exits_2_within_2_s():
    out, took = timed("--masters", "no-such-host.invalid:7000", "get", "jobs")
    assert out.exit_code == 2 and took < 2, (took, out.output)
    assert "no master address names a host that resolves" in out.output


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


def test_an_unknown_status_is_refused_listing_the_valid_ones():
    out = CliRunner().invoke(main, ["--masters", "127.0.0.1:1", "get", "jobs", "--status", "bogus"])
    assert out.exit_code == 2 and "'bogus' is not one of" in out.output
    assert all(s.lower() in out.output for s in ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"))


@pytest.mark.parametrize("args,why", [
    (["job.yaml", "--", "hostname"], "give a job file or a command after --, not both"),
    (["--gpu", "1", "--"], "command: give the command to run after --"),
    (["hostname"], "cannot read hostname: No such file or directory (a command to run goes after --"),
])
def test_submit_tells_a_job_file_from_a_command(args, why):
    out = CliRunner().invoke(main, ["--masters", "127.0.0.1:1", "submit", *args])
    assert out.exit_code == 2 and why in out.output, out.output


def test_submit_runs_the_command_after_dashes_not_a_job_file_of_its_name():
    out = CliRunner().invoke(main, ["--masters", "127.0.0.1:1", "submit", "--", "hostname"])
    assert out.exit_code == 3 and "cluster unreachable" in out.output  # a job was built and sent


@pytest.mark.parametrize("text,field", [
    ("name: a\ntasks: -1\ncommand: [x]\n", "tasks"),
    ("name: a\ncommand: [x]\nresources: {gpu: lots}\n", "resources.gpu"),
    ("name: a\ncommand: [x]\nresources: {memory: 12Xi}\n", "resources.memory"),
    ("name: a\ncommand: [x]\ntopology: {pack: rack, mode: maybe}\n", "topology.mode"),
    ("name: a\ncommand: [x]\ncolour: blue\n", "colour"),
    ("tasks: 2\ncommand: [x]\n", "name"),
    ("name: a\ntasks: 2\n", "command"),
    ("name: [unclosed\n", "(file)"),
])
def test_invalid_job_file_names_the_field(tmp_path, text, field):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    out = CliRunner().invoke(main, ["--masters", "127.0.0.1:1", "submit", str(path)])
    assert out.exit_code == 2 and f"invalid job file {path}: {field}:" in out.output, out.output


def test_a_job_files_dot_slash_paths_are_made_absolute_against_its_directory(tmp_path, monkeypatch):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "job.yaml").write_text(
        "name: a\ncommand: [python3, ./train.py, --data, ../data/x, -c, './q', .hidden]\n"
        "env: {OUT: ./out, MODE: fast, LIB: ../lib/}\n")
    monkeypatch.chdir(tmp_path)  # a relative path to the file, from elsewhere
    spec = load_job_file("jobs/job.yaml")
    assert spec.command == ("python3", f"{tmp_path}/jobs/train.py", "--data", f"{tmp_path}/data/x", "-c",
                            f"{tmp_path}/jobs/q", ".hidden")
    assert dict(spec.env) == {"OUT": f"{tmp_path}/jobs/out", "MODE": "fast", "LIB": f"{tmp_path}/lib/"}


def test_missing_job_file_and_missing_masters(tmp_path):
    out = CliRunner().invoke(main, ["--masters", "127.0.0.1:1", "submit", str(tmp_path / "nope.yaml")])
    assert out.exit_code == 2 and "cannot read" in out.output
    out = CliRunner().invoke(main, ["get", "jobs"], env={"SYNAPSE_MASTERS": ""})
    assert out.exit_code == 2 and "no masters given" in out.output


def test_queue_guarantees_beyond_the_cluster_are_named_with_its_capacity():
    cap = Resources(cpu=128_000, memory=1024 * GI, gpu=16)
    big, team = Queue("research", guaranteed=Resources(0, 0, 1000)), Queue("vision", parent="research")
    other = Queue("infra", guaranteed=Resources(64_000, 0, 8))
    assert guarantee_warnings([big, team], [big, team, other], cap, 2) == [
        "queue/research guarantees gpu 1000, but the cluster has 16 (2 node(s))"]
    fair = Queue("research", guaranteed=Resources(96_000, 0, 12))
    assert guarantee_warnings([fair], [fair, other], cap, 2) == [
        "the top-level queues (research, infra) guarantee gpu 20 together, but the cluster has 16 (2 node(s))",
        "the top-level queues (research, infra) guarantee cpu 160 together, but the cluster has 128 (2 node(s))"]
    assert guarantee_warnings([fair], [fair], cap, 2) == [] and guarantee_warnings([big], [big], Resources(), 0) == []
