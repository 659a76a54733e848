"""Elastic gangs: `tasks: {min: 4, max: 8}`. Pure.

An elastic gang starts all-or-nothing at the largest size between its min and max that fits now
(topology as usual), and waits, holding nothing, while not even its min fits. While it runs below
its max, the leader grows it when room appears and nothing waits ahead of it in the queue: a
`ResizeGang` stops the attempt with its grace (SIGTERM, a checkpoint, then SIGKILL) and the job is
requeued, using none of its restarts, to start again at the larger size; at most once per
`resize_interval` (default DEFAULT_RESIZE_INTERVAL_S). Each attempt's size is its WORLD_SIZE;
`SYNAPSE_TASKS_MIN` / `SYNAPSE_TASKS_MAX` and a rendezvous id stable across attempts
(`SYNAPSE_RDZV_ID`) let torchrun's elastic launcher follow (synapse.master.dispatch).
"""

from __future__ import annotations

import dataclasses

from synapse.core.model import Job, JobSpec, JobStatus, PackMode, Plan
from synapse.core.schedule.placement import ClusterView, pack_depth, place

#: How long an elastic gang runs at one size before it may grow, unless its spec says otherwise.
DEFAULT_RESIZE_INTERVAL_S = 600.0


def is_elastic(spec: JobSpec) -> bool:
    return 0 < spec.tasks_min < spec.tasks


def least(spec: JobSpec) -> int:
    """The fewest tasks the gang may run with."""
    return spec.tasks_min if is_elastic(spec) else spec.tasks


def at_size(spec: JobSpec, size: int) -> JobSpec:
    """The spec of one attempt at `size` tasks (what placement is asked for)."""
    return dataclasses.replace(spec, tasks=size)


def place_largest(view: ClusterView, job_id: str, attempt: int, spec: JobSpec, low: int = 0) -> Plan | None:
    """A plan at the largest size from `low` (default the min) up to the max that fits `view` now,
    or None. A binary search: a gang that fits at n fits at n - 1 (drop any one task)."""
    if not is_elastic(spec):
        return place(view, job_id, attempt, spec, with_reasons=False).plan
    best = place(view, job_id, attempt, spec, with_reasons=False).plan
    if best is not None:
        return best
    lo, hi = max(low or spec.tasks_min, 1), min(spec.tasks - 1, view.bound((), spec.resources))
    while lo <= hi:
        mid = (lo + hi) // 2
        plan = place(view, job_id, attempt, at_size(spec, mid), with_reasons=False).plan
        if plan is not None:
            best, lo = plan, mid + 1
        else:
            hi = mid - 1
    return best


def required_domain_problem(view: ClusterView, spec: JobSpec) -> str:
    """Why an elastic gang whose topology is `required` can never start (no domain of its pack
    level holds its min even when idle), or ''."""
    if not is_elastic(spec) or spec.topology.mode is not PackMode.REQUIRED or not spec.topology.pack:
        return ""
    depth = min(pack_depth(view.levels, spec.topology.pack), len(view.levels))
    if spec.topology.pack == "node":
        most = max((spec.resources.count_in(n.capacity) for n in view.nodes.values()), default=0)
    else:
        most = max((view.bound(key, spec.resources, when_empty=True) for key in view.index.by_depth[depth]),
                   default=0)
    if most < 0 or most >= spec.tasks_min:
        return ""
    return (f"no {spec.topology.pack} holds its min of {spec.tasks_min} task(s) even when idle (at most {most}); "
            "topology mode is required")


def growth(view: ClusterView, job: Job, now: float) -> int:
    """The size a running elastic gang may grow to now (room for the extra tasks beside it), or 0.
    Whoever asks has checked that nothing waits ahead of it in the queue."""
    spec, size = job.spec, len(job.tasks)
    if not is_elastic(spec) or job.status is not JobStatus.RUNNING or size >= spec.tasks:
        return 0
    if now - job.placed_at < (spec.resize_interval or DEFAULT_RESIZE_INTERVAL_S):
        return 0
    # The restarted gang gets its own tasks' room back: it grows by what fits beside it now.
    extra = place_largest(view, job.id, job.attempt, dataclasses.replace(spec, tasks=spec.tasks - size,
                                                                         tasks_min=min(1, spec.tasks - size - 1)),
                          low=1)
    return size + len(extra.placements) if extra is not None else 0
