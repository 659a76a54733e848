"""History in the pure core: archive numbering and runs in apply, the export decision, retention and
the unarchived cap in the leader's brain. No database, no sockets."""

from __future__ import annotations

import pytest

from synapse.core import codec, history, versions
from synapse.core import commands as c
from synapse.core.brain.stimuli import MonitorDue
from synapse.core.model import EndReason, JobStatus, Node, NodeStatus, Placement, Resources
from synapse.core.state.fsm import ClusterState
from synapse.core.state.snapshot import encode
from tests.support.core import N0, N1, brain, proposals, run_job, scenario
from tests.support.helpers import GI, checked, cluster, spec


def test_finished_jobs_are_numbered_in_the_order_they_end_with_one_run_per_placed_attempt():
    state = scenario()
    assert [(state.jobs[j].archive_seq, state.jobs[j].status) for j in ("ok", "bad", "never")] == [
        (1, JobStatus.SUCCEEDED), (2, JobStatus.FAILED), (3, JobStatus.CANCELLED)]
    assert state.unarchived == {1: "ok", 2: "bad", 3: "never"} and state.archive_seq == 3
    ok, bad, never = (state.jobs[j] for j in ("ok", "bad", "never"))
    (run,) = ok.runs
    assert (run.attempt, run.placed_at, run.started_at, run.ended_at, run.nodes) == (1, 101, 102, 112, (N0, N1))
    assert (run.outcome, run.exit_code, run.gpu_seconds, run.cpu_seconds) == (EndReason.COMPLETED, 0, 2 * 8 * 11,
                                                                              2 * 1.0 * 11)
    assert [(r.attempt, r.outcome, r.exit_code, r.nodes) for r in bad.runs] == [
        (1, EndReason.ERROR, 3, (N0,)), (2, EndReason.OOM_KILLED, 137, (N1,))]
    assert never.runs == []


def test_history_exported_marks_jobs_archived_up_to_its_cursor_and_never_beyond_the_last():
    state = scenario()
    assert not checked(state, c.HistoryExported(at=500, upto=4)).ok  # job 4 has not ended
    assert checked(state, c.HistoryExported(at=500, upto=2)).value == "2"
    assert (state.archived_upto, state.unarchived) == (2, {3: "never"})
    assert (state.jobs["ok"].archived_at, state.jobs["never"].archived_at) == (500, 0)
    assert checked(state, c.HistoryExported(at=600, upto=1)).value == "0"  # an older cursor: nothing
    assert state.archived_upto == 2 and state.jobs["ok"].archived_at == 500


def test_the_archive_bookkeeping_survives_a_snapshot_and_an_older_snapshot_is_numbered_by_end():
    state = scenario()
    checked(state, c.HistoryExported(at=500, upto=1))
    again = ClusterState.from_snapshot(state.to_snapshot())
    assert again.digest() == state.digest()
    assert (again.unarchived, again.archived_upto, again.jobs["bad"].runs) == (
        state.unarchived, 1, state.jobs["bad"].runs)
    old = encode(state)
    del old["archive"]
    for jd in old["jobs"]:
        for key in ("runs", "archive_seq", "archived_at"):
            del jd[key]
    before = ClusterState.from_snapshot(old)
    assert before.unarchived == {1: "ok", 2: "bad", 3: "never"} and before.archive_seq == 3


def test_export_batches_follow_the_store_cursor():
    state = scenario()
    first = history.export_batch(state, 0, limit=2)
    assert [r.job_id for r in first.records] == ["ok", "bad"] and (first.upto, first.more) == (2, True)
    rest = history.export_batch(state, 2, limit=2)
    assert [r.job_id for r in rest.records] == ["never"] and (rest.upto, rest.more) == (3, False)
    # the store committed 3 but the proposal was lost: nothing to write, only the cursor to propose
    lost = history.export_batch(state, 3)
    assert (lost.records, lost.upto) == ((), 3)
    checked(state, c.HistoryExported(at=1, upto=3))
    assert history.export_batch(state, 3) == history.ExportBatch((), 3)
    assert "ahead" in history.export_batch(state, 9).problem


def test_a_job_record_holds_the_accounting_fields():
    state = scenario()
    bad = history.job_record(state.jobs["bad"])
    assert (bad.state, bad.reason, bad.exit_code, bad.attempts, bad.start, bad.end, bad.nodes) == (
        "FAILED", EndReason.OOM_KILLED, 137, 2, 201, 312, (N1,))
    assert bad.gpu_seconds == 8 * 11 * 2 and bad.wait == 1 and bad.elapsed == 111
    never = history.job_record(state.jobs["never"])
    assert (never.state, never.reason, never.start, never.cancelled_by, never.runs) == (
        "CANCELLED", EndReason.CANCELLED, 0, "alice", ())


def test_a_job_failed_on_a_dependency_before_it_ran_records_that_cause_with_no_start():
    state = cluster(racks=1, nodes_per_rack=2)
    checked(state, c.SubmitJob(at=10, job_id="dep", request_id="dep", spec=spec()))
    checked(state, c.FailAttempt(at=20, job_id="dep", attempt=1, reason="afterok up: it ended FAILED", final=True,
                                 cause="DependencyNeverSatisfied"))
    record = history.job_record(state.jobs["dep"])
    assert (record.state, record.reason, record.start, record.exit_code, record.runs) == (
        "FAILED", "DependencyNeverSatisfied", 0, 0, ())


def test_with_history_retention_counts_from_the_archive_and_never_forgets_an_unarchived_job():
    state = scenario()
    leader = brain(job_retention=100, history=True, max_unarchived=10)
    assert proposals(leader.handle(state, MonitorDue(at=10_000, mono=0))) == []  # none archived yet
    checked(state, c.HistoryExported(at=9_950, upto=2))
    out = proposals(leader.handle(state, MonitorDue(at=10_000, mono=100)))
    assert out == []  # archived 50 s ago: retention counts from there
    out = proposals(leader.handle(state, MonitorDue(at=10_051, mono=200)))
    assert out == [c.ForgetJobs(at=10_051, job_ids=("ok", "bad"))]
    without = brain(job_retention=100)  # no history store: from the end, as before
    assert proposals(without.handle(scenario(), MonitorDue(at=10_000, mono=0))) == [
        c.ForgetJobs(at=10_000, job_ids=("ok", "bad", "never"))]


def test_beyond_the_cap_the_oldest_unarchived_go_loudly():
    state = scenario()
    leader = brain(job_retention=0, history=True, max_unarchived=1)
    out = proposals(leader.handle(state, MonitorDue(at=1000, mono=0)))
    assert out == [c.HistoryOverflow(at=1000, job_ids=("ok", "bad"))]
    assert checked(state, out[0]).value == "2"
    assert state.history_dropped == 2 and set(state.jobs) == {"never"} and state.unarchived == {3: "never"}
    event = state.cluster_events[-1]
    assert (event.type, event.reason) == ("Warning", "HistoryDropped") and "ok, bad" in event.message


def test_forgetting_a_job_drops_it_from_the_unarchived():
    state = scenario()
    checked(state, c.ForgetJobs(at=1, job_ids=("ok",)))
    assert state.unarchived == {2: "bad", 3: "never"}


@pytest.mark.parametrize("cmd", [c.HistoryExported(at=1.5, upto=7, term=3),
                                 c.HistoryOverflow(at=2, job_ids=("a", "b"), term=3),
                                 c.SetUsageHalfLife(at=3, half_life=86400.0, term=3)])
def test_the_new_commands_round_trip_and_need_command_set_version_2(cmd):
    assert codec.decode_command(codec.encode_command(cmd)) == cmd
    assert versions.KIND_VERSIONS[type(cmd)] == 2


def test_day_shares_split_an_interval_over_utc_days():
    day = 1_700_006_400.0  # 2023-11-15T00:00:00Z
    assert history.day_shares(day - 3600, day + 3 * 3600) == [("2023-11-14", 0.25), ("2023-11-15", 0.75)]
    assert history.day_shares(day + 10, day + 10) == [("2023-11-15", 1.0)]


def test_a_preempted_run_is_its_own_record_and_the_job_keeps_its_place():
    state = cluster(racks=1, nodes_per_rack=2)
    checked(state, c.SubmitJob(at=1, job_id="low", request_id="low", spec=spec(tasks=1)))
    checked(state, c.CommitPlan(at=2, job_id="low", attempt=1, placements=(Placement(0, N0, tuple(range(8)), 0),)))
    checked(state, c.TaskStarted(at=3, job_id="low", attempt=1, index=0, node_id=N0))
    checked(state, c.SubmitJob(at=4, job_id="high", request_id="high", spec=spec(tasks=1, priority=5)))
    checked(state, c.Preempt(at=5, job_id="high", attempt=1, rule="priority", nodes=(N0,),
                             victims=(c.Victim("low", 1, 30.0),)))
    checked(state, c.TaskExited(at=9, job_id="low", attempt=1, index=0, node_id=N0, exit_code=143))
    run_job(state, "low", [N1], at=20)  # its second attempt runs to the end
    low = state.jobs["low"]
    assert [(r.attempt, r.outcome, r.exit_code, r.placed_at, r.ended_at) for r in low.runs] == [
        (1, EndReason.PREEMPTED, 143, 2, 9), (2, EndReason.COMPLETED, 0, 21, 32)]
    assert "preempted by job high" in low.runs[0].reason
    record = history.job_record(low)
    assert (record.state, record.reason, record.attempts, record.preemptions, record.start) == (
        "SUCCEEDED", EndReason.COMPLETED, 2, 1, 2)
    assert record.gpu_seconds == 8 * 7 + 8 * 11  # both runs held their GPUs


def node(name: str, *, used_gpu: int = 0, down: bool = False, cordoned: bool = False) -> Node:
    return Node(id=name, address="", topology=(), capacity=Resources(cpu=64_000, memory=GI, gpu=8),
                used=Resources(cpu=used_gpu * 1000, gpu=used_gpu), status=NodeStatus.DOWN if down else NodeStatus.READY,
                schedulable=not cordoned)


def test_a_cluster_sample_counts_gpus_allocated_idle_and_down():
    sample = history.cluster_sample([node("busy", used_gpu=6), node("free"), node("dead", used_gpu=2, down=True),
                                     node("cordoned", used_gpu=3, cordoned=True)])
    # a cordoned node's tasks still hold their GPUs; its free ones count as down, as a DOWN node's all
    assert sample == history.ClusterSample(allocated_gpus=9, idle_gpus=2 + 8, down_gpus=8 + 5,
                                           allocated_cpu=9000, idle_cpu=58_000 + 64_000, down_cpu=64_000 + 61_000)
    assert history.cluster_sample([]) == history.ClusterSample()


def test_utilization_rows_count_the_time_since_the_last_sample_capped_and_split_at_midnight():
    sample = history.ClusterSample(allocated_gpus=3, idle_gpus=1, down_gpus=4, allocated_cpu=2000)
    day = 1_700_006_400.0  # 2023-11-15T00:00:00Z
    (row,) = history.utilization_rows(sample, last=day + 100, now=day + 130)
    assert row == {"day": "2023-11-15", "allocated_gpu_seconds": 90.0, "idle_gpu_seconds": 30.0,
                   "down_gpu_seconds": 120.0, "allocated_cpu_seconds": 60.0, "idle_cpu_seconds": 0.0,
                   "down_cpu_seconds": 0.0}
    # a sample across midnight goes to both days, each its own seconds
    before, after = history.utilization_rows(sample, last=day - 10, now=day + 20)
    assert (before["day"], before["allocated_gpu_seconds"], after["day"], after["allocated_gpu_seconds"]) == (
        "2023-11-14", 30.0, "2023-11-15", 60.0)
    # a gap after a failover counts for at most max_gap; nothing before the first sample, nor twice
    (capped,) = history.utilization_rows(sample, last=day + 100, now=day + 10_000, max_gap=90)
    assert capped["idle_gpu_seconds"] == 90.0
    assert history.utilization_rows(sample, last=0.0, now=day) == []
    assert history.utilization_rows(sample, last=day, now=day) == []
    assert history.utilization_rows(sample, last=day + 5, now=day) == []
