"""Node failures in the trace replay (synapse.sim.failures): the draws, the work lost, goodput, recovery."""

from __future__ import annotations

import json
import math

import pytest

from synapse.core.model import JobStatus
from synapse.sim.failures import FailureModel, NodeFailures
from synapse.sim.generate import Recipe, generate
from synapse.sim.metrics import summarize
from synapse.sim.policies import POLICIES
from synapse.sim.replay import Replay, replay
from synapse.sim.trace import ClusterShape, Trace, TraceJob

SMALL = ClusterShape(nodes=16, gpus_per_node=8, racks=2)
NODES = [f"n{i:04d}" for i in range(SMALL.nodes)]


def _job(id: str, submit: float, gpus: int, duration: float, limit: float = 0.0) -> TraceJob:
    return TraceJob(id=id, submit=submit, gpus=gpus, nodes=0, duration=duration, time_limit=limit)


def _small_trace(seed: int = 1) -> Trace:
    recipe = Recipe(shape=SMALL, mix="philly", load=0.8, days=0.25, seed=seed)
    return generate(recipe)


def test_draws_are_deterministic_per_seed_and_differ_across_seeds():
    model = FailureModel(mtbf_s=20 * 3600, checkpoint_every_s=600)
    first = NodeFailures(model, NODES).until(7 * 86400)
    again = NodeFailures(model, list(reversed(NODES))).until(7 * 86400)
    other = NodeFailures(FailureModel(mtbf_s=20 * 3600, checkpoint_every_s=600, seed=2), NODES).until(7 * 86400)
    assert first == again
    assert first != other
    lost = [e for e in first if e[1] == "lost"]
    # 16 nodes, a week, MTBF 20 h (less the hour each is down): about 130 failures.
    assert 80 < len(lost) < 200
    # A node fails only while up: its events alternate lost, up, lost...
    for node in NODES:
        kinds = [kind for _, kind, n in first if n == node]
        assert kinds == ["lost", "up"] * (len(kinds) // 2) + ["lost"] * (len(kinds) % 2)


def test_every_policy_sees_the_same_failures():
    trace = _small_trace()
    model = FailureModel(mtbf_s=10 * 3600, checkpoint_every_s=600, restart_cost_s=60)
    runs = [replay(trace, SMALL, POLICIES[p], failures=model) for p in ("fifo", "easy", "synapse")]
    common = min(len(r.failure_times) for r in runs)
    assert common > 0
    assert all(r.failure_times[:common] == runs[0].failure_times[:common] for r in runs)
    counts = {summarize(r)["node_failures"] for r in runs}
    assert len(counts) == 1 and counts.pop() > 0


def test_a_gang_on_a_failed_node_loses_exactly_the_work_since_its_checkpoint():
    shape = ClusterShape(nodes=2, gpus_per_node=8, racks=1)
    trace = Trace(jobs=[_job("big", 0.0, 16, 10_000.0)], shape=shape)
    model = FailureModel(mtbf_s=1.0, checkpoint_every_s=1000, restart_cost_s=100, repair_s=500,
                         script=((3500.0, "n0000"),))
    sim = Replay(trace, shape, POLICIES["synapse"], failures=model)
    run = sim.replay()
    (record,) = run.records
    # Checkpoints at 1000, 2000, 3000: the failure at 3500 loses 500 s. The node is back at 4000;
    # the gang restarts there and runs the 7000 s left plus the 100 s restart.
    assert record.failures == ((0.0, 3500.0, 3000.0),)
    assert (record.start, record.end, record.restart_s) == (4000.0, 11_100.0, 100.0)
    job = sim.state.jobs["big"]
    assert job.status is JobStatus.SUCCEEDED and job.requeues == 1 and job.restarts_used() == 0
    s = summarize(run)
    assert s["failure_work_lost_gpu_hours"] == pytest.approx(500 * 16 / 3600)
    assert s["requeue_wait_gpu_hours"] == pytest.approx(500 * 16 / 3600)  # waiting for its node, 3500 to 4000
    # What the failure cost it in all: the work, the wait and the restart.
    assert s["failure_lost_gpu_hours"] == pytest.approx((500 + 500 + 100) * 16 / 3600)
    assert s["restart_gpu_hours"] == pytest.approx(100 * 16 / 3600)
    assert s["goodput"] == pytest.approx(10_000 / (3500 + 7100))
    assert s["node_failures"] == 0  # after the last submission (at 0)
    assert s["failed_big_gangs"] == 0  # 16 GPUs: not a big gang


def test_a_repaired_suspect_node_is_uncordoned_as_its_operator_would():
    """Gangs of two jobs end on one node within a day: the state machine cordons it as a suspect;
    the replay's operator uncordons it when its repair is done (a cluster nobody uncordons shrinks)."""
    shape = ClusterShape(nodes=2, gpus_per_node=8, racks=1)
    trace = Trace(jobs=[_job("a", 0.0, 8, 200.0), _job("b", 0.0, 8, 200.0),  # a on n0000 at 100
                        _job("c", 650.0, 8, 200.0), _job("d", 650.0, 8, 200.0)], shape=shape)  # one there at 700
    model = FailureModel(mtbf_s=1.0, checkpoint_every_s=0, restart_cost_s=0, repair_s=500,
                         script=((100.0, "n0000"), (700.0, "n0000")))
    sim = Replay(trace, shape, POLICIES["synapse"], failures=model)
    run = sim.replay()
    suspect = [e for e in sim.state.cluster_events if e.reason == "NodeSuspect"]
    assert [(e.at, e.object_id) for e in suspect] == [(700.0, "n0000")]
    node = sim.state.nodes["n0000"]
    assert node.schedulable and not node.suspect  # uncordoned at 1200, when its repair was done
    assert [r.status for r in run.records] == ["SUCCEEDED"] * 4


def test_the_trace_time_limit_bounds_the_whole_run_across_failures():
    shape = ClusterShape(nodes=2, gpus_per_node=8, racks=1)
    trace = Trace(jobs=[_job("long", 0.0, 16, 10_000.0, limit=5000.0)], shape=shape)
    model = FailureModel(mtbf_s=1.0, checkpoint_every_s=1000, restart_cost_s=100, repair_s=500,
                         script=((3500.0, "n0001"),))
    sim = Replay(trace, shape, POLICIES["easy"], failures=model)
    (record,) = sim.replay().records
    # 3000 s kept before the failure: 2000 s of its 5000 s limit left, after the restart.
    assert (record.start, record.end, record.status) == (4000.0, 6100.0, "FAILED")
    assert sim.state.jobs["long"].attempt == 2  # a time limit ends it for good, as the leader's does


def test_goodput_is_one_without_failures_and_the_model_changes_nothing_then():
    trace = _small_trace()
    plain = summarize(replay(trace, SMALL, POLICIES["easy"]))
    never = summarize(replay(trace, SMALL, POLICIES["easy"],
                             failures=FailureModel(mtbf_s=1e15, checkpoint_every_s=600, restart_cost_s=60)))
    assert plain["goodput"] == pytest.approx(1.0)
    assert never["goodput"] == pytest.approx(1.0)
    assert never["failure_lost_gpu_hours"] == 0 and never["node_failures"] == 0
    assert never["mean_jct_s"] == plain["mean_jct_s"]


def _recovery_trace() -> tuple[Trace, ClusterShape]:
    """A 64-GPU gang on the whole cluster; 8-GPU jobs arrive while it runs and wait for it."""
    shape = ClusterShape(nodes=8, gpus_per_node=8, racks=1)
    jobs = [_job("big", 0.0, 64, 10_000.0, 20_000.0)]
    jobs += [_job(f"small{i}", 1000.0 + i, 8, 20_000.0, 30_000.0) for i in range(7)]
    return Trace(jobs=jobs, shape=shape), shape


@pytest.mark.parametrize("policy", ["fifo", "easy", "synapse"])
def test_front_recovery_gives_the_failed_big_gang_a_jct_no_worse_than_back(policy):
    trace, shape = _recovery_trace()
    jct = {}
    for recovery in ("front", "back"):
        model = FailureModel(mtbf_s=1.0, checkpoint_every_s=600, restart_cost_s=60, repair_s=600,
                             recovery=recovery, script=((3500.0, "n0003"),))
        run = replay(trace, shape, POLICIES[policy], failures=model)
        big = next(r for r in run.records if r.id == "big")
        assert big.status == "SUCCEEDED" and len(big.failures) == 1 and big.submit == 0.0
        jct[recovery] = big.end - big.submit
        assert not math.isnan(jct[recovery])
        s = summarize(run)
        assert s["failed_big_gangs"] == 1 and s["failed_big_gang_mean_jct_s"] == jct[recovery]
    assert jct["front"] <= jct["back"]
    # Back: behind the small jobs, which take the seven nodes the gang left at once and hold them
    # for 20000 s. Front: the gang at the head holds them and restarts when the node is back
    # (4100); Synapse's restart, waiting for a node that is DOWN, keeps its survivors the same way.
    assert jct["back"] == pytest.approx(3500 + 20_000 + 60 + 10_000 - 3000)
    assert jct["front"] == pytest.approx(4100 + 60 + 10_000 - 3000)


def _nodes_of(trace, shape, model, job_id):
    run = Replay(trace, shape, POLICIES["synapse"], failures=model)
    run.replay()
    return set(run.state.jobs[job_id].placements[1])


def test_spares_recovery_restarts_the_gang_at_once_on_its_racks_spare():
    """A 3-node gang in a rack of 4 (one a spare), 1-node jobs with time limits filling the rest,
    the spares too; one of the gang's nodes fails: with spares it restarts after the guest's grace,
    on its survivors and its rack's spare; without, it waits for the others to end."""
    shape = ClusterShape(nodes=8, gpus_per_node=8, racks=2)
    jobs = [_job("gang", 0.0, 24, 10_000.0, 20_000.0)]
    jobs += [_job(f"small{i}", 1000.0 + i, 8, 20_000.0, 30_000.0) for i in range(5)]
    trace = Trace(jobs=jobs, shape=shape)
    never = ((1e12, "n0000"),)
    model = {r: FailureModel(mtbf_s=1.0, checkpoint_every_s=600, restart_cost_s=60, repair_s=600, recovery=r,
                             script=never) for r in ("front", "spares")}
    hit = sorted(_nodes_of(trace, shape, model["front"], "gang") & _nodes_of(trace, shape, model["spares"], "gang"))[0]
    jct, runs = {}, {}
    for recovery in ("front", "spares"):
        failing = FailureModel(mtbf_s=1.0, checkpoint_every_s=600, restart_cost_s=60, repair_s=600,
                               recovery=recovery, script=((3500.0, hit),))
        run = Replay(trace, shape, POLICIES["synapse"], failures=failing)
        result = run.replay()
        gang = next(r for r in result.records if r.id == "gang")
        assert gang.status == "SUCCEEDED" and len(gang.failures) == 1
        jct[recovery], runs[recovery] = gang.end - gang.submit, (run, result)
    run, result = runs["spares"]
    [evict] = run.preemptions
    assert evict.rule == "spare" and evict.job_id == "gang" and len(evict.victims) == 1
    # The guest's grace (30 s), the restart (60 s), what was left at the checkpoint (7000 s).
    assert jct["spares"] == pytest.approx(3500 + 30 + 60 + 10_000 - 3000)
    assert jct["front"] > 20_000  # behind the small jobs' 20000 s
    guest = next(r for r in result.records if r.id == evict.victims[0].job_id)
    assert len(guest.failures) == 1  # evicted: it keeps its last checkpoint, and its loss counts as a failure's
    s = summarize(result)
    guest_wait = guest.start - guest.failures[0][1]
    assert s["requeue_wait_gpu_hours"] == pytest.approx(24 * 30 / 3600 + 8 * guest_wait / 3600)


def test_back_recovery_refuses_a_trace_with_dependencies():
    shape = ClusterShape(nodes=2, gpus_per_node=8, racks=1)
    jobs = [_job("a", 0.0, 8, 100.0), TraceJob(id="b", submit=1.0, gpus=8, nodes=0, duration=100.0, after="ok:a")]
    model = FailureModel(mtbf_s=3600.0, checkpoint_every_s=600, recovery="back")
    with pytest.raises(ValueError, match="dependencies"):
        Replay(Trace(jobs=jobs, shape=shape), shape, POLICIES["easy"], failures=model)


def test_run_takes_the_failure_flags(tmp_path):
    from click.testing import CliRunner

    from synapse.sim.main import main
    from synapse.sim.trace import dumps

    path = tmp_path / "t.csv"
    path.write_text(dumps(_small_trace(seed=2)))
    runner = CliRunner()
    result = runner.invoke(main, ["run", str(path), "--policies", "easy,synapse", "--json", "--node-mtbf", "5",
                                  "--checkpoint-every", "10m", "--restart-cost", "1m", "--recovery", "back"],
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["failures"]["checkpoint_every_s"] == 600 and out["failures"]["recovery"] == "back"
    assert out["failures"]["seed"] == 2  # the trace's generation seed
    easy, synapse = out["policies"]["easy"], out["policies"]["synapse"]
    assert easy["node_failures"] == synapse["node_failures"] > 0
    assert 0 < easy["goodput"] < 1 and easy["failure_lost_gpu_hours"] > 0
    text = runner.invoke(main, ["run", str(path), "--policies", "easy", "--node-mtbf", "5"]).output
    assert "goodput" in text and "MTBF 5 h" in text
    bad = runner.invoke(main, ["run", str(path), "--node-mtbf", "0"])
    assert bad.exit_code != 0 and "--node-mtbf must be above 0" in bad.output
    bad = runner.invoke(main, ["run", str(path), "--node-mtbf", "5", "--checkpoint-every", "often"])
    assert bad.exit_code != 0 and "--checkpoint-every" in bad.output
