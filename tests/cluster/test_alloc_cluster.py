"""Allocations and steps on a real local TLS cluster: `synctl alloc` running steps one after another
and side by side on its nodes, a step that does not fit refused, the idle timeout, and a cancel that
ends the steps with the allocation."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from chaos import checkers
from synapse.client.master_client import ClientError
from synapse.client.steps import exit_status, start_step, step_spec, wait_step
from synapse.core import codec
from synapse.core.model import JobSpec, Resources
from synapse.proto import api_pb2
from tests.support.helpers import GI, wait_for
from tests.support.paths import ROOT

SYNCTL = [sys.executable, "-m", "synapse.client.cli"]


def synctl(cluster, *args: str, timeout: float = 90.0) -> subprocess.CompletedProcess:
    """synctl as a user runs it, with `synctl` itself on PATH for the commands it runs."""
    env = {**os.environ, **cluster.env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("SYNAPSE_ALLOC", None)
    return subprocess.run([*SYNCTL, *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout)


def allocation(cluster, tasks: int = 2, gpu: int = 8, idle: float = 0.0) -> str:
    """A running allocation submitted through the API: its id."""
    spec = JobSpec(name="session", tasks=tasks, resources=Resources(2000, GI, gpu), command=(), alloc=True,
                   idle_timeout=idle)
    alloc_id = cluster.client.submit_job(codec.job_spec_to_proto(spec)).job_id
    wait_for(lambda: cluster.client.get_job(alloc_id).status == "RUNNING", what="the allocation granted")
    return alloc_id


def nodes_idle(cluster) -> bool:
    return all(n.used.gpu == 0 and n.live_tasks == 0 for n in cluster.client.list_nodes())


@pytest.mark.slow
def test_alloc_runs_two_steps_one_after_another_on_its_nodes_and_exits_with_its_command(make_cluster):
    cluster = make_cluster(masters=1, workers=2, racks=1, gpus=8)
    first = 'echo "first rank $RANK of $WORLD_SIZE in $SYNAPSE_ALLOC gpus $CUDA_VISIBLE_DEVICES"'
    script = f"synctl step -- sh -c '{first}' && synctl step --label -- sh -c 'echo \"second rank $RANK port " \
             "$MASTER_PORT\"' && exit 7"
    out = synctl(cluster, "alloc", "--tasks", "2", "--gpu", "8", "--", "sh", "-c", script)
    assert out.returncode == 7, out.stderr
    alloc_id = out.stderr.split("synctl: allocation ")[1].split(":")[0]
    assert f"first rank 0 of 2 in {alloc_id} gpus 0,1,2,3,4,5,6,7" in out.stdout
    assert f"first rank 1 of 2 in {alloc_id} gpus 0,1,2,3,4,5,6,7" in out.stdout
    assert "[task 0] second rank 0 port" in out.stdout and "[task 1] second rank 1 port" in out.stdout
    alloc = cluster.client.get_job(alloc_id)
    assert alloc.status == "CANCELLED" and alloc.step_count == 2
    assert any(e.kind == "StepEnded" and f"{alloc_id}.1 SUCCEEDED" in e.message for e in alloc.events)
    steps = cluster.client.list_jobs(alloc_id=alloc_id)
    assert [(s.id, s.status, exit_status(s)) for s in steps] == [(f"{alloc_id}.0", "SUCCEEDED", 0),
                                                               (f"{alloc_id}.1", "SUCCEEDED", 0)]
    held = {t.node_id for t in alloc.tasks}
    assert all({t.node_id for t in s.tasks} == held for s in steps)  # on the allocation's nodes, one per node
    listed = synctl(cluster, "get", "steps", alloc_id)
    assert f"{alloc_id}.1" in listed.stdout and "SUCCEEDED" in listed.stdout, listed.stderr
    assert nodes_idle(cluster)


@pytest.mark.slow
def test_steps_side_by_side_a_step_that_does_not_fit_is_refused_and_a_cancel_ends_them(make_cluster):
    cluster = make_cluster(masters=1, workers=2, racks=1, gpus=8)
    client = cluster.client
    alloc_id = allocation(cluster)
    info = client.get_job(alloc_id)
    half = step_spec(info, ("sleep", "60"), gpu=4)
    first, second = start_step(client, alloc_id, half), start_step(client, alloc_id, half)
    for step_id in (first, second):
        wait_step(client, step_id, until=frozenset({"RUNNING"}), deadline=time.monotonic() + 30)
    gpus = {tuple(t.gpus) for s in (first, second) for t in client.get_job(s).tasks}
    assert gpus == {(0, 1, 2, 3), (4, 5, 6, 7)}  # side by side, each its own half of every node
    with pytest.raises(ClientError) as refused:
        start_step(client, alloc_id, step_spec(info, ("true",), tasks=1, gpu=1))
    assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION and "do not fit" in refused.value.message
    assert [n.used.gpu for n in client.list_nodes()] == [8, 8]  # the allocation's, counted once
    client.cancel(alloc_id, "test")
    for step_id in (first, second):
        assert wait_step(client, step_id, deadline=time.monotonic() + 30).status == "CANCELLED"
    assert wait_step(client, alloc_id, deadline=time.monotonic() + 30).status == "CANCELLED"
    wait_for(lambda: nodes_idle(cluster), what="the nodes given back")
    with pytest.raises(ClientError) as ended:
        start_step(client, alloc_id, half)
    assert "steps start only while it runs" in ended.value.message
    # Every command the cluster applied, replayed with the invariants checked after each one (the
    # chaos checker's pass): no node booked past its capacity, no GPU given twice, steps nested.
    cluster.stop()
    state, problems, replayed = checkers.replay_replica(cluster.state["masters"][0]["data_dir"])
    assert not problems and replayed > 10 and state.jobs[first].alloc_id == alloc_id


@pytest.mark.slow
def test_an_idle_allocation_ends_and_synctl_alloc_ends_its_command(make_cluster):
    cluster = make_cluster(masters=1, workers=1, racks=1, gpus=8)
    started = time.monotonic()
    out = synctl(cluster, "alloc", "--gpu", "2", "--idle-timeout", "2s", "--", "sleep", "60")
    assert out.returncode == 128 + 1 and time.monotonic() - started < 30, out.stderr  # SIGHUP
    assert "no step ran for 2s" in out.stderr
    alloc_id = out.stderr.split("synctl: allocation ")[1].split(":")[0]
    assert cluster.client.get_job(alloc_id).status == "CANCELLED"
    assert nodes_idle(cluster)
    # A SIGTERM to synctl alloc goes on to its command, and the allocation is released after it.
    env = {**os.environ, **cluster.env}
    proc = subprocess.Popen([*SYNCTL, "alloc", "--gpu", "2", "--", "sleep", "60"], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    while "granted" not in line:
        assert line, "synctl alloc ended before its allocation was granted"
        line = proc.stderr.readline()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM
    alloc_id = line.split("synctl: allocation ")[1].split(" ")[0]
    job = cluster.client.get_job(alloc_id)
    assert job.status == "CANCELLED" and "its command exited with status 143" in job.events[-1].message


@pytest.mark.slow
def test_a_lost_node_or_a_drain_ends_the_allocation_and_its_steps_without_requeueing(make_cluster):
    cluster = make_cluster(masters=1, workers=2, racks=1, gpus=8)
    client = cluster.client
    # A drain: the allocation ends (FAILED, not requeued) and so does its step, on both nodes.
    alloc_id = allocation(cluster)
    step_id = start_step(client, alloc_id, step_spec(client.get_job(alloc_id), ("sleep", "60")))
    wait_step(client, step_id, until=frozenset({"RUNNING"}), deadline=time.monotonic() + 30)
    drained = client.get_job(step_id).tasks[0].node_id
    client.call("DrainNode", api_pb2.DrainNodeRequest(node_id=drained))
    assert wait_step(client, step_id, deadline=time.monotonic() + 30).status == "FAILED"
    assert wait_step(client, alloc_id, deadline=time.monotonic() + 30).status == "FAILED"
    client.call("SetSchedulable", api_pb2.SetSchedulableRequest(node_id=drained, schedulable=True))
    wait_for(lambda: nodes_idle(cluster), what="the nodes given back after the drain")
    # A lost node: its tasks are lost, the step's other task is stopped, the allocation ends.
    alloc_id = allocation(cluster)
    step_id = start_step(client, alloc_id, step_spec(client.get_job(alloc_id), ("sleep", "60")))
    wait_step(client, step_id, until=frozenset({"RUNNING"}), deadline=time.monotonic() + 30)
    lost = client.get_job(step_id).tasks[1].node_id
    cluster.kill_worker(lost, with_tasks=True)
    assert wait_step(client, alloc_id, deadline=time.monotonic() + 60).status == "FAILED"
    step = wait_step(client, step_id, deadline=time.monotonic() + 30)
    assert step.status == "FAILED" and step.attempt == 1
    assert {t.state for t in step.tasks} == {"LOST", "EXITED"}
    assert all(n.used.gpu == 0 for n in client.list_nodes())
