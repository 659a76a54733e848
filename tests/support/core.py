"""Scenarios on the pure core, no process: jobs run to an end on a `ClusterState`, the leader's brain and
its rounds, array jobs, the property tests' submissions, a rendered job."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from synapse.core import codec
from synapse.core import commands as c
from synapse.core.brain.config import LeaderConfig
from synapse.core.brain.leader_state import LeaderState
from synapse.core.brain.stimuli import Propose, Proposed, RoundDue
from synapse.core.model import (
    CheckpointSpec,
    EndReason,
    JobStatus,
    Placement,
    Resources,
    Secret,
)
from synapse.core.state.fsm import ClusterState
from synapse.proto import api_pb2
from synapse.sim.engine import uniform_cluster
from tests.support.helpers import GI, checked, cluster, spec

N0, N1 = "r0-n0", "r0-n1"


def run_job(state: ClusterState, job_id: str, nodes: list[str], *, at: float, code: int = 0, cause: str = "",
            **kw) -> None:
    """Submit (if new), place on whole nodes, start, and exit every task with `code`."""
    if job_id not in state.jobs:
        checked(state, c.SubmitJob(at=at, job_id=job_id, request_id=job_id, spec=spec(tasks=len(nodes), **kw)))
    job = state.jobs[job_id]
    checked(state, c.CommitPlan(at=at + 1, job_id=job_id, attempt=job.attempt, placements=tuple(
        Placement(i, n, tuple(range(8)), i) for i, n in enumerate(nodes))))
    for t in job.tasks:
        checked(state, c.TaskStarted(at=at + 2, job_id=job_id, attempt=job.attempt, index=t.index, node_id=t.node_id))
    for t in list(job.tasks):
        checked(state, c.TaskExited(at=at + 12, job_id=job_id, attempt=t.attempt, index=t.index, node_id=t.node_id,
                                    exit_code=code, cause=cause))


def scenario() -> ClusterState:
    """A success, a failure retried once then failed for good, a job cancelled while pending."""
    state = cluster(racks=1, nodes_per_rack=2)
    run_job(state, "ok", [N0, N1], at=100)
    run_job(state, "bad", [N0], at=200, code=3, max_restarts=1)
    assert state.jobs["bad"].status is JobStatus.PENDING  # requeued for its one restart
    run_job(state, "bad", [N1], at=300, code=137, cause=EndReason.OOM_KILLED)
    checked(state, c.SubmitJob(at=400, job_id="never", request_id="never", spec=spec()))
    checked(state, c.CancelJob(at=410, job_id="never", by="alice"))
    return state


def brain(**config) -> LeaderState:
    return LeaderState(LeaderConfig(heartbeat_timeout=1e9, **config))


def proposals(out) -> list[c.Command]:
    return [i.cmd for i in out if isinstance(i, Propose)]


def array_spec(indices: str, throttle: int = 0, **kw) -> object:
    return dataclasses.replace(spec(name="sweep", **kw), array=indices, array_throttle=throttle)


def submit_array(state: ClusterState, indices: str, throttle: int = 0, job_id: str = "A", **kw) -> c.Result:
    return checked(state, c.SubmitWorkflowJob(at=1.0, job_id=job_id, request_id=f"req-{job_id}", by="ann",
                                              spec=array_spec(indices, throttle, **kw)))


def run_round(state: ClusterState, brain: LeaderState, at: float) -> list[c.Command]:
    """One round: apply what the brain proposes (as Raft would) and return the commands."""
    out = brain.handle(state, RoundDue(at=at))
    cmds = [i.cmd for i in out if isinstance(i, Propose)]
    brain.handle(state, *(Proposed(i, checked(state, i.cmd).ok) for i in out if isinstance(i, Propose)))
    return cmds


def finish(state: ClusterState, job_id: str, code: int = 0, at: float = 10.0) -> None:
    """Every task of the job's attempt starts, then exits with `code`."""
    job = state.jobs[job_id]
    for t in list(job.tasks):
        checked(state, c.TaskStarted(at=at, job_id=job_id, attempt=job.attempt, index=t.index, node_id=t.node_id))
    for t in list(job.tasks):
        checked(state, c.TaskExited(at=at, job_id=job_id, attempt=job.attempt, index=t.index, node_id=t.node_id,
                                    exit_code=code))


NODES = uniform_cluster(blocks_per_zone=1, racks_per_block=2, nodes_per_rack=2, capacity=Resources(16_000, 64 * GI, 8))


def _submit(data, state, now, job_id, job, attempt, node_id, term, word):
    sane = data.draw(st.integers(0, 3)) > 0  # mostly a job that can run, so later commands find jobs
    pick = (lambda good, bad: data.draw(st.sampled_from(good if sane else good + bad)))
    shape = spec(tasks=pick([1, 2, 3], [0, 99]), gpu=pick([0, 1, 8], [9]), cpu=pick([500, 16_000], [-1]),
                 priority=data.draw(st.integers(0, 2)), max_restarts=data.draw(st.integers(0, 2)),
                 queue=pick(["", "team-a"] if "team-a" in state.queues else [""], ["nope"]),
                 time_limit=pick([0.0, 60.0], [-1.0]))
    new_id = pick([f"j{len(state.jobs)}"], [job_id, ""])
    kind = data.draw(st.sampled_from(["plain", "plain", "workflow", "checkpoint", "image", "secret", "alloc",
                                      "interactive"]))
    if kind == "interactive":  # a session (bounded by its queue's maximum), or a job held from the start
        shape = dataclasses.replace(shape, interactive=data.draw(st.booleans()),
                                    time_limit=pick([3600.0, 60.0], [0.0, 1e6]))
        return [c.SubmitInteractiveJob(at=now, job_id=new_id, request_id=new_id, spec=shape, by=data.draw(word),
                                       held=data.draw(st.booleans()))]
    if kind == "alloc":
        shape = dataclasses.replace(shape, alloc=True, command=pick([()], [("true",)]),
                                    idle_timeout=pick([0.0, 60.0], [-1.0]))
        return [c.SubmitAllocJob(at=now, job_id=new_id, request_id=new_id, spec=shape, by=data.draw(word))]
    if kind == "secret":
        secret = Secret("API_KEY", b"\x01" * 16, pick([b"\x02" * 40], [b""]))
        shape = dataclasses.replace(shape, secrets=(secret,))
        return [c.SubmitSecretJob(at=now, job_id=new_id, request_id=new_id, spec=shape)]
    if kind == "image":
        shape = dataclasses.replace(shape, image=pick(["127.0.0.1:5000/team/train:1"], ["", "bad ref"]),
                                    command=pick([(), ("true",)], []),
                                    mounts=pick([(("/data", "/data", True),), ()], [(("data", "/", False),)]))
        return [c.SubmitImageJob(at=now, job_id=new_id, request_id=new_id, spec=shape)]
    if kind == "workflow":
        shape = dataclasses.replace(shape, after=((data.draw(st.sampled_from(["ok", "any"])), job_id),))
        return [c.SubmitWorkflowJob(at=now, job_id=new_id, request_id=new_id, spec=shape, by=data.draw(word))]
    if kind == "checkpoint":
        shape = dataclasses.replace(shape, checkpoint=CheckpointSpec("USR1", pick([30.0], [0.0, 1e9])))
        return [c.SubmitCheckpointJob(at=now, job_id=new_id, request_id=new_id, spec=shape)]
    return [c.SubmitJob(at=now, job_id=new_id, request_id=pick([new_id], ["", "same"]), spec=shape,
                        by=data.draw(word))]


def started_state() -> ClusterState:
    state = ClusterState()
    for cmd in NODES:
        assert state.apply(cmd).ok
    return state


def running_job() -> api_pb2.JobInfo:
    job_spec = codec.job_spec_to_proto(spec(tasks=2, gpu=4, cpu=2000, memory=4 * GI, pack="rack", required=True,
                                            max_restarts=1, name="train"))
    return api_pb2.JobInfo(
        id="j-1", spec=job_spec, status="RUNNING", attempt=1, request_id="r-1", submitted_at=3600.0,
        started_at=3661.0, user="alice", tasks=[
            api_pb2.TaskInfo(index=0, rank=0, node_id="n1", gpus=[0, 1, 2, 3], state="running"),
            api_pb2.TaskInfo(index=1, rank=1, node_id="n2", state="exited", exit_code=137, has_exit_code=True,
                             reason="OOMKilled", reason_message="memory limit 4Gi")],
        events=[api_pb2.JobEvent(at=3600.0, kind="Submitted", message="queued"),
                api_pb2.JobEvent(at=3661.0, kind="Scheduled", message="on n1,n2")])
