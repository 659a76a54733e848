"""Recurring traces (synapse-sim generate --recurrence), the predictor's error profile on them,
names through the trace format and the sacct importer, and easy++ against easy."""

import hashlib
import statistics
from collections import Counter, defaultdict

from synapse.sim import sacct
from synapse.sim.generate import MIXES, RECURRENCE, WITHIN_CV, Recipe, generate
from synapse.sim.policies import POLICIES
from synapse.sim.profile import error_profile
from synapse.sim.replay import ExactRuns, replay
from synapse.sim.trace import ClusterShape, Trace, TraceJob, dumps, parse


def test_recurrence_zero_writes_exactly_the_traces_written_before_recurrence_existed():
    """The digests of two traces as the generator wrote them before recurrence (main at 53688db)."""
    old = {Recipe(seed=7, days=2): "c7c861a1001dc3ab82bfea865aca0d69f87e0f185610add19f55547042dfbd95",
           Recipe(seed=3, days=1, mix="philly", failures=0.2, shape=ClusterShape(16, 8, 4),
                  queue_mix=(("a", 0.5), ("b", 0.5))):
           "84721d72be412127d61a1f45515032a346ce2f7bc16cf7bf8963e620eabeb7b8"}
    for recipe, digest in old.items():
        assert recipe.recurrence == 0
        assert hashlib.sha256(dumps(generate(recipe)).encode()).hexdigest() == digest


def test_a_recurring_trace_resubmits_templates_with_their_size_and_limit_spread_by_the_cv():
    trace = generate(Recipe(seed=2, recurrence=RECURRENCE, within_cv=WITHIN_CV))
    seen: set[tuple[str, str]] = set()
    again = 0
    runs: dict[tuple[str, str], list[TraceJob]] = defaultdict(list)
    for job in trace.jobs:  # in submission order; the template is born with its first draw
        key = (job.user, job.name)
        assert job.user and job.name
        again += key in seen
        seen.add(key)
        runs[key].append(job)
    assert 0.6 < again / len(trace.jobs) < RECURRENCE + 0.05  # the first of a cell has nothing to resubmit
    for jobs in runs.values():
        assert len({(j.gpus, j.time_limit) for j in jobs}) == 1
    # the spread within a template: the CV of the runs of the busiest templates
    busiest = sorted(runs.values(), key=len)[-20:]
    cvs = [statistics.pstdev(d) / statistics.fmean(d) for d in ([j.duration for j in js] for js in busiest)]
    assert 0.3 < statistics.median(cvs) < 0.7
    # the sizes keep their mix
    shares = Counter(j.gpus for j in trace.jobs)
    assert abs(shares[1] / len(trace.jobs) - MIXES["gang-heavy"][1]) < 0.05
    assert len({j.user for j in trace.jobs}) > 30


def test_the_default_recurrence_gives_helios_s_error_profile():
    """Calibrated: Helios's estimator had 50 % of jobs within +-50 % and 70 % within +-100 %."""
    profile = error_profile(generate(Recipe(seed=5, recurrence=RECURRENCE, within_cv=WITHIN_CV)))
    assert 0.42 <= profile["within 50 %"] <= 0.62
    assert 0.65 <= profile["within 100 %"] <= 0.85
    # and without recurrence nothing recurs: the predictor falls back to the limits
    flat = error_profile(generate(Recipe(seed=5, days=2)))
    assert flat["basis_job"] == 0 and flat["within 50 %"] < 0.25


def test_names_go_through_the_trace_file_and_only_when_there_are_some():
    trace = generate(Recipe(seed=1, days=1, recurrence=0.5))
    text = dumps(trace)
    assert text.splitlines()[3].endswith(",after,name")
    again = parse(text)
    assert [(j.user, j.name) for j in again.jobs] == [(j.user, j.name) for j in trace.jobs]
    assert ",name" not in dumps(Trace([TraceJob("a", 0, 8, 1, 10)]))


def test_sacct_keeps_the_job_name_and_the_user():
    text = ("JobID|JobName|Submit|Start|End|State|AllocTRES|NNodes|Timelimit|User\n"
            "7|train-llm|2024-05-01T10:00:00|2024-05-01T10:01:00|2024-05-01T11:00:00|COMPLETED|"
            "cpu=8,gres/gpu=8|1|02:00:00|alice\n")
    trace, _ = sacct.parse(text)
    assert (trace.jobs[0].name, trace.jobs[0].user) == ("train-llm", "alice")


def test_easy_plus_plus_backfills_what_easy_holds_back_once_runs_are_known():
    """Two nodes in one rack: alice's job ran 100 s twice and asks for an hour each time; a long job
    of bob's holds a node while a two-node gang waits. EASY by limits keeps alice's third run off
    the free (reserved) node; EASY++ knows it lasts 100 s and starts it there."""
    rows = [TraceJob("r1", 0, 8, 1, 100, 3600, user="alice", name="train"),
            TraceJob("r2", 200, 8, 1, 100, 3600, user="alice", name="train"),
            TraceJob("long", 1000, 8, 1, 2500, 3000, user="bob", name="sim"),
            TraceJob("gang", 1001, 16, 2, 100, 3600, user="carol", name="big"),
            TraceJob("short", 1002, 8, 1, 100, 3600, user="alice", name="train")]
    shape = ClusterShape(2, 8, 1)
    starts = {}
    for name in ("easy", "easy++", "synapse-limits", "synapse"):
        run = replay(Trace(rows, shape), shape, POLICIES[name])
        starts[name] = {r.id: r.start for r in run.records}
    assert starts["easy"]["short"] >= 3500 and starts["synapse-limits"]["short"] >= 3500
    assert starts["easy++"]["short"] == 1002 and starts["synapse"]["short"] == 1002
    assert starts["easy++"]["gang"] == starts["easy"]["gang"] == 3500  # the gang waits no longer for it


def test_a_sweep_pairs_each_policy_with_the_baseline_seed_by_seed():
    from synapse.sim.sweep import paired

    samples = {"easy": {"mean_jct_s": [[100.0, 200.0]], "big_gang_p99_wait_s": [[10.0, 20.0]],
                        "useful_utilisation": [[0.70, 0.60]]},
               "synapse": {"mean_jct_s": [[90.0, 200.0]], "big_gang_p99_wait_s": [[10.0, 30.0]],
                           "useful_utilisation": [[0.71, 0.60]]}}
    out = paired(samples, "easy", 1)
    assert list(out) == ["synapse"]
    jct, big, util = (out["synapse"][m][0] for m in ("mean_jct_s", "big_gang_p99_wait_s", "useful_utilisation"))
    assert jct["values"] == [0.9, 1.0] and abs(jct["mean"] - 0.95) < 1e-12
    assert big["max"] == 1.5
    assert abs(util["values"][0] - 0.01) < 1e-12 and util["min"] == 0.0


def test_exact_runs_let_easy_plus_plus_backfill_what_the_limits_and_no_history_keep_out():
    """`replay(exact_runs=True)`: the predicting policies know every run from the start. A one-node
    job of 50 s with a 20,000 s limit, behind a two-node gang that waits for a job whose limit
    ends at 10,000 s: by the limits (nothing run before) it would outlast the reservation and
    waits; known to run 50 s it goes on the free node at once. The oracle learns nothing."""
    shape = ClusterShape(2, 8, 1)
    trace = Trace([TraceJob("long", 0, 8, 1, 1000, 10_000, user="u"),
                   TraceJob("gang", 1, 16, 2, 100, 1000, user="u"),
                   TraceJob("short", 2, 8, 1, 50, 20_000, user="u")])
    starts = {}
    for exact in (False, True):
        result = replay(trace, shape, POLICIES["easy++"], exact_runs=exact)
        starts[exact] = {r.id: r.start for r in result.records}
    assert starts[True]["short"] == 2
    assert starts[False]["short"] >= 1000  # after the long job at least
    assert starts[True]["gang"] == starts[False]["gang"] == 1000
    runs = ExactRuns(trace, shape)
    runs.learn("u", "short", 8, 5.0)
    assert runs.expect("u", "short", 8, 20_000) == 50 and runs.expect("u", "gang", 16, 1000) == 100
