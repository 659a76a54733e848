"""Recovery policies against node MTBF in the simulator: goodput, failure losses, big gangs' JCT.

    python bench/mtbf_sweep.py --out sweep/ --plot docs/long-training-mtbf.png
    python bench/mtbf_sweep.py --quick       # one small point, to check it runs

The gang-heavy week (64 nodes x 8 GPUs in 8 racks, load 0.9, `synapse-sim generate` with the same
recipe), replayed through Synapse's policy with `--checkpoint-every 10m --restart-cost 1m` and each
MTBF and recovery (`synapse-sim run --node-mtbf H --recovery R`), one replay at a time (the runs are
sequential so that a shared machine is not flooded). Each replay's summary is kept in `--out` as
JSON, and a replay already there is not run again, so an interrupted sweep resumes. Prints the means
over the seeds per MTBF and recovery; `--plot` draws them.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse.sim.failures import RECOVERIES, FailureModel  # noqa: E402
from synapse.sim.generate import Recipe, generate  # noqa: E402
from synapse.sim.metrics import summarize  # noqa: E402
from synapse.sim.policies import POLICIES  # noqa: E402
from synapse.sim.replay import replay  # noqa: E402
from synapse.sim.trace import ClusterShape  # noqa: E402

#: What each replay's summary keeps (synapse.sim.metrics).
KEYS = ("goodput", "failure_lost_gpu_hours", "failure_work_lost_gpu_hours", "requeue_wait_gpu_hours",
        "restart_gpu_hours", "restart_held_idle_gpu_hours", "big_gang_mean_jct_s", "failed_big_gangs",
        "failed_big_gang_mean_jct_s", "node_failures", "mean_jct_s", "utilisation")


def one(shape: ClusterShape, days: float, seed: int, mtbf_h: float, recovery: str, out: Path) -> dict:
    """The summary of one replay, from `out` if it was run before."""
    path = out / f"s{seed}-m{mtbf_h:g}-{recovery}.json"
    if path.exists():
        return json.loads(path.read_text())
    trace = generate(Recipe(shape=shape, mix="gang-heavy", load=0.9, days=days, seed=seed))
    model = FailureModel(mtbf_s=mtbf_h * 3600, checkpoint_every_s=600, restart_cost_s=60, recovery=recovery,
                         seed=seed)
    summary = summarize(replay(trace, shape, POLICIES["synapse"], failures=model))
    kept = {k: summary[k] for k in KEYS}
    path.write_text(json.dumps(kept))
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mtbf", default="50,100,200,500,1000,2000", help="node MTBF values, hours")
    parser.add_argument("--seeds", default="1,2", help="trace and failure seeds")
    parser.add_argument("--recoveries", default=",".join(RECOVERIES))
    parser.add_argument("--out", type=Path, default=Path("mtbf-sweep"), help="where each replay's JSON goes")
    parser.add_argument("--plot", type=Path, help="draw the means into this PNG (matplotlib)")
    parser.add_argument("--quick", action="store_true", help="32 nodes, half a day, one seed, one MTBF (for CI)")
    args = parser.parse_args()
    shape, days = ClusterShape(nodes=64, gpus_per_node=8, racks=8), 7.0
    mtbfs, seeds = [float(x) for x in args.mtbf.split(",")], [int(x) for x in args.seeds.split(",")]
    if args.quick:
        shape, days, mtbfs, seeds = ClusterShape(nodes=32, gpus_per_node=8, racks=4), 0.5, [20.0], [1]
    recoveries = args.recoveries.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    means: dict[tuple[float, str], dict] = {}
    for mtbf in mtbfs:
        for recovery in recoveries:
            runs = [one(shape, days, seed, mtbf, recovery, args.out) for seed in seeds]
            means[(mtbf, recovery)] = {k: _mean([r[k] for r in runs]) for k in KEYS}
    print(f"gang-heavy, {shape.describe()}, {days:g} days, load 0.9, synapse, checkpoint 10m, restart 1m; "
          f"means over seeds {args.seeds if not args.quick else '1'}")
    print(f"{'MTBF h':>7} {'recovery':>8} {'goodput':>8} {'fail-lost':>9} {'work-lost':>9} {'requeue-wait':>12} "
          f"{'held-idle':>9} {'big JCT h':>9} {'failed-big JCT h':>16}")
    for (mtbf, recovery), m in means.items():
        print(f"{mtbf:>7g} {recovery:>8} {m['goodput']:>8.4f} {m['failure_lost_gpu_hours']:>9.0f} "
              f"{m['failure_work_lost_gpu_hours']:>9.0f} {m['requeue_wait_gpu_hours']:>12.0f} "
              f"{m['restart_held_idle_gpu_hours']:>9.0f} {m['big_gang_mean_jct_s'] / 3600:>9.2f} "
              f"{m['failed_big_gang_mean_jct_s'] / 3600:>16.2f}")
    if args.plot:
        plot(args.plot, means, mtbfs, recoveries)


def _mean(values: list[float]) -> float:
    """The mean over the seeds that have a value (a seed without a failed big gang has none: nan)."""
    known = [v for v in values if not math.isnan(v)]
    return statistics.fmean(known) if known else math.nan


def plot(path: Path, means: dict, mtbfs: list[float], recoveries: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("goodput", "goodput", 1.0),
              ("failure-lost GPU-h (work + restart + wait)", "failure_lost_gpu_hours", 1.0),
              ("work lost GPU-h (since checkpoint)", "failure_work_lost_gpu_hours", 1.0),
              ("big gangs' mean JCT, h", "big_gang_mean_jct_s", 3600.0))
    fig, axes = plt.subplots(1, len(panels), figsize=(16, 3.6))
    for ax, (title, key, scale) in zip(axes, panels, strict=True):
        for recovery in recoveries:
            ax.plot(mtbfs, [means[(m, recovery)][key] / scale for m in mtbfs], marker="o", label=recovery)
        ax.set_xscale("log")
        ax.set_xlabel("node MTBF, hours")
        ax.set_title(title)
        if key == "failure_lost_gpu_hours":
            ax.set_yscale("symlog", linthresh=10)
            ax.set_ylim(bottom=0)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
