"""Records that tell the truth (issue 44, item 4), in the pure core and what synctl prints: an
elastic gang's history at the size it ran, a refused mount and a never-run task without an exit
code. No sockets."""

from __future__ import annotations

import dataclasses

from synapse.client import accounting
from synapse.core import commands as c
from synapse.core import history
from synapse.core.model import NEVER_RAN_VERSION, EndReason, JobStatus, Placement
from synapse.proto import api_pb2, types_pb2
from tests.support.helpers import checked, cluster, spec


def run_at(state, job_id: str, nodes: list[str], at: float) -> None:
    """Place the pending job's attempt on these whole nodes and start every task."""
    job = state.jobs[job_id]
    checked(state, c.CommitPlan(at=at, job_id=job_id, attempt=job.attempt, placements=tuple(
        Placement(i, n, tuple(range(8)), i) for i, n in enumerate(nodes))))
    for t in job.tasks:
        checked(state, c.TaskStarted(at=at + 1, job_id=job_id, attempt=job.attempt, index=t.index, node_id=t.node_id))


def exit_all(state, job_id: str, at: float, code: int = 0) -> None:
    job = state.jobs[job_id]
    for t in list(job.tasks):
        checked(state, c.TaskExited(at=at, job_id=job_id, attempt=t.attempt, index=t.index, node_id=t.node_id,
                                    exit_code=code))


def as_proto(record: history.JobRecord) -> api_pb2.HistoryJob:
    """The record as the history API carries it (synapse.master.api.history, field for field)."""
    res = types_pb2.Resources(cpu_millis=record.cpu, memory_bytes=record.memory, gpu=record.gpu)
    return api_pb2.HistoryJob(
        job_id=record.job_id, name=record.name, user=record.user, queue=record.queue, submit=record.submit,
        eligible=record.eligible, start=record.start, end=record.end, state=record.state, reason=record.reason,
        exit_code=record.exit_code, attempts=record.attempts, tasks=record.tasks, nodes=record.nodes, resources=res,
        gpu_seconds=record.gpu_seconds, runs=[api_pb2.HistoryRun(
            attempt=r.attempt, start=r.start, running=r.running, end=r.end, nodes=r.nodes, tasks=r.tasks,
            resources=res, outcome=r.outcome, reason=r.reason, exit_code=r.exit_code, gpu_seconds=r.gpu_seconds)
            for r in record.runs])


def sacct_fields(job: api_pb2.HistoryJob, duplicates: bool = False) -> list[dict[str, str]]:
    return [dict(zip(accounting.SACCT_FIELDS, line.split("|"), strict=True))
            for line in accounting.sacct_lines([job], "synapse", header=False, duplicates=duplicates)]


def test_an_elastic_gang_is_recorded_at_the_size_each_attempt_ran_not_its_maximum():
    state = cluster(racks=1, nodes_per_rack=6)
    elastic = dataclasses.replace(spec(name="e", tasks=6, gpu=8), tasks_min=2, resize_interval=60.0)
    assert checked(state, c.SubmitWorkflowJob(at=1, job_id="e", request_id="e", spec=elastic)).ok
    run_at(state, "e", [f"r0-n{i}" for i in range(4)], at=10)  # 4 of its 2-6 fit
    checked(state, c.ResizeGang(at=100, job_id="e", attempt=1, size=3, reason="a node is needed"))
    exit_all(state, "e", at=101, code=143)
    assert state.jobs["e"].status is JobStatus.PENDING  # the resize starts a new attempt: a new interval
    run_at(state, "e", ["r0-n0", "r0-n1", "r0-n2"], at=110)
    exit_all(state, "e", at=210)
    record = history.job_record(state.jobs["e"])
    assert [(r.attempt, r.tasks, r.gpu_seconds) for r in record.runs] == [(1, 4, 4 * 8 * 91), (2, 3, 3 * 8 * 100)]
    assert (record.tasks, record.gpu) == (3, 8)  # the last run's size, not the spec's 6
    d = accounting.history_dict(as_proto(record))
    assert accounting.history_table([d]).split("\n")[1].split()[9] == "24"  # GPUS: 3 x 8, not 6 x 8
    (last,) = sacct_fields(as_proto(record))
    assert (last["ReqTRES"], last["AllocTRES"], last["NCPUS"]) == (
        "cpu=3,mem=3072M,node=3,gres/gpu=24", "cpu=3,mem=3072M,node=3,gres/gpu=24", "3")
    first, again = sacct_fields(as_proto(record), duplicates=True)
    assert (first["State"], first["AllocTRES"]) == ("REQUEUED", "cpu=4,mem=4096M,node=4,gres/gpu=32")
    assert again["AllocTRES"] == last["AllocTRES"]


def test_an_elastic_gang_that_ran_with_4_of_6_tasks_is_in_history_with_4():
    state = cluster(racks=1, nodes_per_rack=4)
    elastic = dataclasses.replace(spec(name="e", tasks=6, gpu=8), tasks_min=2, resize_interval=60.0)
    assert checked(state, c.SubmitWorkflowJob(at=1, job_id="e", request_id="e", spec=elastic)).ok
    run_at(state, "e", [f"r0-n{i}" for i in range(4)], at=10)
    exit_all(state, "e", at=20)
    record = history.job_record(state.jobs["e"])
    assert (record.state, record.tasks, record.runs[0].tasks) == ("SUCCEEDED", 4, 4)
    (row,) = sacct_fields(as_proto(record))
    assert row["ReqGRES"] == "gpu:32" and row["AllocTRES"].endswith("gres/gpu=32")  # 4 x 8, not 48


def image_gang(state, job_id: str, at: float):
    job_spec = dataclasses.replace(spec(tasks=2, gpu=8, max_restarts=3), image="registry.example/train:1")
    assert checked(state, c.SubmitImageJob(at=at, job_id=job_id, request_id=job_id, spec=job_spec)).ok
    checked(state, c.CommitPlan(at=at + 1, job_id=job_id, attempt=1, placements=(
        Placement(0, "r0-n0", tuple(range(8)), 0), Placement(1, "r0-n1", tuple(range(8)), 1))))
    return state.jobs[job_id]


def test_a_refused_mount_fails_the_job_at_its_first_attempt_naming_the_allowed_prefixes():
    state = cluster(racks=1, nodes_per_rack=2)
    checked(state, c.SetClusterVersion(at=1, version=NEVER_RAN_VERSION))
    job = image_gang(state, "m", at=2)
    why = "mount /home/ann: not under a prefix this worker allows (/data, /scratch)"
    checked(state, c.TaskExited(at=5, job_id="m", attempt=1, index=0, node_id="r0-n0", exit_code=127, reason=why,
                                cause=EndReason.MOUNT_REFUSED))
    checked(state, c.TaskExited(at=6, job_id="m", attempt=1, index=1, node_id="r0-n1", exit_code=143))
    assert (job.status, job.attempt, job.restarts_used()) == (JobStatus.FAILED, 1, 0)  # max_restarts 3, unused
    assert "MountRefused" in job.failure and "(/data, /scratch)" in job.failure
    assert "not retried" in job.events[-1].message
    task = job.tasks[0]
    assert (task.reason, task.exit_code) == (EndReason.MOUNT_REFUSED, None)  # it never ran: no exit code
    record = history.job_record(job)
    assert (record.reason, record.exit_code, record.runs[0].outcome) == ("MountRefused", 0, "MountRefused")
    d = accounting.history_dict(as_proto(record))
    assert d["exit_code"] is None and d["runs"][0]["exit_code"] is None
    assert "exit code -;" in accounting.history_description(d)


def test_a_task_whose_image_was_never_pulled_has_no_exit_code_in_history():
    state = cluster(racks=1, nodes_per_rack=2)
    checked(state, c.SetClusterVersion(at=1, version=NEVER_RAN_VERSION))
    job = image_gang(state, "p", at=2)
    checked(state, c.TaskExited(at=5, job_id="p", attempt=1, index=0, node_id="r0-n0", exit_code=127,
                                reason="NOT_FOUND: no such tag", cause=EndReason.IMAGE_PULL_FAILED))
    checked(state, c.TaskExited(at=6, job_id="p", attempt=1, index=1, node_id="r0-n1", exit_code=127,
                                reason="stopped while its image was being pulled", cause=EndReason.ERROR))
    assert job.status is JobStatus.FAILED and job.tasks[0].exit_code is None
    assert any("task 0 of attempt 1 did not start on r0-n0: ImagePullFailed" in e.message
               for e in state.cluster_events)
    record = history.job_record(job)
    assert (record.reason, record.exit_code, record.runs[0].exit_code) == ("ImagePullFailed", 0, 0)
    d = accounting.history_dict(as_proto(record))
    assert accounting.history_table([d]).split("\n")[1].split()[5] == "-"
    (row,) = sacct_fields(as_proto(record))
    assert row["ExitCode"] == "0:0"


def test_before_every_replica_knows_version_6_a_never_run_task_keeps_the_workers_code():
    state = cluster(racks=1, nodes_per_rack=2)
    checked(state, c.SetClusterVersion(at=1, version=NEVER_RAN_VERSION - 1))
    job = image_gang(state, "p", at=2)
    checked(state, c.TaskExited(at=5, job_id="p", attempt=1, index=0, node_id="r0-n0", exit_code=127,
                                reason="NOT_FOUND: no such tag", cause=EndReason.IMAGE_PULL_FAILED))
    assert job.tasks[0].exit_code == 127  # as an older replica applies it: the states stay equal


def test_an_array_keeps_its_first_start_through_a_snapshot_from_version_6():
    from synapse.core.brain.leader_state import LeaderState
    from synapse.core.brain.stimuli import Started
    from synapse.core.state.fsm import ClusterState
    from tests.support.core import finish, run_round, submit_array

    for version, first_start in ((NEVER_RAN_VERSION - 1, 0.0), (NEVER_RAN_VERSION, 20.0)):
        state = cluster(racks=1, nodes_per_rack=2)
        checked(state, c.SetClusterVersion(at=1, version=version))
        submit_array(state, "0-3", gpu=8)
        brain = LeaderState()
        brain.handle(state, Started(at=2, mono=2))
        at = 20.0
        while state.arrays["A"].ended < 4:
            run_round(state, brain, at)
            for job_id in [j for j in state.array_live.get("A", ()) if state.jobs[j].status.has_gang]:
                finish(state, job_id, at=at)
            at += 10
        array = state.arrays["A"]
        assert (array.status(False), array.started_at) == (JobStatus.SUCCEEDED, first_start)
        again = ClusterState.from_snapshot(state.to_snapshot())
        assert again.arrays["A"].started_at == first_start and again.digest() == state.digest()


def test_a_waiting_gangs_reason_and_reservation_say_a_time_of_day_never_an_epoch():
    import re

    from synapse.core.schedule.scheduler import schedule_round

    now = 1_796_520_000.0  # 2026-12-06 01:20 UTC
    state = cluster(racks=1, nodes_per_rack=2)
    busy = dataclasses.replace(spec(name="busy", tasks=1, gpu=8), time_limit=3600.0)
    assert checked(state, c.SubmitJob(at=now - 60, job_id="busy", request_id="busy", spec=busy)).ok
    run_at(state, "busy", ["r0-n0"], at=now - 50)
    assert checked(state, c.SubmitJob(at=now, job_id="gang", request_id="gang", spec=spec(tasks=2, gpu=8))).ok
    result = schedule_round(state, now)
    reservation = result.reservation
    assert reservation is not None and reservation.job_id == "gang"
    for text in (result.waiting["gang"].message, reservation.describe(now)):
        assert "expected free at 02:19 UTC" in text and not re.search(r"\d{10}", text), text
    assert "expected free at 2026-12-06 02:19 UTC" in reservation.describe(now + 86400)


# ---- preempt --what-if: the leader's own step ------------------------------------------------------

def _preemption_world(data) -> tuple[object, float]:
    """A random cluster: 2 racks of 2 nodes (8 GPUs each), maybe queues, running gangs of random
    queues, priorities and ages, and waiting gangs that may or may not fit."""
    from hypothesis import strategies as st

    from synapse.core.model import Queue, Resources
    from synapse.core.state.fsm import ClusterState
    from synapse.sim.engine import uniform_cluster

    now = 100_000.0
    state = ClusterState()
    for cmd in uniform_cluster(racks_per_block=2, nodes_per_rack=2):
        checked(state, cmd)
    queues = data.draw(st.lists(st.sampled_from([
        Queue("a", guaranteed=Resources(0, 0, 16)), Queue("b", preemption_rules=("priority",)),
        Queue("b", min_runtime=600), Queue("a", preemption_rules=("reclaim", "priority", "backfill")),
        Queue("b", guaranteed=Resources(0, 0, 16), preemption_rules=("fair_share", "priority"))]),
        min_size=1, max_size=2, unique_by=lambda q: q.name), label="queues") if data.draw(st.integers(0, 5)) else []
    if queues:
        checked(state, c.ApplyQueues(at=0, queues=tuple(queues)))
    names = [q.name for q in queues]
    nodes = [f"r{r}-n{n}" for r in range(2) for n in range(2)]
    for i in range(data.draw(st.integers(1, 4), label="running")):
        free = [n for n in nodes if not state.nodes[n].gpus_in_use]
        if not free:
            break
        on = data.draw(st.lists(st.sampled_from(free), min_size=1, max_size=2, unique=True), label="on")
        job_id = f"run{i}"
        started = now - data.draw(st.sampled_from([60, 900, 4000]), label="age")
        checked(state, c.SubmitJob(at=started - 1, job_id=job_id, request_id=job_id, spec=spec(
            name=job_id, tasks=len(on), gpu=8, queue=data.draw(st.sampled_from(["", *names]), label="queue"),
            priority=data.draw(st.integers(0, 2), label="priority"))))
        checked(state, c.CommitPlan(at=started, job_id=job_id, attempt=1, placements=tuple(
            Placement(k, n, tuple(range(8)), k) for k, n in enumerate(on))))
        for t in state.jobs[job_id].tasks:
            checked(state, c.TaskStarted(at=started, job_id=job_id, attempt=1, index=t.index, node_id=t.node_id))
    for i in range(data.draw(st.integers(1, 3), label="waiting")):
        job_id = f"wait{i}"
        checked(state, c.SubmitJob(at=now - 30 + i, job_id=job_id, request_id=job_id, spec=spec(
            name=job_id, tasks=data.draw(st.integers(1, 4), label="tasks"), gpu=8,
            queue=data.draw(st.sampled_from([*names, *names, ""]), label="queue"),
            priority=data.draw(st.integers(0, 3), label="priority"),
            pack=data.draw(st.sampled_from(["", "rack"]), label="pack"))))
    return state, now


def _settled(state, brain, now: float) -> None:
    """Rounds until one places nothing, their plans committed as the log would (a Preempt is not)."""
    from synapse.core.brain.stimuli import Propose, RoundDue

    for _ in range(6):
        out = brain.handle(state, RoundDue(at=now))
        commits = [i.cmd for i in out if isinstance(i, Propose) and isinstance(i.cmd, c.CommitPlan)]
        if not commits:
            return
        for cmd in commits:
            state.apply(cmd)


def test_what_if_answers_what_the_next_round_does_over_random_states():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from synapse.core.brain.leader_state import LeaderState
    from synapse.core.brain.stimuli import Propose, RoundDue, Started
    from synapse.core.schedule.preemption import PreemptionPlan

    @settings(max_examples=150, deadline=None)
    @given(st.data())
    def check(data):
        state, now = _preemption_world(data)
        brain = LeaderState()
        brain.handle(state, Started(at=now, mono=0.0))
        _settled(state, brain, now)
        pending = list(state.pending_jobs())
        said = {j.id: brain.what_if(state, j, now) for j in pending}
        out = brain.handle(state, RoundDue(at=now))
        preempts = [i.cmd for i in out if isinstance(i, Propose) and isinstance(i.cmd, c.Preempt)]
        if any(isinstance(i, Propose) and isinstance(i.cmd, c.CommitPlan) for i in out):
            return  # a round that places gangs preempts nothing yet (its next one decides)
        promised = {job_id: p.command for job_id, p in said.items() if isinstance(p, PreemptionPlan)}
        assert promised == {p.job_id: p for p in preempts}, (said, preempts)

    check()


def test_with_no_queues_what_if_promises_nothing_and_says_why():
    from synapse.core.brain.leader_state import LeaderState
    from synapse.core.brain.stimuli import RoundDue, Started

    state = cluster(racks=1, nodes_per_rack=2)
    for job_id, priority, on in (("low", 0, ["r0-n0", "r0-n1"]), ("high", 5, [])):
        checked(state, c.SubmitJob(at=1, job_id=job_id, request_id=job_id, spec=spec(
            name=job_id, tasks=2, gpu=8, priority=priority)))
        if on:
            run_at(state, job_id, on, at=2)
    brain = LeaderState()
    brain.handle(state, Started(at=5000, mono=0.0))
    brain.handle(state, RoundDue(at=5000))
    said = brain.what_if(state, state.jobs["high"], 5000)
    assert said == "no queue is defined: only jobs of a queue an admin defined preempt"


def test_a_gang_that_preempts_waits_in_the_rack_it_preempts_in_not_the_one_it_reserved():
    """rack0's gang ends within minutes (the round reserves rack0 for the waiting gang), rack1's
    started 100 s ago (preempting it loses least): the preemption is in rack1, and so are the
    gang's wait reason and reservation, where they named rack0."""
    from synapse.core.brain.leader_state import LeaderState
    from synapse.core.brain.stimuli import Propose, RoundDue, Started
    from synapse.core.model import Queue

    state = cluster(racks=2, nodes_per_rack=2)
    checked(state, c.ApplyQueues(at=0, queues=(Queue("a"),)))
    now = 100_000.0
    for job_id, nodes, started, limit in (("old", ["r0-n0", "r0-n1"], now - 3500, 3600.0),
                                          ("young", ["r1-n0", "r1-n1"], now - 100, 0.0)):
        job_spec = dataclasses.replace(spec(name=job_id, tasks=2, gpu=8, queue="a"), time_limit=limit)
        assert checked(state, c.SubmitJob(at=started - 1, job_id=job_id, request_id=job_id, spec=job_spec)).ok
        run_at(state, job_id, nodes, at=started)
    assert checked(state, c.SubmitJob(at=now - 10, job_id="big", request_id="big", spec=spec(
        name="big", tasks=2, gpu=8, queue="a", priority=5, pack="rack", required=True))).ok
    brain = LeaderState()
    brain.handle(state, Started(at=now, mono=0.0))
    out = brain.handle(state, RoundDue(at=now))
    (preempt,) = [i.cmd for i in out if isinstance(i, Propose) and isinstance(i.cmd, c.Preempt)]
    assert preempt.nodes == ("r1-n0", "r1-n1") and preempt.explanation.startswith("preempting in z0/b0/r1")
    (entries,) = [i.cmd.entries for i in out if isinstance(i, Propose) and isinstance(i.cmd, c.PendingReasons)]
    for reason in (brain.wait_reason("big"), *entries):
        assert reason.code == "Preempting" and "z0/b0/r1" in reason.message and "r0" not in reason.message, reason
    assert brain.head_reservation() is None and all(r.job_id != "big" for r in brain.reservations())
