"""Usage that remembers: each queue's and user's GPU time, decayed with a half-life. Pure.

Slurm's PriorityDecayHalfLife, computed exactly instead of every PriorityCalcPeriod: a queue that
held `g` GPUs from `t0` to `t1` adds `g * H/ln2 * (1 - 2^-(t1-t0)/H)` GPU-seconds, and what it had
at `t0` is halved every `H` seconds. Apply keeps, per queue and per user, the value as of the last
change of what it holds (`DecayedUsage`), from the commands' own timestamps, so every replica holds
the same numbers (no clock here). A half-life of 0 keeps no memory: admission then orders by current
usage alone, as before.

Admission (synapse.core.schedule.admission) adds a queue's `history_share` to its current dominant share:
its decayed GPU-seconds over what the whole READY pool would have accumulated running full forever
(`pool GPUs * H/ln2`), so both are fractions of the cluster and a queue that used much lately waits
behind one that did not, until the memory fades.
"""

from __future__ import annotations

import math
from typing import NamedTuple

LN2 = math.log(2.0)
#: The default half-life (Slurm's PriorityDecayHalfLife default): 7 days.
DEFAULT_HALF_LIFE_S = 7 * 86400.0


class DecayedUsage(NamedTuple):
    """GPU-seconds decayed to `at`, and the GPUs held since then."""

    value: float
    at: float
    held: int


def decayed(value: float, held: int, dt: float, half_life: float) -> float:
    """`value` after `dt` seconds of decay, plus what `held` GPUs accrued meanwhile (decayed too)."""
    if half_life <= 0 or dt <= 0:
        return value
    fade: float = 2.0 ** (-dt / half_life)  # (float ** float is Any to a type checker: a negative base)
    return value * fade + held * half_life / LN2 * (1.0 - fade)


def accrue(entry: DecayedUsage | None, delta_gpus: int, at: float, half_life: float) -> DecayedUsage:
    """The entry once what it holds changes by `delta_gpus` at `at` (a time before the entry's own,
    from a skewed proposer clock, counts as the entry's time)."""
    if entry is None:
        return DecayedUsage(0.0, at, delta_gpus)
    now = max(at, entry.at)
    return DecayedUsage(decayed(entry.value, entry.held, now - entry.at, half_life), now, entry.held + delta_gpus)


def value_at(entry: DecayedUsage | None, at: float, half_life: float) -> float:
    """The decayed GPU-seconds at `at` (0 without an entry or a half-life)."""
    if entry is None or half_life <= 0:
        return 0.0
    return decayed(entry.value, entry.held, at - entry.at, half_life)


def history_share(entry: DecayedUsage | None, at: float, half_life: float, pool_gpus: int) -> float:
    """The decayed usage as a fraction of what the pool would accumulate running full forever."""
    if half_life <= 0 or pool_gpus <= 0:
        return 0.0
    return value_at(entry, at, half_life) / (pool_gpus * half_life / LN2)
