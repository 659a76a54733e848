"""What a replay is judged by: completion and waiting times, big gangs, utilisation, locality.

Definitions (docs/evaluation/ repeats them):

* wait = start - submit; JCT = end - submit, over every job of the trace (failed ones too: the
  time they held GPUs is real). Percentiles interpolate linearly between ranks.
* big gangs: 64 GPUs or more (`BIG_GANG_GPUS`); size classes 1, 2-8, 16-32, 64-128, 256+ GPUs.
* bounded slowdown: max(1, JCT / max(run, 10 s)), run = end - start.
* utilisation: GPU-seconds allocated between the first and the last submission over the GPUs of
  the cluster in that time (the window in which load is offered; draining the backlog afterwards
  does not count). `useful_utilisation` counts a gang split across racks at the spread factor.
* single_rack_share: of the multi-node gangs that fit in one rack, the share placed in one (a
  single-node job cannot be split, so counting it would only dilute the figure);
  mean_racks_spanned: over every multi-node gang.
* sched_p99_ms: the policy's own decision time per round, wall clock, 99th percentile.
* preemptions: Preempt commands committed (synapse's policy, with a queue file defining the
  trace's queues); lost_gpu_hours: GPU-hours the victims had run when their tasks exited, rerun
  from the start. A preempted job's wait and start are its last attempt's (the one that ran to
  its end); its JCT is end - submit as for any job. Utilisation counts the GPUs a preempted
  attempt held (allocated) but not as useful.
* dependencies (when the trace has `after`): `dependency_delay_*` is start - ready over the
  dependent jobs that started, ready being when their last upstream ended; `never_started` counts
  jobs that ended without running (a dependency that could never be met).
* node failures (`run --node-mtbf`): `goodput` is the GPU-hours that became kept progress over
  the GPU-hours held, over the jobs that ended (held: every attempt's GPUs from its start to its
  stop, preempted and failed ones included; kept: a finished attempt's run less its restart cost, a
  failed one's run up to its last checkpoint; 1 with no failures and no preemption; the spread
  penalty is not counted here). `failure_lost_gpu_hours`: what failures cost the gangs they hit,
  the three ways the issue and shared GOODPUT.md name: `failure_work_lost_gpu_hours` (held by
  attempts that failures ended and not kept: work since the last checkpoint, and the restart of an
  attempt that failed again; with recovery `spares`, also the guests evicted from spares), plus
  `restart_gpu_hours` (the restart of the attempts that ran to their end), plus
  `requeue_wait_gpu_hours` (the GPUs of each attempt a failure ended times the wait until the next
  attempt started: held by no one, so no part of goodput, but GPU time the gang went without). A
  recovery policy changes the wait; the work lost it cannot (the same failures hit whatever runs).
  `restart_held_idle_gpu_hours`: the cluster's side, GPUs left idle on nodes reserved for
  attempts after a failure (not in `failure_lost_gpu_hours`: the gang's own GPUs are counted by its
  wait, and kept survivors would count twice);
  `node_failures`: nodes failed in the submission window (the same count for every policy).
  `big_gang_mean_jct_s`: mean JCT of the big gangs that ended; `failed_big_gang_mean_jct_s`, of
  those among them that lost an attempt to a failure (`failed_big_gangs`).
* idle_gpu_hours: the idle GPU-hours of the submission window by cause (replay.IDLE_CAUSES);
  big_gang_wait_hours: the big gangs' waits summed, by what they waited in (replay.BIG_WAIT_STATES).
* estimated starts (a policy whose plan gives any: synapse's from its walk, synapse.core.schedule.estimate;
  EASY's for the head job its reservation holds): each job's estimate after the first round that
  saw it pending, against its start. Over the jobs that waited at least `ESTIMATE_MIN_WAIT_S` and
  had a known estimate: `estimate_error_p50` and `estimate_error_p90` of |estimate - start| / wait,
  `estimate_late_share` (started after the estimate), `estimate_jobs`; `estimate_known_share`: of
  the jobs that waited that long, those that had a known estimate. Omitted for a policy that
  estimated no job.
* per queue (when the trace names queues): jobs, GPU-hours used, share of the GPU-hours, mean and
  p99 wait; `jain_fairness` of the queues' used share over their weight (1: exactly fair).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from synapse.core import goodput
from synapse.sim.replay import BIG_GANG_GPUS, JobRecord, RunResult

#: One replay's metrics as `summarize` gives them: JSON-ready numbers (nan for none), and nested
#: objects (by size class, by queue).
Summary = dict[str, Any]

SIZE_CLASSES = (("1", 1, 1), ("2-8", 2, 8), ("16-32", 9, 32), ("64-128", 33, 128), ("256+", 129, 1 << 30))
SLOWDOWN_FLOOR_S = 10.0
#: Estimates are judged over the jobs that waited at least this long (a short wait's relative error
#: says little: a minute off on a minute's wait is 100 %).
ESTIMATE_MIN_WAIT_S = 600.0
#: Two-sided 95 % Student t quantiles by degrees of freedom (beyond the table: 1.96).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1), linear between ranks; nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def size_class(gpus: int) -> str:
    return next(name for name, lo, hi in SIZE_CLASSES if lo <= gpus <= hi)


def allocated_gpu_seconds(records: Sequence[JobRecord], start: float, end: float, spread_factor: float = 1.0,
                          ) -> tuple[float, float]:
    """(allocated, useful) GPU-seconds inside [start, end)."""
    allocated = useful = 0.0
    for r in records:
        for lost_start, lost_stop in r.preempted:  # held, then lost: allocated, never useful
            allocated += max(0.0, min(lost_stop, end) - max(lost_start, start)) * r.gpus
        for lost_start, lost_stop, kept in r.failures:  # held; useful up to its last checkpoint
            allocated += max(0.0, min(lost_stop, end) - max(lost_start, start)) * r.gpus
            useful += max(0.0, min(lost_start + kept, end) - max(lost_start, start)) * r.gpus
        if math.isnan(r.start):
            continue
        stop = r.end if not math.isnan(r.end) else end
        overlap = max(0.0, min(stop, end) - max(r.start, start)) * r.gpus
        allocated += overlap
        useful += overlap * (spread_factor if r.racks > 1 else 1.0)
    return allocated, useful


def utilisation_series(run: RunResult, step: float = 3600.0) -> list[tuple[float, float]]:
    """(bin start, allocated share of the GPUs) per `step` seconds, until the last job ends."""
    ends = [r.end for r in run.records if not math.isnan(r.end)]
    last = max(ends, default=run.horizon)
    bins = [0.0] * (int(last // step) + 1)
    for r in run.records:
        runs = list(r.preempted) + [(a, b) for a, b, _ in r.failures]
        runs += [] if math.isnan(r.start) or math.isnan(r.end) else [(r.start, r.end)]
        for t, stop in runs:
            while t < stop:
                b = int(t // step)
                upto = min(stop, (b + 1) * step)
                bins[b] += (upto - t) * r.gpus
                t = upto
    return [(i * step, v / (step * run.shape.gpus)) for i, v in enumerate(bins)]


def summarize(run: RunResult, *, warmup: float = 0.0) -> Summary:
    """The metrics of one replay, over the jobs submitted after `warmup` seconds."""
    records = [r for r in run.records if r.submit >= warmup]
    started = [r for r in records if not math.isnan(r.start)]
    ended = [r for r in records if not math.isnan(r.end)]
    waits = [r.start - r.submit for r in started]
    jcts = [r.end - r.submit for r in ended]
    big = [r.start - r.submit for r in started if r.gpus >= BIG_GANG_GPUS]
    rack_gpus = run.shape.rack_gpus
    gangs = [r for r in started if r.tasks > 1]
    rack_sized = [r for r in gangs if r.gpus <= rack_gpus]
    window_start = warmup if warmup else (run.records[0].submit if run.records else 0.0)
    window = max(run.horizon - window_start, 1e-9)
    allocated, useful = allocated_gpu_seconds(run.records, window_start, run.horizon, run.spread_factor)
    out = {
        "jobs": len(records),
        "finished": len(ended),
        "failed": sum(1 for r in ended if r.status != "SUCCEEDED"),
        "mean_jct_s": _mean(jcts),
        "p50_jct_s": quantile(jcts, 0.5),
        "p99_jct_s": quantile(jcts, 0.99),
        "mean_wait_s": _mean(waits),
        "p50_wait_s": quantile(waits, 0.5),
        "p99_wait_s": quantile(waits, 0.99),
        "big_gang_jobs": len(big),
        "big_gang_p99_wait_s": quantile(big, 0.99),
        "big_gang_max_wait_s": max(big, default=math.nan),
        "mean_bounded_slowdown": _mean([max(1.0, (r.end - r.submit) / max(r.end - r.start, SLOWDOWN_FLOOR_S))
                                        for r in ended]),
        "utilisation": allocated / (window * run.shape.gpus),
        "useful_utilisation": useful / (window * run.shape.gpus),
        "single_rack_share": (sum(1 for r in rack_sized if r.racks == 1) / len(rack_sized)) if rack_sized else math.nan,
        "mean_racks_spanned": _mean([r.racks for r in gangs]),
        "sched_p99_ms": quantile(run.round_seconds, 0.99) * 1000,
        "sched_mean_ms": _mean(run.round_seconds) * 1000,
        "rounds": len(run.round_seconds),
        "wall_s": run.wall_seconds,
        "by_size": _by_size(started),
        "preemptions": run.preemptions,
        "lost_gpu_hours": sum((stop - begin) * r.gpus for r in run.records for begin, stop in r.preempted) / 3600,
        "idle_gpu_hours": {cause: s / 3600 for cause, s in run.idle.items()},
        "big_gang_wait_hours": {what: s / 3600 for what, s in run.big_wait.items()},
        "big_gang_mean_jct_s": _mean([r.end - r.submit for r in ended if r.gpus >= BIG_GANG_GPUS]),
        "failed_big_gangs": sum(1 for r in ended if r.gpus >= BIG_GANG_GPUS and r.failures),
        "failed_big_gang_mean_jct_s": _mean([r.end - r.submit for r in ended
                                             if r.gpus >= BIG_GANG_GPUS and r.failures]),
        **failure_metrics(ended),
        "restart_held_idle_gpu_hours": run.restart_held_idle / 3600,
        "node_failures": sum(1 for t in run.failure_times if window_start <= t <= run.horizon),
    }
    out.update(estimate_metrics(started))
    delays = [r.start - r.ready for r in started if not math.isnan(r.ready)]
    if delays or any(not math.isnan(r.ready) for r in records):
        out["dependency_jobs"] = len(delays)
        out["dependency_delay_p50_s"] = quantile(delays, 0.5)
        out["dependency_delay_p99_s"] = quantile(delays, 0.99)
    out["never_started"] = sum(1 for r in records if math.isnan(r.start) and r.status in ("FAILED", "CANCELLED"))
    if run.queues or len({r.queue for r in records}) > 1:
        out["queues"], out["jain_fairness"] = _by_queue(run, records)
    return out


def estimate_metrics(started: Sequence[JobRecord]) -> dict[str, float]:
    """How far the estimates at submit were from the starts (see the module's docstring); {} for a
    policy that estimated none."""
    if all(math.isnan(r.estimate) for r in started):
        return {}
    waited = [r for r in started if r.start - r.submit >= ESTIMATE_MIN_WAIT_S]
    known = [r for r in waited if not math.isnan(r.estimate)]
    errors = [abs(r.estimate - r.start) / (r.start - r.submit) for r in known]
    return {"estimate_error_p50": quantile(errors, 0.5), "estimate_error_p90": quantile(errors, 0.9),
            "estimate_late_share": (sum(1 for r in known if r.start > r.estimate) / len(known)) if known else math.nan,
            "estimate_jobs": len(known),
            "estimate_known_share": (len(known) / len(waited)) if waited else math.nan}


def failure_metrics(ended: Sequence[JobRecord]) -> dict[str, float]:
    """`goodput`, `failure_work_lost_gpu_hours`, `restart_gpu_hours`, `requeue_wait_gpu_hours` and
    their sum `failure_lost_gpu_hours` of the jobs that ended, by the leader's definition
    (synapse.core.goodput): a preempted run keeps nothing, a failed one what its last checkpoint
    saved, the run that ended the job all but its restart. The requeue wait: each failed attempt's
    GPUs times its wait until the next attempt starts. (Only failures restart at a cost in a replay,
    and only their waits are counted: all three parts are the failures'.)"""
    attempts = []
    wait = 0.0
    for r in ended:
        attempts += [goodput.Attempt(r.gpus, stop - start, goodput.OTHER) for start, stop in r.preempted]
        attempts += [goodput.Attempt(r.gpus, stop - start, goodput.FAILURE, kept_s=saved)
                     for start, stop, saved in r.failures]
        for i, (_, stop, _) in enumerate(r.failures):
            following = r.failures[i + 1][0] if i + 1 < len(r.failures) else r.start
            if not math.isnan(following):
                wait += max(0.0, following - stop) * r.gpus
        if not math.isnan(r.start):
            attempts.append(goodput.Attempt(r.gpus, r.end - r.start, goodput.FINISHED, restart_s=r.restart_s))
    total = goodput.account(attempts)
    return {"goodput": total.goodput,
            "failure_lost_gpu_hours": (total.lost_failures + total.lost_restarts + wait) / 3600,
            "failure_work_lost_gpu_hours": total.lost_failures / 3600,
            "restart_gpu_hours": total.lost_restarts / 3600, "requeue_wait_gpu_hours": wait / 3600}


def _by_size(started: Sequence[JobRecord]) -> dict[str, dict[str, float]]:
    out = {}
    for name, lo, hi in SIZE_CLASSES:
        waits = [r.start - r.submit for r in started if lo <= r.gpus <= hi]
        if waits:
            out[name] = {"jobs": len(waits), "mean_wait_s": _mean(waits), "p50_wait_s": quantile(waits, 0.5),
                         "p99_wait_s": quantile(waits, 0.99), "max_wait_s": max(waits)}
    return out


def _by_queue(run: RunResult, records: Sequence[JobRecord]) -> tuple[dict[str, dict[str, float]], float]:
    weights = {q.name: q.weight for q in run.queues}
    used: dict[str, float] = {}
    out: dict[str, dict[str, float]] = {}
    for name in sorted({r.queue for r in records}):
        mine = [r for r in records if r.queue == name]
        used[name] = allocated_gpu_seconds(mine, 0.0, math.inf)[0]
        waits = [r.start - r.submit for r in mine if not math.isnan(r.start)]
        out[name] = {"jobs": len(mine), "gpu_hours": used[name] / 3600, "mean_wait_s": _mean(waits),
                     "p99_wait_s": quantile(waits, 0.99), "weight": weights.get(name, 1.0)}
    total = sum(used.values()) or 1.0
    for name, q in out.items():
        q["share"] = used[name] / total
    normalised = [q["share"] / q["weight"] for q in out.values()]
    jain = sum(normalised) ** 2 / (len(normalised) * sum(x * x for x in normalised)) if any(normalised) else math.nan
    return out, jain


def confidence(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of its 95 % confidence interval) over seeds; the half-width is nan for one value."""
    clean = [v for v in values if not math.isnan(v)]
    if not clean:
        return math.nan, math.nan
    if len(clean) == 1:
        return clean[0], math.nan
    df = len(clean) - 1
    t = _T95.get(df) or next((v for k, v in sorted(_T95.items()) if k >= df), 1.96)
    return statistics.fmean(clean), t * statistics.stdev(clean) / math.sqrt(len(clean))


def ratio_claim(a: Sequence[float], b: Sequence[float]) -> str:
    """'a/b = r' when the two 95 % intervals do not overlap, else why no ratio is claimed."""
    (ma, ha), (mb, hb) = confidence(a), confidence(b)
    if math.isnan(ha) or math.isnan(hb):
        return "one seed: no interval, no claim"
    if ma + ha < mb - hb or mb + hb < ma - ha:
        return f"{ma / mb:.2f}x" if mb else "inf"
    return "intervals overlap: no claim"
