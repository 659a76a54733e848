"""What a scheduling round costs the leader while jobs are submitted and cancelled over a long queue.

    python bench/queue_churn.py [--pending 2000] [--ops 400] [--repeat 3] [--quick] [--json]

The state holds `--pending` jobs that cannot fit (gangs larger than the cluster's free room, of a
few shapes) on a small cluster with every node busy. Then `--ops` times: a submission, a round, a
cancel of a pending job, a round, as the leader runs one round per change (bench/ha.py's
submit+cancel load does the same over gRPC). The cancel takes the job just submitted (`own`, as
bench/ha.py does) or a pending job drawn at random (`random`).

Each round is run as the leader runs it, with the memo of the round before. `before` voids the
memo after every cancel, as the code did until a cancel of a pending job was made a quiet change
(synapse.core.schedule.scheduler.RoundMemo): the round after it walks the whole queue. `now` keeps it. Both
run in the same process, interleaved, `--repeat` times; the figure is the median CPU time per
round (this process's CPU time, not wall time, which other work on a shared machine stretches).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse.core import commands as c  # noqa: E402
from synapse.core.model import JobSpec, Placement, Resources, TopologySpec  # noqa: E402
from synapse.core.schedule.scheduler import schedule_round  # noqa: E402
from synapse.core.state.fsm import ClusterState  # noqa: E402
from synapse.sim.engine import uniform_cluster  # noqa: E402

NODE = Resources(64_000, 512 << 30, 8)
#: the shapes of the queued jobs: none fits while every node runs a task
SHAPES = [JobSpec(name=f"s{tasks}", tasks=tasks, resources=Resources(8_000, 32 << 30, 8), command=("train",),
                  topology=TopologySpec("rack")) for tasks in (2, 4, 8, 16)]


def busy_cluster() -> ClusterState:
    """16 nodes in 4 racks, each running one 1-GPU task without a time limit."""
    state = ClusterState()
    for cmd in uniform_cluster(blocks_per_zone=1, racks_per_block=4, nodes_per_rack=4, capacity=NODE):
        state.apply(cmd)
    small = JobSpec(name="hog", tasks=1, resources=Resources(1_000, 1 << 30, 1), command=("sleep",))
    for i, node_id in enumerate(sorted(state.nodes)):
        state.apply(c.SubmitJob(at=0.0, job_id=f"hog-{i}", request_id=f"hog-{i}", spec=small))
        state.apply(c.CommitPlan(at=0.0, job_id=f"hog-{i}", attempt=1,
                                 placements=(Placement(0, node_id, (0,), 0),)))
    return state


def churn(pending: int, ops: int, cancel: str, void_on_cancel: bool, seed: int = 1) -> float:
    """CPU seconds per round over `ops` submissions and cancels."""
    rng = random.Random(seed)
    state = busy_cluster()
    for i in range(pending):
        state.apply(c.SubmitJob(at=1.0, job_id=f"q-{i}", request_id=f"q-{i}", spec=SHAPES[i % len(SHAPES)]))
    now = 2.0
    first = schedule_round(state, now)
    assert not first.plans, "the queued jobs must not fit"
    memo, previous = first.memo, first.reservations
    rounds, spent = 0, 0.0
    for i in range(ops):
        job_id = f"n-{i}"
        state.apply(c.SubmitJob(at=now, job_id=job_id, request_id=job_id, spec=SHAPES[rng.randrange(len(SHAPES))]))
        for change in ("submit", "cancel"):
            if change == "cancel":
                victim = job_id if cancel == "own" else state.pending[rng.randrange(len(state.pending))][1]
                assert state.apply(c.CancelJob(at=now, job_id=victim)).ok
                if void_on_cancel:
                    memo = None
            started = time.process_time()
            result = schedule_round(state, now, previous, memo)
            spent += time.process_time() - started
            rounds += 1
            assert not result.plans
            memo, previous = result.memo, result.reservations
    return spent / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=2000, help="jobs waiting in the queue")
    parser.add_argument("--ops", type=int, default=400, help="submissions, each followed by a cancel")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="the same code path, small: 200 pending, 40 ops")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.pending, args.ops, args.repeat = 200, 40, 1
    runs: dict[str, list[float]] = {}
    for _ in range(args.repeat):  # interleaved, so a busier moment of the machine hits both alike
        for cancel in ("own", "random"):
            for mode, void in (("before", True), ("now", False)):
                runs.setdefault(f"{cancel}_{mode}", []).append(churn(args.pending, args.ops, cancel, void))
    report = {key: round(statistics.median(v) * 1e3, 4) for key, v in runs.items()}  # ms per round
    if args.json:
        print(json.dumps({"pending": args.pending, "ops": args.ops, "repeat": args.repeat,
                          "ms_per_round": report}))
        return
    print(f"{args.pending} pending, {args.ops} submissions + cancels, median of {args.repeat}: "
          "CPU ms per round")
    for cancel in ("own", "random"):
        before, now = report[f"{cancel}_before"], report[f"{cancel}_now"]
        print(f"  cancel {cancel:6}  memo voided by a cancel (before) {before:8.3f}   kept (now) {now:8.3f}   "
              f"({before / now if now else float('inf'):.1f} x)")


if __name__ == "__main__":
    main()
