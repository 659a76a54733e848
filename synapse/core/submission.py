"""The rules a submission must meet against the cluster as it stands: a queue that exists and takes
its submitter, upstream jobs the state knows, a task some node can hold, an elastic gang some domain
can hold. Pure: the API converts the request, asks `refusal` under the master lock and maps the
answer to a status code; apply may ask the same (it does not yet).

The spec's own shape (synapse.core.jobs.jobspec.check_spec) and a retried request id are checked apart:
they need no state, or decide before these rules are asked.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from synapse.core.jobs import dependencies
from synapse.core.model import DEFAULT_QUEUE, JobSpec, Queue
from synapse.core.schedule import elastic
from synapse.core.schedule.placement import ClusterView

if TYPE_CHECKING:
    from synapse.core.state.fsm import ClusterState


class Refused(enum.Enum):
    """Why a submission is refused, as a kind the API maps to a status code."""

    INVALID = "invalid"  #: the job cannot be run here as written
    DENIED = "denied"  #: the submitter may not submit it (a queue's users and groups)


@dataclass(frozen=True, slots=True)
class Submitter:
    """Who submits: a user's name, its groups, and whether it is an admin."""

    name: str
    groups: tuple[str, ...] = ()
    is_admin: bool = False


@dataclass(frozen=True, slots=True)
class Refusal:
    """A refused submission: its kind and the reason, naming the field (`queue: ...`)."""

    kind: Refused
    reason: str


def queue_denial(queue: Queue, submitter: Submitter) -> str:
    """Why `submitter` may not submit to `queue` (it names users or groups, and neither takes it), or ''."""
    if not (queue.users or queue.groups) or submitter.is_admin or submitter.name in queue.users \
            or set(submitter.groups) & set(queue.groups):
        return ""
    return (f"user {submitter.name} may not submit to queue {queue.name}: it takes users "
            f"{', '.join(queue.users) or '-'} and groups {', '.join(queue.groups) or '-'}")


def refusal(state: ClusterState, spec: JobSpec, submitter: Submitter) -> Refusal | None:
    """Why the cluster refuses `spec` from `submitter` now, the first rule broken in the order the
    API has always answered them, or None (read it under the master lock)."""
    unplaceable = elastic.required_domain_problem(ClusterView(state.nodes, state.index, state.levels), spec)
    if unplaceable:
        return Refusal(Refused.INVALID, f"tasks.min: {unplaceable}")
    unknown = [j for _kind, j in spec.after if not dependencies.known(state, j)]
    if unknown:
        return Refusal(Refused.INVALID, f"after: unknown job {unknown[0]} (not submitted, or forgotten too long ago)")
    queue = state.queues.get(spec.queue)
    if queue is None and spec.queue != DEFAULT_QUEUE:
        return Refusal(Refused.INVALID, f"queue: unknown queue {spec.queue}")
    denied = queue_denial(queue, submitter) if queue is not None else ""
    if denied:
        return Refusal(Refused.DENIED, denied)
    largest = state.largest
    if state.nodes and not spec.resources.fits_in(largest):
        return Refusal(Refused.INVALID,
                       f"resources: no node can hold one task: {', '.join(spec.resources.short_of(largest))} per "
                       f"task is more than the largest node has (gpu {largest.gpu}, cpu {largest.cpu}m, memory "
                       f"{largest.memory})")
    return None
