"""The checkpoint notice on the pure core: the job file, the log, apply, the leader's time-limit
monitor, the preemption planner and dispatch, each with exact expectations
(a real cluster's drain and time limit: tests/cluster/test_checkpoint.py)."""

from __future__ import annotations

import dataclasses

import pytest

from synapse.core import codec, versions
from synapse.core import commands as c
from synapse.core.brain.config import LeaderConfig
from synapse.core.brain.leader_state import LeaderState
from synapse.core.brain.stimuli import MonitorDue, Propose, Proposed
from synapse.core.jobs.jobspec import JobFileError, check_spec, parse_job
from synapse.core.model import CheckpointSpec, JobStatus, Placement, Queue
from synapse.core.schedule import preemption
from synapse.core.state.fsm import ClusterState, utc_clock
from synapse.master.dispatch import assignments_for_node
from synapse.sim.engine import uniform_cluster
from tests.support.checkpoint import USR1, events, submit
from tests.support.helpers import checked, cluster, spec

N0, N1 = "r0-n0", "r0-n1"
V3 = versions.KIND_VERSIONS[c.CheckpointNotice]


def doc(**kw):
    return {"name": "train", "command": ["python", "train.py"], "resources": {"gpu": 1}, **kw}


def noticed_spec(checkpoint: CheckpointSpec = USR1, **kw):
    return dataclasses.replace(spec(**kw), checkpoint=checkpoint)


def start(state: ClusterState, job_id: str, nodes: list[str], at: float = 20.0, started: bool = True) -> None:
    job = state.jobs[job_id]
    checked(state, c.CommitPlan(at=at, job_id=job_id, attempt=job.attempt, placements=tuple(
        Placement(i, n, tuple(range(8)), i) for i, n in enumerate(nodes))))
    if started:
        for i, n in enumerate(nodes):
            checked(state, c.TaskStarted(at=at, job_id=job_id, attempt=job.attempt, index=i, node_id=n))


def exit_all(state: ClusterState, job_id: str, at: float, code: int = -15) -> None:
    for t in [t for t in state.jobs[job_id].tasks if t.state.live]:
        assert checked(state, c.TaskExited(at=at, job_id=job_id, attempt=t.attempt, index=t.index, node_id=t.node_id,
                                           exit_code=code)).ok


def listed(state: ClusterState, node_id: str) -> list[tuple[bool, str, float]]:
    """What the node's worker is told of each task: (stop, notice signal, notice seconds)."""
    return [(a.stop, a.notice_signal, a.notice) for a in assignments_for_node(state, node_id)]


# ---- the job file --------------------------------------------------------------------------------


@pytest.mark.parametrize("written", ["USR1", "SIGUSR1", "usr1", " sigusr1 "])
def test_a_job_file_names_the_signal_as_kill_l_does(written):
    parsed = parse_job(doc(checkpoint={"signal": written, "notice": "2m"}))
    assert parsed.checkpoint == CheckpointSpec("USR1", 120.0) and parsed.has_checkpoint
    assert parse_job(doc()).checkpoint == CheckpointSpec() and not parse_job(doc()).has_checkpoint


@pytest.mark.parametrize("checkpoint,field,why", [
    ({"signal": "KILL", "notice": "1m"}, "checkpoint.signal", "SIGKILL cannot be trapped"),
    ({"signal": "SIGSTOP", "notice": "1m"}, "checkpoint.signal", "SIGSTOP cannot be trapped"),
    ({"signal": "CHLD", "notice": "1m"}, "checkpoint.signal", "'CHLD' is not a signal a notice may be"),
    ({"signal": 10, "notice": "1m"}, "checkpoint.signal", "signal numbers differ"),
    ({"signal": "USR1"}, "checkpoint", "give both the signal and the notice"),
    ({"signal": "USR1", "notice": "1m", "when": "x"}, "checkpoint.when", "unknown field"),
    ({"signal": "USR1", "notice": 0}, "checkpoint.notice", "must be above 0 and at most 1 day"),
    ({"signal": "USR1", "notice": "2d"}, "checkpoint.notice", "must be above 0 and at most 1 day"),
    ("USR1", "checkpoint", "must be a mapping"),
])
def test_a_bad_checkpoint_is_refused_naming_the_field(checkpoint, field, why):
    with pytest.raises(JobFileError) as refused:
        parse_job(doc(checkpoint=checkpoint))
    assert refused.value.field == field and why in refused.value.why, str(refused.value)


def test_a_notice_longer_than_the_time_limit_is_refused_naming_both():
    with pytest.raises(JobFileError) as refused:
        parse_job(doc(checkpoint={"signal": "USR1", "notice": "3m"}, time_limit="2m"))
    assert str(refused.value) == ("checkpoint.notice: 180s is longer than the job's time_limit of 120s: the notice "
                                  "would come before the job starts; give a shorter notice or a longer time_limit")
    assert parse_job(doc(checkpoint={"signal": "USR1", "notice": "2m"}, time_limit="2m")).checkpoint.notice == 120
    with pytest.raises(JobFileError, match="checkpoint.signal: a notice needs a signal"):
        check_spec(dataclasses.replace(spec(), checkpoint=CheckpointSpec("", 5.0)))  # as an RPC may send it


# ---- the log -------------------------------------------------------------------------------------


def test_a_checkpoint_travels_in_a_version_3_kind_and_never_in_an_older_one():
    s = noticed_spec()
    cmd = c.SubmitCheckpointJob(at=1, job_id="j", request_id="r", spec=s)
    assert c.submit_kind(s) is c.SubmitCheckpointJob and c.submit_kind(spec()) is c.SubmitJob
    assert c.submit_kind(dataclasses.replace(spec(), after=(("ok", "x"),))) is c.SubmitWorkflowJob
    assert codec.decode_command(codec.encode_command(cmd)) == cmd
    assert codec.CURRENT.version_of(cmd) == 3 == codec.CURRENT.version_of(c.CheckpointNotice(
        at=1, job_id="j", attempt=1, stop_at=2))
    for older in (c.SubmitJob, c.SubmitWorkflowJob):
        with pytest.raises(codec.CodecError, match="travels as SubmitCheckpointJob"):
            codec.encode_command(older(at=1, job_id="j", request_id="r", spec=s))
    # An older kind that carries one anyway is read as an older replica reads it: without it.
    env = codec.command_to_proto(c.SubmitJob(at=1, job_id="j", request_id="r", spec=spec()))
    env.submit_job.spec.checkpoint.signal, env.submit_job.spec.checkpoint.notice_s = "USR1", 120
    assert codec.decode_command(env.SerializeToString()).spec.checkpoint == CheckpointSpec()
    victims = c.Preempt(at=1, job_id="p", attempt=1, rule="priority", nodes=("n",),
                        victims=(c.Victim("v", 1, 30.0, 120.0),))
    assert codec.decode_command(codec.encode_command(victims)) == victims


def test_apply_refuses_a_checkpoint_outside_its_kind_and_a_state_snapshot_keeps_it():
    state = cluster()
    refused = state.apply(c.SubmitWorkflowJob(at=1, job_id="j", request_id="r", spec=noticed_spec()))
    assert not refused.ok and "needs a SubmitCheckpointJob command" in refused.error
    bad = dataclasses.replace(noticed_spec(time_limit=60), checkpoint=CheckpointSpec("USR1", 61.0))
    assert "longer than the job's time_limit" in state.apply(c.SubmitCheckpointJob(
        at=1, job_id="j", request_id="r", spec=bad)).error
    assert state.to_snapshot()["version"] == 2  # nothing of version 3 yet: as a version-2 replica writes it
    submit(state, "j")
    assert state.to_snapshot()["version"] == 3  # a version-2 release would drop the notice: it refuses this
    start(state, "j", [N0])
    checked(state, c.DrainNode(at=60, node_id=N0))
    again = ClusterState.from_snapshot(state.to_snapshot())
    assert again.jobs["j"].spec.checkpoint == USR1
    assert (again.jobs["j"].stop_notice, again.jobs["j"].notice_at) == (120.0, 60.0)
    assert again.digest() == state.digest()


def test_a_queue_max_grace_caps_the_notice_and_the_submission_says_so():
    state = cluster()
    checked(state, c.ApplyQueues(at=0, queues=(Queue("short", max_grace=60.0),)))
    submit(state, "j", queue="short")
    assert events(state, "j", "Submitted") == [(10.0, "1 task(s), max_restarts 0; warning: checkpoint.notice "
                                                      "120s is longer than queue short's max_grace of 60s: the "
                                                      "tasks get 60s of notice")]
    assert state.jobs["j"].spec.checkpoint.notice == 120  # kept as asked: a larger max_grace gives it all
    assert state.notice_of(state.jobs["j"]) == 60
    checked(state, c.ApplyQueues(at=1, queues=(Queue("short", max_grace=600.0),)))
    assert state.notice_of(state.jobs["j"]) == 120


# ---- planned stops -------------------------------------------------------------------------------


def test_a_drain_gives_the_notice_first_and_the_next_attempt_learns_why():
    state = cluster()
    submit(state, "j", tasks=2, max_restarts=0)
    start(state, "j", [N0, N1])
    first = {a.index: dict(a.env) for a in assignments_for_node(state, N0)}
    assert first[0]["SYNAPSE_RESTART_REASON"] == "" and first[0]["SYNAPSE_CHECKPOINT_SIGNAL"] == "USR1"
    assert first[0]["SYNAPSE_CHECKPOINT_NOTICE_S"] == "120"
    assert listed(state, N0) == [(False, "", 0.0)]
    checked(state, c.DrainNode(at=3600, by="admin", node_id=N1))
    job = state.jobs["j"]
    assert (job.status, job.stop_cause, job.stop_notice, job.notice_at) == (JobStatus.STOPPING, "Drained", 120, 3600)
    assert events(state, "j", "Notice") == [(3600, "SIGUSR1 to 2 task(s); the drain stops them at 01:02:00 UTC "
                                                   "(120s notice)")]
    assert [e.kind for e in job.events][-2:] == ["Stopping", "Notice"]
    assert listed(state, N0) == listed(state, N1) == [(True, "USR1", 120.0)]  # both tasks: the whole gang stops
    exit_all(state, "j", at=3725)
    assert (job.status, job.attempt, job.restarts_used(), job.requeues) == (JobStatus.PENDING, 2, 0, 1)
    assert (job.stop_notice, job.notice_at) == (0.0, 0.0)
    start(state, "j", ["r0-n2", "r0-n3"], at=3730)
    assert dict(assignments_for_node(state, "r0-n2")[0].env)["SYNAPSE_RESTART_REASON"] == "Drained"


@pytest.mark.parametrize("stop", ["cancel", "failure", "node lost"])
def test_a_stop_that_was_not_planned_gives_no_notice(stop):
    state = cluster()
    submit(state, "j", tasks=2, max_restarts=1)
    start(state, "j", [N0, N1])
    if stop == "cancel":
        checked(state, c.CancelJob(at=50, job_id="j", by="alice"))
    elif stop == "failure":
        checked(state, c.TaskExited(at=50, job_id="j", attempt=1, index=1, node_id=N1, exit_code=3))
    else:
        checked(state, c.NodeLost(at=50, term=1, node_id=N1))
    job = state.jobs["j"]
    assert job.status is JobStatus.STOPPING and (job.stop_notice, job.notice_at) == (0.0, 0.0)
    assert events(state, "j", "Notice") == [] and listed(state, N0) == [(True, "", 0.0)]
    exit_all(state, "j", at=51)  # what is left of the gang
    if stop != "cancel":
        start(state, "j", ["r0-n2", "r0-n3"], at=60)
        reason = dict(assignments_for_node(state, "r0-n2")[0].env)["SYNAPSE_RESTART_REASON"]
        assert reason == {"failure": "Error", "node lost": "NodeLost"}[stop]


def test_a_gang_not_yet_fully_started_stops_without_a_notice():
    state = cluster()
    submit(state, "j", tasks=2)
    start(state, "j", [N0, N1], started=False)
    checked(state, c.TaskStarted(at=21, job_id="j", attempt=1, index=0, node_id=N0))
    checked(state, c.DrainNode(at=22, node_id=N0))
    assert state.jobs["j"].stop_notice == 0 and events(state, "j", "Notice") == []
    assert listed(state, N0) == [(True, "", 0.0)]


def test_a_resize_of_an_elastic_gang_gives_the_notice():
    state = cluster()
    elastic = dataclasses.replace(spec(name="e", tasks=4), tasks_min=2, checkpoint=CheckpointSpec("TERM", 30.0))
    checked(state, c.SubmitCheckpointJob(at=1, job_id="e", request_id="e", spec=elastic))
    start(state, "e", [N0, N1], at=2)
    checked(state, c.ResizeGang(at=900, term=1, job_id="e", attempt=1, size=4, reason="room for more tasks"))
    assert state.jobs["e"].stop_notice == 30 and state.jobs["e"].stop_cause == "Resized"
    assert events(state, "e", "Notice") == [(900, "SIGTERM to 2 task(s); the resize stops them at 00:15:30 UTC "
                                                  "(30s notice)")]
    assert listed(state, N0) == [(True, "TERM", 30.0)]


def test_a_preempted_victim_gets_its_notice_capped_by_its_queue():
    state = ClusterState()
    for cmd in uniform_cluster(racks_per_block=1, nodes_per_rack=2):
        checked(state, cmd)
    checked(state, c.ApplyQueues(at=0, queues=(Queue("q", max_grace=90.0),)))
    submit(state, "low", at=1, tasks=2, queue="q", checkpoint=CheckpointSpec("USR2", 300.0))
    start(state, "low", [N0, N1], at=2)
    checked(state, c.SubmitJob(at=3, job_id="high", request_id="high", spec=spec(name="high", tasks=2, queue="q",
                                                                                 priority=10)))
    found = preemption.plan(state, state.jobs["high"], now=1000)
    assert found.command.victims == (c.Victim("low", 1, 30.0, 90.0),)  # grace DEFAULT_GRACE_S, notice capped
    checked(state, found.command)
    assert state.jobs["low"].stop_notice == 90
    assert events(state, "low", "Notice") == [(1000, "SIGUSR2 to 2 task(s); the preemption stops them at "
                                                     "00:18:10 UTC (90s notice)")]
    assert listed(state, N1) == [(True, "USR2", 90.0)]


# ---- the time limit ------------------------------------------------------------------------------


def test_a_checkpoint_notice_is_applied_once_to_a_running_attempt_only():
    state = cluster()
    submit(state, "j", time_limit=600)
    submit(state, "plain", checkpoint=CheckpointSpec())
    notice = c.CheckpointNotice(at=580, term=1, job_id="j", attempt=1, stop_at=700)
    assert "not running attempt 1" in state.apply(notice).error  # still pending
    start(state, "j", [N0], at=100)
    start(state, "plain", [N1], at=100)
    assert "asks for no checkpoint notice" in state.apply(dataclasses.replace(notice, job_id="plain")).error
    assert "a notice is for a planned stop ahead" in state.apply(dataclasses.replace(notice, cause="Cancelled")).error
    assert checked(state, notice).ok and state.jobs["j"].notice_at == 580
    assert events(state, "j", "Notice") == [(580, "SIGUSR1 to 1 task(s); its time limit stops them at 00:11:40 UTC "
                                                  "(120s notice)")]
    assert listed(state, N0) == [(False, "USR1", 120.0)]  # still wanted: signal it, the stop comes later
    assert checked(state, dataclasses.replace(notice, at=581, stop_at=701)).value == "already noticed"
    assert len(events(state, "j", "Notice")) == 1
    checked(state, c.FailAttempt(at=701, term=1, job_id="j", attempt=1, reason="time limit of 600s exceeded",
                                 final=True, cause="TimeLimit"))
    assert listed(state, N0) == [(True, "USR1", 120.0)]  # noticed at 580: its worker sends SIGTERM at once
    assert len(events(state, "j", "Notice")) == 1


class Driver:
    """The leader's brain over a state, the clock in the test's hands (as tests/unit/test_leader_state.py)."""

    def __init__(self, state: ClusterState, version: int = V3) -> None:
        self.state, self.brain = state, LeaderState(LeaderConfig(job_retention=0))
        if version >= V3:  # the cluster version, as a leader records it once every member applies it
            checked(state, c.SetClusterVersion(at=0, version=version))

    def monitor(self, at: float, version: int = V3) -> list[c.Command]:
        return [i.cmd for i in self.brain.handle(self.state, MonitorDue(at=at, mono=0, cluster_version=version))
                if isinstance(i, Propose)]

    def commit(self, cmds: list[c.Command]) -> None:
        for cmd in cmds:
            result = checked(self.state, cmd)
            self.brain.handle(self.state, Proposed(Propose(cmd), result.ok, result.value))
        self.brain.validate(self.state)


def test_the_leader_sends_the_notice_its_length_before_the_limit_and_stops_at_the_limit():
    d = Driver(cluster())
    submit(d.state, "j", time_limit=600)
    start(d.state, "j", [N0], at=100)
    assert d.monitor(579) == []
    notice = d.monitor(580)
    assert notice == [c.CheckpointNotice(at=580, job_id="j", attempt=1, stop_at=700, cause="TimeLimit")]
    assert d.monitor(581) == []  # on its way: not proposed twice
    d.commit(notice)
    assert d.monitor(700) == []
    stop = d.monitor(701)
    assert stop == [c.FailAttempt(at=701, job_id="j", attempt=1, reason="time limit of 600s exceeded", final=True,
                                  cause="TimeLimit")]
    d.commit(stop)
    exit_all(d.state, "j", at=702)
    assert d.state.jobs["j"].status is JobStatus.FAILED and d.state.jobs["j"].runs[-1].outcome == "TimeLimit"


def test_a_notice_that_went_out_late_still_gives_its_whole_length():
    d = Driver(cluster())
    submit(d.state, "j", time_limit=600)
    start(d.state, "j", [N0], at=100)
    late = d.monitor(650)  # a new leader's first pass, say
    assert late == [c.CheckpointNotice(at=650, job_id="j", attempt=1, stop_at=770, cause="TimeLimit")]
    d.commit(late)
    assert d.monitor(701) == [] and d.monitor(770) == []
    assert [cmd.cause for cmd in d.monitor(771)] == ["TimeLimit"]


def test_until_every_member_applies_version_3_the_stop_at_the_limit_gives_the_notice():
    d = Driver(cluster(), version=V3 - 1)
    submit(d.state, "j", time_limit=600)
    start(d.state, "j", [N0], at=100)
    assert d.monitor(580, version=V3 - 1) == [] and d.monitor(700, version=V3 - 1) == []
    stop = d.monitor(701, version=V3 - 1)
    assert [type(cmd) for cmd in stop] == [c.FailAttempt]
    d.commit(stop)
    assert events(d.state, "j", "Notice") == [(701, "SIGUSR1 to 1 task(s); its time limit stops them at "
                                                    "00:13:41 UTC (120s notice)")]
    assert listed(d.state, N0) == [(True, "USR1", 120.0)]


def test_utc_clock_is_the_time_of_day_in_utc():
    assert utc_clock(0) == "00:00:00 UTC" and utc_clock(86399.9) == "23:59:59 UTC"
    assert utc_clock(1_700_000_000) == "22:13:20 UTC"


# ---- a real cluster ------------------------------------------------------------------------------


