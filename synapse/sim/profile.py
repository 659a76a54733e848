"""How well a run-time predictor does on a trace: the share of jobs it predicts within a bound.

Each job is predicted at its submission by synapse.core.schedule.predict from the runs that ended before
then (a job ends its run time, capped at its limit, after its submission: queueing is left out, so
the predictor knows a little less than it would on a cluster). The error of a prediction is
|predicted - actual| / actual; Helios reports its estimator's as the share of jobs within +-10 %,
+-50 %, +-100 % and within 10x (actual / 10 to actual x 10).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from synapse.core.schedule.predict import RunTimes
from synapse.sim.trace import Trace

#: (label, the predicate on predicted / actual) of the profile's columns.
BOUNDS: tuple[tuple[str, Callable[[float], bool]], ...] = (
          ("within 10 %", lambda r: abs(r - 1) <= 0.1), ("within 50 %", lambda r: abs(r - 1) <= 0.5),
          ("within 100 %", lambda r: abs(r - 1) <= 1.0), ("within 10x", lambda r: 0.1 <= r <= 10))
#: Helios's estimator (S-Lab-System-Group/HeliosArtifact), the same columns.
HELIOS = (0.10, 0.50, 0.70, 0.90)


def error_profile(trace: Trace) -> dict[str, float]:
    """Share of jobs within each bound of BOUNDS, and by what the predictions rested on."""
    times = RunTimes()
    ended: list[tuple[float, str, str, int, float]] = []  #: (end, user, name, gpus, run)
    ratios, basis = [], {"job": 0, "user": 0, "limit": 0, "none": 0}
    for job in sorted(trace.jobs, key=lambda j: j.submit):
        while ended and ended[0][0] <= job.submit:
            _, user, name, gpus, run = heapq.heappop(ended)
            times.learn(user, name, gpus, run)
        run = min(job.duration, job.time_limit) if job.time_limit else job.duration
        guess = times.predict(job.user, job.job_name, job.gpus, job.time_limit)
        basis[guess.basis] += 1
        ratios.append(guess.seconds / max(run, 1.0))
        heapq.heappush(ended, (job.submit + run, job.user, job.job_name, job.gpus, run))
    n = max(1, len(ratios))
    out = {label: sum(1 for r in ratios if test(r)) / n for label, test in BOUNDS}
    out.update({f"basis_{k}": v / n for k, v in basis.items()})
    return out
