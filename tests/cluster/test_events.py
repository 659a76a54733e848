"""The cluster's event stream over a real 3-master cluster: watch, resume, any replica."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from synapse.client.cli.main import main
from synapse.core import codec
from tests.support.cluster import wait_status
from tests.support.helpers import spec

pytestmark = pytest.mark.slow


def synctl(cluster, *args, masters=None):
    env = {**cluster.env, "SYNAPSE_MASTERS": masters or ",".join(cluster.addresses)}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_watch_prints_json_lines_within_seconds_of_a_submission(make_cluster):
    cluster = make_cluster(workers=1, racks=1)
    env = {**os.environ, **cluster.env}
    watcher = subprocess.Popen([sys.executable, "-m", "synapse.client.cli", "get", "events", "--watch", "-o",
                                "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        time.sleep(0.5)
        started = time.monotonic()
        job_id = cluster.client.submit(codec.job_spec_to_proto(spec(tasks=1, gpu=1)))
        seen: list[dict] = []
        while time.monotonic() - started < 5 and not {"JobSubmitted", "GangPlaced"} <= {
                e["reason"] for e in seen if e["object"] == job_id}:
            line = watcher.stdout.readline()
            if line:
                seen.append(json.loads(line))
        reasons = [e["reason"] for e in seen if e["object"] == job_id]
        assert "JobSubmitted" in reasons and "GangPlaced" in reasons, seen
        assert reasons.index("JobSubmitted") < reasons.index("GangPlaced")
        assert time.monotonic() - started < 5
    finally:
        watcher.kill()
        watcher.wait(timeout=10)


def test_every_replica_serves_the_same_events_and_a_cursor_resumes_without_gap(make_cluster):
    cluster = make_cluster(workers=1, racks=1)
    job_id = cluster.client.submit(codec.job_spec_to_proto(spec(tasks=1, gpu=1)))
    wait_status(cluster.client, job_id, {"SUCCEEDED"})
    cluster.converged_digest()
    streams = {}
    for address in cluster.addresses:
        out = synctl(cluster, "get", "events", "-o", "json", masters=address)
        assert out.exit_code == 0, out.output
        streams[address] = json.loads(out.output)
    first = next(iter(streams.values()))
    assert all(s == first for s in streams.values())  # leader and followers alike
    reasons = [e["reason"] for e in first if e["object"] == job_id]
    assert reasons[:2] == ["JobSubmitted", "GangPlaced"] and reasons[-1] == "JobSucceeded"
    middle = first[len(first) // 2]["seq"]
    rest = json.loads(synctl(cluster, "get", "events", "--after", str(middle), "-o", "json",
                             masters=cluster.addresses[-1]).output)
    assert [e["seq"] for e in rest] == [e["seq"] for e in first if e["seq"] > middle]  # no gap, no repeat
    mine = json.loads(synctl(cluster, "get", "events", "--for", f"job/{job_id}", "-o", "json").output)
    assert {e["object"] for e in mine} == {job_id} and [e["reason"] for e in mine] == reasons


def test_why_a_gang_waits_is_recorded_once_in_its_events(make_cluster):
    cluster = make_cluster(workers=1, racks=1)
    job_id = cluster.client.submit(codec.job_spec_to_proto(spec(tasks=3, gpu=8)))  # 3 nodes' worth on 1 node
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        events = json.loads(synctl(cluster, "get", "events", "--for", f"job/{job_id}", "-o", "json").output)
        if any(e["reason"] == "JobPending" for e in events):
            break
        time.sleep(0.2)
    time.sleep(2.5)  # more rounds: the unchanged reason is not recorded again
    events = json.loads(synctl(cluster, "get", "events", "--for", f"job/{job_id}", "-o", "json").output)
    pending = [e for e in events if e["reason"] == "JobPending"]
    assert len(pending) == 1 and pending[0]["message"].startswith("Unschedulable"), events
    described = json.loads(synctl(cluster, "describe", "job", job_id, "-o", "json").output)
    assert any(e["reason"] == "Waiting" for e in described["events"])
