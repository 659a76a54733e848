"""GPU errors a worker reports (issue 35): the gangs on the failed GPUs requeue uncharged off the node at
once, the node is cordoned naming the GPU, and the end counts against the node (a suspect). The pure
core here (the state machine, the leader's brain, the worker's parsing); a real cluster in
tests/cluster/test_gpu_error.py."""

from __future__ import annotations

import dataclasses

from synapse.core import codec, versions
from synapse.core import commands as c
from synapse.core.brain.config import LeaderConfig
from synapse.core.brain.heartbeat import NODE_GPUS, GpuErrorReport, gpu_fault, gpu_fault_change
from synapse.core.brain.leader_state import LeaderState
from synapse.core.brain.stimuli import Heartbeat, MonitorDue, Proposed
from synapse.core.model import JobStatus, Placement
from synapse.core.schedule.spares import restarting
from synapse.core.state.fsm import ClusterState
from synapse.worker.gpu_errors import hook_watch, parse_hook, parse_query
from tests.support.helpers import checked, cluster, spec

N0, N1 = "r0-n0", "r0-n1"


def submit(state: ClusterState, job_id: str, **kw) -> None:
    checked(state, c.SubmitJob(at=10, job_id=job_id, request_id=job_id, spec=spec(name=job_id, **kw)))


def place(state: ClusterState, job_id: str, *nodes: str, gpus=tuple(range(8)), at: float = 20) -> None:
    job = state.jobs[job_id]
    result = checked(state, c.CommitPlan(at=at, job_id=job_id, attempt=job.attempt, placements=tuple(
        Placement(i, n, gpus, i) for i, n in enumerate(nodes))))
    assert result.ok, result.error
    for t in job.tasks:
        checked(state, c.TaskStarted(at=at + 1, job_id=job_id, attempt=job.attempt, index=t.index, node_id=t.node_id))


def exit_all(state: ClusterState, job_id: str, at: float) -> None:
    job = state.jobs[job_id]
    for t in list(job.tasks):
        if t.state.live:
            checked(state, c.TaskExited(at=at, job_id=job_id, attempt=job.attempt, index=t.index, node_id=t.node_id,
                                        exit_code=-15))


# ---- the state machine -----------------------------------------------------------------------------


def test_a_gpu_error_stops_the_gangs_on_that_gpu_alone_and_cordons_the_node_naming_it():
    state = cluster(racks=1, nodes_per_rack=2)
    submit(state, "a", tasks=2, gpu=4)
    submit(state, "b", tasks=1, gpu=4)
    place(state, "a", N0, N1, gpus=(0, 1, 2, 3))
    place(state, "b", N0, gpus=(4, 5, 6, 7))
    result = checked(state, c.GpuFault(at=50, node_id=N0, gpus=(2,), message="GPU 2: uncorrectable ECC errors: 1"))
    assert result.value == "a"
    a, b, node = state.jobs["a"], state.jobs["b"], state.nodes[N0]
    assert (a.status, a.stop_cause) == (JobStatus.STOPPING, "GpuError")
    assert b.status is JobStatus.RUNNING  # its GPUs are fine: it keeps running on the cordoned node
    assert (node.schedulable, node.cordon_reason) == (False, "GPU error: GPU 2: uncorrectable ECC errors: 1")
    assert node.gpu_error == "GPU 2: uncorrectable ECC errors: 1" and not node.suspect
    assert node.failures == ((50, "a", "GpuError"),)
    exit_all(state, "a", 51)
    # Requeued at its place, uncharged, excluding the node; the next attempt is a restart (spares).
    assert (a.status, a.attempt, a.restarts_used(), a.requeues, a.excluded_nodes) == (
        JobStatus.PENDING, 2, 0, 1, (N0,))
    assert a.runs[-1].outcome == "GpuError" and restarting(a)
    reasons = [(e.reason, e.message) for e in state.events_after(0) if e.object_id == N0]
    assert ("NodeGpuError", "GPU error: GPU 2: uncorrectable ECC errors: 1; stopping a") in reasons


def test_gpu_errors_of_two_jobs_make_a_suspect_and_an_uncordon_clears_the_error():
    state = cluster(racks=1, nodes_per_rack=2)
    submit(state, "a", tasks=1, gpu=4)
    submit(state, "b", tasks=1, gpu=4)
    place(state, "a", N0, gpus=(0, 1, 2, 3))
    place(state, "b", N0, gpus=(4, 5, 6, 7))
    assert checked(state, c.GpuFault(at=50, node_id=N0, message="GPUs: nvidia-smi failed")).value == "a,b"
    node = state.nodes[N0]
    assert node.suspect and node.cordon_reason == "GPU error: GPUs: nvidia-smi failed"  # what to repair
    assert [e.reason for e in state.events_after(0) if e.reason == "NodeSuspect"] == ["NodeSuspect"]
    snap = state.to_snapshot()
    assert snap["version"] == 4 and ClusterState.from_snapshot(snap).digest() == state.digest()
    checked(state, c.SetNodeHealth(at=51, node_id=N0, healthy=True))  # a passing health check lifts nothing
    assert not node.schedulable
    checked(state, c.SetSchedulable(at=60, by="admin", node_id=N0, schedulable=True))
    assert (node.schedulable, node.gpu_error, node.suspect, node.failures) == (True, "", False, ())
    assert not checked(state, c.GpuFault(at=61, node_id="ghost", message="x")).ok


def test_the_command_round_trips_at_version_4():
    cmd = c.GpuFault(at=1, term=2, node_id="n1", gpus=(1, 3), message="GPU 1: x; GPU 3: y")
    assert codec.decode_command(codec.encode_command(cmd)) == cmd
    assert codec.command_to_proto(cmd).version == 4 == versions.KIND_VERSIONS[c.GpuFault]


# ---- the leader's brain ----------------------------------------------------------------------------


def test_the_leader_proposes_one_gpu_fault_and_again_only_if_the_state_does_not_hold_it():
    state = cluster(racks=1, nodes_per_rack=2)
    brain = LeaderState(LeaderConfig())
    submit(state, "a", tasks=1)
    place(state, "a", N0)
    errors = (GpuErrorReport(3, "not listed by nvidia-smi (fallen off the bus?)"),)
    assert brain.handle(state, Heartbeat(N0, at=30, mono=30, gpu_errors=errors)) == []  # version 1: not acted on
    brain.handle(state, MonitorDue(at=31, mono=31, cluster_version=4))
    first = brain.handle(state, Heartbeat(N0, at=32, mono=32, gpu_errors=errors))
    fault = c.GpuFault(at=32, node_id=N0, gpus=(3,), message="GPU 3: not listed by nvidia-smi (fallen off the bus?)")
    assert [i.cmd for i in first] == [fault]
    assert brain.handle(state, Heartbeat(N0, at=33, mono=33, gpu_errors=errors)) == []  # in flight
    brain.handle(state, Proposed(first[0], False))  # lost to a leader change: the next heartbeat makes it again
    again = brain.handle(state, Heartbeat(N0, at=34, mono=34, gpu_errors=errors))
    assert [i.cmd for i in again] == [dataclasses.replace(fault, at=34)]
    result = state.apply(again[0].cmd)
    brain.handle(state, Proposed(again[0], result.ok, result.value))
    assert brain.handle(state, Heartbeat(N0, at=35, mono=35, gpu_errors=errors)) == []  # the state holds it
    assert brain.handle(state, Heartbeat(N0, at=36, mono=36)) == []  # the error cleared: the cordon stays
    assert not state.nodes[N0].schedulable
    brain.validate(state)


def test_the_message_names_every_gpu_and_a_whole_node_error_hits_every_gpu_task():
    assert gpu_fault([GpuErrorReport(3, "b"), GpuErrorReport(1, "a"), GpuErrorReport(1, "a")]) == (
        (1, 3), "GPU 1: a; GPU 3: b")
    assert gpu_fault([GpuErrorReport(NODE_GPUS, "nvidia-smi failed"), GpuErrorReport(0, "x")]) == (
        (), "GPUs: nvidia-smi failed; GPU 0: x")
    state = cluster(racks=1, nodes_per_rack=2)
    submit(state, "cpu", tasks=1, gpu=0)
    place(state, "cpu", N0, gpus=())
    checked(state, c.SetSchedulable(at=25, node_id=N0, schedulable=False))
    node = state.nodes[N0]
    node.gpu_error = "GPUs: gone"  # as a GpuFault recorded it: a task without GPUs is not hit
    assert gpu_fault_change(node, (GpuErrorReport(NODE_GPUS, "gone"),), state.tasks_on_node(N0), 1) is None


# ---- the worker ------------------------------------------------------------------------------------


def test_the_worker_reads_nvidia_smi_and_the_test_hook(tmp_path):
    listing = "0, 0\n1, 2\n2, [GPU requires reset]\n4, [N/A]\n"
    assert parse_query(listing, range(5)) == (
        GpuErrorReport(1, "uncorrectable ECC errors: 2"), GpuErrorReport(2, "GPU requires reset"),
        GpuErrorReport(3, "not listed by nvidia-smi (fallen off the bus?)"))
    assert parse_query("0, 0\n", [0]) == ()
    assert parse_hook("# a comment\n\n1 Xid 79: fallen off the bus\n* driver gone\nbad line\n") == (
        GpuErrorReport(1, "Xid 79: fallen off the bus"), GpuErrorReport(NODE_GPUS, "driver gone"))
    watch = hook_watch("w1", {"SYNAPSE_TEST_GPU_ERRORS": str(tmp_path / "errors-{node}")})
    assert watch is not None and watch.poll() == ()  # no file: no error
    (tmp_path / "errors-w1").write_text("0 Xid 48\n")
    assert watch.poll() == (GpuErrorReport(0, "Xid 48"),)
    assert hook_watch("w1", {}) is None


# ---- a real cluster --------------------------------------------------------------------------------


