"""The run-time predictor: the rule (synapse.core.schedule.predict), its replicated learning in apply, its
snapshot, and the scheduler's use of it (a backfill the limits forbid and a prediction allows).
A real cluster: tests/cluster/test_predict.py."""

import math
import random

from synapse.core import commands as c
from synapse.core.model import Placement
from synapse.core.schedule.predict import STEPS, Prediction, RunTimes
from synapse.core.schedule.reservations import TUNING, expected_run
from synapse.core.schedule.scheduler import schedule_round
from synapse.core.state.fsm import PREDICT_VERSION, ClusterState
from synapse.sim.policies import LIMITS
from tests.support.helpers import checked, cluster, spec


def brief(p: Prediction) -> tuple:
    return p.seconds, p.basis, p.runs


def test_the_mean_of_the_last_two_runs_of_the_job_then_of_the_user_then_the_limit():
    times = RunTimes()
    assert brief(times.predict("alice", "train", 64, 7200)) == (7200, "limit", 0)
    assert brief(times.predict("alice", "train", 64, 0)) == (math.inf, "none", 0)
    for run in (100, 600, 1000):
        times.learn("alice", "train", 64, run)
    assert brief(times.predict("alice", "train", 64, 7200)) == (800, "job", 3)
    # another size of the same script is another key: the user's runs are the fallback
    assert brief(times.predict("alice", "train", 8, 7200)) == (800, "user", 3)
    times.learn("alice", "eval", 8, 20)
    assert brief(times.predict("alice", "sweep", 8, 7200)) == (510, "user", 4)
    assert brief(times.predict("bob", "train", 64, 7200)) == (7200, "limit", 0)
    assert times.predict("alice", "train", 64, 300).seconds == 300  # never beyond the limit
    assert times.predict("alice", "train", 64, 7200).longest == 1000  # the longer of the two kept


def test_a_job_that_outlives_its_prediction_is_raised_to_the_next_step_never_beyond_its_limit():
    times = RunTimes()
    times.learn("alice", "train", 8, 100)
    times.learn("alice", "train", 8, 100)
    assert times.predict("alice", "train", 8, 86400, elapsed=50).seconds == 100
    raised = times.predict("alice", "train", 8, 86400, elapsed=400)
    assert (raised.seconds, raised.extended) == (900, True)  # the first step above 400 s
    assert times.predict("alice", "train", 8, 86400, elapsed=40_000).seconds == 72_000
    assert times.predict("alice", "train", 8, 3600, elapsed=2000).seconds == 3600
    assert STEPS == tuple(sorted(STEPS))


def test_jobs_without_a_user_are_not_learned_nor_predicted():
    times = RunTimes()
    times.learn("", "a", 8, 100)
    assert len(times) == 0
    assert brief(times.predict("", "a", 8, 3600)) == (3600, "limit", 0)


def test_memory_is_bounded_by_keys_and_runs_kept():
    times = RunTimes(max_keys=4)
    for i in range(10):
        for _ in range(5):
            times.learn("alice", f"job{i}", 8, 60.0 * (i + 1))
    assert len(times) == 4
    assert all(len(runs) <= 2 for _, runs in times.keys.values())
    # the user's key was learned last each time, so it stays; the oldest jobs went first
    assert times.predict("alice", "job9", 8, 0).basis == "job"
    assert times.predict("alice", "job0", 8, 0).basis == "user"
    assert RunTimes.from_list(times.to_list(), max_keys=4).to_list() == times.to_list()


def test_describe_says_what_the_prediction_rests_on():
    assert Prediction(2520, "job", 5).describe("alice", "train-llm", 64) == \
        "predicted 42m from 5 run(s) of (alice, train-llm, 64 GPU)"
    assert "its time limit" in Prediction(3600, "limit").describe("bob", "x", 8)
    assert Prediction(math.inf, "none").describe("bob", "x", 8).startswith("no prediction")


def _run(state: ClusterState, job_id: str, node: str, start: float, end: float, code: int = 0, name: str = "train",
         user: str = "alice", limit: float = 3600) -> None:
    checked(state, c.SubmitJob(at=start, job_id=job_id, request_id=job_id, by=user,
                               spec=spec(name=name, time_limit=limit)))
    checked(state, c.CommitPlan(at=start, job_id=job_id, attempt=1,
                                placements=(Placement(0, node, tuple(range(8)), 0),)))
    checked(state, c.TaskStarted(at=start, job_id=job_id, attempt=1, index=0, node_id=node))
    if end:
        checked(state, c.TaskExited(at=end, job_id=job_id, attempt=1, index=0, node_id=node, exit_code=code))


def learning_cluster() -> ClusterState:
    """Two nodes of one rack, at cluster version 4: apply learns run times from then on only."""
    state = cluster(racks=1, nodes_per_rack=2)
    checked(state, c.SetClusterVersion(at=0, version=PREDICT_VERSION))
    return state


def test_apply_learns_nothing_before_every_replica_runs_version_4():
    """A replica of an older release does not learn: while one is a member, nobody may."""
    state = cluster(racks=1, nodes_per_rack=2)
    _run(state, "a", sorted(state.nodes)[0], 0, 100)
    assert len(state.run_times) == 0 and "run_times" not in state.to_snapshot()


def test_apply_learns_the_runs_that_ended_on_their_own_and_snapshots_keep_them():
    state = learning_cluster()
    node = sorted(state.nodes)[0]
    _run(state, "a", node, 0, 100)
    _run(state, "b", node, 200, 500, code=1)  # a failure is a run too
    _run(state, "c", node, 600, 0)
    checked(state, c.CancelJob(at=700, job_id="c", by="alice"))  # cancelled: says nothing of the run
    checked(state, c.TaskExited(at=710, job_id="c", attempt=1, index=0, node_id=node, exit_code=143))
    assert brief(state.run_times.predict("alice", "train", 8, 3600)) == (200, "job", 2)
    copy = ClusterState.from_snapshot(state.to_snapshot())
    assert copy.run_times.to_list() == state.run_times.to_list()
    assert copy.digest() == state.digest()
    # a state that learned nothing snapshots as before
    assert "run_times" not in cluster(racks=1, nodes_per_rack=2).to_snapshot()


def test_a_short_job_with_a_long_limit_backfills_on_reserved_nodes_once_its_runs_are_known():
    """Two nodes; a long job holds one, a two-node gang reserves both; a job of alice's that ran
    100 s twice asks for an hour: by limits it would end after the gang's expected start, by its
    runs it ends long before, so it starts on the reserved idle node."""
    state = learning_cluster()
    first, second = sorted(state.nodes)
    _run(state, "r1", first, 0, 100)
    _run(state, "r2", first, 200, 300)
    _run(state, "long", first, 1000, 0, name="sim", user="bob", limit=3000)
    checked(state, c.SubmitJob(at=1001, job_id="gang", request_id="gang", by="carol", spec=spec(tasks=2)))
    checked(state, c.SubmitJob(at=1002, job_id="short", request_id="short", by="alice",
                               spec=spec(name="train", time_limit=3600)))
    assert expected_run(state, state.jobs["short"], 1003) == 100
    assert expected_run(state, state.jobs["short"], 1003, predict=False) == 3600
    by_runs = schedule_round(state, 1003, tuning=TUNING)
    by_limits = schedule_round(state, 1003, tuning=LIMITS)
    assert [p.job_id for p in by_runs.plans] == ["short"]
    assert by_runs.plans[0].placements[0].node_id == second
    assert by_runs.reservation.job_id == "gang" and by_runs.reservation.starts_at == 4000
    assert by_limits.plans == [] and "short" in by_limits.waiting


def test_describe_job_shows_the_prediction_and_its_basis():
    from synapse.client import render
    from tests.support.core import running_job

    info = running_job()
    info.prediction = Prediction(2520, "job", 5).describe("alice", "train-llm", 64)
    lines = render.job_description(render.job_dict(info)).split("\n")
    assert "Predicted:  predicted 42m from 5 run(s) of (alice, train-llm, 64 GPU)" in lines


def test_expect_is_predict_s_seconds():
    times = RunTimes()
    for run in (100, 300, 5000):
        times.learn("alice", "train", 8, run)
    for args in (("alice", "train", 8, 3600), ("alice", "train", 8, 0), ("alice", "eval", 8, 1000),
                 ("alice", "train", 8, 3600, 3000), ("alice", "train", 8, 3600, 3599), ("bob", "x", 8, 60),
                 ("bob", "x", 8, 0), ("", "train", 8, 100), ("alice", "train", 8, 0, 400_000)):
        assert times.expect(*args) == times.predict(*args).seconds, args


def test_expect_and_longest_own_answer_as_predict_does_whatever_the_runs_limit_and_time_run():
    """The round's cheap readers (expect, longest_own, longest_user) are predict without the Prediction: the same
    floats on every path (guess, raised to a step, past the last step, capped by the limit)."""
    rng = random.Random(36)
    times = RunTimes()
    edges = [0.0, 1.0, 59.9, 60.0, 61.0, *STEPS, STEPS[-1] + 1, 1e7]
    for _ in range(300):
        times.learn(rng.choice(["alice", "bob"]), rng.choice(["train", "eval"]), rng.choice([8, 64]),
                    rng.choice([rng.uniform(0, 400_000), rng.choice(edges)]))
        user, name, gpus = rng.choice(["alice", "bob", "carol", ""]), rng.choice(["train", "eval", "x"]), \
            rng.choice([8, 64])
        limit = rng.choice([0.0, 60.0, 3600.0, rng.uniform(1, 500_000), *rng.sample(edges, 2)])
        elapsed = rng.choice([0.0, rng.uniform(0, 800_000), *rng.sample(edges, 2)])
        p = times.predict(user, name, gpus, limit, elapsed)
        assert times.expect(user, name, gpus, limit, elapsed) == p.seconds, (user, name, gpus, limit, elapsed)
        if p.basis == "job":
            assert times.expect(user, name, gpus, limit, elapsed, own_kind=True) == p.seconds
        own = times.longest_own(user, name, gpus, limit, elapsed)
        assert own == (p.longest if p.basis == "job" else None), (user, name, gpus, limit, elapsed)
        if p.basis != "job":  # without runs of its kind, the prediction rests on the user's, if any
            users = times.longest_user(user, limit, elapsed)
            assert users == (p.longest if p.basis == "user" else None), (user, name, gpus, limit, elapsed)
