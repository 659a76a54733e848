"""How fast a trace replays: wall time per policy, and time per simulated event against cluster size.

    python bench/sim.py              # a week of gang-heavy on 64 x 8 GPUs, then 30 days on 256 nodes
    python bench/sim.py --quick      # one day on 16 nodes, the same code path
    python bench/sim.py --json
    python bench/sim.py --no-predict # without the prediction case (two more replays of the month)
    python bench/sim.py --predict-only --repeat 3   # only the prediction case, three times: the median

Targets (issue 15): a week of the gang-heavy mix on 64 nodes x 8 GPUs (about 3,000 jobs) replays
through every policy in under a minute; a month on 256 nodes in minutes. Each case also reports
the time per simulated event (arrivals and task ends) and the mean pending queue length, so the
growth with queue length and cluster size can be read off the rows.

Issue 36: the run-time predictor adds at most 10 % to the month's replay. The cases above replay
traces without users, where the predictor answers at once; the prediction case replays the month
with recurring jobs (generate's default recurrence) through `synapse` and through
`synapse-limits` (the same policy by time limits alone) and prints what prediction adds, in wall
time (the target's measure) and in policy time per round (the two decide differently, so the
rounds differ in number).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse.sim.generate import RECURRENCE, Recipe, generate  # noqa: E402
from synapse.sim.metrics import summarize  # noqa: E402
from synapse.sim.policies import DEFAULT_POLICIES, POLICIES  # noqa: E402
from synapse.sim.replay import Replay  # noqa: E402
from synapse.sim.trace import ClusterShape  # noqa: E402


class CountingReplay(Replay):
    """Also samples the pending queue's length at every round."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.queue_lengths: list[int] = []

    def schedule(self, *, full: bool = True):
        self.queue_lengths.append(len(self.state.pending))
        return super().schedule(full=full)


def case(name: str, recipe: Recipe, policies: list[str]) -> dict:
    trace = generate(recipe)
    rows = []
    for policy in policies:
        sim = CountingReplay(trace, recipe.shape, POLICIES[policy])
        started = time.perf_counter()
        run = sim.replay()
        wall = time.perf_counter() - started
        m = summarize(run)
        rows.append({"policy": policy, "wall_s": wall, "events": run.events, "rounds": len(run.round_seconds),
                     "us_per_event": wall / max(run.events, 1) * 1e6,
                     "policy_share": sum(run.round_seconds) / wall,
                     "mean_queue": sum(sim.queue_lengths) / max(len(sim.queue_lengths), 1),
                     "sched_p99_ms": m["sched_p99_ms"]})
    return {"case": name, "jobs": len(trace.jobs), "nodes": recipe.shape.nodes, "days": recipe.days,
            "load": recipe.load, "total_wall_s": sum(r["wall_s"] for r in rows), "policies": rows}


#: issue 36: what predictions may add to the replay's wall time, at most
PREDICT_TARGET = 0.10


def prediction_case(name: str, recipe: Recipe, first: str = "synapse-limits") -> dict:
    """`case` through synapse-limits and synapse (`first` runs first) on the same recurring trace,
    and what prediction adds."""
    order = ["synapse-limits", "synapse"] if first == "synapse-limits" else ["synapse", "synapse-limits"]
    result = case(name, recipe, order)
    result["policies"].sort(key=lambda row: row["policy"] != "synapse-limits")
    off, on = result["policies"]

    def per_round(row: dict) -> float:
        return row["wall_s"] * row["policy_share"] / max(row["rounds"], 1)

    result["prediction_adds"] = on["wall_s"] / off["wall_s"] - 1
    result["prediction_adds_per_round"] = per_round(on) / per_round(off) - 1
    result["target"] = PREDICT_TARGET
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one day on 16 nodes (a few seconds)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    parser.add_argument("--no-month", action="store_true", help="skip the 30-day, 256-node case")
    parser.add_argument("--no-predict", action="store_true", help="skip the prediction case")
    parser.add_argument("--predict-only", action="store_true",
                        help="only the prediction case (the month; the week with --no-month, the day with --quick)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the prediction case this many times, the policies' order alternating, and "
                             "give the median of what prediction adds")
    args = parser.parse_args()
    policies = args.policies.split(",")
    if args.quick:
        cases = [("quick: 1 day philly, 16 nodes", Recipe(ClusterShape(16, 8, 2), "philly", 0.9, 1.0, 1))]
    else:
        cases = [("week: 7 days gang-heavy, 64 nodes", Recipe(ClusterShape(64, 8, 8), "gang-heavy", 0.9, 7.0, 1))]
        if not args.no_month:
            cases.append(("month: 30 days gang-heavy, 256 nodes",
                          Recipe(ClusterShape(256, 8, 32), "gang-heavy", 0.9, 30.0, 1)))
    print(f"load average before: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    results = [] if args.predict_only else [case(name, recipe, policies) for name, recipe in cases]
    if not args.no_predict or args.predict_only:
        # the month (the quick day with --quick, or the week with --no-month), its jobs recurring
        name, recipe = cases[-1]
        for i in range(max(1, args.repeat)):
            results.append(prediction_case(f"prediction: {name.split(': ', 1)[1]}, recurring",
                                           dataclasses.replace(recipe, recurrence=RECURRENCE),
                                           first="synapse-limits" if i % 2 == 0 else "synapse"))
    adds = [r["prediction_adds"] for r in results if "prediction_adds" in r]
    if args.json:
        print(json.dumps({"cases": results, "prediction_adds_median": statistics.median(adds) if adds else None},
                         indent=2))
        return
    for r in results:
        print(f"{r['case']}: {r['jobs']} jobs, all policies {r['total_wall_s']:.1f} s")
        print(f"  {'policy':<15}{'wall s':>8}{'events':>8}{'us/event':>10}{'policy %':>10}{'mean queue':>12}"
              f"{'sched p99 ms':>14}")
        for p in r["policies"]:
            print(f"  {p['policy']:<15}{p['wall_s']:>8.1f}{p['events']:>8}{p['us_per_event']:>10.0f}"
                  f"{p['policy_share']:>10.0%}{p['mean_queue']:>12.1f}{p['sched_p99_ms']:>14.2f}")
        if "prediction_adds" in r:
            verdict = "met" if r["prediction_adds"] <= r["target"] else "MISSED"
            print(f"  prediction adds {r['prediction_adds']:+.1%} wall ({r['prediction_adds_per_round']:+.1%} policy "
                  f"time per round); target at most {r['target']:.0%} wall: {verdict}")
    if len(adds) > 1:
        median = statistics.median(adds)
        print(f"prediction adds, median of {len(adds)} (order alternating): {median:+.1%} wall "
              f"({' / '.join(f'{a:+.1%}' for a in adds)}); target at most {PREDICT_TARGET:.0%}: "
              f"{'met' if median <= PREDICT_TARGET else 'MISSED'}")


if __name__ == "__main__":
    main()
