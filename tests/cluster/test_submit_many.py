"""Several jobs in one request on a real cluster: SubmitJobs through the client library, and `synctl
submit` of several job files or `--count N`; they share one log entry, a retry by the same request
ids gets the same jobs, and one refused job refuses the request with nothing submitted (the servicer's
rules in isolation are in tests/unit/test_submit_many.py)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from synapse.client.cli.main import main
from synapse.client.master_client import ClientError, job_request
from synapse.core import codec
from synapse.core.model import JobSpec, Resources
from synapse.proto import api_pb2

SPEC = JobSpec(name="many", tasks=1, resources=Resources(1000, 64 << 20, 0), command=("sleep", "600"))
JOB = "name: {name}\nresources: {{cpu: 1, memory: 64Mi}}\n{queue}command: [sleep, '600']\n"


def synctl(cluster, *args):
    return CliRunner().invoke(main, ["--timeout", "15", *args], env=cluster.env, catch_exceptions=False)


def entries_and_commands(cluster) -> tuple[int, int]:
    """The leader's log entries proposed, and the commands inside them, so far."""
    leader = cluster.client.replica_status(cluster.master(cluster.leader_id())["api_address"])
    return leader.entries_proposed, leader.commands_proposed


def jobs_named(cluster, prefix: str) -> list[str]:
    return sorted(j.spec.name for j in cluster.client.list_jobs() if j.spec.name.startswith(prefix))


@pytest.mark.slow
def test_several_jobs_go_in_one_request_and_one_log_entry(make_cluster, tmp_path):
    cl = make_cluster(workers=0)
    proto = codec.job_spec_to_proto(SPEC)
    requests = [job_request(proto, f"rpc-{k}") for k in range(10)]
    entries, commands = entries_and_commands(cl)
    replies = cl.client.submit_jobs(requests)
    more_entries, more_commands = entries_and_commands(cl)
    # Ten commands in one entry: ten apart would add as many entries as commands (the leader's own
    # proposals meanwhile add an entry each at most).
    assert more_commands - commands >= 10 and (more_commands - commands) - (more_entries - entries) >= 9
    ids = [r.job_id for r in replies]
    assert len(set(ids)) == 10 and all(cl.client.get_job(i).spec.name == "many" for i in ids)
    assert [r.job_id for r in cl.client.submit_jobs(requests)] == ids  # a retry gets the same jobs

    for name in ("a", "b"):
        (tmp_path / f"{name}.yaml").write_text(JOB.format(name=f"file-{name}", queue=""))
    out = synctl(cl, "submit", str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml"))
    assert out.exit_code == 0, out.output
    assert [cl.client.get_job(i).spec.name for i in out.output.split()] == ["file-a", "file-b"]  # one id a line
    out = synctl(cl, "submit", "--count", "3", "--request-id", "copies", str(tmp_path / "a.yaml"))
    assert out.exit_code == 0, out.output
    assert [cl.client.get_job(i).spec.name for i in out.output.split()] == ["file-a-1", "file-a-2", "file-a-3"]
    again = synctl(cl, "submit", "--count", "3", "--request-id", "copies", str(tmp_path / "a.yaml"))
    assert again.output == out.output  # the same command retried: the same jobs


@pytest.mark.slow
def test_one_refused_job_refuses_the_request_and_nothing_is_submitted(make_cluster, tmp_path):
    cl = make_cluster(workers=0)
    (tmp_path / "queues.yaml").write_text("queues:\n  - {name: capped, max_per_user: {jobs: 2}}\n")
    assert synctl(cl, "apply", str(tmp_path / "queues.yaml")).exit_code == 0
    (tmp_path / "capped.yaml").write_text(JOB.format(name="capped", queue="queue: capped\n"))
    (tmp_path / "nope.yaml").write_text(JOB.format(name="nope", queue="queue: nope\n"))

    # Three to a queue that takes two of the user's: the third is refused, and with it the others.
    out = synctl(cl, "submit", "--count", "3", str(tmp_path / "capped.yaml"))
    assert out.exit_code == 2 and "refused: job 3 of 3 (capped-3): limit reached: queue capped" in out.output, \
        out.output
    assert "this request adds 2 before this one" in out.output
    assert jobs_named(cl, "capped") == []
    # A file naming an unknown queue refuses the files before it too.
    out = synctl(cl, "submit", str(tmp_path / "capped.yaml"), str(tmp_path / "nope.yaml"))
    assert out.exit_code == 2 and "job 2 of 2 (nope): invalid job: queue: unknown queue nope" in out.output, \
        out.output
    assert jobs_named(cl, "capped") == [] and jobs_named(cl, "nope") == []
    # Two fit.
    out = synctl(cl, "submit", "--count", "2", str(tmp_path / "capped.yaml"))
    assert out.exit_code == 0, out.output
    assert jobs_named(cl, "capped") == ["capped-1", "capped-2"]

    # The RPC refuses two jobs under one request id, and an empty request, before anything.
    proto = codec.job_spec_to_proto(SPEC)
    with pytest.raises(ClientError, match="request id twice is given twice: each job needs its own"):
        cl.client.submit_jobs([job_request(proto, "twice"), job_request(proto, "twice")])
    with pytest.raises(ClientError, match="give 1 to 1000 jobs, not 0"):
        cl.client.call("SubmitJobs", api_pb2.SubmitJobsRequest())
    assert jobs_named(cl, "many") == []
