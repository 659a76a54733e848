"""The simulator decides as the leader does: one small trace, replayed by `synapse-sim` (policy
`synapse`) and submitted for real to a local cluster, starts the same gangs in the same order,
together where the replay starts them together, on the same nodes (issue 23)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from synapse.core import codec
from synapse.sim import trace as tracefile
from synapse.sim.policies import POLICIES
from synapse.sim.replay import Replay

pytestmark = pytest.mark.slow

# 4 nodes x 8 GPUs in 2 racks, as `make_cluster(workers=4, racks=2)` starts them. Every decision
# here has seconds of slack against the real cluster's latencies (a task's start and its exit's
# report): a backfilled job ends at least 4 s before the reservation it runs beside, and jobs
# submitted after a round of starts come at least 2 s after it was due.
#
# No job waits for a multi-node gang's end that could start on part of its nodes: the replay ends
# a gang's tasks at one instant, while the leader hears their exits one by one and schedules in
# between, so such a job starts on whichever node reports first (see docs/evaluation/).
#   a, b   start at once: a on one node, b in one rack
#   c      the whole cluster: blocked, reserves every node from b's limit (20 s)
#   d      backfills beside c's reservation (ends by 6 s); e, the whole cluster too, waits behind c
#   f      a rack gang: backfills into rack0 once a ends (ends by 14 s), ahead of c and e
#   c, e   start one after the other as the cluster empties
#   g,x,y  submitted at once on the idle cluster: start together, x beside g in rack0, y in rack1
#   m      a rack gang: when g ends, one node is free in each rack; it waits 3 s for rack0 rather
#          than run split (EASY, greedy and conservative start it split there): by the limits,
#          rack0 frees 5.5 s after its submission, less than a split would slow its 90 s run by
#          (a ninth of it)
#   j      the whole cluster, behind m: starts when y ends
TRACE = """\
# synapse-sim trace v1
# cluster: nodes=4 gpus_per_node=8 racks=2
id,submit_s,gpus,nodes,duration_s,time_limit_s,exit_code,queue,user,array,after
a,0,8,1,6,12,0,,,,
b,0,16,2,8,20,0,,,,
c,1,32,4,4,8,0,,,,
d,2,8,1,2,4,0,,,,
e,3,32,4,3,30,0,,,,
f,5,16,2,4,8,0,,,,
g,21,8,1,3,6,0,,,,
x,21,8,1,6,12,0,,,,
y,21,8,1,9,18,0,,,,
m,21.5,16,2,2,90,0,,,,
j,22,32,4,2,4,0,,,,
"""
#: Starts this far apart are one round's, on the real cluster (its rounds follow each commit).
TOGETHER_S = 1.0


@dataclasses.dataclass(frozen=True)
class Decisions:
    """What a user would call a scheduler's decisions: which gangs started together, in what
    order, and on which nodes and racks."""

    groups: list[frozenset[str]]  #: gangs that started together, in the order they started
    nodes: dict[str, frozenset[str]]  #: gang -> nodes its tasks ran on
    racks: dict[str, frozenset[str]]  #: gang -> racks of those nodes


def decisions(starts: dict[str, float], nodes: dict[str, frozenset[str]], rack_of: dict[str, str]) -> Decisions:
    groups: list[set[str]] = []
    last = None
    for job, at in sorted(starts.items(), key=lambda kv: kv[1]):
        if last is None or at - last > TOGETHER_S:
            groups.append(set())
        groups[-1].add(job)
        last = at
    return Decisions([frozenset(g) for g in groups], nodes,
                     {job: frozenset(rack_of[n] for n in ns) for job, ns in nodes.items()})


def simulated(trace: tracefile.Trace, policy: str = "synapse") -> tuple[Decisions, list[tuple[str, str]]]:
    """The replay's decisions, and its nodes (id, rack) in id order. No spread penalty: the real
    tasks sleep as long wherever they run."""
    sim = Replay(trace, trace.shape, POLICIES[policy], spread_factor=1.0)
    run = sim.replay()
    assert not run.unfinished
    records = {r.id: r for r in run.records}
    assert all(r.status == "SUCCEEDED" for r in records.values()), records
    nodes = {job_id: frozenset(sim.state.jobs[job_id].placements[1]) for job_id in records}
    racks = {n.id: n.topology[-1] for n in sim.state.nodes.values()}
    layout = sorted(racks.items())
    return decisions({r.id: r.start for r in records.values()}, nodes, racks), layout


def run_on_cluster(cluster, sim: Replay, trace: tracefile.Trace) -> tuple[Decisions, list[tuple[str, str]]]:
    """Submit each row at its time as a gang of `sleep`s; the decisions the leader took."""
    ids = {}
    t0 = time.monotonic()
    for job in sorted(trace.jobs, key=lambda j: j.submit):
        time.sleep(max(0.0, t0 + job.submit - time.monotonic()))
        spec = dataclasses.replace(sim.spec_of(job), command=("sleep", f"{job.duration:g}"))
        ids[job.id] = cluster.client.submit(codec.job_spec_to_proto(spec))
    deadline = time.monotonic() + 60
    infos = {}
    while time.monotonic() < deadline and len(infos) < len(ids):
        for name, job_id in ids.items():
            info = cluster.client.get_job(job_id)
            if info.status in ("SUCCEEDED", "FAILED", "CANCELLED"):
                infos[name] = info
        time.sleep(0.5)
    assert len(infos) == len(ids), f"not done in time: {sorted(set(ids) - set(infos))}"
    assert {i.status for i in infos.values()} == {"SUCCEEDED"}, {n: i.status for n, i in infos.items()}
    assert all(i.attempt == 1 for i in infos.values())
    # The commit of its plan (the replay's start is its commit too).
    starts = {n: next(e.at for e in i.events if e.kind == "Scheduled") for n, i in infos.items()}
    nodes = {n: frozenset(i.attempts[0].nodes) for n, i in infos.items()}
    racks = {n.id: n.topology[-1] for n in cluster.client.list_nodes()}
    return decisions(starts, nodes, racks), sorted(racks.items())


def renamed(d: Decisions, names: dict[str, str]) -> Decisions:
    """The same decisions with nodes and racks under other names."""
    return Decisions(d.groups, {j: frozenset(names[n] for n in ns) for j, ns in d.nodes.items()},
                     {j: frozenset(names[r] for r in rs) for j, rs in d.racks.items()})


def test_the_simulator_and_a_real_cluster_decide_alike(make_cluster):
    trace = tracefile.parse(TRACE)
    expected, sim_layout = simulated(trace)
    # The trace does exercise the policy: a whole-cluster reservation (c) with backfills beside it
    # (d and f start before it), gangs started at once, a rack wait; and the baselines decide
    # otherwise on it (m split, 3 s earlier).
    order = [job for group in expected.groups for job in sorted(group)]
    assert order.index("d") < order.index("f") < order.index("c") < order.index("e")
    assert frozenset("gxy") in expected.groups and len(expected.racks["m"]) == 1
    for baseline in ("easy", "greedy", "conservative"):
        assert simulated(trace, baseline)[0] != expected

    cluster = make_cluster(masters=1, workers=4, racks=2, gpus=8)
    sim = Replay(trace, trace.shape, POLICIES["synapse"])  # only its job specs are used
    got, real_layout = run_on_cluster(cluster, sim, trace)

    # The two clusters alike: nodes in id order sit in racks in the same pattern (placement breaks
    # ties by id), so the n-th node of one stands for the n-th of the other, and its rack for its rack.
    names: dict[str, str] = {}
    for (sim_node, sim_rack), (real_node, real_rack) in zip(sim_layout, real_layout, strict=True):
        names[sim_node] = real_node
        assert names.setdefault(sim_rack, real_rack) == real_rack, (sim_layout, real_layout)
    assert len(set(names.values())) == len(names), (sim_layout, real_layout)
    expected = renamed(expected, names)

    assert got.groups == expected.groups, f"start order: real {got.groups}, simulated {expected.groups}"
    assert got.racks == expected.racks
    assert got.nodes == expected.nodes
