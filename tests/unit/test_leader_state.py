"""The leader's brain without sockets or threads: stimuli in, the exact commands out.

Each test drives a bare `LeaderState` over a `ClusterState` it builds with commands, the way the
leader's driver and the simulator do, and a fixture checks the brain's own invariants afterwards.
"""

from __future__ import annotations

import dataclasses

import pytest

from synapse.core import commands as c
from synapse.core.brain import monitors, rounds
from synapse.core.brain.config import LeaderConfig
from synapse.core.brain.leader_state import LeaderState
from synapse.core.brain.stimuli import (
    HealthReport,
    Heartbeat,
    LivenessDigest,
    MonitorDue,
    Propose,
    Proposed,
    Reschedule,
    RoundDue,
    Started,
)
from synapse.core.model import JobStatus, NodeStatus, Placement, Queue, Resources
from synapse.core.schedule import preemption
from synapse.core.state.fsm import ClusterState
from tests.support.helpers import checked, cluster, spec

N0, N1 = "r0-n0", "r0-n1"


class Driver:
    """What synapse.master.leader does, with the clock in the test's hands: apply what the brain
    proposes to the state (as Raft would) and feed back the outcome."""

    def __init__(self, state: ClusterState, **config) -> None:
        self.state = state
        self.brain = LeaderState(LeaderConfig(**config))

    def handle(self, *stimuli) -> list:
        return self.brain.handle(self.state, *stimuli)

    def commit(self, instructions: list) -> list:
        """Apply every proposal, feed back the outcomes; what those call for."""
        outcomes = []
        for i in instructions:
            if isinstance(i, Propose):
                result = self.state.apply(i.cmd)
                outcomes.append(Proposed(i, result.ok, result.value))
        return self.handle(*outcomes)


@pytest.fixture
def make():
    drivers: list[Driver] = []

    def factory(state: ClusterState | None = None, **config) -> Driver:
        drivers.append(Driver(state if state is not None else cluster(racks=1, nodes_per_rack=2), **config))
        return drivers[-1]

    yield factory
    for d in drivers:
        d.brain.validate(d.state)


def cmds(instructions: list) -> list[c.Command]:
    return [i.cmd for i in instructions if isinstance(i, Propose)]


def submit(state: ClusterState, job_id: str, at: float = 0.0, **kw) -> None:
    checked(state, c.SubmitJob(at=at, job_id=job_id, request_id=job_id, spec=spec(name=job_id, **kw)))


def start(state: ClusterState, job_id: str, nodes: list[str], at: float) -> None:
    checked(state, c.CommitPlan(at=at, job_id=job_id, attempt=1, placements=tuple(
        Placement(i, n, tuple(range(8)), i) for i, n in enumerate(nodes))))
    for i, n in enumerate(nodes):
        checked(state, c.TaskStarted(at=at, job_id=job_id, attempt=1, index=i, node_id=n))


# ---- heartbeats ----------------------------------------------------------------------------------


def test_a_new_leader_gives_every_node_a_full_timeout_then_declares_the_silent_one_down(make):
    d = make(heartbeat_timeout=10)
    assert d.handle(Started(at=100, mono=1000)) == [Reschedule("leader ready")]
    assert d.handle(Heartbeat(N1, at=105, mono=1005)) == []
    assert cmds(d.handle(MonitorDue(at=110, mono=1010))) == []  # exactly the timeout: not yet
    assert cmds(d.handle(MonitorDue(at=111, mono=1011))) == [
        c.NodeDown(at=111, node_id=N0, reason="no heartbeat for 11.0s")]


def test_a_new_leader_gives_workers_of_a_cut_off_replica_the_move_window(make):
    """A worker attached to the old leader, partitioned from the others, heartbeats there until
    that replica's cut-off and only then moves: a full timeout from the election was too short for
    it (a false NodeDown in a 30-minute chaos run). A node heard by the leader itself counts from then."""
    d = make(heartbeat_timeout=10, shard_move=16)
    d.handle(Started(at=100, mono=1000))
    d.handle(Heartbeat(N1, at=101, mono=1001))
    assert cmds(d.handle(MonitorDue(at=111, mono=1011))) == []
    down = cmds(d.handle(MonitorDue(at=112, mono=1012)))
    assert down == [c.NodeDown(at=112, node_id=N1, reason="no heartbeat for 11.0s")]
    checked(d.state, down[0])
    assert cmds(d.handle(MonitorDue(at=116, mono=1016))) == []  # N0: the move window has not passed
    assert cmds(d.handle(MonitorDue(at=117, mono=1017))) == [
        c.NodeDown(at=117, node_id=N0, reason="no heartbeat for 11.0s")]


def test_digests_keep_nodes_up_and_a_node_silent_on_its_shard_goes_down(make):
    d = make(heartbeat_timeout=10, shard_silence=3)
    d.handle(Started(at=100, mono=1000))
    for t in range(1001, 1021):  # shard A hears N0 every 5 s; it last heard N1 at 1003
        ages = ((N0, (t - 1001) % 5),) + (((N1, 0.0),) if t == 1003 else ())
        assert d.handle(LivenessDigest("A", at=t - 900, mono=t, ages=ages)) == []
        out = cmds(d.handle(MonitorDue(at=t - 900, mono=t)))
        assert out == ([c.NodeDown(at=114, node_id=N1, reason="no heartbeat for 11.0s")] if t == 1014 else [])
        for cmd in out:
            checked(d.state, cmd)
    assert d.state.nodes[N0].status is NodeStatus.READY


def test_the_freshest_report_of_any_shard_counts(make):
    d = make(heartbeat_timeout=10, shard_silence=3)
    d.handle(Started(at=0, mono=0))
    d.handle(LivenessDigest("A", at=12, mono=12, ages=((N0, 9.0), (N1, 0.5))),
             LivenessDigest("B", at=12, mono=12, ages=((N0, 1.0),)),
             LivenessDigest("A", at=13, mono=13, ages=((N0, 10.0),)))  # an older report changes nothing
    d.handle(LivenessDigest("A", at=21, mono=21), LivenessDigest("B", at=21, mono=21))
    assert cmds(d.handle(MonitorDue(at=21, mono=21))) == []  # N0: 10 s since 11 (through B), N1: 9.5
    d.handle(LivenessDigest("A", at=22, mono=22), LivenessDigest("B", at=22, mono=22))
    assert cmds(d.handle(MonitorDue(at=22, mono=22))) == [
        c.NodeDown(at=22, node_id=N0, reason="no heartbeat for 11.0s"),
        c.NodeDown(at=22, node_id=N1, reason="no heartbeat for 10.5s")]


def test_a_silent_shard_gives_its_nodes_a_full_timeout_to_move(make):
    d = make(heartbeat_timeout=10, shard_silence=3)
    d.handle(Started(at=0, mono=0))
    for t in range(1, 21):  # B keeps sending digests (with nothing in them) all along
        d.handle(LivenessDigest("B", at=t, mono=t))
    d.handle(LivenessDigest("A", at=5, mono=5, ages=((N0, 2.0), (N1, 0.0))))
    # A's digests stopped at 5: its nodes' silence counts from then, not from their last beats
    assert cmds(d.handle(MonitorDue(at=14, mono=14))) == []
    d.handle(LivenessDigest("B", at=11, mono=11, ages=((N1, 0.0),)))  # N1's worker moved to B
    assert cmds(d.handle(MonitorDue(at=15, mono=15))) == []
    down = cmds(d.handle(MonitorDue(at=16, mono=16)))
    assert down == [c.NodeDown(at=16, node_id=N0, reason="no heartbeat for 13.0s")]
    checked(d.state, down[0])
    assert cmds(d.handle(MonitorDue(at=21, mono=21))) == []  # N1 heard through B at 11
    assert cmds(d.handle(MonitorDue(at=21.5, mono=21.5))) == [
        c.NodeDown(at=21.5, node_id=N1, reason="no heartbeat for 10.5s")]


def test_a_new_leader_forgets_the_old_digests(make):
    d = make(heartbeat_timeout=10, shard_silence=3)
    d.handle(Started(at=0, mono=0))
    d.handle(LivenessDigest("A", at=1, mono=1, ages=((N0, 0.0), (N1, 0.0))))
    d.handle(Started(at=50, mono=50))  # as after a re-election: a full timeout from now
    assert cmds(d.handle(MonitorDue(at=60, mono=60))) == []
    d.handle(LivenessDigest("A", at=61, mono=61, ages=((N0, 0.0),)))
    assert cmds(d.handle(MonitorDue(at=61, mono=61))) == [
        c.NodeDown(at=61, node_id=N1, reason="no heartbeat for 11.0s")]


def test_a_node_never_heard_of_starts_its_grace_when_first_seen(make):
    d = make(heartbeat_timeout=10)
    d.handle(Started(at=0, mono=0))
    for cmd in cmds(d.handle(MonitorDue(at=0, mono=0))):
        checked(d.state, cmd)
    checked(d.state, c.RegisterNode(at=50, node_id="late", address="late:1", topology=("z0", "b0", "r0"),
                                    capacity=Resources(1000, 1 << 30, 0)))
    d.handle(Heartbeat(N0, at=50, mono=50), Heartbeat(N1, at=50, mono=50))
    assert cmds(d.handle(MonitorDue(at=55, mono=55))) == []  # "late" starts its count at 55
    d.handle(Heartbeat(N0, at=60, mono=60), Heartbeat(N1, at=60, mono=60))
    assert [x.node_id for x in cmds(d.handle(MonitorDue(at=66, mono=66)))] == ["late"]


def test_a_down_node_heard_again_comes_up_once_per_proposal(make):
    d = make()
    checked(d.state, c.NodeDown(at=1, node_id=N0, reason="test"))
    first = d.handle(Heartbeat(N0, at=2, mono=2))
    assert cmds(first) == [c.NodeUp(at=2, node_id=N0)]
    assert d.handle(Heartbeat(N0, at=3, mono=3)) == []  # one on its way already
    assert d.handle(Proposed(first[0], ok=False)) == []  # lost: the next heartbeat tries again
    retry = d.handle(Heartbeat(N0, at=4, mono=4))
    assert cmds(retry) == [c.NodeUp(at=4, node_id=N0)]
    assert d.commit(retry) == []
    assert d.state.nodes[N0].status is NodeStatus.READY
    assert d.handle(Heartbeat(N0, at=5, mono=5)) == []


def test_an_unknown_node_is_ignored(make):
    d = make()
    assert d.handle(Heartbeat("nobody", at=1, mono=1, health=HealthReport(True, "bad"))) == []


def test_a_health_report_is_recorded_once_and_lifted_when_it_passes(make):
    d = make()
    bad = HealthReport(unhealthy=True, message="gpu 3 fell off the bus", drain=True)
    first = d.handle(Heartbeat(N0, at=1, mono=1, health=bad))
    assert cmds(first) == [c.SetNodeHealth(at=1, node_id=N0, healthy=False, message="gpu 3 fell off the bus",
                                           drain=True)]
    assert d.handle(Heartbeat(N0, at=2, mono=2, health=bad)) == []  # in flight
    assert d.commit(first) == []
    assert d.handle(Heartbeat(N0, at=3, mono=3, health=bad)) == []  # the state says so already
    lifted = d.handle(Heartbeat(N0, at=4, mono=4, health=HealthReport(unhealthy=False)))
    assert cmds(lifted) == [c.SetNodeHealth(at=4, node_id=N0, healthy=True)]


def test_from_version_3_a_failing_checks_drain_requeues_uncharged_and_is_made_again_if_lost(make):
    """The health cordon, then a DrainNode; a DrainNode lost (a leader change) is proposed again by
    the next heartbeat while the node is health-cordoned with gangs wanted on it."""
    d = make()
    d.handle(MonitorDue(at=0, mono=0, cluster_version=3))
    submit(d.state, "j", tasks=1)
    checked(d.state, c.CommitPlan(at=1, job_id="j", attempt=1, placements=(
        Placement(0, N0, tuple(range(8)), 0),)))
    bad = HealthReport(unhealthy=True, message="gpu 3 fell off the bus", drain=True)
    first = cmds(d.handle(Heartbeat(N0, at=2, mono=2, health=bad)))
    assert first == [c.SetNodeHealth(at=2, node_id=N0, healthy=False, message="gpu 3 fell off the bus"),
                     c.DrainNode(at=2, node_id=N0, cordon=False, reason="health check failed: gpu 3 fell off the bus")]
    checked(d.state, first[0])  # the cordon commits; the drain is lost
    d.handle(Proposed(Propose(first[0]), True, None), Proposed(Propose(first[1]), False, None))
    again = cmds(d.handle(Heartbeat(N0, at=3, mono=3, health=bad)))
    assert again == [c.DrainNode(at=3, node_id=N0, cordon=False, reason="health check failed: gpu 3 fell off the bus")]
    checked(d.state, again[0])
    job = d.state.jobs["j"]
    assert job.status is JobStatus.STOPPING and job.stop_cause == "Drained"


def test_a_new_leader_drains_uncharged_from_its_first_heartbeat_once_the_state_records_version_3(make):
    d = make()
    checked(d.state, c.SetClusterVersion(at=0, version=3))  # no MonitorDue handled yet
    bad = HealthReport(unhealthy=True, message="xid 79", drain=True)
    assert [type(cmd) for cmd in cmds(d.handle(Heartbeat(N0, at=1, mono=1, health=bad)))] == [
        c.SetNodeHealth, c.DrainNode]


# ---- rounds --------------------------------------------------------------------------------------


def test_a_gang_that_fits_is_committed_whole(make):
    d = make()
    submit(d.state, "a", tasks=2, gpu=8)
    out = d.handle(RoundDue(at=10))
    assert cmds(out) == [c.CommitPlan(at=10, job_id="a", attempt=1, placements=(
        Placement(0, N0, tuple(range(8)), 0), Placement(1, N1, tuple(range(8)), 1)))]
    assert d.commit(out) == []
    assert d.state.jobs["a"].status is JobStatus.SCHEDULED


def test_a_plan_that_does_not_commit_asks_for_another_round(make):
    d = make()
    submit(d.state, "a", gpu=8)
    (plan,) = d.handle(RoundDue(at=10))
    assert d.handle(Proposed(plan, ok=False)) == [Reschedule("plan of job a not committed")]


def test_why_a_gang_waits_is_recorded_when_it_changes_and_not_again(make):
    d = make()
    submit(d.state, "big", tasks=3, gpu=8)  # two nodes: can never fit
    out = d.handle(RoundDue(at=10))
    (pending,) = cmds(out)
    assert isinstance(pending, c.PendingReasons)
    assert [(e.job_id, e.attempt, e.code) for e in pending.entries] == [("big", 1, "Unschedulable")]
    assert d.brain.wait_reason("big").code == "Unschedulable"
    d.commit(out)
    assert cmds(d.handle(RoundDue(at=11))) == []  # the same reason: nothing new to record


def test_a_full_batch_of_reasons_asks_for_another_full_round(make, monkeypatch):
    monkeypatch.setattr(rounds, "PENDING_BATCH", 2)
    d = make()
    for j in ("a", "b", "c"):
        submit(d.state, j, tasks=3, gpu=8)
    out = d.handle(RoundDue(at=10))
    assert [len(x.entries) for x in cmds(out)] == [2]
    assert out[-1] == Reschedule("more pending reasons to record") and d.brain.rounds.memo is None
    d.commit(out)
    assert [[e.job_id for e in x.entries] for x in cmds(d.handle(RoundDue(at=11, full=False)))] == [["c"]]


def test_reservations_carry_from_round_to_round(make):
    d = make(state=cluster(racks=1, nodes_per_rack=2))
    submit(d.state, "long", gpu=8, time_limit=100)
    d.commit(d.handle(RoundDue(at=5)))
    checked(d.state, c.TaskStarted(at=5, job_id="long", attempt=1, index=0,
                                   node_id=d.state.jobs["long"].tasks[0].node_id))
    submit(d.state, "big", tasks=2, gpu=8, at=6)
    d.commit(d.handle(RoundDue(at=6)))
    head = d.brain.head_reservation()
    assert head is not None and head.job_id == "big" and head.starts_at == 105
    assert d.brain.reservations()[0] == head  # what the dashboard's heatmap marks
    d.handle(RoundDue(at=7))
    assert d.brain.head_reservation().nodes == head.nodes


# ---- time limits and retention -------------------------------------------------------------------


def test_an_attempt_past_its_time_limit_fails_for_good(make):
    d = make()
    submit(d.state, "a", gpu=8, time_limit=60)
    start(d.state, "a", [N0], at=100)
    assert cmds(d.handle(MonitorDue(at=160, mono=0))) == []
    assert cmds(d.handle(MonitorDue(at=161, mono=1))) == [c.FailAttempt(
        at=161, job_id="a", attempt=1, reason="time limit of 60s exceeded", final=True, cause="TimeLimit")]


def test_finished_jobs_are_forgotten_after_their_retention_in_chunks(make, monkeypatch):
    monkeypatch.setattr(monitors, "FORGET_CHUNK", 2)
    d = make(job_retention=100)
    for j in ("a", "b", "c"):
        submit(d.state, j, gpu=8)
        checked(d.state, c.CancelJob(at=10, job_id=j))
    assert cmds(d.handle(MonitorDue(at=110, mono=0))) == []  # not past it yet
    assert cmds(d.handle(MonitorDue(at=200, mono=5))) == []  # the next sweep is 10 s after the last
    out = d.handle(MonitorDue(at=200, mono=10))
    assert cmds(out) == [c.ForgetJobs(at=200, job_ids=("a", "b")), c.ForgetJobs(at=200, job_ids=("c",))]
    d.commit(out)
    assert d.state.jobs == {}


def test_final_states_are_kept_only_once_every_member_applies_version_2(make):
    """Before, retention proposes the version-1 ForgetJobs (older replicas keep no final states)
    and leaves arrays and their elements for later; then ArchiveJobs, arrays included."""
    d = make(job_retention=100)
    submit(d.state, "a", gpu=8)
    checked(d.state, c.CancelJob(at=10, job_id="a"))
    checked(d.state, c.SubmitWorkflowJob(at=0, job_id="A", request_id="rA", spec=dataclasses.replace(
        spec(name="sweep"), array="0-1")))
    checked(d.state, c.CancelJob(at=10, job_id="A"))
    assert cmds(d.handle(MonitorDue(at=200, mono=0, cluster_version=1))) == [c.ForgetJobs(at=200, job_ids=("a",))]
    assert cmds(d.handle(MonitorDue(at=200, mono=10, cluster_version=2))) == [
        c.ArchiveJobs(at=200, job_ids=("a", "A_0", "A"))]


def test_retention_zero_keeps_every_job(make):
    d = make(job_retention=0)
    submit(d.state, "a", gpu=8)
    checked(d.state, c.CancelJob(at=0, job_id="a"))
    assert cmds(d.handle(MonitorDue(at=1e9, mono=1e9))) == []


# ---- preemption ----------------------------------------------------------------------------------


def queued(queues: list[Queue]) -> ClusterState:
    state = cluster(racks=1, nodes_per_rack=2)
    checked(state, c.ApplyQueues(at=0, queues=tuple(queues)))
    return state


def test_a_round_that_places_nothing_plans_one_preemption(make):
    gpu = Resources(0, 0, 16)
    d = make(state=queued([Queue("a", guaranteed=gpu), Queue("b")]))
    submit(d.state, "b1", gpu=8, queue="b")
    start(d.state, "b1", [N0], at=0)
    submit(d.state, "b2", gpu=8, queue="b", at=1)
    start(d.state, "b2", [N1], at=1)
    submit(d.state, "a1", tasks=2, gpu=8, queue="a", at=5000)
    out = d.handle(RoundDue(at=5000))
    (preempt, pending) = cmds(out)
    assert isinstance(preempt, c.Preempt) and preempt.job_id == "a1" and preempt.rule == "reclaim"
    assert {v.job_id for v in preempt.victims} == {"b1", "b2"} and set(preempt.nodes) == {N0, N1}
    assert [e.job_id for e in pending.entries] == ["a1"]
    assert Reschedule("preemption for job a1") in d.commit(out)
    assert set(d.state.holds) == {"a1"}


def test_a_gang_with_no_preemption_plan_is_not_planned_again_until_the_state_changes(make, monkeypatch):
    d = make(state=queued([Queue("a"), Queue("b")]))
    submit(d.state, "b1", gpu=8, queue="b", priority=5)
    start(d.state, "b1", [N0], at=0)
    submit(d.state, "b2", gpu=8, queue="b", priority=5, at=1)
    start(d.state, "b2", [N1], at=1)
    submit(d.state, "a1", gpu=8, queue="a", at=5000)  # nothing to reclaim: a has no guarantee
    calls = []
    real = preemption.plan
    monkeypatch.setattr(preemption, "plan", lambda *a: calls.append(a[1].id) or real(*a))
    assert not any(isinstance(x, c.Preempt) for x in cmds(d.handle(RoundDue(at=5000))))
    assert "no preemption" in d.brain.wait_reason("a1").message
    d.handle(RoundDue(at=5001))
    assert calls == ["a1"]
    submit(d.state, "a2", gpu=8, queue="a", at=5002)  # a submission alone changes nothing
    d.handle(RoundDue(at=5003))
    assert calls == ["a1", "a2"]
    checked(d.state, c.SetSchedulable(at=5004, node_id=N1, schedulable=True))  # any other change does
    d.handle(RoundDue(at=5005))
    assert calls == ["a1", "a2", "a1", "a2"]


def test_without_queues_or_with_preemption_off_nothing_is_preempted(make):
    d = make(state=queued([Queue("a", guaranteed=Resources(0, 0, 16)), Queue("b")]), preempt=False)
    submit(d.state, "b1", tasks=2, gpu=8, queue="b")
    start(d.state, "b1", [N0, N1], at=0)
    submit(d.state, "a1", tasks=2, gpu=8, queue="a", at=5000)
    assert not any(isinstance(x, c.Preempt) for x in cmds(d.handle(RoundDue(at=5000))))


# ---- the mass-silence guard ----------------------------------------------------------------------


def heard_every_5s(d: Driver, nodes: list[str], until: float) -> None:
    """Each node beats every 5 s, the beats spread over the interval, up to `until` (exclusive)."""
    beats = sorted((start + k * 5.0, node) for i, node in enumerate(nodes)
                   for start in (i * 5.0 / len(nodes),) for k in range(int(until // 5) + 1) if start + k * 5.0 < until)
    d.handle(*(Heartbeat(node, at=t, mono=t) for t, node in beats))


def monitor(d: Driver, t: float) -> list[c.Command]:
    """One monitor pass at `t`; its NodeDowns applied."""
    out = cmds(d.handle(MonitorDue(at=t, mono=t)))
    for cmd in out:
        checked(d.state, cmd)
    return out


def test_nodes_all_silent_at_once_are_held_for_a_further_timeout_then_declared(make):
    d = make(cluster(racks=3, nodes_per_rack=8), heartbeat_timeout=10)
    nodes = sorted(d.state.nodes)
    d.handle(Started(at=0, mono=0))
    heard_every_5s(d, nodes, until=20)  # then the leader hears no one: its own link is the likelier fault
    for t in range(21, 36):  # without the guard the first nodes would go DOWN at 26
        assert monitor(d, t) == [], t
        last_beats = [15 + i * 5 / len(nodes) for i in range(len(nodes))]
        assert d.brain.held_silent == sum(1 for beat in last_beats if t - beat > 10), t
    assert d.brain.nodes.mass_silence_since == 26
    down = monitor(d, 36.5)  # the silence lasted a further timeout: every silent node goes at once
    assert sorted(x.node_id for x in down) == nodes
    assert d.brain.held_silent == 0


def test_a_mass_silence_that_ends_within_the_hold_declares_no_one(make):
    d = make(cluster(racks=3, nodes_per_rack=8), heartbeat_timeout=10)
    nodes = sorted(d.state.nodes)
    d.handle(Started(at=0, mono=0))
    heard_every_5s(d, nodes, until=20)
    assert [monitor(d, t) for t in range(21, 30)] == [[]] * 9
    assert d.brain.held_silent > 0
    d.handle(LivenessDigest("A", at=30, mono=30, ages=tuple((n, 0.5) for n in nodes)))  # the view is back
    assert monitor(d, 30) == [] and d.brain.held_silent == 0 and d.brain.nodes.mass_silence_since is None
    assert [monitor(d, t) for t in range(31, 40)] == [[]] * 9


def test_a_minority_of_nodes_silent_at_once_goes_down_at_the_timeout(make):
    d = make(cluster(racks=3, nodes_per_rack=8), heartbeat_timeout=10)
    nodes = sorted(d.state.nodes)
    rack = [n for n in nodes if n.startswith("r1-")]  # a rack loses power: a real fault, acted on at once
    d.handle(Started(at=0, mono=0))
    heard_every_5s(d, rack, until=20)
    heard_every_5s(d, [n for n in nodes if n not in rack], until=60)
    down = {x.node_id: t for t in range(21, 40) for x in monitor(d, t)}
    assert set(down) == set(rack) and max(down.values()) <= 30
    assert d.brain.nodes.mass_silence_since is None and d.brain.held_silent == 0


def test_a_stalled_leader_holds_the_nodes_its_late_digests_then_vouch_for(make):
    d = make(cluster(racks=3, nodes_per_rack=8), heartbeat_timeout=10)
    nodes = sorted(d.state.nodes)
    d.handle(Started(at=0, mono=0))
    heard_every_5s(d, nodes, until=20)
    # the leader's process stalls from 20 to 45: its first pass after sees everyone silent ...
    assert monitor(d, 45) == [] and d.brain.held_silent == len(nodes)
    # ... then the digests that waited for it arrive: no one was silent after all
    d.handle(LivenessDigest("A", at=45, mono=45, ages=tuple((n, 1.0) for n in nodes)))
    assert [monitor(d, t) for t in range(46, 50)] == [[]] * 4 and d.brain.held_silent == 0


def test_the_outcome_of_a_drain_is_heard_and_the_stimuli_after_it_too(make):
    """A DrainNode's outcome once raised in the brain (it was logged as a SetNodeHealth), and the
    outcomes after it in the same batch went unheard: here a NodeUp's, whose node stayed 'proposed'."""
    d = make(cluster(racks=1, nodes_per_rack=2))
    d.brain.inflight.propose(c.DrainNode(at=1.0, node_id=N0, reason="health"))
    d.brain.inflight.propose(c.NodeUp(at=1.0, node_id=N1))
    d.handle(Proposed(Propose(c.DrainNode(at=1.0, node_id=N0, reason="health")), True, "j1"),
             Proposed(Propose(c.NodeUp(at=1.0, node_id=N1)), True))
    assert not d.brain.inflight.holds("health", N0) and not d.brain.inflight.holds("node up", N1)


def test_the_in_flight_ledger_holds_a_proposal_until_its_outcome_and_checks_what_it_names():
    """One ledger for every decision on its way: recorded when proposed, cleared by its outcome
    (committed or not), shared by kinds of one name, and validated against the state."""
    from synapse.core.brain.inflight import InFlight

    state = cluster(racks=1, nodes_per_rack=2)
    ledger = InFlight()
    assert ledger.propose(c.SetNodeHealth(at=1.0, node_id=N0, healthy=False)) == \
        Propose(c.SetNodeHealth(at=1.0, node_id=N0, healthy=False))
    assert ledger.holds("health", N0) and not ledger.holds("health", N1) and ledger.any("health")
    ledger.heard(c.DrainNode(at=2.0, node_id=N0, reason="health"))  # a drain shares the health entry
    assert not ledger.any("health")
    ledger.heard(c.FailAttempt(at=2.0, job_id="j", attempt=1, reason="time limit", final=True))  # not followed
    ledger.propose(c.NodeUp(at=3.0, node_id="gone"))
    with pytest.raises(AssertionError, match="unknown node gone"):
        ledger.validate(state)
