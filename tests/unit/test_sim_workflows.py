"""Arrays and dependencies in traces: the two columns, and their replay through every policy."""

from __future__ import annotations

import math

import pytest

from synapse.sim import trace as tracefile
from synapse.sim.metrics import summarize
from synapse.sim.policies import POLICIES
from synapse.sim.replay import replay
from synapse.sim.trace import ClusterShape, TraceError

SHAPE = ClusterShape(nodes=8, gpus_per_node=8, racks=2)
TRACE = """\
# synapse-sim trace v1
id,submit_s,gpus,nodes,duration_s,array,after
sweep,0,8,1,100,0-9%2,
solo,0,8,1,50,,
merge,1,8,1,10,,ok:sweep
fix,1,8,1,10,,notok:sweep
one,2,8,1,10,,"ok:sweep_3,any:solo"
"""


def test_the_array_and_after_columns_survive_a_round_trip():
    trace = tracefile.parse(TRACE)
    sweep, merge = trace.jobs[0], trace.jobs[2]
    assert (sweep.array, merge.dependencies) == ("0-9%2", (("ok", "sweep"),))
    assert trace.jobs[4].dependencies == (("ok", "sweep_3"), ("any", "solo"))
    assert tracefile.parse(tracefile.dumps(trace)).jobs == trace.jobs


@pytest.mark.parametrize(("row", "message"), [
    ("x,0,8,1,10,0-x,", "array '0-x'"),
    ("x,0,8,1,10,,ok:later", "after: later is not a job"),
    ("x,0,8,1,10,,ok:sweep_99", "after: sweep_99 is not a job"),
    ("x,0,8,1,10,,soon:sweep", "after: cannot read 'soon:sweep'"),
])
def test_bad_workflow_columns_name_the_problem(row, message):
    text = "id,submit_s,gpus,nodes,duration_s,array,after\nsweep,0,8,1,10,0-9,\n" + row + "\nlater,5,8,1,10,,\n"
    with pytest.raises(TraceError, match=message):
        tracefile.parse(text)


@pytest.mark.parametrize("policy", ["synapse", "fifo", "greedy", "easy"])
def test_every_policy_honours_throttles_and_dependencies(policy):
    run = replay(tracefile.parse(TRACE), SHAPE, POLICIES[policy])
    records = {r.id: r for r in run.records}
    elements = [records[f"sweep_{i}"] for i in range(10)]
    assert all(r.status == "SUCCEEDED" for r in elements) and "sweep" not in records
    most = max(sum(1 for r in elements if r.start <= t < r.end) for t in (r.start for r in elements))
    assert most == 2  # the throttle, though the cluster has room for 8
    last = max(r.end for r in elements)
    assert records["merge"].start == last and records["merge"].ready == last  # the round after the end
    assert records["one"].start == max(records["sweep_3"].end, records["solo"].end)
    assert records["fix"].status == "FAILED" and math.isnan(records["fix"].start)  # DependencyNeverSatisfied
    summary = summarize(run)
    assert summary["dependency_jobs"] == 2 and summary["dependency_delay_p99_s"] == 0.0
    assert summary["never_started"] == 1
