"""Queue policy: order, reservation of the head blocked gang, backfill, and no starvation."""

import dataclasses
import functools
import math
import random

from synapse.core import commands as c
from synapse.core.model import JobStatus, Placement, Plan
from synapse.core.schedule.placement import ClusterView, place
from synapse.core.schedule.reservations import CONSERVATIVE, TUNING
from synapse.core.schedule.scheduler import schedule_round
from synapse.sim.engine import Simulator, uniform_cluster
from tests.support.helpers import spec


def sim(racks=2, nodes_per_rack=4):
    s = Simulator()
    for cmd in uniform_cluster(racks_per_block=racks, nodes_per_rack=nodes_per_rack):
        assert s.apply(cmd).ok
    return s


def test_priority_order_decides_who_gets_the_last_node():
    s = sim(racks=1, nodes_per_rack=1)
    low = s.submit(spec(tasks=1, name="low"), duration=10)
    high = s.submit(spec(tasks=1, name="high", priority=5), duration=10)
    result = s.schedule()
    assert [p.job_id for p in result.plans] == [high]
    assert s.state.jobs[low].status is JobStatus.PENDING


def occupy(s, node_ids, duration=100.0):
    """Run a one-node, whole-node job on each of these nodes."""
    for node_id in node_ids:
        job_id = s.submit(spec(tasks=1), duration=duration)
        s.commit(Plan(job_id, 1, (Placement(0, node_id, tuple(range(8)), 0),)))


def test_blocked_gang_holds_nothing_and_gets_a_reservation():
    s = sim(racks=3, nodes_per_rack=4)
    occupy(s, ["r0-n0", "r0-n1", "r0-n2", "r1-n0", "r1-n1", "r2-n0", "r2-n1", "r2-n2"])
    big = s.submit(spec(tasks=4, pack="rack", required=True), duration=10)
    small = s.submit(spec(tasks=1), duration=10)
    result = s.schedule()
    assert s.state.jobs[big].status is JobStatus.PENDING
    assert all(n.used.gpu in (0, 8) for n in s.state.nodes.values())  # the big gang took nothing
    res = result.reservation
    # r1 has 2 free nodes: closest to fitting. Its free nodes come first, then busy ones to make 4.
    assert res.job_id == big and res.domain == ("z0", "b0", "r1")
    assert res.nodes == {"r1-n0", "r1-n1", "r1-n2", "r1-n3"}
    # The small job may run, but not on the reserved rack.
    assert [p.job_id for p in result.plans] == [small]
    assert result.plans[0].placements[0].node_id in ("r0-n3", "r2-n3")
    assert "does not fit now" in str(result.waiting[big])


def test_shortfalls_are_worked_out_when_asked_as_place_reports_them():
    s = sim(racks=2, nodes_per_rack=4)
    occupy(s, ["r0-n0", "r0-n1", "r1-n0"])
    big = s.submit(spec(tasks=4, pack="rack", required=True), duration=10)
    reason = s.schedule().waiting[big]
    assert reason.shortfalls == ()  # the round did not spend time on them
    view = ClusterView(s.state.nodes, s.state.index, s.state.levels)
    expected = place(view, big, 1, s.state.jobs[big].spec).shortfalls
    assert expected and reason.shortfalls_in(s.state) == expected
    assert reason.describe(s.state) == "; ".join([reason.message, *map(str, expected)])


def test_backfill_skips_reserved_nodes_unless_its_time_limit_ends_first():
    s = sim(racks=1, nodes_per_rack=4)
    s.submit(spec(tasks=2, time_limit=100), duration=100)
    s.schedule()  # 2 nodes busy until t=100
    s.submit(spec(tasks=4), duration=10)  # head gang: needs all 4, reservation starts at t=100
    short = s.submit(spec(tasks=1, time_limit=50), duration=50)
    long = s.submit(spec(tasks=1, time_limit=500), duration=50)
    result = s.schedule()
    assert result.reservation.starts_at == 100
    assert [p.job_id for p in result.plans] == [short]
    assert "outside the reservation" in str(result.waiting[long])


def test_no_backfill_into_reservation_when_its_start_is_unknown():
    s = sim(racks=1, nodes_per_rack=2)
    s.submit(spec(tasks=1), duration=100)  # no time limit: the reservation's start is unknown
    s.schedule()
    s.submit(spec(tasks=2), duration=10)
    quick = s.submit(spec(tasks=1, time_limit=1), duration=1)
    result = s.schedule()
    assert result.plans == [] and quick in result.waiting


def test_reservation_is_sticky_for_the_same_job():
    s = sim(racks=2, nodes_per_rack=4)
    s.submit(spec(tasks=7), duration=100)
    s.schedule()
    s.submit(spec(tasks=8), duration=10)
    first = s.schedule().reservation
    second = schedule_round(s.state, s.now, first).reservation
    assert first.nodes == second.nodes


def test_impossible_gang_does_not_block_the_queue():
    s = sim(racks=2, nodes_per_rack=2)
    never = s.submit(spec(tasks=3, pack="rack", required=True), duration=1)  # racks hold 2
    fine = s.submit(spec(tasks=2), duration=1)
    result = s.schedule()
    assert [p.job_id for p in result.plans] == [fine] and result.reservation is None
    assert "can never fit" in str(result.waiting[never])


def test_a_gang_that_needs_the_down_nodes_waits_for_them_not_never():
    """A cluster whose workers are lost is not one too small: the reason names the DOWN nodes and is
    no 'can never fit' (which `synctl submit --wait` gives up on)."""
    s = sim(racks=1, nodes_per_rack=4)
    node_ids = sorted(s.state.nodes)
    for node_id in node_ids[:2]:
        assert s.state.apply(c.NodeDown(at=s.now, node_id=node_id)).ok
    waiting = s.submit(spec(tasks=3), duration=1)
    reason = s.schedule().waiting[waiting]
    assert reason.code == "NodesUnavailable" and "2 DOWN of 4 node(s)" in reason.message, reason
    never = s.submit(spec(tasks=5), duration=1)  # more than every node of the cluster holds
    assert s.schedule().waiting[never].code == "Unschedulable"


def busy_cluster_with_stream(seed=7):
    """8 nodes all busy with 1-node jobs, a 4-node rack gang waiting, and a source of more small
    jobs: two per round, always more than what frees up."""
    rng = random.Random(seed)
    s = sim(racks=2, nodes_per_rack=4)
    small = lambda: s.submit(spec(tasks=1, gpu=8), duration=rng.uniform(5, 50))  # noqa: E731
    for _ in range(8):
        small()
    s.schedule()
    big = s.submit(spec(tasks=4, pack="rack", required=True), duration=10)
    return s, big, lambda: (small(), small())


def test_head_gang_is_not_starved_by_a_stream_of_small_jobs():
    """The 4-node gang fits the healthy cluster, so it starts within a bounded number of rounds even
    though small jobs keep arriving and would always fill whatever frees up first."""
    s, big, more = busy_cluster_with_stream()
    for _ in range(200):
        more()
        s.schedule()
        if s.state.jobs[big].status is not JobStatus.PENDING:
            break
        s.advance()
    assert s.state.jobs[big].status is not JobStatus.PENDING, "the gang starved"
    assert s.rounds < 20  # at most one task per reserved node has to finish


def test_without_a_reservation_the_same_stream_starves_it():
    """The control for the test above: greedy placement in queue order, no reservation."""
    s, big, more = busy_cluster_with_stream()
    for _ in range(60):
        more()
        view = ClusterView(s.state.nodes, s.state.index, s.state.levels)
        for job in list(s.state.pending_jobs()):
            placed = place(view, job.id, job.attempt, job.spec)
            if placed.plan is not None:
                s.commit(placed.plan)
                view.claim(placed.plan, job.spec.resources)
        s.advance()
    assert s.state.jobs[big].status is JobStatus.PENDING


def _decisions(result):
    return ([(p.job_id, p.placements) for p in result.plans], result.reservation,
            {job: str(reason) for job, reason in result.waiting.items()})


def test_a_round_after_submissions_alone_decides_what_a_full_round_decides():
    """The memo of a round that placed nothing lets the next look only at new jobs; randomized
    clusters, queues and submissions (some of higher priority, some after other commands) must
    give the same plans, reservation and reasons as a full round every time."""
    rng = random.Random(11)
    incremental_rounds = 0
    for trial in range(40):
        s = sim(racks=rng.randint(1, 3), nodes_per_rack=rng.randint(1, 4))
        occupy(s, rng.sample(sorted(s.state.nodes), k=rng.randint(0, len(s.state.nodes))))
        memo, previous = None, None
        for _step in range(12):
            for _ in range(rng.randint(1, 4)):
                s.submit(spec(tasks=rng.randint(1, 6), gpu=rng.choice([1, 4, 8]), priority=rng.choice([0, 0, 0, 3]),
                              pack=rng.choice(["", "rack"]), required=rng.random() < 0.3,
                              time_limit=rng.choice([0, 0, 50])), duration=10)
            if rng.random() < 0.15:
                s.advance()  # tasks end: not a submission, so the memo no longer holds
            full = schedule_round(s.state, s.now, previous)
            quick = schedule_round(s.state, s.now, previous, memo)
            assert _decisions(quick) == _decisions(full), f"trial {trial}"
            incremental_rounds += memo is not None and memo.valid_for(s.state)
            memo = full.memo
            previous = full.reservation
            for plan in full.plans:
                s.commit(plan)
    assert incremental_rounds > 50  # the shortcut was really taken, not always refused


def test_the_memo_is_refused_after_any_other_command_or_a_job_queued_ahead():
    s = sim(racks=1, nodes_per_rack=1)
    occupy(s, ["r0-n0"])
    s.submit(spec(tasks=1), duration=10)
    memo = schedule_round(s.state, s.now).memo
    assert memo is not None and memo.valid_for(s.state)
    s.submit(spec(tasks=1), duration=10)
    assert memo.valid_for(s.state)  # queued behind: the memo holds
    s.submit(spec(tasks=1, priority=9), duration=10)
    assert not memo.valid_for(s.state)  # queued ahead of what it saw
    memo = schedule_round(s.state, s.now).memo
    s.advance()
    assert not memo.valid_for(s.state)  # a task ended: capacity changed


def occupy_until(s, limits):
    """Run a one-node, whole-node job with this time limit on each node (started now)."""
    for node_id, limit in limits.items():
        job_id = s.submit(spec(tasks=1, time_limit=limit), duration=limit)
        s.commit(Plan(job_id, 1, (Placement(0, node_id, tuple(range(8)), 0),)))


def end_tasks_on(s, node_ids):
    for node_id in node_ids:
        for job_id, attempt, index in sorted(s.state.live_tasks[node_id]):
            assert s.apply(c.TaskExited(at=s.now, job_id=job_id, attempt=attempt, index=index, node_id=node_id,
                                        exit_code=0)).ok


def test_reservation_takes_the_nodes_expected_to_free_first():
    """r0 has a free node now but its busy ones run to t=500; r1's all end by t=100: the gang is
    expected to start earlier on r1, so r1 is held (most room now would have picked r0)."""
    s = sim(racks=2, nodes_per_rack=4)
    occupy_until(s, {"r0-n0": 500, "r0-n1": 500, "r0-n2": 500, "r1-n0": 100, "r1-n1": 50, "r1-n2": 100,
                     "r1-n3": 80})
    big = s.submit(spec(tasks=4, pack="rack", required=True), duration=10)
    res = s.schedule().reservation
    assert res.job_id == big and res.domain == ("z0", "b0", "r1") and res.starts_at == 100
    # Two of r1's nodes would do for a 2-node gang: the two that end first.
    s2 = sim(racks=2, nodes_per_rack=4)
    occupy_until(s2, {n: 100 + 10 * i for i, n in enumerate(sorted(s2.state.nodes))})
    s2.submit(spec(tasks=2), duration=10)
    res = s2.schedule().reservation
    assert res.nodes == {"r0-n0", "r0-n1"} and res.starts_at == 110


def test_among_nodes_expected_free_at_once_the_reservation_takes_those_with_room_now():
    """Every node is expected to be empty at t=100, but two of r1's run half-node jobs and take a
    task each now: a 3-task gang (two nodes when empty) reserves those two, in r1, not the first
    nodes by name."""
    s = sim(racks=2, nodes_per_rack=4)
    occupy_until(s, {n: 100 for n in s.state.nodes if n not in ("r1-n1", "r1-n3")})
    for node_id in ("r1-n1", "r1-n3"):
        job_id = s.submit(spec(tasks=1, gpu=4, time_limit=100), duration=100)
        s.commit(Plan(job_id, 1, (Placement(0, node_id, (0, 1, 2, 3), 0),)))
    gang = s.submit(spec(tasks=3, gpu=4), duration=10)
    res = s.schedule().reservation
    assert res.job_id == gang and res.starts_at == 100
    assert res.domain == ("z0", "b0", "r1") and res.nodes == {"r1-n1", "r1-n3"}


def test_a_kept_reservation_moves_only_for_a_clearly_earlier_start():
    s = sim(racks=2, nodes_per_rack=2)
    occupy_until(s, {"r0-n0": 1000, "r0-n1": 1000, "r1-n0": 2000, "r1-n1": 2000})
    big = s.submit(spec(tasks=2, pack="rack", required=True), duration=10)
    first = s.schedule().reservation
    assert first.domain == ("z0", "b0", "r0") and first.starts_at == 1000
    # The jobs on r1 are cancelled and replaced by ones ending at 950 and 980: earlier, but not by
    # the margin (max(600 s, 10 % of the 1000 s wait)): the reservation stays.
    end_tasks_on(s, ["r1-n0", "r1-n1"])
    occupy_until(s, {"r1-n0": 950, "r1-n1": 980})
    every_round = dataclasses.replace(TUNING, reevaluate_s=0)  # weigh the alternatives at every round
    kept = schedule_round(s.state, s.now, first, tuning=every_round).reservation
    assert kept.nodes == first.nodes and kept.starts_at == 1000
    # r1 now ends at 300: 700 s earlier, past the margin; the gang moves there, and stays.
    end_tasks_on(s, ["r1-n0", "r1-n1"])
    occupy_until(s, {"r1-n0": 300, "r1-n1": 300})
    # ... but a leader weighs the alternatives only every `reevaluate_s`: within it, the rounds
    # (one per change) keep the reservation without the search over every node.
    assert schedule_round(s.state, kept.chosen_at + TUNING.reevaluate_s - 1, kept).reservation.nodes == kept.nodes
    moved = schedule_round(s.state, kept.chosen_at + TUNING.reevaluate_s, kept).reservation
    assert moved.job_id == big and moved.domain == ("z0", "b0", "r1") and moved.starts_at <= 400
    again = schedule_round(s.state, moved.chosen_at, moved, tuning=every_round).reservation
    assert (again.domain, again.nodes, again.starts_at) == (moved.domain, moved.nodes, moved.starts_at)


def test_a_kept_reservation_trades_a_draining_node_for_one_that_emptied_early():
    """Jobs end before their time limits: when a node of the reservation's domain empties early, the
    kept reservation holds it instead of a node still draining (its start only gets earlier), so a
    long job cannot refill it while the gang waits on a node with hours to run."""
    s = sim(racks=1, nodes_per_rack=4)
    occupy_until(s, {"r0-n0": 100, "r0-n1": 200, "r0-n2": 1000, "r0-n3": 1000})
    big = s.submit(spec(tasks=2), duration=10)
    first = s.schedule().reservation
    assert first.job_id == big and first.nodes == {"r0-n0", "r0-n1"} and first.starts_at == 200
    end_tasks_on(s, ["r0-n2"])  # its job ends 1000 s ahead of its limit
    long = s.submit(spec(tasks=1, time_limit=5000), duration=5000)
    every_round = dataclasses.replace(TUNING, reevaluate_s=0)
    result = schedule_round(s.state, s.now, first, tuning=every_round)
    kept = result.reservation
    # 100 s earlier is within the margin: the same domain, no move, but the emptied node is held.
    assert kept.domain == first.domain and kept.nodes == {"r0-n0", "r0-n2"} and kept.starts_at == 100
    assert long not in {p.job_id for p in result.plans}


def test_the_next_blocked_gangs_reserve_other_nodes_and_backfill_respects_each():
    s = sim(racks=2, nodes_per_rack=4)
    occupy_until(s, {n: 100 for n in sorted(s.state.nodes)})
    first = s.submit(spec(tasks=4, pack="rack", required=True), duration=10)
    second = s.submit(spec(tasks=4, pack="rack", required=True), duration=10)
    third = s.submit(spec(tasks=4, pack="rack", required=True), duration=10)
    result = schedule_round(s.state, s.now, tuning=dataclasses.replace(TUNING, reservations=2))
    assert [r.job_id for r in result.reservations] == [first, second]
    assert result.reservation == result.reservations[0]
    assert not result.reservations[0].nodes & result.reservations[1].nodes
    assert result.waiting[third].code == "BehindReservation"
    # A one-node job ending at t=50 may backfill either reservation (both start at t=100); one
    # ending at t=150 neither.
    end_tasks_on(s, ["r0-n0"])
    quick = s.submit(spec(tasks=1, time_limit=50), duration=10)
    slow = s.submit(spec(tasks=1, time_limit=150), duration=10)
    result = schedule_round(s.state, s.now, tuning=dataclasses.replace(TUNING, reservations=2))
    assert [p.job_id for p in result.plans] == [quick] and slow in result.waiting


def test_a_preferred_gang_waits_a_bounded_time_for_one_rack():
    """Delay scheduling (the fixed wait alone): 2 free nodes, one in each rack. A 2-node gang that
    would fit one rack waits for it; once its locality wait is over it takes the split placement.
    A gang larger than any rack is split at once."""
    fixed = dataclasses.replace(TUNING, weigh_locality=False)
    s = Simulator(policy=functools.partial(schedule_round, tuning=fixed))
    for cmd in uniform_cluster(racks_per_block=2, nodes_per_rack=2):
        assert s.apply(cmd).ok
    occupy_until(s, {"r0-n0": 10_000_000, "r1-n0": 10_000_000})
    gang = s.submit(spec(tasks=2, time_limit=3600), duration=10)
    result = s.schedule()
    assert result.plans == [] and "waiting for one rack" in str(result.waiting[gang])
    wait = TUNING.locality_wait_s
    assert 0 < wait < math.inf
    s.advance(until=wait - 1)
    assert schedule_round(s.state, s.now, tuning=fixed).plans == []
    s.advance(until=wait)
    plans = schedule_round(s.state, s.now, tuning=fixed).plans
    assert [p.job_id for p in plans] == [gang]
    assert {p.node_id for p in plans[0].placements} == {"r0-n1", "r1-n1"}

    s = sim(racks=2, nodes_per_rack=2)
    occupy_until(s, {"r0-n0": 10_000_000})
    wide = s.submit(spec(tasks=3, time_limit=3600), duration=10)  # racks hold 2
    assert [p.job_id for p in s.schedule().plans] == [wide]


def test_a_preferred_gang_that_fits_one_rack_now_starts_at_once():
    s = sim(racks=2, nodes_per_rack=2)
    occupy_until(s, {"r0-n0": 1000})
    gang = s.submit(spec(tasks=2, time_limit=3600), duration=10)
    plans = s.schedule().plans
    assert [p.job_id for p in plans] == [gang] and {p.node_id for p in plans[0].placements} == {"r1-n0", "r1-n1"}


def test_the_head_gang_splits_now_when_split_it_would_end_first():
    """One free node in each rack, the others busy until t=10,000. A 2-node gang with a 1 h limit,
    split, is expected to end at 3600 / 0.9 = 4,000 s, in one rack at 13,600: it starts split now;
    so does one with a 10 h limit (40,000 against 46,000), though it would not be done before the
    rack frees. With a 36 h limit (144,000 split, 139,600 in one rack) it waits for one rack, and
    reserves one (expected free at 10,000)."""
    s = sim(racks=2, nodes_per_rack=2)
    occupy_until(s, {"r0-n0": 10_000, "r1-n0": 10_000})
    gang = s.submit(spec(tasks=2, time_limit=3600), duration=10)
    result = schedule_round(s.state, s.now)
    assert result.plans == [Plan(gang, 1, (Placement(0, "r0-n1", tuple(range(8)), 0),
                                           Placement(1, "r1-n1", tuple(range(8)), 1)))]

    s = sim(racks=2, nodes_per_rack=2)
    occupy_until(s, {"r0-n0": 10_000, "r1-n0": 10_000})
    ten = s.submit(spec(tasks=2, time_limit=36_000), duration=10)
    assert [p.job_id for p in schedule_round(s.state, s.now).plans] == [ten]

    s = sim(racks=2, nodes_per_rack=2)
    occupy_until(s, {"r0-n0": 10_000, "r1-n0": 10_000})
    long = s.submit(spec(tasks=2, time_limit=36 * 3600), duration=10)
    result = schedule_round(s.state, s.now)
    assert result.plans == [] and "waiting for one rack" in result.waiting[long].message
    held = result.reservation
    assert (held.job_id, held.domain, held.nodes, held.starts_at) == \
        (long, ("z0", "b0", "r0"), {"r0-n0", "r0-n1"}, 10_000)
    # Without a time limit, the gang is taken to run as long as the locality wait (48 h): it waits
    # (192,000 split against 182,800).
    s = sim(racks=2, nodes_per_rack=2)
    occupy_until(s, {"r0-n0": 10_000, "r1-n0": 10_000})
    unknown = s.submit(spec(tasks=2), duration=10)
    assert schedule_round(s.state, s.now).waiting[unknown].code == "Resources"


def test_a_head_gang_that_splits_reserves_the_nodes_that_free_first_anywhere():
    """No rack has 2 nodes free before t=50,000 (r0) or 60,000 (r1), but r0-n0 and r1-n0 free at
    t=100 and 200: split, the gang is expected done by 200 + 4,000 s. It reserves those two
    nodes across racks, expected to start at 200."""
    s = sim(racks=2, nodes_per_rack=2)
    occupy_until(s, {"r0-n0": 100, "r0-n1": 50_000, "r1-n0": 200, "r1-n1": 60_000})
    gang = s.submit(spec(tasks=2, time_limit=3600), duration=10)
    result = schedule_round(s.state, s.now)
    held = result.reservation
    assert result.plans == [] and "waiting for one" not in result.waiting[gang].message
    assert (held.job_id, held.domain, held.nodes, held.starts_at, held.ends_at) == \
        (gang, (), {"r0-n0", "r1-n0"}, 200, 3800)


def test_a_gang_beyond_the_reservations_keeps_the_fixed_rack_wait():
    """With one reservation, taken by a 3-node gang, a 2-node gang that could start split on the
    reserved nodes (its limit ends before they are needed) is not the one the queue waits for:
    it waits for one rack, as before."""
    s = sim(racks=2, nodes_per_rack=2)
    occupy_until(s, {"r0-n0": 10_000, "r1-n0": 10_000})
    wide = s.submit(spec(tasks=3, time_limit=3600), duration=10)
    gang = s.submit(spec(tasks=2, time_limit=3600), duration=10)
    result = schedule_round(s.state, s.now, tuning=dataclasses.replace(TUNING, reservations=1))
    assert [r.job_id for r in result.reservations] == [wide] and result.plans == []
    assert "waiting for one rack" in result.waiting[gang].message


def test_conservative_backfill_reserves_for_every_blocked_gang_one_after_another():
    """Every node busy until t=100. Conservative backfill: the first whole-cluster gang (limit
    1,000) reserves the 4 nodes from 100 to 1,100; the second (limit 500) the same nodes from 1,100
    to 1,600; the third (no limit) from 1,600 on, for good. A one-node job ending at t=90 could
    backfill, but no node is free."""
    s = sim(racks=2, nodes_per_rack=2)
    occupy_until(s, {n: 100 for n in sorted(s.state.nodes)})
    first = s.submit(spec(tasks=4, time_limit=1000), duration=10)
    second = s.submit(spec(tasks=4, time_limit=500), duration=10)
    third = s.submit(spec(tasks=4), duration=10)
    result = schedule_round(s.state, s.now, tuning=CONSERVATIVE)
    nodes = frozenset(s.state.nodes)
    assert [(r.job_id, r.nodes, r.starts_at, r.ends_at) for r in result.reservations] == \
        [(first, nodes, 100, 1100), (second, nodes, 1100, 1600), (third, nodes, 1600, math.inf)]
    # A gang behind them all reserves nothing: the third holds the nodes for good.
    fourth = s.submit(spec(tasks=1, time_limit=90), duration=10)
    result = schedule_round(s.state, s.now, tuning=CONSERVATIVE)
    assert result.plans == [] and fourth not in {r.job_id for r in result.reservations}


def _submit_as(s, user, job_spec, duration):
    job_id = f"{user}-{job_spec.name}-{len(s.state.jobs)}"
    assert s.apply(c.SubmitJob(at=s.now, job_id=job_id, request_id=job_id, spec=job_spec, by=user)).ok
    s._runtime[job_id] = (duration, 0)
    return job_id


def _known_runs(s):
    """bob's prep ran 100 s twice; alice's train 1000 s twice."""
    for user, name, run in (("bob", "prep", 100.0), ("alice", "train", 1000.0)):
        for _ in range(2):
            s.state.run_times.learn(user, name, 8, run)


def _behind_a_gang(knob, holder, behind):
    """Two nodes: `holder` (user, name, run) runs on one, a two-node gang of carol's waits, then
    `behind` (user, name, run) is submitted, each with an hour's limit; a round with `knob` off
    and on, the guess by the user's longest runs off (`backfill_user_factor`, measured apart):
    {on: (the gang's expected start, what the round starts)}, and the id of `behind`."""
    out = {on: _round_behind(holder, behind, backfill_user_factor=0.0, **{knob: on})[0] for on in (False, True)}
    return out, _round_behind(holder, behind)[1]


def _round_behind(holder, behind, **changes):
    """`_behind_a_gang`'s round with Tuning `changes`: ((the gang's expected start, what the round
    starts), the id of `behind`)."""
    s = sim(racks=1, nodes_per_rack=2)
    _known_runs(s)
    _submit_as(s, holder[0], spec(tasks=1, name=holder[1], time_limit=3600), holder[2])
    s.schedule()
    _submit_as(s, "carol", spec(tasks=2, name="big", time_limit=3600), 100)
    job = _submit_as(s, behind[0], spec(tasks=1, name=behind[1], time_limit=3600), behind[2])
    result = schedule_round(s.state, s.now, tuning=dataclasses.replace(TUNING, **changes))
    return (result.reservation.starts_at, [p.job_id for p in result.plans]), job


def test_the_drain_clock_expects_a_job_of_unknown_kind_to_run_its_users_runs():
    """bob's sim, of a kind never run, holds one of two nodes; a two-node gang reserves both. By
    the kind alone the node drains at its limit and alice's 1000 s train fits before it; by bob's
    runs (100 s) it drains at once, and the train would delay the gang."""
    out, train = _behind_a_gang("drain_by_user", ("bob", "sim", 500), ("alice", "train", 1000))
    assert out == {False: (3600, [train]), True: (100, [])}


def test_a_job_of_unknown_kind_may_backfill_by_its_users_runs():
    """bob's sim, of a kind never run, asks for an hour; bob's runs last 100 s. By its limit it may
    not go on the nodes reserved for a gang expected to start in 1000 s; by bob's runs it may."""
    out, quick = _behind_a_gang("backfill_by_user", ("alice", "train", 1000), ("bob", "sim", 100))
    assert out == {False: (1000, []), True: (1000, [quick])}


def test_a_job_of_unknown_kind_may_backfill_by_a_multiple_of_its_users_longest_run():
    """bob's sim, of a kind never run, asks for an hour; bob's runs last 100 s, and the gang is
    expected to start in 1000 s. By its limit it may not go on the reserved nodes; by four times
    bob's longest run (400 s) it may; by twenty times (2000 s) it may not."""
    holder, behind = ("alice", "train", 1000), ("bob", "sim", 100)
    starts = {factor: _round_behind(holder, behind, backfill_user_factor=factor)[0] for factor in (0.0, 4.0, 20.0)}
    quick = _round_behind(holder, behind)[1]
    assert starts == {0.0: (1000, []), 4.0: (1000, [quick]), 20.0: (1000, [])}


def test_the_drain_clock_counts_a_job_of_unknown_kind_by_the_guess_that_let_it_backfill():
    """bob's sim, of a kind never run, holds one of two nodes with an hour's limit; bob's runs last
    100 s. With drain_user_factor the drain clock expects it to run four times that (the guess
    backfill_user_factor=4 lets such a job onto reserved nodes by), so the gang expects both nodes
    at 400 s, not at the sim's limit; alice's 1000 s train then no longer fits before it."""
    holder, behind = ("bob", "sim", 500), ("alice", "train", 1000)
    starts = {on: _round_behind(holder, behind, backfill_user_factor=4.0, drain_user_factor=on)[0]
              for on in (False, True)}
    train = _round_behind(holder, behind)[1]
    assert starts == {False: (3600, [train]), True: (400, [])}


def test_a_gang_that_waited_long_takes_no_guessed_backfill():
    """As above, bob's sim may go on the nodes of a gang expected in 1000 s by four times bob's
    longest run, but only while the gang has waited less than `guess_wait_s`: at 0 s it has waited
    long enough to be promised its start by the sim's kind or limit alone."""
    holder, behind = ("alice", "train", 1000), ("bob", "sim", 100)
    starts = {wait: _round_behind(holder, behind, backfill_user_factor=4.0, guess_wait_s=wait)[0]
              for wait in (0.0, 3600.0)}
    quick = _round_behind(holder, behind)[1]
    assert starts == {0.0: (1000, []), 3600.0: (1000, [quick])}


def test_shortest_backfill_tries_the_jobs_behind_the_reservations_shortest_first():
    """One node free outside a blocked gang's reservation and two jobs behind it: in queue order
    the hour-long one takes it; shortest first, the 100 s one does."""
    order = {}
    for shortest in (False, True):
        s = sim(racks=2, nodes_per_rack=2)
        _known_runs(s)
        occupy(s, ["r0-n0", "r1-n0"])  # no limit: the reservation's start is unknown, no one goes on its nodes
        _submit_as(s, "carol", spec(tasks=2, name="big", pack="rack", required=True), 100)
        long = _submit_as(s, "dave", spec(tasks=1, name="long", time_limit=3600), 3600)
        quick = _submit_as(s, "bob", spec(tasks=1, name="prep", time_limit=3600), 100)
        tuning = dataclasses.replace(TUNING, reservations=1, shortest_backfill=shortest)
        result = schedule_round(s.state, s.now, tuning=tuning)
        order[shortest] = [p.job_id for p in result.plans]
    assert order == {False: [long], True: [quick]}


def test_shortest_backfill_orders_by_known_runs_and_not_by_limits():
    """The same node free, and behind the gang first erin's job that no run is known of, with a
    50 s limit, then bob's prep, which ran 100 s: bob's goes first (a limit says what a job may
    take, not what it will); in queue order, or by limits, erin's would. With `predict` off the
    backfill keeps queue order."""
    order = {}
    for predict in (True, False):
        s = sim(racks=2, nodes_per_rack=2)
        _known_runs(s)
        occupy(s, ["r0-n0", "r1-n0"])
        _submit_as(s, "carol", spec(tasks=2, name="big", pack="rack", required=True), 100)
        unknown = _submit_as(s, "erin", spec(tasks=1, name="new", time_limit=50), 50)
        known = _submit_as(s, "bob", spec(tasks=1, name="prep", time_limit=3600), 100)
        tuning = dataclasses.replace(TUNING, reservations=1, predict=predict, shortest_backfill=True)
        order[predict] = [p.job_id for p in schedule_round(s.state, s.now, tuning=tuning).plans]
    assert order == {True: [known], False: [unknown]}


def test_a_blocked_gang_behind_the_head_reserves_no_nodes_expected_too_far_out():
    """r0's nodes free at t=100 and the head gang (one rack) reserves them; the whole-cluster gang
    behind it can start only when r1-n0 ends, at t=200,000. Reserved, r1-n1 (free now) takes no job
    whose limit does not end first; with `reserve_within_s` of a day that start is too far out to
    hold nodes for: it reserves nothing, still counts as the round's second reservation (a third
    blocked gang reserves nothing either), and r1-n1 takes the long job."""
    plans, reserved = {}, {}
    for within in (math.inf, 86_400.0):
        s = sim(racks=2, nodes_per_rack=2)
        occupy_until(s, {"r0-n0": 100, "r0-n1": 100, "r1-n0": 200_000})
        head = s.submit(spec(tasks=2, pack="rack", required=True, time_limit=1000), duration=10)
        wide = s.submit(spec(tasks=4, time_limit=1000), duration=10)
        third = s.submit(spec(tasks=3, time_limit=1000), duration=10)
        long = s.submit(spec(tasks=1, time_limit=300_000), duration=10)
        result = schedule_round(s.state, s.now, tuning=dataclasses.replace(TUNING, reserve_within_s=within))
        plans[within] = [p.job_id for p in result.plans]
        reserved[within] = [(r.job_id, r.starts_at) for r in result.reservations]
        assert result.waiting[third].code == "BehindReservation"
        if within < math.inf:
            assert result.waiting[wide].code == "BehindReservation" and "would start" in result.waiting[wide].message
    assert reserved == {math.inf: [(head, 100), (wide, 200_000)], 86_400.0: [(head, 100)]}
    assert plans == {math.inf: [], 86_400.0: [long]}
