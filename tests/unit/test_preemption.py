"""The preemption planner and the Preempt command, on the pure core (TENANCY.md's scenarios)."""

from __future__ import annotations

import pytest

from synapse.core import commands as c
from synapse.core.model import JobStatus, Placement, Queue, Resources
from synapse.core.schedule import admission, preemption
from synapse.core.state.fsm import ClusterState
from synapse.sim.engine import uniform_cluster
from tests.support.helpers import checked, spec

UNL = Resources(-1, -1, -1)


def gpu(n: int) -> Resources:
    return Resources(0, 0, n)


def state_with(queues, racks=2, nodes_per_rack=8) -> ClusterState:
    state = ClusterState()
    for cmd in uniform_cluster(racks_per_block=racks, nodes_per_rack=nodes_per_rack):
        checked(state, cmd)
    checked(state, c.ApplyQueues(at=0, queues=tuple(queues)))
    return state


def run(state, job_id, queue, nodes, started, gpus_per_task=8, priority=0, grace=0.0):
    """A running gang of len(nodes) tasks, one per node, started at `started`."""
    checked(state, c.SubmitJob(at=started - 1, job_id=job_id, request_id=job_id, spec=spec(
        tasks=len(nodes), gpu=gpus_per_task, queue=queue, priority=priority, name=job_id)))
    free = {n: sorted(set(range(8)) - state.nodes[n].gpus_in_use) for n in nodes}
    checked(state, c.CommitPlan(at=started, job_id=job_id, attempt=1, placements=tuple(
        Placement(i, n, tuple(free[n][:gpus_per_task]), i) for i, n in enumerate(nodes))))
    for t in state.jobs[job_id].tasks:
        checked(state, c.TaskStarted(at=started, job_id=job_id, attempt=1, index=t.index, node_id=t.node_id))


def pend(state, job_id, queue, tasks, gpus_per_task=8, pack="rack", priority=0):
    checked(state, c.SubmitJob(at=5000, job_id=job_id, request_id=job_id, spec=spec(
        tasks=tasks, gpu=gpus_per_task, queue=queue, pack=pack, required=bool(pack), priority=priority)))
    return state.jobs[job_id]


def r(rack, *ns):
    return [f"r{rack}-n{n}" for n in ns]


def test_least_lost_work_decides_the_rack():
    state = state_with([Queue("a", guaranteed=gpu(64)), Queue("b", guaranteed=gpu(64), max=Resources(-1, -1, 128))])
    now = 6000
    run(state, "b1", "b", r(0, *range(8)), started=now - 3000)  # 64 GPUs, 50 min
    run(state, "b2", "b", r(1, 0, 1, 2, 3), started=now - 600)  # 32 GPUs, 10 min
    run(state, "b3", "b", r(1, 4, 5, 6, 7), started=now - 1800)  # 32 GPUs, 30 min
    found = preemption.plan(state, pend(state, "a1", "a", 8), now)
    assert {v.job_id for v in found.command.victims} == {"b2", "b3"}
    assert found.command.rule == "reclaim" and set(found.command.nodes) == set(r(1, *range(8)))
    why = found.command.explanation
    assert "queue a uses gpu 0 of guaranteed 64, needs 64" in why and "queue b uses gpu 128 of guaranteed 64" in why
    assert "preempting in z0/b0/r1 (" in why and "not chosen: z0/b0/r0" in why and "work lost 76800 GPU-s" in why
    assert "not chosen: z0/b0/r0 at least" in why  # the other rack, and what it would have cost

    # Variant: b1 has only just started, so it costs least.
    state = state_with([Queue("a", guaranteed=gpu(64)), Queue("b", guaranteed=gpu(64), max=Resources(-1, -1, 128))])
    run(state, "b1", "b", r(0, *range(8)), started=now - 300)
    run(state, "b2", "b", r(1, 0, 1, 2, 3), started=now - 600)
    run(state, "b3", "b", r(1, 4, 5, 6, 7), started=now - 1800)
    found = preemption.plan(state, pend(state, "a1", "a", 8), now)
    assert [v.job_id for v in found.command.victims] == ["b1"]


def test_a_spanning_gang_is_never_cut_and_guarantees_come_first():
    state = state_with([Queue("a", guaranteed=gpu(64)), Queue("b", guaranteed=gpu(64), max=Resources(-1, -1, 128))])
    run(state, "b5", "b", r(0, *range(8)) + r(1, 0, 1, 2, 3), started=1000)  # 96 GPUs over both racks
    run(state, "b6", "b", r(1, 4, 5), started=5900)
    run(state, "b7", "b", r(1, 6, 7), started=5900)
    found = preemption.plan(state, pend(state, "a1", "a", 4), 6000)
    assert {v.job_id for v in found.command.victims} == {"b6", "b7"}


def test_no_ping_pong_between_two_queues():
    state = state_with([Queue("a", guaranteed=gpu(8), max=gpu(16)), Queue("b", guaranteed=gpu(8))],
                       racks=1, nodes_per_rack=2)
    run(state, "a1", "a", r(0, 0, 1), started=100)
    found = preemption.plan(state, pend(state, "b1", "b", 1, pack=""), 1000)
    assert [v.job_id for v in found.command.victims] == ["a1"]
    checked(state, c.Preempt(at=1000, job_id="b1", attempt=1, rule=found.command.rule, victims=found.command.victims,
                             nodes=found.command.nodes))
    for t in state.jobs["a1"].tasks:
        checked(state, c.TaskExited(at=1001, job_id="a1", attempt=1, index=t.index, node_id=t.node_id, exit_code=143))
    a1 = state.jobs["a1"]
    assert a1.status is JobStatus.PENDING and a1.attempt == 2 and a1.preemptions == 1
    assert a1.restarts_used() == 0  # a preemption is not a failure
    checked(state, c.CommitPlan(at=1002, job_id="b1", attempt=1, placements=(Placement(0, found.command.nodes[0],
                                                                                        tuple(range(8)), 0),)))
    assert state.holds == {} and state.held_nodes == {}
    again = preemption.plan(state, a1, 1100)
    assert isinstance(again, str) and "no rule" in again  # a1 is beyond a's guarantee; b1 is within b's


def test_an_infeasible_preemption_proposes_nothing():
    state = state_with([Queue("a", guaranteed=gpu(8))], racks=1, nodes_per_rack=2)
    for n in r(0, 0, 1):
        for k in range(5):
            run(state, f"hi-{n}-{k}", "a", [n], started=10, gpus_per_task=1, priority=100)
        for k in range(2):
            run(state, f"lo-{n}-{k}", "a", [n], started=10, gpus_per_task=1, priority=10)
    found = preemption.plan(state, pend(state, "big", "a", 1, pack="", priority=100), 1000)
    assert isinstance(found, str) and "would still not make room" in found


def test_min_runtime_protects_young_gangs_and_says_until_when():
    state = state_with([Queue("a", guaranteed=gpu(8)), Queue("b", preemption_rules=("reclaim",), min_runtime=600)],
                       racks=1, nodes_per_rack=1)
    run(state, "b1", "b", r(0, 0), started=900)
    found = preemption.plan(state, pend(state, "a1", "a", 1, pack=""), 1000)
    assert isinstance(found, str) and "protected by min_runtime" in found and "b1" in found
    assert "until 00:25 UTC" in found  # t=1500: a time of day, not an epoch
    assert not isinstance(preemption.plan(state, state.jobs["a1"], 1600), str)


def test_held_nodes_go_to_the_preemptor_alone():
    state = state_with([Queue("a", guaranteed=gpu(8)), Queue("b")], racks=1, nodes_per_rack=1)
    run(state, "b1", "b", r(0, 0), started=10)
    found = preemption.plan(state, pend(state, "a1", "a", 1, pack=""), 1000)
    checked(state, found.command)
    checked(state, c.TaskExited(at=1001, job_id="b1", attempt=1, index=0, node_id="r0-n0", exit_code=0))
    pend(state, "other", "b", 1, pack="")
    stolen = state.apply(c.CommitPlan(at=1002, job_id="other", attempt=1,
                                      placements=(Placement(0, "r0-n0", tuple(range(8)), 0),)))
    assert not stolen.ok and "held for job a1" in stolen.error
    # The scheduler sees it too: only a1 is placed.
    from synapse.core.schedule.scheduler import schedule_round
    assert [p.job_id for p in schedule_round(state, 1003).plans] == ["a1"]


@pytest.mark.parametrize("mutate, error", [
    (lambda s: checked(s, c.CancelJob(at=1, job_id="a1")), "not pending"),
    (lambda s: checked(s, c.NodeDown(at=1, node_id="r0-n0")), "not READY"),
])
def test_a_preempt_command_rechecks_the_state(mutate, error):
    state = state_with([Queue("a", guaranteed=gpu(8)), Queue("b")], racks=1, nodes_per_rack=1)
    run(state, "b1", "b", r(0, 0), started=10)
    found = preemption.plan(state, pend(state, "a1", "a", 1, pack=""), 1000)
    mutate(state)
    result = state.apply(found.command)
    assert not result.ok and error in result.error


def drive_round(state: ClusterState, now: float):
    """One round as the leader and the workers would play it: place and start what fits; if
    nothing did, commit one preemption plan (the first waiting gang's) and let its victims exit at
    once. Returns (the round's plans, the Preempt committed or None)."""
    from synapse.core.schedule.scheduler import schedule_round

    result = schedule_round(state, now)
    for p in result.plans:
        checked(state, c.CommitPlan(at=now, job_id=p.job_id, attempt=p.attempt, placements=p.placements))
        for t in state.jobs[p.job_id].tasks:
            checked(state, c.TaskStarted(at=now, job_id=p.job_id, attempt=p.attempt, index=t.index,
                                         node_id=t.node_id))
    if result.plans:
        return result.plans, None
    for job in state.pending_jobs():
        if job.id in result.waiting and job.id not in state.holds and not admission.max_block(state, job):
            found = preemption.plan(state, job, now)
            if not isinstance(found, str):
                break
    else:
        return [], None
    checked(state, found.command)
    for v in found.command.victims:
        for t in state.jobs[v.job_id].tasks:
            if t.state.live:
                checked(state, c.TaskExited(at=now, job_id=v.job_id, attempt=v.attempt, index=t.index,
                                            node_id=t.node_id, exit_code=143))
    return [], found.command


def settle(state: ClusterState, now: float, rounds: int = 300) -> int:
    """Drive the state as the leader and the workers would: schedule, start, preempt one gang per
    quiet round, let victims exit at once. Returns the number of preemptions."""
    preemptions = 0
    for _ in range(rounds):
        now += 1
        placed, planned = drive_round(state, now)
        if placed:
            continue
        if planned is None:
            return preemptions
        preemptions += 1
    raise AssertionError("did not settle")


def test_weighted_fair_share_converges_and_never_preempts_back():
    fair = ("fair_share",)
    state = state_with([Queue("x", weight=3, preemption_rules=fair), Queue("y", weight=1, preemption_rules=fair)])
    for i in range(16):
        checked(state, c.SubmitJob(at=i, job_id=f"y{i:02}", request_id=f"y{i}", spec=spec(queue="y", name="y")))
    assert settle(state, 100) == 0
    assert state.queue_usage["y"].gpu == 128
    for i in range(20):
        checked(state, c.SubmitJob(at=200 + i, job_id=f"x{i:02}", request_id=f"x{i}", spec=spec(queue="x", name="x")))
    count = settle(state, 300)
    assert state.queue_usage["x"].gpu == 96 and state.queue_usage["y"].gpu == 32
    assert count == 12  # one gang each, and none back
    assert settle(state, 1000) == 0


def test_with_queues_gangs_within_their_guarantee_are_admitted_first():
    from synapse.core.schedule.scheduler import schedule_round

    state = state_with([Queue("a", guaranteed=gpu(8)), Queue("b", guaranteed=gpu(64))], racks=1, nodes_per_rack=1)
    checked(state, c.SubmitJob(at=1, job_id="a-over", request_id="1", spec=spec(queue="a", gpu=8, priority=9)))
    run(state, "a-run", "a", r(0, 0), started=2, gpus_per_task=4)
    checked(state, c.SubmitJob(at=3, job_id="b-in", request_id="3", spec=spec(queue="b", gpu=4)))
    # a already uses 4 of its 8: a-over would take it to 12, beyond; b-in stays within b's guarantee.
    assert [p.job_id for p in schedule_round(state, 10).plans] == ["b-in"]


def test_a_gang_preempted_three_times_in_a_day_is_exempt_from_the_priority_rule():
    state = state_with([Queue("a", guaranteed=gpu(8))], racks=1, nodes_per_rack=1)
    run(state, "low", "a", r(0, 0), started=10, priority=1)
    state.jobs["low"].preempted_at = (100.0, 200.0, 300.0)
    found = preemption.plan(state, pend(state, "high", "a", 1, pack="", priority=9), 1000)
    assert isinstance(found, str) and "preemption budget" in found and "low" in found
    assert not isinstance(preemption.plan(state, state.jobs["high"], 300 + 86400), str)  # the day is over


def test_gangs_backfilled_past_a_waiting_big_gang_are_its_first_victims():
    """Scenario 6: in one queue, the small gangs placed while a 48-GPU gang waited (behind it in
    the queue) make room for it; the gangs that ran before it are never touched."""
    state = state_with([Queue("q", guaranteed=gpu(128))])  # default rules: reclaim, priority, backfill
    for i in range(6):
        run(state, f"old-r0-{i}", "q", r(0, i), started=100)
    for i in range(2):
        run(state, f"old-r1-{i}", "q", r(1, i), started=4900)  # younger than the backfilled ones: cheaper
    big = pend(state, "big", "q", 6)  # 48 GPUs, one rack, queued at 5000
    for i in (6, 7):
        run(state, f"bf-r0-{i}", "q", r(0, i), started=5900)  # cheap, but freeing r0 is not enough
    for i in range(2, 8):
        run(state, f"bf-r1-{i}", "q", r(1, i), started=5100)
    found = preemption.plan(state, big, 6000)
    assert found.command.rule == "backfill"
    assert {v.job_id for v in found.command.victims} == {f"bf-r1-{i}" for i in range(2, 8)}
    assert set(found.command.nodes) == set(r(1, *range(2, 8)))

    # Through the scheduler: one preemption, the big gang runs, nothing that ran before it stopped,
    # and the requeued victims (behind it in the queue) cannot take anything back.
    assert settle(state, 6000) == 1
    assert state.jobs["big"].status is JobStatus.RUNNING
    for job_id in [f"old-r0-{i}" for i in range(6)] + ["old-r1-0", "old-r1-1", "bf-r0-6", "bf-r0-7"]:
        assert state.jobs[job_id].status is JobStatus.RUNNING and state.jobs[job_id].attempt == 1


def test_only_the_head_of_a_queue_evicts_what_was_backfilled_past_it():
    state = state_with([Queue("q", guaranteed=gpu(128))], racks=1, nodes_per_rack=2)
    pend(state, "head", "q", 4, pack="", priority=5)  # can never fit two nodes: it blocks nobody's plan
    big = pend(state, "big", "q", 2, pack="")
    run(state, "bf", "q", r(0, 0, 1), started=5100)
    found = preemption.plan(state, big, 6000)
    assert isinstance(found, str) and "no rule" in found
    # A gang placed after the big one queued but ahead of it in the queue (higher priority) stays.
    state = state_with([Queue("q", guaranteed=gpu(128))], racks=1, nodes_per_rack=2)
    big = pend(state, "big", "q", 2, pack="")
    run(state, "urgent", "q", r(0, 0), started=5100, priority=9)
    run(state, "bf", "q", r(0, 1), started=5100)
    found = preemption.plan(state, big, 6000)
    assert isinstance(found, str) and "would still not make room" in found


def test_a_gang_that_asks_for_a_gpu_model_takes_victims_only_on_nodes_of_that_model():
    import dataclasses

    state = state_with([Queue("a", guaranteed=gpu(16)), Queue("b")], racks=1, nodes_per_rack=2)
    for node_id, model in (("r0-n0", "A100"), ("r0-n1", "H100")):
        state.nodes[node_id] = dataclasses.replace(state.nodes[node_id], labels=(("gpu_model", model),))
    run(state, "cheap-a100", "b", ["r0-n0"], started=5900)  # the cheaper victim, on the wrong model
    run(state, "dear-h100", "b", ["r0-n1"], started=1000)
    checked(state, c.SubmitJob(at=5000, job_id="h", request_id="h", spec=dataclasses.replace(
        spec(tasks=1, gpu=8, queue="a"), gpu_model="h100")))
    found = preemption.plan(state, state.jobs["h"], 6000)
    assert [v.job_id for v in found.command.victims] == ["dear-h100"] and found.command.nodes == ("r0-n1",)


@pytest.mark.parametrize("seed", range(12))
def test_random_workloads_keep_every_promise(seed):
    """Random queues and gangs: every step keeps the invariants (no overcommit, no partial gang);
    every plan's preemptor is placed in the round after its victims leave (no signal without a
    feasible plan, nothing stolen from the hold); and with no new work, preemption stops."""
    import random

    from synapse.core.schedule.scheduler import schedule_round
    from synapse.core.state.invariants import violations

    rng = random.Random(seed)
    names = ["q0", "q1", "q2"]
    rules = ["reclaim", "priority", "backfill", "fair_share"]
    queues = [Queue(n, guaranteed=gpu(rng.choice([0, 16, 32, 48])), weight=rng.choice([1, 2, 3]),
                    preemption_rules=tuple(rng.sample(rules, rng.randint(1, 4))))
              for n in names]
    state = state_with(queues, racks=2, nodes_per_rack=4)
    now, preemptions = 1000.0, 0
    for i in range(40):
        tasks = rng.choice([1, 1, 2, 4])
        checked(state, c.SubmitJob(at=now + i, job_id=f"j{i:02}", request_id=f"j{i}", spec=spec(
            tasks=tasks, gpu=rng.choice([2, 4, 8]), queue=rng.choice(names), priority=rng.randint(0, 3),
            pack=rng.choice(["", "rack"]), required=rng.random() < 0.5)))
    for _round in range(400):
        now += 10
        placed, planned = drive_round(state, now)
        assert violations(state) == [], violations(state)
        if placed:
            continue
        if planned is None:
            break  # quiet: nothing to place, nobody to preempt
        preemptions += 1
        after = schedule_round(state, now + 1)
        assert planned.job_id in [p.job_id for p in after.plans], "the victims left and the preemptor did not fit"
        first = next(p for p in after.plans if p.job_id == planned.job_id)
        for p in after.plans:
            if p.job_id != planned.job_id:
                assert not {pl.node_id for pl in p.placements} & set(planned.nodes), "a held node went elsewhere"
        assert {pl.node_id for pl in first.placements} <= set(state.nodes)
    else:
        raise AssertionError(f"still preempting after 400 rounds ({preemptions} preemptions): a cycle")
    PREEMPTIONS_SEEN[seed] = preemptions


PREEMPTIONS_SEEN: dict[int, int] = {}


def test_the_random_workloads_do_preempt():
    """The test above must exercise preemption, not only quiet clusters."""
    if len(PREEMPTIONS_SEEN) < 12:
        pytest.skip("run with the random workload test")
    assert sum(1 for n in PREEMPTIONS_SEEN.values() if n) >= 6, PREEMPTIONS_SEEN
