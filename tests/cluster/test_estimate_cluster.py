"""Estimated starts on a real local cluster: `synctl get jobs` and `describe job` show when a waiting
gang is expected to start, from the leader's plan."""

import json

from click.testing import CliRunner

from synapse.client.cli.main import main
from synapse.core import codec
from synapse.core.jobs.jobspec import parse_job
from tests.support.helpers import wait_for


def synctl(cluster, *args: str) -> str:
    out = CliRunner().invoke(main, ["--timeout", "20", *args], env=dict(cluster.env), catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return out.output


def submit(cluster, **doc) -> str:
    doc = {"tasks": 2, "resources": {"cpu": 1, "memory": "64Mi", "gpu": 8}, "command": ["sleep", "300"], **doc}
    return cluster.client.submit(codec.job_spec_to_proto(parse_job(doc)))


def test_get_jobs_has_the_estimated_start_of_a_waiting_gang(make_cluster):
    cluster = make_cluster(workers=2, racks=1, gpus=8)
    running = submit(cluster, name="first", time_limit="1h")  # both nodes, for an hour at most
    first = wait_for(lambda: next((j for j in json.loads(synctl(cluster, "get", "jobs", "-o", "json"))
                                   if j["id"] == running and j["started_at"]), None), what="the first gang to run")
    gang = submit(cluster, name="second", time_limit="30m")

    def estimated():
        jobs = {j["id"]: j for j in json.loads(synctl(cluster, "get", "jobs", "-o", "json"))}
        return jobs[gang] if jobs[gang]["estimated_start"] else None

    waiting = wait_for(estimated, what="an estimate for the waiting gang")
    # no runs of its kind learned yet: the running gang is expected to run to its limit
    assert abs(waiting["estimated_start"] - (first["started_at"] + 3600)) < 5
    assert waiting["estimate_basis"] == "reservation" and waiting["estimate_ahead"][0]["job"] == running
    assert "holds a reservation of 2 node(s)" in waiting["estimate_detail"]
    table = synctl(cluster, "get", "jobs").splitlines()
    assert table[0].split()[-1] == "START"
    assert any(line.startswith(gang) and ("in ~" in line or " at " in line) for line in table)
    described = synctl(cluster, "describe", "job", gang)
    assert any(line.startswith("Start:") and running in line for line in described.splitlines())
    running_row = next(j for j in json.loads(synctl(cluster, "get", "jobs", "-o", "json")) if j["id"] == running)
    assert running_row["estimated_start"] is None and running_row["estimate_basis"] is None
