"""A load sweep over several seeds: every policy on the same traces, with 95 % confidence intervals.

For each offered load and seed one trace is generated and replayed through every policy, so the
policies are compared on identical work (paired). A ratio between two policies is claimed only where
their intervals do not overlap (metrics.ratio_claim); `paired` gives each policy's ratio to a
baseline seed by seed (the mean of those ratios with its 95 % interval, and the worst seed).
"""

from __future__ import annotations

import dataclasses
import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from synapse.sim.generate import Recipe, generate
from synapse.sim.metrics import Summary, confidence, ratio_claim, summarize
from synapse.sim.policies import POLICIES
from synapse.sim.replay import RunResult, replay

#: Metrics a sweep aggregates over seeds.
SWEPT = ("mean_jct_s", "p99_jct_s", "mean_wait_s", "big_gang_p99_wait_s", "utilisation", "useful_utilisation",
         "single_rack_share", "mean_racks_spanned", "sched_p99_ms")
#: What is paired against the baseline policy seed by seed: (metric, "ratio" or "difference").
PAIRED = (("mean_jct_s", "ratio"), ("big_gang_p99_wait_s", "ratio"), ("useful_utilisation", "difference"))


@dataclass(frozen=True, slots=True)
class Case:
    recipe: Recipe
    policy: str
    spread_factor: float


def _run(case: Case) -> tuple[Case, Summary, RunResult]:
    run = replay(generate(case.recipe), case.recipe.shape, POLICIES[case.policy], spread_factor=case.spread_factor)
    return case, summarize(run), run


def sweep(base: Recipe, loads: list[float], seeds: list[int], policies: list[str], *, spread_factor: float,
          workers: int = 1, keep: float | None = None, baseline: str | tuple[str, ...] = ("easy", "easy++"),
          ) -> tuple[dict[str, Any], list[RunResult]]:
    """{"loads", "seeds", "policies": {NAME: {metric: [(mean, half width) per load]}}, "samples", "claims",
    "baseline", "paired"} (paired with the first of the `baseline`s that was replayed), "paired_with"
    ({baseline: paired} for each of them that was), and the replays of the first seed at load `keep`
    (for the per-run plots)."""
    baselines = [b for b in ((baseline,) if isinstance(baseline, str) else baseline) if b in policies]
    cases = [Case(dataclasses.replace(base, load=load, seed=seed), p, spread_factor)
             for load in loads for seed in seeds for p in policies]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            done = list(pool.map(_run, cases))
    else:
        done = [_run(c) for c in cases]
    samples: dict[str, dict[str, list[list[float]]]] = {p: {m: [[] for _ in loads] for m in SWEPT} for p in policies}
    kept = []
    for case, summary, run in done:
        li = loads.index(case.recipe.load)
        for m in SWEPT:
            samples[case.policy][m][li].append(summary[m])
        if case.recipe.load == keep and case.recipe.seed == seeds[0]:
            kept.append(run)
    curves = {p: {m: [confidence(v) for v in by_load] for m, by_load in ms.items()} for p, ms in samples.items()}
    claims = {}
    if "synapse" in policies:
        for other in policies:
            if other == "synapse":
                continue
            claims[other] = {m: [ratio_claim(samples["synapse"][m][i], samples[other][m][i]) for i in range(len(loads))]
                             for m in ("mean_jct_s", "big_gang_p99_wait_s")}
    paired_with = {b: paired(samples, b, len(loads)) for b in baselines}
    return {"loads": loads, "seeds": seeds, "policies": curves, "samples": samples,
            "claims_synapse_over": claims, "baseline": baselines[0] if baselines else None,
            "paired": paired_with[baselines[0]] if baselines else {}, "paired_with": paired_with}, kept


def paired(samples: dict[str, dict[str, list[list[float]]]], baseline: str,
           loads: int) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """{policy: {metric: [{"mean", "half", "max", "values"} per load]}}: each policy's ratio to (or
    difference from) `baseline` on the same trace, seed by seed, with the mean's 95 % interval."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for policy, metrics in samples.items():
        if policy == baseline:
            continue
        out[policy] = {}
        for metric, how in PAIRED:
            per_load = []
            for li in range(loads):
                pairs = zip(metrics[metric][li], samples[baseline][metric][li], strict=True)
                values = [a / b if how == "ratio" and b else a - b for a, b in pairs]
                mean, half = confidence(values)
                per_load.append({"mean": mean, "half": half, "max": max(values, default=math.nan),
                                 "min": min(values, default=math.nan), "values": values})
            out[policy][metric] = per_load
    return out
