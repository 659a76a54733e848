"""Queue policy: which pending gangs to place in one scheduling round. Pure, like placement.

`schedule_round(state, now, previous)` reads a cluster state, never changes it, and returns the
plans to propose (in order), the reservation of the head blocked gang, and why every job left
waiting is waiting. The leader turns the plans into CommitPlan commands; the simulator applies them
directly. Both pass back the reservation of the previous round.

The policy, in queue order (priority, then submission time; once an admin has defined queues, gangs
within their queue's guarantee first, then by the weighted dominant share of their queue once
admitted, see synapse.core.preemption):

* A gang that fits is planned at once, and its resources count as used for the rest of the round.
  A gang that does not fit holds nothing.
* The first gang that does not fit (but would fit the idle cluster) gets a **reservation**: the
  nodes of the topology domain closest to fitting it, enough to hold it once they are empty. The
  reservation is sticky — kept for the same job and attempt while its nodes accept work — so its
  nodes only ever drain: nothing new lands there, and the gang cannot be starved.
* Jobs behind it are **backfilled** on nodes outside the reservation, or inside it when the job's
  `time_limit` ends before the reservation is expected to start (known only when every task on
  the reserved nodes has a time limit itself; otherwise the reserved nodes stay untouched).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from synapse.core.fsm import ClusterState
from synapse.core.model import Job, JobSpec, PackMode, Plan, Resources, Shortfall, topology_path
from synapse.core.placement import ClusterView, pack_depth, place
from synapse.core.preemption import admission_key, max_block, pool_of
from synapse.core.topology import Domain


@dataclass(frozen=True, slots=True)
class Reservation:
    """Nodes held back so the head blocked gang can start once they drain."""

    job_id: str
    attempt: int
    domain: Domain
    nodes: frozenset[str]
    starts_at: float  #: when the reserved nodes are expected to be empty; inf when unknown

    def describe(self) -> str:
        start = "unknown" if math.isinf(self.starts_at) else f"{self.starts_at:.0f}"
        return (f"job {self.job_id} holds {len(self.nodes)} node(s) in "
                f"{topology_path(self.domain)} (expected free at {start})")


#: Why a gang waits, a closed set ranked from the most to the least lasting (metrics count by it).
PENDING_REASONS = ("Unschedulable", "QueueAtMax", "BehindReservation", "Resources", "Preempting")


@dataclass(frozen=True, slots=True)
class WaitReason:
    """Why a pending job was not placed this round."""

    shortfalls: tuple[Shortfall, ...]
    message: str
    code: str = "Resources"  #: one of PENDING_REASONS

    def __str__(self) -> str:
        return "; ".join([self.message, *map(str, self.shortfalls)])


@dataclass(frozen=True, slots=True)
class RoundMemo:
    """What a round that placed nothing concluded, valid while only submissions follow it.

    Placement is deterministic, and a submission changes no capacity: the jobs that round saw
    would fail again exactly as they did. The next round then looks only at the jobs queued after
    them (if every new one queues behind them), carrying on with the same failed shapes and
    reservation. A leader with thousands of waiting jobs thus spends per submission, not per job in
    the queue. Time-dependent backfill (time limits) is refreshed by the periodic full round."""

    state: ClusterState  #: the state it read (a loaded snapshot is a new object: the memo lapses)
    other_changes: int  #: ClusterState.other_changes then
    seen: int  #: how many pending jobs it went through
    last_key: tuple | None  #: the queue entry of the last one
    failed: dict[tuple, WaitReason]
    reservation: Reservation | None
    waiting: dict[str, WaitReason]

    def valid_for(self, state: ClusterState) -> bool:
        if self.state is not state or self.other_changes != state.other_changes:
            return False
        # Every job it saw is still pending and none queued ahead of the last one.
        return self.seen == 0 or (len(state.pending) >= self.seen and state.pending[self.seen - 1] == self.last_key)


@dataclass(slots=True)
class RoundResult:
    plans: list[Plan] = field(default_factory=list)
    reservation: Reservation | None = None
    waiting: dict[str, WaitReason] = field(default_factory=dict)
    memo: RoundMemo | None = None  #: set when the round placed nothing
    #: the jobs this round looked at and left waiting (a round after submissions alone looks only
    #: at the new ones): whoever records reasons need not walk the whole queue
    examined: list[str] = field(default_factory=list)


def _shape(spec: JobSpec, may_use_reservation: bool) -> tuple:
    """Jobs of the same shape fit or fail alike within one round (claims only grow). A job that
    holds nodes from a preemption is a shape of its own (see schedule_round)."""
    r, t = spec.resources, spec.topology
    return (spec.tasks, r.cpu, r.memory, r.gpu, t.pack, t.mode, may_use_reservation)


def schedule_round(state: ClusterState, now: float, previous: Reservation | None = None,
                   memo: RoundMemo | None = None) -> RoundResult:
    """Plans for the pending gangs that can start now, and the head blocked gang's reservation.

    With a `memo` of the round before that still holds, only the jobs queued since are examined."""
    view = ClusterView(state.nodes, state.index, state.levels)
    result = RoundResult()
    failed: dict[tuple, WaitReason] = {}
    reservation: Reservation | None = None
    start = 0
    if memo is not None and memo.valid_for(state):
        failed, reservation, start = dict(memo.failed), memo.reservation, memo.seen
        result.waiting = dict(memo.waiting)
    held = frozenset(state.held_nodes)  #: nodes kept for preemptors: no one else is placed there
    claimed: dict[str, Resources] = {}  #: queue -> what this round's plans add to its usage
    queue_order = _queue_order(state) if state.queues else None
    if queue_order is not None and start:
        start = 0  # the order depends on usage: no memo (it assumes the plain queue order)
        failed, reservation, result.waiting = {}, None, {}
    # Gangs that preempted others go first: the nodes held for them are theirs alone, and the head
    # reservation must not fall on them for another job.
    holders = [state.jobs[j] for j in sorted(state.holds) if j in state.jobs] if start == 0 else []
    for job in [*holders, *(j for j in (queue_order if queue_order is not None else state.pending_jobs(start))
                            if j.id not in state.holds)]:
        may_use_reservation = reservation is None or (
            bool(job.spec.time_limit) and not math.isinf(reservation.starts_at)
            and now + job.spec.time_limit <= reservation.starts_at)
        beyond_max = max_block(state, job, claimed) if state.queues else ""
        if beyond_max:
            result.waiting[job.id] = WaitReason((), beyond_max, "QueueAtMax")
            result.examined.append(job.id)
            continue
        hold = state.holds.get(job.id)
        shape = (job.id,) if hold else _shape(job.spec, may_use_reservation)
        if shape in failed:
            result.waiting[job.id] = failed[shape]
            result.examined.append(job.id)
            continue
        blocked = held - frozenset(hold.nodes) if hold else held
        if reservation is not None and not may_use_reservation:
            blocked = blocked | reservation.nodes
        view.set_blocked(blocked)
        placed = place(view, job.id, job.attempt, job.spec)
        if placed.plan is not None:
            result.plans.append(placed.plan)
            view.claim(placed.plan, job.spec.resources)
            name = state.queue_of(job)
            claimed[name] = claimed.get(name, Resources()) + job.spec.total
            continue
        if hold is not None:
            result.examined.append(job.id)
            result.waiting[job.id] = failed[shape] = WaitReason(
                placed.shortfalls, f"waits for the gangs it preempted ({', '.join(hold.victims)}) to stop; "
                                   f"{', '.join(hold.nodes)} held for it", "Preempting")
            continue
        if reservation is None:
            reservation = _reserve(state, view, job, now, previous)
            message = ("does not fit now; " + reservation.describe() if reservation else
                       "can never fit: no domain it may use is large enough even when idle")
            code = "Resources" if reservation else "Unschedulable"
        else:
            message = f"does not fit outside the reservation ({reservation.describe()})"
            code = "BehindReservation"
        result.waiting[job.id] = failed[shape] = WaitReason(placed.shortfalls, message, code)
        result.examined.append(job.id)
    result.reservation = reservation
    if not result.plans and queue_order is None:
        seen = len(state.pending)
        result.memo = RoundMemo(state, state.other_changes, seen, state.pending[seen - 1] if seen else None,
                                failed, reservation, result.waiting)
    return result


def _queue_order(state: ClusterState) -> list[Job]:
    """With queues defined: gangs within their queue's guarantee first, then by fair share."""
    pool = pool_of(state)
    return sorted(state.pending_jobs(), key=lambda job: admission_key(state, job, pool))


def _reserve(state: ClusterState, view: ClusterView, job: Job, now: float,
             previous: Reservation | None) -> Reservation | None:
    if (previous is not None and previous.job_id == job.id and previous.attempt == job.attempt
            and all(state.index.contains(n) for n in previous.nodes)):
        return Reservation(job.id, job.attempt, previous.domain, previous.nodes,
                           _expected_free_at(state, previous.nodes, now))
    domain = _closest_domain(view, job.spec)
    if domain is None:
        return None
    nodes = _nodes_to_hold(state, view, domain, job.spec)
    return Reservation(job.id, job.attempt, domain, nodes, _expected_free_at(state, nodes, now))


def _closest_domain(view: ClusterView, spec: JobSpec) -> Domain | None:
    """The lowest-level domain able to hold the gang when idle with the most room now."""
    n, per_task = spec.tasks, spec.resources
    leaf = len(view.levels)
    lowest = 0
    if spec.topology.mode is PackMode.REQUIRED and spec.topology.pack:
        lowest = min(pack_depth(view.levels, spec.topology.pack), leaf)
    for depth in range(leaf, lowest - 1, -1):
        able = [key for key in view.index.by_depth[depth]
                if view.bound(key, per_task, when_empty=True) >= n]
        if able:
            return min(able, key=lambda k: (-view.bound(k, per_task), k))
    return None


def _nodes_to_hold(state: ClusterState, view: ClusterView, domain: Domain, spec: JobSpec) -> frozenset[str]:
    """Nodes of `domain` with the most room now, enough to hold the gang once empty."""
    per_task = spec.resources
    racks = [k for k in state.index.by_depth[len(state.levels)] if k[:len(domain)] == domain]
    candidates = []
    for rack in racks:
        for _, _, _, node_id in state.index.domains[rack].entries:  # type: ignore[union-attr]
            when_empty = per_task.count_in(state.nodes[node_id].capacity)
            if when_empty > 0:
                candidates.append((-view.tasks_fit(node_id, per_task), -when_empty, node_id))
    held, room = [], 0
    for _, neg_empty, node_id in sorted(candidates):
        held.append(node_id)
        room -= neg_empty
        if room >= spec.tasks:
            break
    return frozenset(held)


def _expected_free_at(state: ClusterState, nodes: frozenset[str], now: float) -> float:
    """When every live task on these nodes will have hit its time limit (inf if one has none)."""
    latest = now
    for node_id in nodes:
        for task, _ in state.tasks_on_node(node_id):
            limit = state.jobs[task.job_id].spec.time_limit
            if not limit:
                return math.inf
            latest = max(latest, (task.started_at or now) + limit)
    return latest
