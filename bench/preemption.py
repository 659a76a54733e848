"""Preemption planning time on a large, full cluster, beside plain placement time on the same state.

    python bench/preemption.py                 # 10,000 nodes, a table
    python bench/preemption.py --json          # {"nodes", "gangs", "plan_p50_ms", "plan_p99_ms", ...}
    python bench/preemption.py --quick         # 1,000 nodes, a few seconds (CI)

8-GPU nodes, 32 a rack. Two queues: `a` (guaranteed half the GPUs, running nothing) and `b`
(guaranteed a quarter, borrowing the rest). Every node is busy with one of thousands of running
gangs of `b` (1, 2 or 4 whole nodes, inside one rack, or 1-7 GPUs on one node), started at random
times. `a` submits a 16 x 8-GPU gang that must sit in one rack: placement finds no room, and the
planner (synapse.core.schedule.preemption.plan) picks the rack and victims with the least lost work. Both
are timed on the same state; the ratio is the planner's cost over a plain placement attempt.
Plans are timed twice: under Python's default collector thresholds, then under the thresholds a
master sets for itself (synapse.common.collector), since a full collection over a large state costs
more than a plan. Target: plan p99 under 50 ms on 10,000 nodes, as a master runs it.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from support.measure import percentile  # noqa: E402

from synapse.common.collector import THRESHOLDS, tune_for_large_state  # noqa: E402
from synapse.core import commands as c  # noqa: E402
from synapse.core.model import JobSpec, PackMode, Placement, Queue, Resources, TopologySpec  # noqa: E402
from synapse.core.schedule import preemption
from synapse.core.schedule.placement import ClusterView, place  # noqa: E402
from synapse.core.state.fsm import ClusterState  # noqa: E402

NODE = Resources(64_000, 512 << 30, 8)
NODES_PER_RACK, RACKS_PER_BLOCK = 32, 8


def build(nodes: int, seed: int) -> tuple[ClusterState, int]:
    """A full cluster of running gangs of queue b; returns the state and the number of gangs."""
    rng = random.Random(seed)
    state = ClusterState()
    for i in range(nodes):
        rack = i // NODES_PER_RACK
        state.apply(c.RegisterNode(at=0, node_id=f"n{i:05d}", address=f"n{i:05d}.invalid:7000",
                                   topology=("z0", f"b{rack // RACKS_PER_BLOCK}", f"r{rack}"), capacity=NODE))
    total = nodes * NODE.gpu
    state.apply(c.ApplyQueues(at=0, queues=(
        Queue("a", guaranteed=Resources(0, 0, total // 2)), Queue("b", guaranteed=Resources(0, 0, total // 4)))))
    gangs, i, now = 0, 0, 100_000.0
    while i < nodes:
        rack_end = (i // NODES_PER_RACK + 1) * NODES_PER_RACK
        kind = rng.random()
        width = 1 if kind < 0.5 else (2 if kind < 0.8 else 4)
        width = min(width, rack_end - i, nodes - i)
        gpus = 8 if width > 1 or kind > 0.25 else rng.randint(1, 7)
        job_id = f"b-{gangs:05d}"
        spec = JobSpec(name="b", tasks=width, resources=Resources(1000, 1 << 30, gpus), command=("train",), queue="b")
        state.apply(c.SubmitJob(at=1, job_id=job_id, request_id=job_id, spec=spec))
        placements = tuple(Placement(k, f"n{i + k:05d}", tuple(range(gpus)), k) for k in range(width))
        started = now - rng.uniform(60, 36_000)
        result = state.apply(c.CommitPlan(at=started, job_id=job_id, attempt=1, placements=placements))
        if not result.ok:
            raise SystemExit(f"bench setup rejected: {result.error}")
        for k in range(width):
            state.apply(c.TaskStarted(at=started, job_id=job_id, attempt=1, index=k, node_id=f"n{i + k:05d}"))
        gangs += 1
        i += width
    return state, gangs


def run(nodes: int, trials: int, seed: int) -> dict:
    state, gangs = build(nodes, seed)
    spec = JobSpec(name="a", tasks=16, resources=Resources(1000, 1 << 30, 8), command=("train",), queue="a",
                   topology=TopologySpec("rack", PackMode.REQUIRED))
    state.apply(c.SubmitJob(at=100_000, job_id="a-big", request_id="a-big", spec=spec))
    job = state.jobs["a-big"]
    view = ClusterView(state.nodes, state.index, state.levels)
    place_ms, plan_ms, default_ms, found = [], [], [], None
    defaults = gc.get_threshold()
    for times in (default_ms, plan_ms):  # Python's default collector, then a master's
        for _ in range(trials):
            t0 = time.perf_counter()
            placed = place(view, job.id, job.attempt, job.spec)
            place_ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            found = preemption.plan(state, job, 100_000.0)
            times.append((time.perf_counter() - t0) * 1000)
        tune_for_large_state()
    gc.set_threshold(*defaults)
    if placed.plan is not None or isinstance(found, str):
        raise SystemExit(f"bench setup wrong: placed={placed.plan is not None} plan={found}")
    return {"nodes": nodes, "gangs": gangs, "victims": len(found.command.victims),
            "held_nodes": len(found.command.nodes), "lost_gpu_seconds": round(found.lost_gpu_seconds),
            "plan_p50_ms": round(percentile(plan_ms, 0.5), 2), "plan_p99_ms": round(percentile(plan_ms, 0.99), 2),
            "plan_default_gc_p50_ms": round(percentile(default_ms, 0.5), 2),
            "plan_default_gc_p99_ms": round(percentile(default_ms, 0.99), 2),
            "place_p50_ms": round(percentile(place_ms, 0.5), 3), "place_p99_ms": round(percentile(place_ms, 0.99), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a few seconds, same code path: 1,000 nodes, 5 trials")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.trials = 1000, 5
    report = run(args.nodes, args.trials, args.seed)
    if args.json:
        print(json.dumps(report))
        return
    ratio = report["plan_p50_ms"] / report["place_p50_ms"] if report["place_p50_ms"] else float("inf")
    print(f"{report['nodes']:,} nodes, {report['gangs']:,} running gangs: a 16 x 8-GPU rack-packed gang")
    print(f"  preemption plan, collector as a master sets it {THRESHOLDS}: p50 {report['plan_p50_ms']} ms, "
          f"p99 {report['plan_p99_ms']} ms ({report['victims']} victims, {report['held_nodes']} nodes held, "
          f"{report['lost_gpu_seconds']:,} GPU-s lost)")
    print(f"  preemption plan, Python's default collector: p50 {report['plan_default_gc_p50_ms']} ms, "
          f"p99 {report['plan_default_gc_p99_ms']} ms")
    print(f"  plain placement attempt on the same state: p50 {report['place_p50_ms']} ms, "
          f"p99 {report['place_p99_ms']} ms (plan = {ratio:.0f} x placement)")
    if args.quick:
        print("(--quick: sizes too small to judge the target)")
        return
    print("target plan p99 < 50 ms on 10,000 nodes:", "met" if report["plan_p99_ms"] < 50 else "NOT met")


if __name__ == "__main__":
    main()
