"""synctl's error paths that need no server: no master, a bad address or file, a bad status (against
a real 3-master cluster: tests/cluster/test_synctl.py)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from synapse.client.cli.main import main
from synapse.client.cli.queues import guarantee_warnings
from synapse.client.jobfile import load_job_file
from synapse.core.model import Queue, Resources
from tests.support.cli import timed
from tests.support.helpers import GI


def test_unreachable_cluster_is_one_line_and_exit_3():
    out = CliRunner().invoke(main, ["--masters", "127.0.0.1:1", "--timeout", "1", "get", "jobs"])
    assert out.exit_code == 3 and out.output.startswith("synctl: cluster unreachable")


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
