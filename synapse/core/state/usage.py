"""The usage table: what each queue's live tasks hold, the decayed GPU usage of queues and users
(synapse.core.schedule.fairshare), and the nodes held for preemptors.

State: `queue_usage`, `user_usage`, `queue_decay`, `user_decay`, `usage_clock`, `usage_half_life`, `holds`,
`held_nodes`. Command: SetUsageHalfLife. `count_usage` and `release_hold` are called by the job
transitions (synapse.core.state.transitions) and, for `count_usage`, by a snapshot's rebuild.
"""

from __future__ import annotations

from synapse.core import commands as c
from synapse.core.commands import Result
from synapse.core.model import DEFAULT_QUEUE, Job, Resources
from synapse.core.schedule import fairshare
from synapse.core.state.tables import ClusterTables


def queue_of(job: Job) -> str:
    """The queue a job is counted in: its spec's, else the default queue."""
    return job.spec.queue or DEFAULT_QUEUE


def count_usage(state: ClusterTables, job: Job, delta: Resources, at: float | None = None) -> None:
    """Count what the job's live tasks take (or give back) in its queue's usage; with `at` (in
    apply, not when a snapshot rebuilds it), in the decayed usage of its queue and user too."""
    name = queue_of(job)
    state.queue_usage[name] = state.queue_usage.get(name, Resources()) + delta
    key = (name, job.user)
    state.user_usage[key] = state.user_usage.get(key, Resources()) + delta
    if at is not None:
        half_life = state.usage_half_life
        state.queue_decay[name] = fairshare.accrue(state.queue_decay.get(name), delta.gpu, at, half_life)
        state.user_decay[job.user] = fairshare.accrue(state.user_decay.get(job.user), delta.gpu, at, half_life)
        state.usage_clock = max(state.usage_clock, at)


def release_hold(state: ClusterTables, job_id: str) -> None:
    """Forget the nodes held for a preemptor (placed, ended, or its plan lapsed)."""
    hold = state.holds.pop(job_id, None)
    if hold is not None:
        for node_id in hold.nodes:
            state.held_nodes.pop(node_id, None)


def set_usage_half_life(state: ClusterTables, cmd: c.SetUsageHalfLife) -> Result:
    """A new half-life for the decayed usage; every entry is first decayed to the command's time under
    the old one."""
    if cmd.half_life < 0:
        return Result.rejected("the usage half-life must not be negative")
    for table in (state.queue_decay, state.user_decay):  # decayed up to now under the old half-life
        for key, entry in table.items():
            table[key] = fairshare.accrue(entry, 0, cmd.at, state.usage_half_life)
    state.usage_half_life = cmd.half_life
    return Result(True)
