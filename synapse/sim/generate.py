"""Synthetic traces from published statistics (see docs/evaluation/).

* Durations: Philly's 83,154 run times as a quantile table, sampled by interpolating log-linearly
  between quantiles (a lognormal fitted to p50/p90 underestimates p99 by 3x). The ends, 10 s at
  p0 and twice p99.9 at p100, are ours. Gangs above 8 GPUs run longer: x (gpus/8)^exponent, 0.3 by
  default (an assumption to sweep).
* Sizes: `philly` (Philly's classic mix) or `gang-heavy` (ours, LLM-era: three quarters of GPU
  demand from gangs of 16 GPUs or more).
* Arrivals: Poisson with Venus's diurnal and weekly shape (181 days), scaled so that the trace's
  own GPU-seconds over its days equal the offered load times the cluster's GPUs (the realised load
  is the one asked for, not only its expectation: a heavy tail makes the two differ a lot).
* Time limits as users give them: the smallest of a few round values at or above the run time
  times U(1, 3), a fifth asking for the largest. A run longer than its limit is ended there.
* Early failures, optionally: that share of jobs fails after U(0, 0.5) of its run time.
* Recurrence, optionally (`recurrence` > 0): jobs have users and names. Each job's user is drawn
  by a Zipf popularity over `USERS` users; with probability `recurrence` the job resubmits one of
  its user's earlier templates (chosen in proportion to how often each was submitted: a few
  scripts make most of a user's runs), else it is a new template, drawn as a job is without
  recurrence (size, run time, time limit). A template keeps its size, name and time limit; each
  resubmission runs the template's run time times a lognormal of mean 1 and coefficient of
  variation `within_cv` (and is ended at the limit if it outlives it). The template's choice is
  independent of its run time, so the marginals of sizes and run times stay Philly's. Defaults are
  calibrated (docs/evaluation/) so that a predictor keyed on user and name (EASY++'s mean of the
  last two runs) reproduces Helios's error profile: about half the jobs within +-50 % and 70 %
  within +-100 %. With `recurrence` 0 the trace is exactly the one drawn before recurrence existed.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
from dataclasses import dataclass

from synapse.core.queues import queue_name_problem
from synapse.sim.trace import ClusterShape, Trace, TraceError, TraceJob

#: Philly run times: (quantile, seconds).
DURATION_QUANTILES = ((0.0, 10), (0.05, 48), (0.10, 61), (0.25, 131), (0.35, 428), (0.50, 1_186), (0.60, 1_871),
                      (0.75, 3_342), (0.80, 4_700), (0.85, 6_300), (0.90, 12_860), (0.95, 49_969),
                      (0.97, 101_884), (0.98, 167_785), (0.99, 287_333), (0.995, 484_829), (0.999, 1_361_908),
                      (1.0, 2_723_816))
#: GPUs per job -> share of jobs.
MIXES = {
    "philly": {1: 0.687, 2: 0.030, 4: 0.134, 8: 0.126, 16: 0.017, 32: 0.006},
    "gang-heavy": {1: 0.55, 2: 0.05, 4: 0.08, 8: 0.17, 16: 0.06, 32: 0.04, 64: 0.03, 128: 0.015, 256: 0.005},
}
#: Arrival rate multipliers by hour from midnight, and Monday to Sunday (Venus).
HOURLY = (0.90, 0.66, 0.60, 0.38, 0.27, 0.21, 0.19, 0.22, 0.37, 0.80, 1.29, 1.47, 1.16, 1.30, 1.56, 1.66, 1.73,
          1.73, 1.28, 1.31, 1.34, 1.36, 1.15, 1.04)
WEEKLY = (1.02, 1.11, 1.27, 1.20, 0.95, 0.68, 0.77)
#: Time limits users pick from, hours; a fifth of users ask for the largest.
LIMIT_HOURS = (0.5, 1, 2, 4, 8, 12, 24, 48, 72)
ASK_FOR_MAX = 0.2
#: Users of a recurring trace, and the Zipf exponent of how many jobs each submits.
USERS = 100
USER_ZIPF = 1.0
#: The defaults of a recurring trace (docs/evaluation/ shows the error profile they give).
RECURRENCE = 0.8
WITHIN_CV = 0.5
#: A resubmission's run-time quantile falls in the same one of this many equal bins as its template's.
QUANTILE_BINS = 20


@dataclass(frozen=True, slots=True)
class Recipe:
    """Everything a generated trace depends on."""

    shape: ClusterShape = ClusterShape()
    mix: str = "gang-heavy"
    load: float = 0.9
    days: float = 7.0
    seed: int = 1
    failures: float = 0.0  #: share of jobs that fail early
    size_exponent: float = 0.3  #: duration x (gpus/8)^this above 8 GPUs
    queue_mix: tuple[tuple[str, float], ...] = ()  #: (queue, share of jobs); empty: the default queue
    recurrence: float = 0.0  #: share of jobs that resubmit one of their user's templates (0: none, no users)
    within_cv: float = WITHIN_CV  #: coefficient of variation of a template's run times

    def problem(self) -> str:
        for name, _ in self.queue_mix:
            if queue_name_problem(name):
                return f"queue mix: {queue_name_problem(name)}"
        if self.mix not in MIXES:
            return f"unknown mix {self.mix!r} (known: {', '.join(MIXES)})"
        if not 0 < self.load <= 10:
            return f"load must be above 0 and at most 10, not {self.load:g}"
        if not 0 < self.days <= 366:
            return f"days must be above 0 and at most 366, not {self.days:g}"
        if not 0 <= self.recurrence < 1:
            return f"recurrence must be a share from 0 up to (not including) 1, not {self.recurrence:g}"
        if not 0 <= self.within_cv <= 10:
            return f"within-cv must be between 0 and 10, not {self.within_cv:g}"
        if not 0 <= self.failures <= 1:
            return f"failures must be a share between 0 and 1, not {self.failures:g}"
        too_big = [g for g in MIXES[self.mix] if g > self.shape.gpus]
        if too_big:
            return (f"the {self.mix} mix has gangs of {max(too_big)} GPUs; the cluster has {self.shape.gpus} "
                    f"({self.shape.describe()})")
        return ""

    def describe(self) -> str:
        queues = ",".join(f"{n}={s:g}" for n, s in self.queue_mix)
        return (f"mix={self.mix} load={self.load:g} days={self.days:g} seed={self.seed} failures={self.failures:g} "
                f"size_exponent={self.size_exponent:g}" + (f" queues={queues}" if queues else "")
                + (f" recurrence={self.recurrence:g} within_cv={self.within_cv:g}" if self.recurrence else ""))


def sample_duration(rng: random.Random) -> float:
    """One run time from the Philly quantile table, log-linear between quantiles."""
    return duration_at(rng.random())


def duration_at(u: float) -> float:
    """The run time at quantile `u` of the Philly table, log-linear between quantiles."""
    i = bisect.bisect_right([q for q, _ in DURATION_QUANTILES], u) - 1
    (q0, s0), (q1, s1) = DURATION_QUANTILES[i], DURATION_QUANTILES[min(i + 1, len(DURATION_QUANTILES) - 1)]
    if q1 == q0:
        return float(s0)
    return math.exp(math.log(s0) + (u - q0) / (q1 - q0) * (math.log(s1) - math.log(s0)))


def time_limit(run: float, rng: random.Random) -> float:
    """What a user asks for: a round value at or above run x U(1, 3), or the largest one."""
    hours = LIMIT_HOURS[-1]
    if rng.random() >= ASK_FOR_MAX:
        want = run * rng.uniform(1, 3) / 3600
        hours = next((h for h in LIMIT_HOURS if h >= want), LIMIT_HOURS[-1])
    return hours * 3600.0


def arrival_rate(t: float) -> float:
    """Relative arrival rate at `t` seconds from a Monday midnight (mean over a week: 1)."""
    hour = int(t // 3600)
    return HOURLY[hour % 24] * WEEKLY[(hour // 24) % 7] / _MEAN_RATE


_MEAN_RATE = sum(h * d for h in HOURLY for d in WEEKLY) / (24 * 7)


def _arrivals(n: int, horizon: float, rng: random.Random) -> list[float]:
    """`n` Poisson arrival times over [0, horizon) with the diurnal and weekly shape (given their
    number, the times of a Poisson process are independent draws from its rate's shape)."""
    peak = max(HOURLY) * max(WEEKLY) / _MEAN_RATE
    out: list[float] = []
    while len(out) < n:
        t = rng.uniform(0, horizon)
        if rng.random() * peak <= arrival_rate(t):
            out.append(t)
    return sorted(out)


@dataclass(slots=True)
class _Template:
    """A user's job template: what a resubmission runs, and how often it was submitted so far."""

    user: str
    name: str
    run: float  #: base run time (a resubmission's is spread around it)
    limit: float
    submissions: int


class _Users:
    """The users of a recurring trace and their templates.

    A job's size and run-time quantile are drawn as without recurrence; a resubmission then picks,
    among the templates of that size whose run-time quantile lies in the same `QUANTILE_BINS`-th of
    the table, one in proportion to how often each was submitted (a few scripts make most of the
    runs), and runs the template's run time spread by `within_cv`. So recurrence reshuffles who runs
    what, not how much: the sizes and run times of the trace keep their marginals (a choice in
    proportion to uses alone would let one rare 256-GPU, 72-hour template fill a week)."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        # A stream of its own for who submits what: the sizes and run times stay on the trace's.
        self.rng = random.Random(f"users-{recipe.seed}")
        self.popularity = [1 / (rank + 1) ** USER_ZIPF for rank in range(USERS)]
        #: (gpus, quantile bin) -> its templates
        self.cells: dict[tuple[int, int], list[_Template]] = {}
        self.made = 0  #: templates so far (names them)
        self.sigma = math.sqrt(math.log1p(recipe.within_cv ** 2))  #: of the lognormal spread

    def next_job(self, rng: random.Random, sizes: tuple[int, ...], weights: tuple[float, ...],
                 ) -> tuple[int, float, float, str, str]:
        """(gpus, run, limit, user, name) of the next job."""
        gpus = rng.choices(sizes, weights)[0]
        u = rng.random()
        cell = self.cells.setdefault((gpus, min(int(u * QUANTILE_BINS), QUANTILE_BINS - 1)), [])
        if cell and self.rng.random() < self.recipe.recurrence:
            template = self.rng.choices(cell, [t.submissions for t in cell])[0]
            template.submissions += 1
            spread = math.exp(self.rng.gauss(-self.sigma ** 2 / 2, self.sigma))
            return gpus, template.run * spread, template.limit, template.user, template.name
        run = duration_at(u)
        if gpus > 8:
            run *= (gpus / 8) ** self.recipe.size_exponent
        limit = time_limit(run, rng)
        self.made += 1
        user = f"u{self.rng.choices(range(USERS), self.popularity)[0]:03d}"
        name = f"job{self.made:05d}"
        cell.append(_Template(user, name, run, limit, 1))
        return gpus, run, limit, user, name


def generate(recipe: Recipe) -> Trace:
    """A trace for `recipe`; TraceError if the recipe cannot be met."""
    problem = recipe.problem()
    if problem:
        raise TraceError(problem)
    rng = random.Random(recipe.seed)
    sizes, weights = zip(*MIXES[recipe.mix].items(), strict=True)
    horizon = recipe.days * 86400
    target = recipe.load * recipe.shape.gpus * horizon  #: GPU-seconds the trace must offer
    drawn, offered = [], 0.0
    users = _Users(recipe) if recipe.recurrence else None
    while offered < target:
        if users is not None:
            gpus, run, limit, user, name = users.next_job(rng, sizes, weights)
        else:
            gpus = rng.choices(sizes, weights)[0]
            run = sample_duration(rng)
            if gpus > 8:
                run *= (gpus / 8) ** recipe.size_exponent
            limit = time_limit(run, rng)
            user = name = ""
        exit_code = 0
        if recipe.failures and rng.random() < recipe.failures:
            run, exit_code = run * rng.uniform(0, 0.5), 1
        run = max(1.0, round(run))
        offered += gpus * min(run, limit)
        drawn.append((gpus, run, limit, exit_code, user, name))
    times = _arrivals(len(drawn), horizon, rng)
    jobs = [TraceJob(id=f"j{i + 1:06d}", submit=round(at, 1), gpus=gpus, nodes=0, duration=run, time_limit=limit,
                     exit_code=exit_code, user=user, name=name)
            for i, (at, (gpus, run, limit, exit_code, user, name)) in enumerate(zip(times, drawn, strict=True))]
    # Queues from a stream of their own: the same seed gives the same jobs with or without queues.
    queue_rng = random.Random(f"queues-{recipe.seed}")
    names, shares = zip(*recipe.queue_mix, strict=True) if recipe.queue_mix else ((), ())
    jobs = [dataclasses.replace(j, nodes=j.tasks_on(recipe.shape),
                                queue=queue_rng.choices(names, shares)[0] if names else "") for j in jobs]
    return Trace(jobs, recipe.shape, (f"generated: {recipe.describe()}",))
