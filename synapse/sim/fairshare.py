"""Two teams over a week on the real state machine and leader brain: does fair share remember?

Team A has the cluster to itself on the first day; from then on both teams keep it full of 8-GPU
jobs of 30 to 90 minutes (an hour on average; each team always has more waiting than the cluster
can hold). With a usage half-life
(synapse.core.schedule.fairshare), admission puts team B first while team A's recent GPU time weighs on it,
so B runs more than its weight's share of each day until the decayed usage of the two matches their
weights; with a half-life of 0, admission sees current usage only and the first day is never paid
back. `synapse-sim fair-share` prints both runs, day by day.
"""

from __future__ import annotations

from dataclasses import dataclass

from synapse.core import commands as c
from synapse.core.model import JobSpec, Queue, Resources
from synapse.core.schedule.fairshare import value_at
from synapse.sim.engine import Simulator, uniform_cluster

DAY = 86400.0
TEAMS = ("team-a", "team-b")


@dataclass(frozen=True, slots=True)
class Day:
    """One simulated day: GPU-hours each team ran, and its share of the decayed usage at the day's end."""

    day: int
    gpu_hours: tuple[float, float]
    decayed_share: tuple[float, float]


def two_teams(half_life: float, *, days: int = 7, weights: tuple[float, float] = (1.0, 1.0), nodes: int = 8,
              job_hours: float = 1.0, b_joins_day: float = 1.0) -> list[Day]:
    """Run the scenario of the module docstring; one `Day` per simulated day."""
    sim = Simulator()
    for cmd in uniform_cluster(racks_per_block=1, nodes_per_rack=nodes):
        sim.apply(cmd)
    sim.apply(c.ApplyQueues(at=0, queues=tuple(Queue(name, weight=w) for name, w in zip(TEAMS, weights,
                                                                                            strict=True))))
    sim.apply(c.SetUsageHalfLife(at=0, half_life=half_life))
    specs = {team: JobSpec(name=team, tasks=1, resources=Resources(8000, 64 << 30, 8), command=("train",),
                           queue=team) for team in TEAMS}
    used = {team: [0.0] * days for team in TEAMS}
    out: list[Day] = []
    submitted = 0
    while sim.now < days * DAY:
        for team in TEAMS:  # keep each active team's backlog above what the cluster holds
            if team == "team-b" and sim.now < b_joins_day * DAY:
                continue
            waiting = sum(1 for j in sim.state.pending_jobs() if j.spec.queue == team)
            for _ in range(nodes + 1 - waiting):
                submitted += 1  # durations spread evenly over 0.5x..1.5x, so slots free one by one
                sim.submit(specs[team], job_hours * 3600 * (0.5 + (submitted * 7 % 11) / 10))
        sim.schedule()
        held = {team: sim.state.queue_usage.get(team, Resources()).gpu for team in TEAMS}
        start, end = sim.now, min(sim.next_event_at() or days * DAY, days * DAY)
        t = start
        while t < end:  # the GPU-seconds held until the next event, into each day they fall in
            day = int(t // DAY)
            stop = min(end, (day + 1) * DAY)
            for team in TEAMS:
                used[team][day] += held[team] * (stop - t)
            if stop == (day + 1) * DAY:
                out.append(_day(sim, day, used, half_life, stop))
            t = stop
        sim.advance(end)
        if sim.now >= days * DAY:
            break
    return out


def _day(sim: Simulator, day: int, used: dict[str, list[float]], half_life: float, at: float) -> Day:
    decayed = [value_at(sim.state.queue_decay.get(team), at, half_life) for team in TEAMS]
    total = sum(decayed)
    a, b = TEAMS
    return Day(day, (used[a][day] / 3600, used[b][day] / 3600),
               (decayed[0] / total if total else 0.0, decayed[1] / total if total else 0.0))


def table(with_memory: list[Day], without: list[Day], half_life_days: float) -> str:
    """The two runs side by side: team A's share of each day's GPU-hours, and of the decayed usage."""
    lines = ["day  A's share of the day's GPU-hours       A's share of decayed usage",
             f"     half-life {half_life_days:g}d   half-life 0           half-life {half_life_days:g}d"]
    for m, z in zip(with_memory, without, strict=True):
        share_m = m.gpu_hours[0] / (sum(m.gpu_hours) or 1)
        share_z = z.gpu_hours[0] / (sum(z.gpu_hours) or 1)
        lines.append(f"{m.day + 1:>3}  {share_m:>8.1%}        {share_z:>8.1%}            {m.decayed_share[0]:>8.1%}")
    return "\n".join(lines)
