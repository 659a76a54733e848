"""Issue 48's figures: synapse against easy and easy++, seed by seed, with means and 95 % intervals.

    python3 scripts/sim_targets.py --seeds 1-12                                # the gang-heavy week
    python3 scripts/sim_targets.py --seeds 1-12 --tuning guess_wait_s=inf      # an ablation
    python3 scripts/sim_targets.py --seeds 1-6 --recurrence 0                  # today's traces
    python3 scripts/sim_targets.py --seeds 1-3 --mix philly --nodes 128 --racks 16
    python3 scripts/sim_targets.py --seeds 1-12 --spread-factor 0.8
    python3 scripts/sim_targets.py --seeds 8 --by-size                         # waits by gang size

Each trace is `synapse-sim generate`'s for the seed and options given; each replay is `run`'s
(`replay`, `summarize`). Per seed: synapse's mean JCT over easy's and easy++'s, its big-gang p99
wait over easy++'s, useful utilisation minus easy++'s (points), and the single-rack share (easy++'s
in brackets); then the means over the seeds with Student t 95 % intervals, as
docs/evaluation/results.md reports them. `--cache DIR` keeps the baselines' summaries (they do not
depend on --tuning) so that ablations replay synapse alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

import click

from synapse.sim.generate import RECURRENCE, Recipe, generate
from synapse.sim.metrics import summarize
from synapse.sim.policies import POLICIES, tuned
from synapse.sim.replay import SPREAD_FACTOR, replay
from synapse.sim.trace import ClusterShape

#: Student t, two-sided 95 %, by degrees of freedom
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131}
KEYS = ("mean_jct_s", "big_gang_p99_wait_s", "useful_utilisation", "single_rack_share", "by_size")


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return out


def _interval(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "n/a"
    mean = statistics.mean(values)
    if len(values) < 2:
        return f"{mean:.3f}"
    return f"{mean:.3f} ± {T95.get(len(values) - 1, 2.0) * statistics.stdev(values) / math.sqrt(len(values)):.3f}"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--seeds", default="1-12", show_default=True, help="e.g. 1-12 or 1,4,8")
@click.option("--mix", default="gang-heavy", show_default=True)
@click.option("--days", type=float, default=7.0, show_default=True)
@click.option("--recurrence", type=float, default=None, help="generate's --recurrence (its default if not given)")
@click.option("--within-cv", type=float, default=None, help="generate's --within-cv (its default if not given)")
@click.option("--nodes", type=int, default=64, show_default=True)
@click.option("--racks", type=int, default=8, show_default=True)
@click.option("--spread-factor", type=float, default=SPREAD_FACTOR, show_default=True)
@click.option("--tuning", default="", help="synapse's knobs, as run --tuning takes them")
@click.option("--cache", "cache_dir", default=None, help="a directory keeping the baselines' summaries")
@click.option("--exact-runs", is_flag=True, help="run's --exact-runs: easy++ and synapse know every run (an oracle)")
@click.option("--by-size", is_flag=True, help="also print the mean wait by gang size, easy++ against synapse")
def main(seeds: str, mix: str, days: float, recurrence: float | None, within_cv: float | None, nodes: int, racks: int,
         spread_factor: float, tuning: str, cache_dir: str | None, exact_runs: bool, by_size: bool) -> None:
    """Replay easy, easy++ and synapse on each seed's trace and print the ratios."""
    synapse = tuned(POLICIES["synapse"], tuning) if tuning else POLICIES["synapse"]
    shape = ClusterShape(nodes, 8, racks)
    rows = []
    for seed in _seeds(seeds):
        recipe = Recipe(shape, mix, 0.9, days, seed, recurrence=RECURRENCE if recurrence is None else recurrence)
        if within_cv is not None:
            recipe = dataclasses.replace(recipe, within_cv=within_cv)
        trace = generate(recipe)
        summaries = {}
        for name in ("easy", "easy++"):
            key = f"{mix}-{days}d-{nodes}x{racks}-{seed}-{recurrence}-{within_cv}-{spread_factor}-{name}" + \
                ("-exact.json" if exact_runs else ".json")
            cached = Path(cache_dir, key) if cache_dir else None
            if cached is not None and cached.exists():
                summaries[name] = json.loads(cached.read_text())
                continue
            summary = summarize(replay(trace, shape, POLICIES[name], spread_factor=spread_factor,
                                       exact_runs=exact_runs))
            summaries[name] = {k: summary[k] for k in KEYS}
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_text(json.dumps(summaries[name]))
        s = summarize(replay(trace, shape, synapse, spread_factor=spread_factor, exact_runs=exact_runs))
        e, pp = summaries["easy"], summaries["easy++"]
        big = s["big_gang_p99_wait_s"] / pp["big_gang_p99_wait_s"] if pp["big_gang_p99_wait_s"] else math.nan
        row = (s["mean_jct_s"] / e["mean_jct_s"], s["mean_jct_s"] / pp["mean_jct_s"], big,
               100 * (s["useful_utilisation"] - pp["useful_utilisation"]), s["single_rack_share"],
               pp["single_rack_share"])
        rows.append(row)
        click.echo(f"seed {seed:2}: JCT/easy {row[0]:.3f}  JCT/easy++ {row[1]:.3f}  big p99/easy++ {row[2]:.3f}  "
                   f"useful util {row[3]:+.2f} pt  single-rack {row[4]:.3f} ({row[5]:.3f})")
        if by_size:
            for size, theirs in pp["by_size"].items():
                ours = s["by_size"].get(size, {}).get("mean_wait_s", math.nan)
                click.echo(f"    {size:>7} GPUs: {theirs['jobs']:5} jobs, mean wait easy++ "
                           f"{theirs['mean_wait_s'] / 3600:6.2f} h, synapse {ours / 3600:6.2f} h")
    columns = list(zip(*rows, strict=True))
    worst = max((v for v in columns[2] if not math.isnan(v)), default=math.nan)
    label = ", ".join(([tuning] if tuning else []) + (["exact runs"] if exact_runs else []))
    click.echo(f"mean over {len(rows)} seed(s){' [' + label + ']' if label else ''}: JCT/easy "
               f"{_interval(list(columns[0]))}; JCT/easy++ {_interval(list(columns[1]))}; big p99/easy++ "
               f"{_interval(list(columns[2]))} (worst {worst:.2f}); useful util {_interval(list(columns[3]))} pt; "
               f"single-rack {statistics.mean(columns[4]):.3f} (easy++ {statistics.mean(columns[5]):.3f})")


if __name__ == "__main__":
    main()
