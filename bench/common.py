"""Helpers shared by the benchmarks."""

from __future__ import annotations


def percentile(samples: list[float], q: float) -> float:
    """The q-quantile (0..1) of the samples, nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]
