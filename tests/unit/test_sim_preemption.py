"""synapse-sim with the leader's preemption step: backfilled gangs evicted for the gang they passed."""

from __future__ import annotations

import pytest

from synapse.core import commands as c
from synapse.core.model import DEFAULT_GRACE_S, JobStatus, Queue, Resources
from synapse.core.state.invariants import violations
from synapse.sim.generate import Recipe, generate
from synapse.sim.metrics import summarize
from synapse.sim.policies import POLICIES
from synapse.sim.replay import Replay
from synapse.sim.trace import ClusterShape, Trace, TraceJob

SMALL = ClusterShape(nodes=8, gpus_per_node=8, racks=2)
#: One queue for the trace's unqueued jobs, with a guarantee nobody exceeds (so the queue order is
#: the plain one) and only the backfill rule, as docs/evaluation-queues.yaml.
EVERYONE = Queue("default", guaranteed=Resources(10**9, 10**18, 10**6), preemption_rules=("backfill",))


def job(id, submit, gpus, duration, limit=0.0):
    return TraceJob(id=id, submit=submit, gpus=gpus, nodes=0, duration=duration, time_limit=limit)


class Checked(Replay):
    """A replay that checks the state's invariants after every command it applies."""

    def apply(self, cmd: c.Command) -> c.Result:
        result = super().apply(cmd)
        problems = violations(self.state)
        assert not problems, (type(cmd).__name__, problems)
        return result


def backfill_trace() -> Trace:
    """Eight one-node gangs that ask for 1,000 s and end after 100-170 s; a 64-GPU gang queued
    behind them; then eight one-node gangs asking for 500 s (running 450 s), which the reservation
    by time limits lets start on each node as it frees: they sit on every node the big gang needs."""
    jobs = [job(f"f{i}", 0, 8, 100 + 10 * i, 1000) for i in range(8)] + [job("big", 1, 64, 50)]
    jobs += [job(f"s{i}", 2, 8, 450, 500) for i in range(8)]
    return Trace(jobs, SMALL)


def replayed(queues=(), policy="synapse", trace=None):
    sim = Checked(trace or backfill_trace(), SMALL, POLICIES[policy], queues=queues)
    result = sim.replay()
    return sim, result, {r.id: r for r in result.records}


def test_without_queues_the_big_gang_waits_for_the_backfilled_gangs():
    sim, result, rec = replayed()
    assert sim.preemptions == [] and result.preemptions == 0
    assert rec["big"].start == pytest.approx(610)  # s6, started at 160, ends at 610
    assert summarize(result)["lost_gpu_hours"] == 0


def test_the_waiting_gang_preempts_what_was_backfilled_past_it_and_the_victims_rerun():
    sim, result, rec = replayed((EVERYONE,))
    assert len(sim.preemptions) == 1
    preempt = sim.preemptions[0]
    assert preempt.job_id == "big" and preempt.rule == "backfill"
    victims = {v.job_id for v in preempt.victims}
    assert victims == {f"s{i}" for i in range(7)}  # s7 never started: the last filler ended at 170
    # The preemptor starts only once its victims' tasks have exited, at the end of their grace.
    assert rec["big"].start == pytest.approx(170 + DEFAULT_GRACE_S)
    for v in victims:
        (lost_start, lost_stop), = rec[v].preempted
        assert lost_stop == pytest.approx(170 + DEFAULT_GRACE_S) and lost_stop <= rec["big"].start
        assert lost_start == pytest.approx(100 + 10 * int(v[1:]))
        # Requeued behind the preemptor, with the original submission time, and rerun in full.
        assert rec[v].submit == 2 and rec[v].start >= rec["big"].end
        assert rec[v].end - rec[v].start == pytest.approx(450)
        assert rec[v].status == "SUCCEEDED" and sim.state.jobs[v].preemptions == 1
    lost = sum((170 + DEFAULT_GRACE_S - (100 + 10 * i)) * 8 for i in range(7))
    assert sim.lost_gpu_seconds == pytest.approx(lost)
    m = summarize(result)
    assert m["preemptions"] == 1 and m["lost_gpu_hours"] == pytest.approx(lost / 3600)
    assert all(j.status is JobStatus.SUCCEEDED for j in sim.state.jobs.values())
    assert sim.state.holds == {} and sim.state.held_nodes == {}


def test_the_grace_is_the_commands_and_the_baselines_never_preempt():
    short = Queue("default", guaranteed=EVERYONE.guaranteed, preemption_rules=("backfill",), max_grace=5)
    sim, _, rec = replayed((short,))
    assert [v.grace for v in sim.preemptions[0].victims] == [5.0] * 7
    assert rec["big"].start == pytest.approx(175)
    for policy in ("fifo", "greedy", "easy"):
        assert replayed((EVERYONE,), policy)[0].preemptions == []


def test_min_runtime_protects_the_backfilled_gangs():
    protected = Queue("default", guaranteed=EVERYONE.guaranteed, preemption_rules=("backfill",), min_runtime=1000)
    sim, _, rec = replayed((protected,))
    assert sim.preemptions == [] and rec["big"].start == pytest.approx(610)


def test_a_generated_trace_with_preemption_keeps_every_invariant():
    """Two days of the gang-heavy mix on 32 nodes: the invariants hold after every command, every
    job ends, and the replay does preempt."""
    shape = ClusterShape(nodes=32, gpus_per_node=8, racks=4)
    trace = generate(Recipe(shape=shape, mix="gang-heavy", load=1.0, days=2, seed=3))
    sim = Checked(trace, shape, POLICIES["synapse"], queues=(EVERYONE,))
    result = sim.replay()
    assert result.unfinished == []
    assert all(j.status.terminal for j in sim.state.jobs.values())
    assert sim.preemptions, "the trace should exercise preemption"
    for p in sim.preemptions:
        assert p.rule == "backfill"
    m = summarize(result)
    assert m["preemptions"] == len(sim.preemptions) and m["lost_gpu_hours"] > 0

