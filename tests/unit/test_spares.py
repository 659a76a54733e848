"""Restarts after a lost node and spare nodes: the pure core (designation, restart order, reservations,
eviction from spares, driven through the leader's brain on a simulated clock);
a real local cluster in tests/cluster/test_spares.py."""


import pytest
from click.testing import CliRunner

from synapse.core import commands as c
from synapse.core import versions
from synapse.core.brain.config import LeaderConfig
from synapse.core.brain.leader_state import LeaderState
from synapse.core.brain.stimuli import Propose, RoundDue
from synapse.core.model import JobStatus, Placement
from synapse.core.schedule.reservations import TUNING
from synapse.core.schedule.scheduler import schedule_round
from synapse.core.schedule.spares import SPARE_RULE, SparePolicy, designate, restarting
from synapse.local.main import main as synapse_local
from synapse.master.config import ConfigError, parse_cluster_config
from synapse.sim.engine import Simulator, uniform_cluster
from tests.support.helpers import checked, cluster, spec
from tests.support.spares import submit

ONE_SPARE = SparePolicy("rack", 1)


def place(state, job_id, *nodes, at=20.0):
    job = state.jobs[job_id]
    placements = tuple(Placement(i, n, tuple(range(8)), i) for i, n in enumerate(nodes))
    assert checked(state, c.CommitPlan(at=at, job_id=job_id, attempt=job.attempt, placements=placements)).ok
    for t in job.tasks:
        checked(state, c.TaskStarted(at=at, job_id=job_id, attempt=job.attempt, index=t.index, node_id=t.node_id))


def lose(state, node_id, at=50.0):
    """The node dies: NodeLost, and the gangs' other tasks exit as their workers report them."""
    hit = sorted({j for j, _a, _i in state.live_tasks[node_id]})
    assert checked(state, c.NodeLost(at=at, node_id=node_id)).ok
    for job_id in hit:
        job = state.jobs[job_id]
        for t in list(job.tasks) if job.status.has_gang else ():
            if t.state.live:
                checked(state, c.TaskExited(at=at, job_id=job_id, attempt=job.attempt, index=t.index,
                                            node_id=t.node_id, exit_code=143))


def nodes_of(plans, job_id):
    return sorted(p.node_id for plan in plans if plan.job_id == job_id for p in plan.placements)


def spare_sim(racks=2, nodes_per_rack=4, policy=ONE_SPARE):
    sim = Simulator(spares=policy)
    for cmd in uniform_cluster(racks_per_block=racks, nodes_per_rack=nodes_per_rack):
        assert sim.apply(cmd).ok
    sim.schedule()  # the brain designates
    return sim


# ---- designation ------------------------------------------------------------------------------------


def test_the_first_registered_node_of_each_rack_becomes_its_spare_and_a_new_leader_agrees():
    sim = spare_sim()
    assert sim.state.spares == {"r0-n0", "r1-n0"}
    assert {n.id for n in sim.state.nodes.values() if n.spare} == {"r0-n0", "r1-n0"}
    assert [(e.object_id, e.reason) for e in sim.state.events_after(0) if e.reason == "NodeSpare"] == [
        ("r0-n0", "NodeSpare"), ("r1-n0", "NodeSpare")]
    # Another leader of the same state proposes nothing: the choice keeps the spares there are.
    fresh = LeaderState(LeaderConfig(spares=ONE_SPARE, job_retention=0))
    out = fresh.handle(sim.state, RoundDue(at=1.0))
    assert not [i for i in out if isinstance(i, Propose) and isinstance(i.cmd, c.SetSpares)]
    # A snapshot keeps them.
    restored = type(sim.state).from_snapshot(sim.state.to_snapshot())
    assert restored.spares == sim.state.spares and restored.digest() == sim.state.digest()


def test_a_leader_whose_cluster_file_asks_for_no_spares_releases_them():
    sim = spare_sim()
    assert sim.state.spares
    brain = LeaderState(LeaderConfig(job_retention=0))
    [proposal] = [i for i in brain.handle(sim.state, RoundDue(at=1.0)) if isinstance(i, Propose)]
    assert proposal.cmd.node_ids == () and "r0-n0 released (not needed)" in proposal.cmd.reason
    assert sim.apply(proposal.cmd).ok and not sim.state.spares


def test_designation_waits_for_every_member_to_apply_version_4():
    state = cluster(racks=1, nodes_per_rack=3)
    brain = LeaderState(LeaderConfig(spares=ONE_SPARE, job_retention=0))
    assert not [i for i in brain.handle(state, RoundDue(at=1.0))
                if isinstance(i, Propose) and isinstance(i.cmd, c.SetSpares)]
    assert checked(state, c.SetClusterVersion(at=2.0, version=versions.KIND_VERSIONS[c.SetSpares])).ok
    [proposal] = [i for i in brain.handle(state, RoundDue(at=3.0))
                  if isinstance(i, Propose) and isinstance(i.cmd, c.SetSpares)]
    assert proposal.cmd.node_ids == ("r0-n0",)


def test_a_spare_that_dies_is_replaced_by_an_idle_node_of_its_rack():
    sim = spare_sim()
    sim.lose_node("r0-n0")
    sim.schedule()
    assert sim.state.spares == {"r0-n1", "r1-n0"}
    released = [e.message for e in sim.state.events_after(0) if e.reason == "NodeSpareReleased"]
    assert released == ["no longer a spare: r0-n0 released (DOWN); r0-n1 designated"], released
    sim.restore_node("r0-n0")  # back: an ordinary node now, the replacement stays
    sim.schedule()
    assert sim.state.spares == {"r0-n1", "r1-n0"}


def test_a_rack_no_larger_than_its_spares_gets_none_and_designate_says_why():
    state = cluster(racks=2, nodes_per_rack=1)
    chosen, notes = designate(state, SparePolicy("rack", 1))
    assert chosen == frozenset()
    assert notes == ("rack z0/b0/r0 has 1 node(s): too few for 1 spare(s) and a node for work; none designated there",
                     "rack z0/b0/r1 has 1 node(s): too few for 1 spare(s) and a node for work; none designated there")


@pytest.mark.parametrize("doc, why", [
    ({"per": "pod", "nodes": 1}, "spares.per: 'pod' is not a topology level (levels: zone, block, rack)"),
    ({"per": "rack", "nodes": -1}, "spares.nodes: a whole number from 0 to 64, not -1"),
    ({"per": "rack"}, "spares: must be {per: rack, nodes: N}"),
    ({"per": "rack", "nodes": 1, "each": 2}, "spares: must be {per: rack, nodes: N}"),
])
def test_a_bad_spares_section_is_refused_naming_the_field(doc, why):
    base = {"replicas": [{"id": "m1", "raft": "h:1", "api": "h:2"}], "spares": doc}
    with pytest.raises(ConfigError) as refused:
        parse_cluster_config(base, need_secrets=False)
    assert str(refused.value) == why
    good = parse_cluster_config({**base, "spares": {"per": "rack", "nodes": 2}}, need_secrets=False)
    assert good.spares == SparePolicy("rack", 2)


def test_synapse_local_refuses_more_spares_than_a_rack_has_workers(tmp_path):
    result = CliRunner().invoke(synapse_local, ["up", "--data-dir", str(tmp_path / "c"), "--workers", "4",
                                                "--racks", "2", "--spares-per-rack", "2"])
    assert result.exit_code != 0
    assert ("--spares-per-rack 2: the smallest rack has 2 worker(s) (4 over 2 rack(s)); a rack needs more workers "
            "than spares") in result.output
    assert not (tmp_path / "c" / "cluster.json").exists()  # refused before anything started


# ---- restarts without spares ----------------------------------------------------------------------------


def test_a_restart_is_placed_in_the_next_round_on_its_survivor_ahead_of_what_arrived_since():
    """A loses a node while X, submitted after it, waits for 3 nodes: A keeps its place ahead of
    X and is re-placed at once on its survivor and the free node of its rack, never the lost one."""
    state = cluster(racks=1, nodes_per_rack=4)
    submit(state, "L", at=1.0)
    place(state, "L", "r0-n3")
    submit(state, "A", at=10.0, tasks=2)
    place(state, "A", "r0-n0", "r0-n1")
    submit(state, "X", at=30.0, tasks=3)
    lose(state, "r0-n0")
    a = state.jobs["A"]
    assert (a.status, restarting(a)) == (JobStatus.PENDING, True)
    result = schedule_round(state, now=60.0)
    assert [p.job_id for p in result.plans] == ["A"]
    assert nodes_of(result.plans, "A") == ["r0-n1", "r0-n2"]
    assert result.waiting["X"].code in ("Resources", "NodesUnavailable", "BehindReservation")


def test_a_restart_that_cannot_start_reserves_so_backfill_does_not_take_its_nodes():
    """A 4-task gang on a 4-node rack loses a node: it waits for the node (NodesUnavailable) and
    keeps its survivors, so a job without a time limit is not placed on them meanwhile."""
    state = cluster(racks=1, nodes_per_rack=4)
    submit(state, "A", tasks=4, pack="rack", required=True)
    place(state, "A", "r0-n0", "r0-n1", "r0-n2", "r0-n3")
    lose(state, "r0-n0")
    submit(state, "B", at=55.0, tasks=1)
    result = schedule_round(state, now=60.0)
    assert result.plans == []
    assert result.waiting["A"].code == "NodesUnavailable"
    assert "keeps 3 node(s) of z0/b0/r0 for its restart" in result.waiting["A"].message
    assert result.reservations[0].job_id == "A" and result.reservations[0].nodes == {"r0-n1", "r0-n2", "r0-n3"}
    checked(state, c.NodeUp(at=70.0, node_id="r0-n0"))
    [plan] = schedule_round(state, now=71.0, previous=result.reservations).plans
    assert plan.job_id == "A"  # the repaired node back (the others could never hold it without it)


def test_a_restart_keeps_its_survivors_only_while_its_node_may_be_rebooting():
    """The same gang: its node is not back within Tuning.restart_hold_s (under repair, for hours or
    for good), so the restart lets its survivors go rather than hold them idle; it still waits."""
    state = cluster(racks=1, nodes_per_rack=4)
    submit(state, "A", tasks=4, pack="rack", required=True)
    place(state, "A", "r0-n0", "r0-n1", "r0-n2", "r0-n3")
    lose(state, "r0-n0", at=50.0)
    submit(state, "B", at=55.0, tasks=1)
    hold = TUNING.restart_hold_s
    assert schedule_round(state, now=50.0 + hold - 1).reservations[0].job_id == "A"  # still rebooting
    result = schedule_round(state, now=50.0 + hold)
    assert [p.job_id for p in result.plans] == ["B"] and result.reservations == ()
    assert result.waiting["A"].code == "NodesUnavailable"
    assert "keeps no node for its restart (one is DOWN since 00:00 UTC, longer than a reboot)" \
        in result.waiting["A"].message


# ---- spares ------------------------------------------------------------------------------------------


def test_only_restarts_and_jobs_with_a_time_limit_go_on_spares_and_the_latter_only_where_nothing_else_fits():
    sim = spare_sim()
    plain = sim.submit(spec(tasks=1), 1000.0)  # no time limit: never on a spare
    limited = sim.submit(spec(tasks=1, time_limit=600), 500.0)
    sim.schedule()
    assert not sim.state.nodes[sim.state.jobs[plain].tasks[0].node_id].spare
    assert not sim.state.nodes[sim.state.jobs[limited].tasks[0].node_id].spare  # room elsewhere
    more = [sim.submit(spec(tasks=1), 1000.0) for _ in range(5)]  # the 6 ordinary nodes full
    sim.schedule()
    assert all(sim.state.jobs[j].status is not JobStatus.PENDING for j in more[:4])
    assert sim.state.jobs[more[4]].status is JobStatus.PENDING  # no time limit: the spares are not for it
    guest = sim.submit(spec(tasks=1, time_limit=600), 500.0)
    sim.schedule()
    assert sim.state.nodes[sim.state.jobs[guest].tasks[0].node_id].spare


def test_a_failed_gang_restarts_on_its_racks_spare_evicting_the_guest_with_its_notice():
    sim = spare_sim()
    a = sim.submit(spec(tasks=3), 10_000.0)
    b = sim.submit(spec(tasks=3), 10_000.0)
    sim.schedule()
    guests = [sim.submit(spec(tasks=1, time_limit=3600), 3000.0) for _ in range(2)]
    sim.schedule()
    rack_of = {j: sim.state.nodes[sim.state.jobs[j].tasks[0].node_id].topology[-1] for j in (a, b, *guests)}
    assert {sim.state.jobs[g].tasks[0].node_id for g in guests} == {"r0-n0", "r1-n0"}  # on the spares
    guest = next(g for g in guests if rack_of[g] == rack_of[a])
    lost = sim.state.jobs[a].tasks[0].node_id
    sim.now = 100.0
    assert sim.lose_node(lost) == [a]
    sim.schedule()
    [evict] = [p for p in sim.preemptions if p.job_id == a]
    assert (evict.rule, [v.job_id for v in evict.victims]) == (SPARE_RULE, [guest])
    spare = f"{rack_of[a]}-n0"
    assert spare in evict.nodes and lost not in evict.nodes
    sim.advance()  # the guest's grace over: its task exits
    sim.schedule()
    job = sim.state.jobs[a]
    assert (job.status, job.attempt) == (JobStatus.RUNNING, 2)
    placed = {t.node_id for t in job.tasks}
    assert lost not in placed and spare in placed and {sim.state.nodes[n].topology[-1] for n in placed} == {rack_of[a]}
    sim.schedule()  # the next round designates again
    assert not sim.state.nodes[spare].spare  # taken by the restart: no longer a spare
    assert not any(sim.state.nodes[n].topology[-1] == rack_of[a] for n in sim.state.spares)  # none left to spare
    evicted = sim.state.jobs[guest]
    assert (evicted.status, evicted.preemptions, evicted.restarts_used()) == (JobStatus.PENDING, 1, 0)
    assert any(e.kind == "Preempted" and f"by job {a}" in e.message and "rule spare" in e.message
               for e in evicted.events)
    sim.leader.validate(sim.state)


def test_a_restart_never_evicts_a_guest_gang_larger_than_itself():
    """A 1-task gang loses its node; the only room is the spares, where one 2-task guest runs on
    both: evicting 16 GPUs of work to restart 8 would cost more than it saves, so the restart waits."""
    sim = spare_sim()
    a = sim.submit(spec(tasks=1, pack="rack", required=True), 10_000.0)
    sim.submit(spec(tasks=2, pack="rack", required=True), 10_000.0)
    sim.submit(spec(tasks=3, pack="rack", required=True), 10_000.0)
    sim.schedule()
    guest = sim.submit(spec(tasks=2, time_limit=3600, pack="block", required=True), 3000.0)
    sim.schedule()
    assert {t.node_id for t in sim.state.jobs[guest].tasks} == {"r0-n0", "r1-n0"}  # on the spares
    sim.now = 100.0
    assert sim.lose_node(sim.state.jobs[a].tasks[0].node_id) == [a]
    sim.schedule()
    assert sim.preemptions == []
    g = sim.state.jobs[guest]
    assert sim.state.jobs[a].status is JobStatus.PENDING and g.status.has_gang and g.preemptions == 0
    sim.leader.validate(sim.state)


def test_two_failures_in_a_rack_with_one_spare_one_restarts_at_once_the_other_waits_reserved():
    """Two 2-task gangs and a guest on the spare fill a 5-node rack; both gangs lose a node at once:
    the rack has room (with the spare) for one of them, which restarts at once; the other waits at
    the head of the queue with a reservation, so the job submitted after them does not take its nodes."""
    sim = spare_sim(racks=1, nodes_per_rack=5)
    a = sim.submit(spec(tasks=2), 10_000.0)
    b = sim.submit(spec(tasks=2), 10_000.0)
    sim.schedule()
    guest = sim.submit(spec(tasks=1, time_limit=3600), 3000.0)
    sim.schedule()
    assert sim.state.jobs[guest].tasks[0].node_id == "r0-n0"  # the spare, the only node left
    waiting = sim.submit(spec(tasks=1), 10_000.0)  # queued behind them
    sim.now = 100.0
    sim.lose_node(sim.state.jobs[a].tasks[0].node_id)
    sim.lose_node(sim.state.jobs[b].tasks[0].node_id)
    result = sim.schedule()
    sim.advance(sim.now + 60)  # any eviction's grace over
    later = sim.schedule()
    status = {j: sim.state.jobs[j].status for j in (a, b)}
    assert sorted(status.values()) == [JobStatus.PENDING, JobStatus.RUNNING], status
    stuck = next(j for j, s in status.items() if s is JobStatus.PENDING)
    assert later.reservations and later.reservations[0].job_id == stuck  # at the head, reserved
    assert stuck in {r.job_id for r in result.reservations}
    assert sim.state.jobs[waiting].status is JobStatus.PENDING  # not placed on what the restart needs
    sim.leader.validate(sim.state)


# ---- a real cluster -----------------------------------------------------------------------------------


