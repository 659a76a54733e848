"""The noise floor (synapse.sim.noise, `synapse-sim run --jitter`): jittered copies of a trace stay valid
traces, and the command gives each metric's range and each ratio to the baseline over them."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from click.testing import CliRunner

from synapse.sim import trace as tracefile
from synapse.sim.main import main
from synapse.sim.metrics import summarize
from synapse.sim.noise import jittered, spread, versus
from synapse.sim.policies import POLICIES
from synapse.sim.replay import replay
from synapse.sim.trace import ClusterShape
from tests.support.sim import invoke

SHAPE = ClusterShape(nodes=8, gpus_per_node=8, racks=2)
#: A workflow whose rows are a second apart: shifted independently by up to 600 s, a dependant would
#: often land before its upstream.
WORKFLOW = """\
# cluster: nodes=8 gpus_per_node=8 racks=2
id,submit_s,gpus,nodes,duration_s,time_limit_s,exit_code,queue,user,array,after
prep,0,8,1,600,0,0,,,,
sweep,1,8,1,300,0,0,,,0-3%2,ok:prep
merge,2,8,1,300,0,0,,,,ok:sweep
report,3,8,1,60,0,0,,,,any:sweep_2
big,4,64,8,3600,0,0,,,,
late,5,16,2,900,0,0,,,,
"""


def test_copies_are_deterministic_for_a_seed_and_differ_between_copies_and_seeds():
    trace = tracefile.parse(WORKFLOW)
    submits = lambda copies: [[(j.id, j.submit) for j in t.jobs] for t in copies]  # noqa: E731
    once, again = submits(jittered(trace, 600, 3, seed=7)), submits(jittered(trace, 600, 3, seed=7))
    assert once == again
    assert len(once) == 3 and len({tuple(c) for c in once}) == 3
    assert submits(jittered(trace, 600, 3, seed=8)) != once
    assert [(j.id, j.submit) for j in trace.jobs][0] == ("prep", 0.0)  # the trace itself is left alone


def test_each_submission_moves_by_less_than_the_jitter_and_keeps_id_order_and_dependencies():
    trace = tracefile.parse(WORKFLOW)
    before = {j.id: j for j in trace.jobs}
    lifted = 0
    for copy in jittered(trace, 600, 8, seed=1):
        assert sorted(j.id for j in copy.jobs) == sorted(before)
        assert [j.submit for j in copy.jobs] == sorted(j.submit for j in copy.jobs)
        for job in copy.jobs:
            shift = job.submit - before[job.id].submit
            assert 0 < shift < 600, (job.id, shift)
            assert dataclasses.replace(job, submit=before[job.id].submit) == before[job.id]  # only the time moves
        at = {j.id: j.submit for j in copy.jobs}
        assert at["sweep"] >= at["prep"] and at["merge"] >= at["sweep"] and at["report"] >= at["sweep"]
        lifted += at["sweep"] == at["prep"] or at["merge"] == at["sweep"] or at["report"] == at["sweep"]
        # The copy is a valid trace: written out and read back, every `after` names an earlier row.
        assert [j.id for j in tracefile.parse(tracefile.dumps(copy)).jobs] == [j.id for j in copy.jobs]
    assert lifted  # some dependant drew an earlier time than its upstream and was held back to it


@pytest.mark.parametrize("policy", ["easy", "synapse"])
def test_a_jittered_workflow_replays_to_the_end(policy):
    trace = tracefile.parse(WORKFLOW)
    for copy in jittered(trace, 600, 3, seed=1):
        summary = summarize(replay(copy, SHAPE, POLICIES[policy]))
        assert summary["jobs"] == 9 and summary["finished"] == 9  # 4 array elements + 5 rows


def test_spread_and_versus():
    nan = math.nan
    s = spread([5.0, 4.0, nan, 7.0])
    assert (s.given, s.low, s.high) == (5.0, 4.0, 7.0)
    assert math.isnan(spread([5.0, nan]).low)
    v = versus([2.0, 4.0, 3.0, nan, 1.0], [2.0, 2.0, 6.0, 1.0, 0.0])
    assert v.ratios[:3] == (1.0, 2.0, 0.5) and math.isnan(v.ratios[3]) and math.isnan(v.ratios[4])
    assert (v.low, v.high) == (0.5, 2.0)
    assert (v.at_or_below, v.at_or_above) == (2, 3)  # the tie counts on both sides, nan on neither


def test_run_with_jitter_prints_the_ranges_and_the_ratios(trace_file):
    result = invoke("run", str(trace_file), "--policies", "easy,synapse", "--jitter", "60", "--repeats", "3")
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.index("\neasy ") < out.index("noise floor: 3 copies") < out.index("mean JCT h\npolicy")
    for heading in ("mean JCT h", "big-gang p99 wait h", "useful utilisation %", "single-rack share %"):
        table = out.split(f"\n{heading}\n", 1)[1].split("\n\n", 1)[0].splitlines()
        assert table[0].split() == ["policy", "as", "given", "jittered", "/", "easy", "<=", "easy", ">=", "easy"]
        easy, synapse = table[1].split(), table[2].split()
        assert easy[0] == "easy" and len(easy) == 3  # the baseline has no ratio to itself
        assert synapse[0] == "synapse" and synapse[-1].endswith("/4") and synapse[-2].endswith("/4")
    utilisation = out.split("\nuseful utilisation %\n", 1)[1].splitlines()[1].split()
    assert "–" in utilisation[2] and float(utilisation[1]) > 0


def test_run_with_jitter_adds_the_copies_and_ratios_to_the_json(trace_file):
    plain = json.loads(invoke("run", str(trace_file), "--policies", "easy,synapse,greedy", "--json").output)
    result = invoke("run", str(trace_file), "--policies", "easy,synapse,greedy", "--json", "--jitter", "120",
                    "--jitter-seed", "5")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert "jitter" not in plain
    assert {k: v for k, v in data.items() if k != "jitter"} == {**plain, "policies": data["policies"]}
    noise = data["jitter"]
    assert (noise["seconds"], noise["repeats"], noise["seed"], noise["baseline"]) == (120, 4, 5, "easy")
    assert list(noise["copies"]) == ["easy", "synapse", "greedy"]
    assert all(len(copies) == 5 for copies in noise["copies"].values())
    for policy in ("easy", "synapse"):
        given = noise["copies"][policy][0]
        assert given["mean_jct_s"] == data["policies"][policy]["mean_jct_s"]  # the trace as given comes first
    assert set(noise["ratios"]) == {"synapse", "greedy"}
    ratios = noise["ratios"]["synapse"]["mean_jct_s"]
    assert len(ratios) == 5
    assert ratios == [s["mean_jct_s"] / e["mean_jct_s"]
                      for s, e in zip(noise["copies"]["synapse"], noise["copies"]["easy"], strict=True)]
    # The copies are other traces: some metric moves off its value on the trace as given.
    assert any(c["mean_wait_s"] != noise["copies"]["easy"][0]["mean_wait_s"] for c in noise["copies"]["easy"][1:])


def test_run_with_jitter_puts_the_noise_tables_in_the_report(trace_file, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "report"
    result = invoke("run", str(trace_file), "--policies", "easy,synapse", "--jitter", "60", "--repeats", "1",
                    "--report", str(out))
    assert result.exit_code == 0, result.output
    assert "noise floor: 1 copies" in (out / "index.html").read_text()


@pytest.mark.parametrize("args, message", [
    (["--jitter", "0"], "'--jitter': 0 is not a number of seconds above 0"),
    (["--jitter", "-5"], "'--jitter': -5 is not a number of seconds above 0"),
    (["--jitter", "nan"], "'--jitter'"),
    (["--jitter", "soon"], "'--jitter'"),
    (["--jitter", "60", "--repeats", "0"], "'--repeats'"),
    (["--repeats", "3"], "--repeats, --jitter-seed and --workers go with --jitter"),
    (["--jitter-seed", "3"], "--repeats, --jitter-seed and --workers go with --jitter"),
    (["--workers", "2"], "--repeats, --jitter-seed and --workers go with --jitter"),
    (["--jitter", "60", "--workers", "0"], "'--workers'"),
])
def test_bad_jitter_values_name_the_option(trace_file, args, message):
    result = CliRunner().invoke(main, ["run", str(trace_file), "--policies", "easy", *args])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert message in result.output, result.output
