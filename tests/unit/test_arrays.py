"""Job arrays in the pure core: index specs, the one record, lazy elements, the throttle, cancel."""

from __future__ import annotations

import dataclasses
import re

import pytest

from synapse.core import codec
from synapse.core import commands as c
from synapse.core.brain.leader_state import LeaderState
from synapse.core.jobs.arrays import ArraySpecError, JobArray, folded_id, format_spec, parse_array, split_element_id
from synapse.core.jobs.jobspec import JobFileError, check_spec, parse_job
from synapse.core.model import JobStatus
from synapse.core.schedule.scheduler import schedule_round
from synapse.core.state.fsm import ClusterState
from synapse.master.dispatch import assignments_for_node
from synapse.sim.policies import easy
from tests.support.core import array_spec, finish, run_round, submit_array
from tests.support.helpers import checked, cluster, spec

# ---- index specs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "canonical", "count"), [
    ("0-99%8", "0-99%8", 100), ("0-15:4", "0-12:4", 4), ("1,3,7", "1,3,7", 3), ("7, 3,1-2", "1-3,7", 4),
    ("5", "5", 1), ("0-9,5-14%2", "0-14%2", 15),
])
def test_index_specs_parse_as_slurm_writes_them(text, canonical, count):
    ranges, throttle = parse_array(text)
    assert format_spec(ranges, throttle) == canonical
    array = JobArray(id="A", spec=array_spec(format_spec(ranges, 0)), request_id="", user="", submitted_at=0,
                     seq=1, throttle=throttle)
    assert array.count == count
    assert [array.position_of(array.index_at(p)) for p in range(count)] == list(range(count))


@pytest.mark.parametrize(("text", "why"), [
    ("", "is empty"), ("a-b", "cannot read 'a-b'"), ("5-1", "ends before it starts"), ("0-9%0", "throttle"),
    ("0-9%x", "throttle"), ("0-20000", "more than 10000 elements"), ("0-9:0", "step"), ("1,,2", "cannot read ''"),
    ("0-9%\u00b2", "throttle"), ("\u00b2", "cannot read"), ("0-\u0663", "cannot read"),
])
def test_bad_index_specs_are_refused_with_the_reason(text, why):
    with pytest.raises(ArraySpecError, match=why):
        parse_array(text, limit=10_000)


@pytest.mark.parametrize(("job_id", "parts"), [
    ("A_7", ("A", 7)), ("my_job_0", ("my_job", 0)), ("A_10", ("A", 10)),
    ("A_01", None), ("A_00", None), ("A_\u00b2", None), ("A_\u0663", None), ("A_", None), ("_7", None), ("A", None),
])
def test_an_element_id_is_read_only_as_element_id_writes_it(job_id, parts):
    assert split_element_id(job_id) == parts


def test_a_dependency_or_cancel_naming_an_element_id_that_is_not_one_is_refused_not_raised():
    state = cluster(racks=1, nodes_per_rack=2)
    submit_array(state, "0-3", gpu=8)
    for bad in ("A_01", "A_\u00b2"):
        refused = state.apply(c.SubmitWorkflowJob(at=2.0, job_id="B", request_id="rB", spec=dataclasses.replace(
            spec(name="b"), after=(("ok", bad),))))
        assert not refused.ok and f"unknown job {bad}" in refused.error
        assert state.apply(c.CancelJob(at=2.0, job_id=bad)).code is c.Rejection.NOT_FOUND


def test_a_job_file_array_is_checked_against_the_field_and_the_cluster_limit():
    doc = {"name": "sweep", "command": ["true"], "resources": {"gpu": 1}, "array": "0-99%8"}
    parsed = parse_job(doc)
    assert (parsed.array, parsed.array_throttle) == ("0-99", 8)
    with pytest.raises(JobFileError) as bad:
        parse_job({**doc, "array": "0-x"})
    assert bad.value.field == "array"
    with pytest.raises(JobFileError, match="more than 50 elements") as big:
        check_spec(parsed, max_array_size=50)
    assert big.value.field == "array"


# ---- the one record and its elements ----------------------------------------------------------------


def test_an_array_is_one_record_and_one_queued_element_however_large():
    state = cluster(racks=1, nodes_per_rack=2)
    assert submit_array(state, "0-9999").value == "A"
    assert list(state.jobs) == ["A_0"] and state.jobs["A_0"].status is JobStatus.PENDING
    array = state.arrays["A"]
    assert (array.count, array.rep, array.remaining()) == (10_000, "A_0", 9_999)
    assert folded_id("A", array.waiting_ranges()) == "A_[0-9999]"
    assert state.job_by_request["req-A"] == "A"
    assert submit_array(state, "0-9999").value == "A"  # a retried submission returns the array, no second one
    assert submit_array(state, "0-3").code is c.Rejection.CONFLICT  # its request id with another spec: refused
    restored = ClusterState.from_snapshot(state.to_snapshot())
    assert restored.digest() == state.digest() and restored.arrays["A"].count == 10_000


def test_a_round_places_elements_up_to_the_throttle_under_the_ids_apply_gives_them():
    state = cluster(racks=1, nodes_per_rack=8)
    submit_array(state, "0-19", throttle=4)
    brain = LeaderState()
    cmds = run_round(state, brain, 2.0)
    assert [(type(x).__name__, x.job_id) for x in cmds] == [("CommitPlan", f"A_{i}") for i in range(4)]
    assert [j.status for j in state.jobs.values()] == [JobStatus.SCHEDULED] * 4 + [JobStatus.PENDING]
    cmds = run_round(state, brain, 3.0)
    assert [(type(x).__name__, [(e.job_id, e.code) for e in x.entries]) for x in cmds] == [
        ("PendingReasons", [("A_4", "ArrayThrottle")])]
    finish(state, "A_1")
    assert [x.job_id for x in run_round(state, brain, 4.0)] == ["A_4"]


def test_an_array_runs_to_the_end_never_above_its_throttle():
    state = cluster(racks=1, nodes_per_rack=8)
    submit_array(state, "0-19", throttle=4, gpu=1)
    brain, at, most = LeaderState(), 2.0, 0
    while not state.arrays["A"].done:
        run_round(state, brain, at)
        running = [j for j in state.jobs.values() if j.status.has_gang]
        most = max(most, len(running))
        for job in running:
            finish(state, job.id, at=at)
        at += 1
        assert at < 100
    assert most == 4
    assert sorted(j.array_index for j in state.jobs.values() if j.status is JobStatus.SUCCEEDED) == list(range(20))
    assert state.arrays["A"].status(False) is JobStatus.SUCCEEDED and state.arrays["A"].finished_at


def test_the_throttle_changes_while_the_array_runs():
    state = cluster(racks=1, nodes_per_rack=8)
    submit_array(state, "0-19", throttle=1)
    brain = LeaderState()
    assert [x.job_id for x in run_round(state, brain, 2.0)] == ["A_0"]
    assert checked(state, c.SetArrayThrottle(at=3.0, job_id="A", throttle=3)).ok
    assert [x.job_id for x in run_round(state, brain, 4.0)] == ["A_1", "A_2"]
    assert not checked(state, c.SetArrayThrottle(at=3.0, job_id="nope", throttle=3)).ok


def test_a_throttle_change_names_who_made_it():
    state = cluster(racks=1, nodes_per_rack=2)
    submit_array(state, "0-9", throttle=1)
    for throttle, text in ((3, "at most 3 element(s) running (by bob)"), (0, "no limit on running elements (by bob)")):
        checked(state, c.SetArrayThrottle(at=3.0, job_id="A", throttle=throttle, by="bob"))
        assert state.cluster_events[-1].message == text


def test_each_element_gets_its_array_ids_in_its_environment():
    state = cluster(racks=1, nodes_per_rack=2)
    submit_array(state, "3,5", gpu=8)
    run_round(state, LeaderState(), 2.0)
    envs = {a.job_id: dict(a.env) for n in state.nodes for a in assignments_for_node(state, n)}
    assert {k: (e["SYNAPSE_ARRAY_JOB_ID"], e["SYNAPSE_ARRAY_TASK_ID"], e["SYNAPSE_ARRAY_TASK_COUNT"])
            for k, e in envs.items()} == {"A_3": ("A", "3", "2"), "A_5": ("A", "5", "2")}


def test_cancel_the_array_cancels_every_element_and_one_element_alone():
    state = cluster(racks=1, nodes_per_rack=2)
    submit_array(state, "0-9", gpu=8)
    run_round(state, LeaderState(), 2.0)  # A_0 and A_1 placed, A_2 queued
    assert checked(state, c.CancelJob(at=3.0, job_id="A_7")).ok  # not yet a job: it never becomes one
    assert "A_7" not in state.jobs and state.arrays["A"].cancelled_count == 1
    assert folded_id("A", state.arrays["A"].waiting_ranges()) == "A_[2-6,8-9]"
    assert checked(state, c.CancelJob(at=3.0, job_id="A_1")).ok  # a running element stops
    assert state.jobs["A_1"].status is JobStatus.STOPPING
    assert checked(state, c.CancelJob(at=4.0, job_id="A")).ok
    array = state.arrays["A"]
    assert array.cancelled and state.jobs["A_0"].status is JobStatus.STOPPING
    assert state.jobs["A_2"].status is JobStatus.CANCELLED and array.next == array.count
    for job_id in ("A_0", "A_1"):
        finish(state, job_id, code=143)
    assert array.done and array.cancelled_count == 10 and array.status(False) is JobStatus.CANCELLED
    assert not state.pending


def test_a_finished_array_is_forgotten_with_its_final_state_kept():
    state = cluster(racks=1, nodes_per_rack=2)
    submit_array(state, "0-1", gpu=8)
    run_round(state, LeaderState(), 2.0)
    finish(state, "A_0")
    finish(state, "A_1")
    assert checked(state, c.ArchiveJobs(at=9e9, job_ids=("A", "A_0", "A_1"))).value == "3"
    assert not state.arrays and not state.jobs
    assert state.finished == {"A": "SUCCEEDED", "A_0": "SUCCEEDED", "A_1": "SUCCEEDED"}


def test_arrays_travel_as_their_own_command_kind_at_version_2():
    cmd = c.SubmitWorkflowJob(at=1.0, job_id="A", request_id="r", spec=array_spec("0-9", 2))
    data = codec.encode_command(cmd)
    assert codec.decode_command(data) == cmd
    assert codec.commands_pb2.Command.FromString(data).version == 2
    throttle = c.SetArrayThrottle(at=1.0, job_id="A", throttle=4)
    assert codec.decode_command(codec.encode_command(throttle)) == throttle
    with pytest.raises(codec.CodecError, match="SubmitWorkflowJob"):
        codec.encode_command(c.SubmitJob(at=1.0, job_id="A", request_id="r", spec=array_spec("0-9")))
    state = ClusterState()
    refused = state.apply(c.SubmitJob(at=1.0, job_id="A", request_id="r", spec=array_spec("0-9")))
    assert not refused.ok and "SubmitWorkflowJob" in refused.error


def test_a_round_that_plans_more_elements_then_reserves_for_a_blocked_gang_does_not_fail():
    """The drain clock reads the time limit of every plan of the round, the array's next elements
    (not jobs yet) among them; the simulator's EASY reservation too."""
    state = cluster(racks=1, nodes_per_rack=2)
    submit_array(state, "0-3", gpu=8, time_limit=600.0)
    checked(state, c.SubmitJob(at=2.0, job_id="J", request_id="rJ", by="bob", spec=spec(name="j")))
    result = schedule_round(state, 3.0)
    assert [p.job_id for p in result.plans] == ["A_0", "A_1"]
    assert result.waiting["J"].code == "Resources" and result.reservation.starts_at == 603.0
    assert [p.job_id for p in easy(state, 3.0).plans] == ["A_0", "A_1"]


@pytest.mark.parametrize(("array", "throttle", "why"), [
    ("0-9%2", 0, "give the throttle apart"),  # the throttle would be dropped silently
    ("", 4, "a throttle (%N) needs an index spec"),
    ("0-1000000", 0, "more than 1000000 elements"),
])
def test_apply_refuses_what_the_endpoint_refuses(array, throttle, why):
    state = cluster(racks=1, nodes_per_rack=2)
    s = dataclasses.replace(spec(name="sweep"), array=array, array_throttle=throttle)
    refused = state.apply(c.SubmitWorkflowJob(at=1.0, job_id="A", request_id="rA", spec=s))
    assert not refused.ok and why in refused.error
    with pytest.raises(JobFileError, match=re.escape(why)):
        check_spec(s)
    assert not state.arrays and not state.jobs
