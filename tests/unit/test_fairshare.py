"""Usage that remembers (synapse.core.schedule.fairshare): the decay, its bookkeeping in apply, admission's
order, and the leader setting the configured half-life. Pure."""

from __future__ import annotations

import pytest

from synapse.core import commands as c
from synapse.core.state.fsm import ClusterState
from tests.support.core import N0, N1, brain, proposals, run_job
from tests.support.helpers import checked, cluster, spec

H = 7 * 86400.0


def test_decayed_usage_halves_every_half_life_and_a_steady_holder_approaches_its_ceiling():
    from synapse.core.schedule import fairshare

    assert fairshare.decayed(100.0, 0, H, H) == pytest.approx(50.0)
    assert fairshare.decayed(0.0, 8, 1.0, H) == pytest.approx(8.0, rel=1e-5)  # a second of 8 GPUs
    assert fairshare.decayed(0.0, 8, 50 * H, H) == pytest.approx(8 * H / fairshare.LN2)
    assert fairshare.decayed(100.0, 8, 10.0, 0.0) == 100.0  # no half-life: no memory kept
    entry = fairshare.accrue(None, 8, at=10.0, half_life=H)
    assert fairshare.accrue(entry, -8, at=5.0, half_life=H) == fairshare.DecayedUsage(0.0, 10.0, 0)  # skewed clock


def test_apply_keeps_each_queue_and_users_decayed_gpu_time_from_the_commands_timestamps():
    from synapse.core.schedule import fairshare

    state = cluster(racks=1, nodes_per_rack=2)
    checked(state, c.SetUsageHalfLife(at=0, half_life=H))
    run_job(state, "a", [N0, N1], at=100)  # 16 GPUs placed at 101, tasks gone at 112
    entry = state.queue_decay["default"]
    assert entry.held == 0 and entry.at == 112
    assert entry.value == pytest.approx(16 * 11, rel=1e-4) and state.user_decay[""].value == entry.value
    assert fairshare.value_at(entry, 112 + H, H) == pytest.approx(entry.value / 2)
    again = ClusterState.from_snapshot(state.to_snapshot())
    assert again.digest() == state.digest() and again.queue_decay == state.queue_decay
    assert not checked(state, c.SetUsageHalfLife(at=200, half_life=-1)).ok


def test_admission_puts_the_queue_that_used_less_lately_first():
    from synapse.core.model import Queue
    from synapse.core.schedule import admission

    state = cluster(racks=1, nodes_per_rack=2)
    checked(state, c.ApplyQueues(at=0, queues=(Queue("a"), Queue("b"))))
    checked(state, c.SetUsageHalfLife(at=0, half_life=H))
    run_job(state, "past", [N0, N1], at=100, queue="a")  # queue a used the cluster lately
    checked(state, c.SubmitJob(at=500, job_id="a2", request_id="a2", spec=spec(queue="a")))
    checked(state, c.SubmitJob(at=600, job_id="b2", request_id="b2", spec=spec(queue="b")))
    pool = admission.pool_of(state)
    order = sorted(state.pending_jobs(), key=lambda j: admission.admission_key(state, j, pool))
    assert [j.id for j in order] == ["b2", "a2"]
    checked(state, c.SetUsageHalfLife(at=700, half_life=0))  # no memory: submission order again
    order = sorted(state.pending_jobs(), key=lambda j: admission.admission_key(state, j, pool))
    assert [j.id for j in order] == ["a2", "b2"]


def test_admission_keeps_each_queues_own_order_whatever_the_gangs_sizes():
    """A job's key is its queue's share once it runs, which grows with the job: sorted job by job,
    each queue's small gangs went ahead of the big ones submitted before them (big gangs lost their
    turn and their reservations in every cluster with queues defined)."""
    from synapse.core.model import Queue
    from synapse.core.schedule import admission
    from synapse.core.schedule.scheduler import schedule_round

    state = cluster(racks=1, nodes_per_rack=4)
    checked(state, c.ApplyQueues(at=0, queues=(Queue("a"), Queue("b"))))
    checked(state, c.SetUsageHalfLife(at=0, half_life=H))
    run_job(state, "past", [N0, N1], at=100, queue="a")  # queue a used the cluster lately
    for at, (job_id, tasks, queue) in enumerate([("big-a", 4, "a"), ("small-a", 1, "a"), ("big-b", 4, "b"),
                                                 ("small-b", 1, "b")]):
        checked(state, c.SubmitJob(at=500 + at, job_id=job_id, request_id=job_id, spec=spec(tasks, queue=queue)))
    order = admission.admission_order(state, state.pending_jobs())
    assert [j.id for j in order] == ["big-b", "small-b", "big-a", "small-a"]
    only_a = admission.admission_order(state, (j for j in state.pending_jobs() if j.spec.queue == "a"))
    assert [j.id for j in only_a] == ["big-a", "small-a"]
    # the round walks that order: every gang fits the idle cluster, so the first one takes it all
    assert [p.job_id for p in schedule_round(state, 600.0).plans] == ["big-b"]


def test_a_new_leader_sets_the_configured_half_life_once():
    from synapse.core.brain.stimuli import Started

    state = cluster(racks=1, nodes_per_rack=2)
    leader = brain(usage_half_life=H)
    assert proposals(leader.handle(state, Started(at=5, mono=0))) == [c.SetUsageHalfLife(at=5, half_life=H)]
    checked(state, c.SetUsageHalfLife(at=5, half_life=H))
    assert proposals(brain(usage_half_life=H).handle(state, Started(at=6, mono=0))) == []
    assert proposals(brain().handle(state, Started(at=6, mono=0))) == []


def test_over_a_week_of_two_teams_fair_share_pays_back_the_first_day_only_with_a_half_life():
    from synapse.sim.fairshare import two_teams

    remembering, forgetting = (two_teams(h, weights=(1.0, 3.0)) for h in (H, 0.0))

    def a_share(day) -> float:
        return day.gpu_hours[0] / sum(day.gpu_hours)

    assert a_share(remembering[0]) == a_share(forgetting[0]) == 1.0  # team A alone on day 1
    # with memory, team A runs less than its weight's 25% while its first day weighs on it...
    assert all(a_share(d) < 0.22 for d in remembering[1:5])
    # ...without, it gets about its weight each day, and the first day is never paid back
    assert all(0.24 < a_share(d) < 0.31 for d in forgetting[1:])
    assert remembering[-1].decayed_share[0] < 0.30 and remembering[1].decayed_share[0] > 0.5


def test_the_fair_share_command_prints_both_runs():
    from click.testing import CliRunner

    from synapse.sim.main import main

    out = CliRunner().invoke(main, ["fair-share", "--days", "3", "--weights", "1,1"])
    assert out.exit_code == 0 and "half-life 7d" in out.output and len(out.output.splitlines()) == 6, out.output
    assert CliRunner().invoke(main, ["fair-share", "--weights", "x"]).exit_code == 2
    assert CliRunner().invoke(main, ["fair-share", "--half-life", "soon"]).exit_code == 2
