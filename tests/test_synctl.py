"""synctl against a real 3-master cluster, and its error paths."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from synapse.client.jobfile import load_job_file
from synapse.client.synctl import main
from synapse.core import codec
from tests.test_master_ha import register, wait_status

JOB = """\
name: train
tasks: 2
resources: {cpu: 2, memory: 4Gi, gpu: 4}
command: ["python", "-c", "print('hi')"]
topology: {pack: rack, mode: required}
max_restarts: 1
"""


def synctl(cluster, *args, **kw):
    env = dict(cluster.env) if cluster else {}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False, **kw)


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
    assert "Attempt:    1 of 2" in table and "Scheduled" in table

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
    while status["cluster_version"] != codec.COMMAND_VERSION and time.monotonic() < deadline:
        time.sleep(0.2)
        status = json.loads(synctl(cluster, "cluster", "status", "-o", "json").output)
    assert status["cluster_version"] == codec.COMMAND_VERSION
    assert {r["command_version"] for r in status["replicas"]} == {codec.COMMAND_VERSION}
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


def test_unreachable_cluster_is_one_line_and_exit_3():
    out = CliRunner().invoke(main, ["--masters", "127.0.0.1:1", "--timeout", "1", "get", "jobs"])
    assert out.exit_code == 3 and out.output.startswith("synctl: cluster unreachable")


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


def wait_waiting(client, job_id, timeout=10.0):
    """Until a scheduling round has recorded why the job waits."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get_job(job_id).waiting:
            return
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} has no waiting reason")
