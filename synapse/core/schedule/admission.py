"""Queue admission: the limits and the order in which queued gangs may take resources. Pure.

Admins define queues; a job runs in the queue its spec names (or the default queue). Admission
asks two things of a waiting gang:

* **limits** — a queue (with its children, for a parent) may never hold more than its `max`;
  `max_block` says why a gang would break that, counting usage claimed earlier in the same round;
  one user's gangs in a queue never more GPUs than its `max_per_user.gpu` (`user_block`).
* **order** — across queues, gangs whose queue stays within its `guaranteed` resources once they run
  come first; then the lowest weighted dominant share once admitted (Kueue's: the largest fraction
  of the READY pool the queue uses beyond its guarantee, plus, with a usage half-life, the decayed
  GPU time it used lately as a fraction of the pool's (synapse.core.schedule.fairshare), over its weight);
  within a queue, priority then submission time.

The scheduler asks both on every round; preemption planning uses the same guarantees and shares
to choose its victims (on current usage alone).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from synapse.core.model import UNLIMITED, Job, NodeStatus, Queue, Resources
from synapse.core.schedule.fairshare import history_share
from synapse.core.schedule.view import ClusterRead

_DIMENSIONS = ("gpu", "cpu", "memory")


def queue_of(state: ClusterRead, job: Job) -> Queue:
    """The job's queue (an undefined one as an unlimited queue with no guarantee)."""
    name = state.queue_of(job)
    return state.queues.get(name) or Queue(name)


def usage_of(state: ClusterRead, name: str) -> Resources:
    """What the live tasks of a queue's jobs hold now."""
    return state.queue_usage.get(name, Resources())


def _above(amount: Resources, limit: Resources) -> list[str]:
    """Dimensions in which `amount` exceeds a limit (UNLIMITED dimensions never do)."""
    return [d for d in _DIMENSIONS if getattr(limit, d) != UNLIMITED and getattr(amount, d) > getattr(limit, d)]


def beyond_guarantee(amount: Resources, guaranteed: Resources) -> list[str]:
    """Dimensions in which `amount` is more than guaranteed. Only the dimensions a queue declares
    a guarantee in count; a queue with no guarantee at all borrows all it uses."""
    declared = [d for d in _DIMENSIONS if getattr(guaranteed, d) > 0]
    return [d for d in declared or _DIMENSIONS if getattr(amount, d) > getattr(guaranteed, d)]


def pool_of(state: ClusterRead) -> Resources:
    """What the READY nodes hold in all: the pool that shares are fractions of."""
    total = Resources()
    for node in state.nodes.values():
        if node.status is NodeStatus.READY:
            total = total + node.capacity
    return total


def share(queue: Queue, usage: Resources, pool: Resources) -> float:
    """Kueue's weighted dominant share: the largest fraction of the pool the queue uses beyond its
    guarantee, over its weight."""
    worst = 0.0
    for d in _DIMENSIONS:
        total = getattr(pool, d)
        if total > 0:
            worst = max(worst, max(0, getattr(usage, d) - getattr(queue.guaranteed, d)) / total)
    return worst / queue.weight


def admission_key(state: ClusterRead, job: Job, pool: Resources) -> tuple[bool, float, tuple[int, float, int]]:
    """Order across queues: gangs that stay within their queue's guarantee first, then the lowest
    share after admission; within a queue, priority then submission time (the job's queue key)."""
    queue = queue_of(state, job)
    after = usage_of(state, queue.name) + job.spec.total
    remembered = history_share(state.queue_decay.get(queue.name), state.usage_clock, state.usage_half_life, pool.gpu)
    return (bool(beyond_guarantee(after, queue.guaranteed)) if _declares(queue) else True,
            share(queue, after, pool) + remembered / queue.weight, job.queue_key())


def admission_order(state: ClusterRead, jobs: Iterable[Job]) -> list[Job]:
    """`jobs` (given in queue order: priority, then submission) in admission's order: within a
    queue they keep their order; across queues, the next gang of each queue competes by its
    `admission_key`, as Kueue's queue heads do. A job's key is not compared with the keys of its
    own queue's jobs: its size would then order them (the key is its queue's share once it runs),
    smallest first, and a big gang would sort behind every smaller one of its queue."""
    pool = pool_of(state)
    by_queue: dict[str, list[Job]] = {}
    for job in jobs:
        by_queue.setdefault(state.queue_of(job), []).append(job)
    heads = [(admission_key(state, queued[0], pool), name, 0) for name, queued in by_queue.items()]
    heapq.heapify(heads)
    order: list[Job] = []
    while heads:
        _, name, i = heapq.heappop(heads)
        queued = by_queue[name]
        order.append(queued[i])
        if i + 1 < len(queued):
            heapq.heappush(heads, (admission_key(state, queued[i + 1], pool), name, i + 1))
    return order


def _declares(queue: Queue) -> bool:
    return any(getattr(queue.guaranteed, d) > 0 for d in _DIMENSIONS)


def max_block(state: ClusterRead, job: Job, extra: dict[str, Resources] | None = None) -> str:
    """Why the job's queue (or its parent) may not take the job now, by its `max`; or ''.
    `extra`: usage claimed earlier in the same scheduling round, by queue."""
    extra = extra or {}
    queue = queue_of(state, job)
    need = job.spec.total
    chain = [queue] + ([state.queues[queue.parent]] if queue.parent in state.queues else [])
    for q in chain:
        members = [q.name] + ([n for n, child in state.queues.items() if child.parent == q.name] if q is not queue
                              else [])
        used = Resources()
        for name in members:
            used = used + usage_of(state, name) + extra.get(name, Resources())
        over = _above(used + need, q.max)
        if over:
            d = over[0]
            return (f"queue {q.name} is at its max: {d} {getattr(used, d)} in use of {getattr(q.max, d)}, "
                    f"the job needs {getattr(need, d)}")
    return ""


def user_block(state: ClusterRead, job: Job, extra: dict[tuple[str, str], int] | None = None) -> str:
    """Why the job's user may not take more GPUs in its queue now, by the queue's max_per_user.gpu;
    or ''. `extra`: GPUs claimed earlier in the same round, by (queue, user)."""
    name = state.queue_of(job)
    queue = state.queues.get(name)
    if queue is None or queue.user_gpu == UNLIMITED:
        return ""
    need = job.spec.total.gpu
    if not need:
        return ""
    key = (name, job.user)
    used = state.user_usage.get(key, Resources()).gpu + (extra or {}).get(key, 0)
    if used + need <= queue.user_gpu:
        return ""
    return (f"user limit: {queue.user_gpu} GPUs in queue {name} (max_per_user.gpu): user {job.user or '-'} "
            f"holds {used}, the job needs {need}")
