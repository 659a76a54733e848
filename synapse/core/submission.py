"""The rules a submission must meet against the cluster as it stands: a queue that exists and takes
its submitter, within the queue's per-user job limit and, for an interactive job, its maximum
duration; upstream jobs the state knows, a task some node can hold, an elastic gang some domain can
hold. Pure: the API converts the request, asks `refusal` under the master lock and maps the answer
to a status code. Apply asks `limit_problem` again for a submission (two submissions may each pass
the API's check and not both fit), and `queue_refusal` whole when a job moves to another queue
(UpdateJob).

The spec's own shape (synapse.core.jobs.jobspec.check_spec) and a retried request id are checked apart:
they need no state, or decide before these rules are asked.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from synapse.core.identity import ANONYMOUS, BOOTSTRAP_ADMIN
from synapse.core.jobs import dependencies
from synapse.core.jobs.arrays import MAX_ARRAY_SIZE, parse_array, size_of
from synapse.core.jobs.quantity import format_duration
from synapse.core.model import DEFAULT_QUEUE, UNLIMITED, JobSpec, Queue, Role
from synapse.core.schedule import elastic
from synapse.core.schedule.placement import ClusterView

if TYPE_CHECKING:
    from synapse.core.state.tables import ClusterTables


class Refused(enum.Enum):
    """Why a submission is refused, as a kind the API maps to a status code."""

    INVALID = "invalid"  #: the job cannot be run here as written
    DENIED = "denied"  #: the submitter may not submit it (a queue's users and groups)
    LIMIT = "limit"  #: the submitter has as many jobs in the queue as its per-user limit allows


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


def refusal(state: ClusterTables, spec: JobSpec, submitter: Submitter, earlier: int = 0) -> Refusal | None:
    """Why the cluster refuses `spec` from `submitter` now, the first rule broken in the order the
    API has always answered them, or None (read it under the master lock). `earlier`: the jobs the
    same request submits to the same queue before this one (SubmitJobs), which its per-user job
    limit counts as if they were there already."""
    unplaceable = elastic.required_domain_problem(ClusterView(state.nodes, state.index, state.levels), spec)
    if unplaceable:
        return Refusal(Refused.INVALID, f"tasks.min: {unplaceable}")
    unknown = [j for _kind, j in spec.after if not dependencies.known(state, j)]
    if unknown:
        return Refusal(Refused.INVALID, f"after: unknown job {unknown[0]} (not submitted, or forgotten too long ago)")
    refused = queue_refusal(state, spec, submitter, earlier=earlier)
    if refused is not None:
        return refused
    largest = state.largest
    if state.nodes and not spec.resources.fits_in(largest):
        return Refusal(Refused.INVALID,
                       f"resources: no node can hold one task: {', '.join(spec.resources.short_of(largest))} per "
                       f"task is more than the largest node has (gpu {largest.gpu}, cpu {largest.cpu}m, memory "
                       f"{largest.memory})")
    return None


def queue_refusal(state: ClusterTables, spec: JobSpec, submitter: Submitter, moving: str = "",
                  earlier: int = 0) -> Refusal | None:
    """Why the queue `spec` names does not take it from `submitter`: unknown, its users and groups,
    its per-user job limit, its interactive maximum; or None. `moving`: the id of a job of
    `submitter` moving into this queue (it does not count against the limit twice); `earlier`: jobs
    of the same request ahead of it in this queue (counted against the limit)."""
    name = spec.queue or DEFAULT_QUEUE
    queue = state.queues.get(name)
    if queue is None and name != DEFAULT_QUEUE:
        return Refusal(Refused.INVALID, f"queue: unknown queue {name}")
    denied = queue_denial(queue, submitter) if queue is not None else ""
    if denied:
        return Refusal(Refused.DENIED, denied)
    problem = interactive_problem(spec, queue)
    if problem:
        return Refusal(Refused.INVALID, problem)
    problem = user_jobs_problem(state, spec, submitter.name, moving, earlier)
    return Refusal(Refused.LIMIT, problem) if problem else None


def limit_problem(state: ClusterTables, spec: JobSpec, user: str, moving: str = "") -> str:
    """What apply re-checks of a submission against its queue: its interactive maximum and the
    per-user job limit ('' when within both, or the queue is unknown: apply refuses that apart)."""
    queue = state.queues.get(spec.queue or DEFAULT_QUEUE)
    return interactive_problem(spec, queue) or user_jobs_problem(state, spec, user, moving)


def interactive_problem(spec: JobSpec, queue: Queue | None) -> str:
    """Why an interactive spec breaks its queue's maximum duration, or ''. Its time limit must be
    set (the API sets it to the maximum when the job gives none) and at most the maximum."""
    if not spec.interactive:
        return ""
    longest = (queue or Queue(DEFAULT_QUEUE)).interactive_max_duration
    where = f"queue {queue.name if queue else DEFAULT_QUEUE}"
    if spec.time_limit <= 0:
        return f"time_limit: an interactive job needs one (at most {format_duration(longest)} in {where})"
    if spec.time_limit > longest:
        return (f"time_limit: an interactive job may run at most {format_duration(longest)} in {where} (its "
                f"interactive max_duration), not {format_duration(spec.time_limit)}")
    return ""


def user_jobs_problem(state: ClusterTables, spec: JobSpec, user: str, moving: str = "", earlier: int = 0) -> str:
    """Why `user` may not add `spec` (an array counts its elements) to its queue by the queue's
    max_per_user jobs limit, or ''. Only a queue that sets the limit counts anything. `earlier`:
    jobs the same request adds to this queue before `spec`, counted as if already there."""
    queue = state.queues.get(spec.queue or DEFAULT_QUEUE)
    if queue is None or queue.user_jobs == UNLIMITED:
        return ""
    have = unfinished_jobs(state, queue.name, user, skip=moving)
    adding = elements(spec)
    if have + earlier + adding <= queue.user_jobs:
        return ""
    return (f"queue {queue.name}: user {user or '-'} has {have} pending or running job(s) there"
            + (f", this request adds {earlier} before this one," if earlier else "")
            + f" and its max_per_user.jobs is {queue.user_jobs}" + (f"; this array adds {adding}" if spec.array else "")
            + ": wait for some to end, or cancel some")


def unfinished_jobs(state: ClusterTables, queue: str, user: str, skip: str = "") -> int:
    """Pending and running jobs of `user` in `queue`: its unfinished jobs, and its arrays' elements
    that are not jobs yet (what max_per_user.jobs counts). A pass over the jobs: asked only of a
    queue that sets the limit."""
    count = sum(1 for j in state.jobs.values() if j.user == user and not j.status.terminal and j.id != skip
                and (j.spec.queue or DEFAULT_QUEUE) == queue)
    count += sum(a.remaining() for a in state.arrays.values() if a.user == user and not a.done
                 and (a.spec.queue or DEFAULT_QUEUE) == queue)
    return count


def elements(spec: JobSpec) -> int:
    """Jobs a submission of `spec` adds: one, or an array's elements."""
    return size_of(parse_array(spec.array, MAX_ARRAY_SIZE)[0]) if spec.array else 1


def submitter_of(state: ClusterTables, name: str) -> Submitter:
    """A user as apply knows it (its groups and role from the state): the cluster's own identities
    (the bootstrap admin, an open cluster's anonymous caller, no name at all) are admins."""
    user = state.users.get(name)
    if user is None:
        return Submitter(name, is_admin=name in ("", BOOTSTRAP_ADMIN, ANONYMOUS))
    return Submitter(name, user.groups, user.role is Role.ADMIN)
