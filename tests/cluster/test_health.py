"""Node health checks on a real cluster (issue 16): a failing check cordons the node with the check's
message, a passing one makes it schedulable again, and an admin's cordon is never lifted by it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from synapse.client.cli.main import main as synctl
from synapse.proto import api_pb2
from synapse.worker.health import HealthCheck, command_problem

INTERVAL = 1.0


def test_health_check_results():
    assert HealthCheck("true", 1, 1).run().healthy
    result = HealthCheck("sh -c 'echo; echo first words; echo second; exit 3'", 1, 5).run()
    assert (result.healthy, result.message) == (False, "first words")
    assert HealthCheck("false", 1, 5).run().message == "health check exited with code 1 and printed nothing"
    started = time.monotonic()
    slow = HealthCheck("sh -c 'sleep 30 & sleep 30'", 1, 0.3).run()  # a grandchild holds the pipe too
    assert slow.message == "health check gave no answer within 0.3s" and time.monotonic() - started < 5
    assert "not found" in command_problem("/no/such/check --now")
    assert command_problem("true") == ""


def test_a_health_check_that_does_not_exist_stops_the_worker_with_a_clear_message(tmp_path):
    run = subprocess.run([sys.executable, "-m", "synapse.worker", "--masters", "127.0.0.1:1", "--data-dir",
                          str(tmp_path), "--gpus", "0", "--health-check", "/no/such/check"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "--health-check: command '/no/such/check' not found" in run.stderr


def node(cluster, node_id: str) -> api_pb2.NodeInfo | None:
    return next((n for n in cluster.client.list_nodes() if n.id == node_id), None)


def wait_node(cluster, node_id: str, predicate, timeout: float, what: str) -> float:
    """Seconds until the node satisfies `predicate`; fails after `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        info = node(cluster, node_id)
        if info is not None and predicate(info):
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"node {node_id}: timed out waiting for {what}: {node(cluster, node_id)}")


@pytest.mark.slow
def test_failing_check_cordons_within_two_intervals_and_passing_uncordons(make_cluster, tmp_path):
    cluster = make_cluster(workers=0)
    broken = tmp_path / "broken"
    check = tmp_path / "check.sh"
    check.write_text(f"#!/bin/sh\nif [ -e {broken} ]; then echo 'GPU 3 fell off the bus'; echo more; exit 1; fi\n")
    check.chmod(0o755)
    argv = [sys.executable, "-m", "synapse.worker", "--masters", ",".join(cluster.addresses),
            "--token", cluster.token, "--node-id", "hw1", "--data-dir", str(tmp_path / "hw1"), "--gpus", "0",
            "--cpus", "4", "--memory", "8Gi", "--address", "127.0.0.1", "--heartbeat-interval", "0.5",
            "--health-check", str(check), "--health-interval", str(INTERVAL), "--stop-tasks-on-exit",
            *cluster.worker_tls_argv("hw1")]
    with open(tmp_path / "hw1.log", "wb") as log:
        worker = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_node(cluster, "hw1", lambda n: n.schedulable and n.status == "READY", 20, "registration")
        time.sleep(INTERVAL)  # a passing check has run at least once

        broken.touch()
        took = wait_node(cluster, "hw1", lambda n: not n.schedulable, 4 * INTERVAL, "the health cordon")
        assert took <= 2 * INTERVAL, took
        info = node(cluster, "hw1")
        assert info.cordon_reason == "health check failed: GPU 3 fell off the bus"
        assert info.health == "GPU 3 fell off the bus"
        listed = CliRunner().invoke(synctl, ["get", "nodes"], env=cluster.env).output
        assert "health check failed: GPU 3 fell off the bus" in listed
        described = CliRunner().invoke(synctl, ["describe", "node", "hw1"], env=cluster.env).output
        assert "Schedulable:  no: health check failed: GPU 3 fell off the bus" in described
        assert "Isolation:" in described

        broken.unlink()
        took = wait_node(cluster, "hw1", lambda n: n.schedulable, 4 * INTERVAL, "the cordon to lift")
        assert took <= 2 * INTERVAL, took
        assert node(cluster, "hw1").cordon_reason == "" and node(cluster, "hw1").health == ""

        # An admin's cordon outlives the health check failing and passing again.
        result = CliRunner().invoke(synctl, ["cordon", "hw1", "--reason", "firmware update"], env=cluster.env)
        assert result.exit_code == 0, result.output
        broken.touch()
        wait_node(cluster, "hw1", lambda n: n.health == "GPU 3 fell off the bus", 4 * INTERVAL, "the failure")
        broken.unlink()
        wait_node(cluster, "hw1", lambda n: n.health == "", 4 * INTERVAL, "the check to pass")
        time.sleep(INTERVAL)
        info = node(cluster, "hw1")
        assert not info.schedulable and info.cordon_reason == "firmware update (by admin)"
    finally:
        worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    assert Path(tmp_path / "hw1.log").read_text().count("health check fails node=hw1") == 2
    assert os.path.exists(tmp_path / "hw1" / "worker-state.json")
