"""The noise floor of a comparison: the same trace with every submission a little later, through every policy.

A trace whose submissions all move by a few seconds is, to anyone reading it, the same trace; a
difference between two policies that such a shift can undo or double is noise, not a result.
`jittered` makes the copies (deterministic from a seed, ids, order and dependencies kept valid);
`spread` and `versus` say how far one policy's metric, and its ratio to a baseline, move over them.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from synapse.core.jobs.arrays import split_element_id
from synapse.sim.metrics import Summary
from synapse.sim.trace import Trace

#: (heading, summarize's key, scale, format) of the metrics the noise floor covers.
NOISE_METRICS = (("mean JCT h", "mean_jct_s", 3600, "{:.2f}"),
                 ("big-gang p99 wait h", "big_gang_p99_wait_s", 3600, "{:.1f}"),
                 ("useful utilisation %", "useful_utilisation", 0.01, "{:.1f}"),
                 ("single-rack share %", "single_rack_share", 0.01, "{:.1f}"))


def jitter(trace: Trace, seconds: float, rng: random.Random) -> Trace:
    """`trace` with each submission later by U(0, seconds), never before an upstream's; ids unchanged."""
    submits: dict[str, float] = {}
    jobs = []
    for job in trace.jobs:  # in submission order, so a job's upstreams are already placed
        at = job.submit + rng.random() * seconds
        for _kind, upstream in job.dependencies:
            element = split_element_id(upstream)
            row = upstream if upstream in submits or not element else element[0]
            # Its own draw is below its old time + seconds and the upstream's below the upstream's
            # old time + seconds, which is no later: the shift stays in [0, seconds).
            at = max(at, submits.get(row, at))
        submits[job.id] = at
        jobs.append(dataclasses.replace(job, submit=at))
    # An upstream tied with its dependant stays ahead of it (the replay submits ties in list order).
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].submit, i))
    return dataclasses.replace(trace, jobs=[jobs[i] for i in order])


def jittered(trace: Trace, seconds: float, repeats: int, seed: int) -> list[Trace]:
    """`repeats` jittered copies of `trace`; copy k (from 1) draws from its own stream of `seed`."""
    return [jitter(trace, seconds, random.Random(f"jitter {seed} {k}")) for k in range(1, repeats + 1)]


@dataclass(frozen=True, slots=True)
class Spread:
    """One policy's metric: its value on the trace as given, and its range over the jittered copies."""

    given: float  #: on the trace as given
    low: float  #: least over the jittered copies that have a value; nan if none has
    high: float  #: greatest over the same


def spread(values: Sequence[float]) -> Spread:
    """From the values on each copy, the trace as given first."""
    rest = [v for v in values[1:] if not math.isnan(v)]
    return Spread(values[0], min(rest, default=math.nan), max(rest, default=math.nan))


@dataclass(frozen=True, slots=True)
class Versus:
    """One policy's metric against the baseline's, copy by copy."""

    ratios: tuple[float, ...]  #: policy / baseline on each copy, the trace as given first; nan where undefined
    at_or_below: int  #: copies on which the policy's value is at or below the baseline's
    at_or_above: int  #: copies on which it is at or above (a tie counts in both; a copy without both values in neither)

    @property
    def low(self) -> float:
        """The least ratio; nan if no copy has one."""
        return min((r for r in self.ratios if not math.isnan(r)), default=math.nan)

    @property
    def high(self) -> float:
        """The greatest ratio; nan if no copy has one."""
        return max((r for r in self.ratios if not math.isnan(r)), default=math.nan)


def versus(values: Sequence[float], baseline: Sequence[float]) -> Versus:
    """The policy's values against the baseline's, on the same copies in the same order."""
    pairs = [(v, b) for v, b in zip(values, baseline, strict=True) if not (math.isnan(v) or math.isnan(b))]
    ratios = tuple(v / b if b else math.nan for v, b in zip(values, baseline, strict=True))  # nan stays nan
    return Versus(ratios, sum(v <= b for v, b in pairs), sum(v >= b for v, b in pairs))


def values_of(summaries: Sequence[Summary], key: str) -> list[float]:
    """One metric from one policy's summary on each copy; None (nan in JSON) reads as nan."""
    return [math.nan if s[key] is None else float(s[key]) for s in summaries]


def noise_floor(given: dict[str, Summary], copies: list[dict[str, Summary]], *, seconds: float,
                seed: int) -> dict[str, Any]:
    """The `jitter` object of `run --json`: each policy's summary per copy (the trace as given first)
    and, for each policy after the first (the baseline), its ratio to the baseline per copy."""
    by_policy = {name: [given[name], *(c[name] for c in copies)] for name in given}
    baseline, *others = by_policy
    ratios = {name: {key: list(versus(values_of(by_policy[name], key), values_of(by_policy[baseline], key)).ratios)
                     for _, key, _, _ in NOISE_METRICS} for name in others}
    return {"seconds": seconds, "repeats": len(copies), "seed": seed, "baseline": baseline, "copies": by_policy,
            "ratios": ratios}
