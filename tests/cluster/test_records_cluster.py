"""Records that tell the truth (issue 44, item 4), on a real local cluster: what-if promises only
what the leader does, describe and get print no epoch, a finished array shows its first start, a
refused mount fails at once and an image that is not there is named once."""

from __future__ import annotations

import json
import re
import time

import pytest
import yaml
from click.testing import CliRunner

from synapse.client.cli.main import main
from synapse.core import codec
from synapse.core.jobs.jobspec import parse_job
from synapse.core.model import NEVER_RAN_VERSION
from tests.support.cluster import start_worker
from tests.support.helpers import wait_for
from tests.support.images import busybox_root, needs_root_fs

EPOCH = re.compile(r"\b\d{10}\b")


def synctl(cluster, *args: str) -> str:
    out = CliRunner().invoke(main, ["--timeout", "20", *args], env=dict(cluster.env), catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return out.output


def submit(cluster, **doc) -> str:
    doc = {"resources": {"cpu": 1, "memory": "64Mi", "gpu": 8}, "command": ["sleep", "300"], **doc}
    return cluster.client.submit(codec.job_spec_to_proto(parse_job(doc)))


def status(cluster, job_id: str) -> tuple[str, int]:
    info = cluster.client.get_job(job_id)
    return info.status, info.attempt


def at_version(cluster, version: int) -> None:
    wait_for(lambda: min(cluster.client.replica_status(a).applied_version for a in cluster.addresses) >= version,
             30, f"version {version} applied on every replica")


@pytest.mark.slow
def test_what_if_keeps_its_promises_and_describe_prints_no_epoch(make_cluster, tmp_path):
    cluster = make_cluster(workers=2, racks=1, gpus=8)
    at_version(cluster, NEVER_RAN_VERSION)

    # A finished array shows when its first element started, not "-".
    array = submit(cluster, name="sweep", tasks=1, array="0-1", resources={"cpu": 1, "memory": "64Mi"},
                   command=["true"])
    wait_for(lambda: status(cluster, array)[0] == "SUCCEEDED", 60, "the array to succeed")
    started = [line for line in synctl(cluster, "describe", "job", array).splitlines() if "Started:" in line]
    assert started and "Started: -" not in started[0], started

    # No queues: a high-priority gang waits behind a running one, with a reservation for when its
    # time limit ends; what-if promises no preemption, and none comes.
    busy = submit(cluster, name="busy", tasks=2, time_limit="1h")
    wait_for(lambda: status(cluster, busy)[0] == "RUNNING", 60, "busy to run")
    high = submit(cluster, name="high", tasks=2, priority=5)
    wait_for(lambda: cluster.client.get_job(high).reservation, 30, "high's reservation")
    said = json.loads(synctl(cluster, "preempt", high, "--what-if", "-o", "json"))
    assert not said["possible"] and "no queue is defined" in said["explanation"], said
    described, listed = synctl(cluster, "describe", "job", high), synctl(cluster, "get", "jobs")
    assert "expected free at" in described and " UTC" in described, described
    for text in (described, listed):
        assert not EPOCH.search(text), text
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert status(cluster, busy) == ("RUNNING", 1) and status(cluster, high)[0] == "PENDING"
        time.sleep(0.5)
    cluster.client.cancel(high)
    cluster.client.cancel(busy)
    wait_for(lambda: status(cluster, busy)[0] == "CANCELLED", 60, "busy to end")

    # With a queue that preempts by priority: what-if's promise is kept within 10 s.
    queues = tmp_path / "queues.yaml"
    queues.write_text(yaml.safe_dump({"queues": [{"name": "a"}]}))
    synctl(cluster, "apply", str(queues))
    low = submit(cluster, name="low", tasks=2, queue="a")
    wait_for(lambda: status(cluster, low)[0] == "RUNNING", 60, "low to run")
    urgent = submit(cluster, name="urgent", tasks=2, queue="a", priority=5)
    # Asked before the leader's first round has weighed the job, what-if says so (and promises nothing).
    said = wait_for(lambda: (lambda a: a if "not weighed it yet" not in a["explanation"] else None)(
        json.loads(synctl(cluster, "preempt", urgent, "--what-if", "-o", "json"))), 10, "a round to weigh urgent")
    assert said["possible"] or "already preempted low" in said["explanation"], said
    wait_for(lambda: status(cluster, low)[1] >= 2 or status(cluster, low)[0] == "STOPPING", 10,
             "the promised preemption")
    wait_for(lambda: status(cluster, urgent)[0] == "RUNNING", 60, "urgent to run on the freed nodes")


@needs_root_fs
@pytest.mark.slow
def test_a_refused_mount_fails_at_once_and_a_missing_image_is_named_once(make_cluster, tmp_path):
    root = busybox_root(tmp_path / "rootfs")
    allowed = tmp_path / "data"
    allowed.mkdir()
    cluster = make_cluster(workers=0)
    start_worker(cluster, "i1", "rack1", "--allow-mount", str(allowed))
    at_version(cluster, NEVER_RAN_VERSION)
    refused = submit(cluster, name="refused", tasks=1, resources={"cpu": 1}, image=f"dir:{root}", max_restarts=3,
                     mounts=[{"source": str(tmp_path)}], command=["cat", "/etc/os-release"])
    info = wait_for(lambda: (lambda j: j if j.status in ("FAILED", "SUCCEEDED") else None)(
        cluster.client.get_job(refused)), 60, "the refused job to end")
    assert (info.status, info.attempt, info.restarts_used) == ("FAILED", 1, 0), info
    assert "MountRefused" in info.failure and f"({allowed})" in info.failure, info.failure
    (task,) = json.loads(synctl(cluster, "describe", "job", refused, "-o", "json"))["tasks"]
    assert (task["reason"], task["exit_code"]) == ("MountRefused", None)

    missing = submit(cluster, name="missing", tasks=1, resources={"cpu": 1}, image=f"dir:{tmp_path}/nothing",
                     command=["true"])
    info = wait_for(lambda: (lambda j: j if j.status == "FAILED" else None)(cluster.client.get_job(missing)), 60,
                    "the missing image's job to fail")
    assert "ImagePullFailed" in info.failure and info.failure.count("NOT_FOUND") == 1, info.failure
