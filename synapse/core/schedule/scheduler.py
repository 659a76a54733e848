"""Queue policy: which pending gangs to place in one scheduling round. Pure, like placement.

`schedule_round(state, now, previous)` reads a cluster state, never changes it, and returns the
plans to propose (in order), the reservation of the head blocked gang, and why every job left
waiting is waiting. The leader turns the plans into CommitPlan commands; the simulator applies them
directly. Both pass back the reservation of the previous round.

The policy, in queue order (priority, then submission time; once an admin has defined queues, gangs
within their queue's guarantee first, then by the weighted dominant share of their queue once
admitted, see synapse.core.schedule.admission):

* A gang that fits is planned at once, and its resources count as used for the rest of the round.
  A gang that does not fit holds nothing. "Fits" includes locality (delay scheduling, Zaharia et
  al.): a multi-task gang with `preferred` packing that one domain of its pack level (a rack when
  it names none) would hold when idle fits only inside one such domain for `Tuning.locality_wait_s`
  after its submission; after that it takes a split placement, and a gang no such domain can hold
  is split at once. Waiting is what keeps gangs in one rack: when a gang finally fits, it is
  usually in the holes the others left, across racks. The wait is bounded, so no gang starves.
  A gang that would hold a reservation (below) does not wait when waiting does not pay: if, run
  split at `Tuning.spread_factor` of its speed, it is expected to end (start split + run /
  spread_factor) before it would end in one domain (start there + run), it takes the split
  placement now, or reserves the nodes that free first anywhere (`split_pays`). The queue waits
  behind such a gang, so its rack wait is everyone's.
* The first `Tuning.reservations` gangs that do not fit (but would fit the idle cluster) each get a
  **reservation** (those behind the head only if it is expected to start within
  `Tuning.reserve_within_s`), and jobs behind them are **backfilled** around the reservations: when nodes are
  expected to drain, which a gang reserves and who may run on them meanwhile is
  synapse.core.schedule.reservations.
* A **restart** after a lost node (synapse.core.schedule.spares.restarting) keeps its place in the queue
  (its original submission: ahead of what arrived since, not of what waited before it, whose
  reservations it respects), is placed in the domain of its last run first (its survivors and
  replacements there), waits for no rack, and always reserves, beyond `Tuning.reservations`;
  waiting for nodes that are DOWN, it keeps the usable nodes of its domain.
  **Spares** take restarts anywhere and other jobs only if they have a time limit and fit nowhere
  else; reservations of other gangs never hold them (the leader evicts their guests for a restart).

The round reads the cluster through a `ClusterRead` (synapse.core.schedule.view), never the state
machine itself. `_Round` is one walk down the queue; each step of a job's turn is one method.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Iterator, Set
from dataclasses import dataclass, field
from typing import Any

from synapse.core.jobs.quantity import format_moment
from synapse.core.model import (
    Hold,
    Job,
    JobSpec,
    PackMode,
    Plan,
    Resources,
    Shortfall,
    TopologySpec,
    excluded_for,
)
from synapse.core.schedule.admission import admission_order, max_block, user_block
from synapse.core.schedule.elastic import at_size, is_elastic, least, place_largest
from synapse.core.schedule.eligibility import Gate
from synapse.core.schedule.placement import ClusterView, explain, pack_depth
from synapse.core.schedule.reservations import (
    TUNING,
    DrainClock,
    Reservation,
    Tuning,
    blocked_reason,
    expected_run,
    may_use_reserved,
    reserved_until,
    split_pays,
)
from synapse.core.schedule.spares import last_domain, may_use_spares, restarting
from synapse.core.schedule.topology import Domain
from synapse.core.schedule.view import ClusterRead

#: What makes gangs fit or fail alike within one round (`_shape`, plus what a round adds to it).
Shape = tuple[Any, ...]


#: Why a gang waits, a closed set ranked from the most to the least lasting (metrics count by it).
PENDING_REASONS = ("DependencyNeverSatisfied", "Held", "Unschedulable", "QueueAtMax", "UserLimit", "Dependency",
                   "Singleton", "ArrayThrottle", "BehindReservation", "Resources", "Preempting")


@dataclass(frozen=True, slots=True)
class WaitReason:
    """Why a pending job was not placed this round.

    A round does not work out the shortfalls of every gang it cannot place (they cost more than
    the search): it keeps the spec and the nodes it was kept off, and `shortfalls_in` works them
    out against the state when someone asks (describe, the dashboard)."""

    shortfalls: tuple[Shortfall, ...]
    message: str
    code: str = "Resources"  #: one of PENDING_REASONS
    spec: JobSpec | None = None  #: what was placed (with a rack wait, the one-rack form)
    blocked: frozenset[str] = frozenset()  #: nodes the round kept it off (reservations, holds)

    def shortfalls_in(self, state: ClusterRead) -> tuple[Shortfall, ...]:
        if self.shortfalls or self.spec is None:
            return self.shortfalls
        view = ClusterView(state.nodes, state.index, state.levels, state.jobs)
        view.set_blocked(self.blocked)
        return explain(view, self.spec)

    def describe(self, state: ClusterRead) -> str:
        return "; ".join([self.message, *map(str, self.shortfalls_in(state))])

    def __str__(self) -> str:
        return "; ".join([self.message, *map(str, self.shortfalls)])


@dataclass(frozen=True, slots=True)
class RoundMemo:
    """What a round that placed nothing concluded, valid while only the queue changes after it.

    Placement is deterministic, and a submission changes no capacity: the jobs that round saw
    would fail again exactly as they did. The next round then looks only at the jobs queued after
    them (if every new one queues behind them), carrying on with the same failed shapes and
    reservation. A leader with thousands of waiting jobs thus spends per submission, not per job in
    the queue. Time-dependent backfill (time limits) is refreshed by the periodic full round.

    A pending job that left the queue quietly (`ClusterState.dequeued`: cancelled or failed while
    pending, holding nothing) does not void it either, unless it is `pivotal`. The round's walk is
    a fold over the queue in order; a job seen that failed on a shape an earlier one failed on, or
    that the gate held back, changed nothing in that fold but its own waiting entry. Without it,
    the walk of the same queue gives the same plans (none), reservations, failed shapes and
    reasons for everyone else. A pivotal job is one whose own evaluation decided something for
    later ones (it failed a shape first: the failed shapes, any reservation), or one a seen job
    depends on (its status is what the gate reads). A finished task frees resources and an exit
    is no quiet departure: it still voids the memo, as every other command does.

    The carried reservations are the answer of a round given its `previous`; the next round gets
    them as its own `previous`, and a fresh round at the same `now` comes back to each (chosen
    now, it is kept within `Tuning.reevaluate_s`; weighed again, the choice that won still wins).
    Carrying them is thus recomputing them, as long as the drain clock answers from the state and
    `now` alone, never from the order a round asks about nodes in (`DrainClock._free_at`). The
    memo is exact at one `now` only (tests/unit/test_round_memo.py): as time moves, locality waits end
    and expected starts move, which the leader's periodic full round takes in."""

    state: ClusterRead  #: the state it read (a loaded snapshot is a new object: the memo lapses)
    other_changes: int  #: ClusterRead.other_changes then
    dequeued: int  #: ClusterRead.dequeued_count then
    seen: int  #: how many pending jobs it went through
    last_key: tuple[Any, ...] | None  #: the queue entry of the last one
    failed: dict[Shape, WaitReason]
    reservations: tuple[Reservation, ...]
    waiting: dict[str, WaitReason]
    #: the jobs seen whose departure would change the round: each the first to fail its shape, and
    #: every upstream a seen job depends on
    pivotal: frozenset[str] = frozenset()
    declined: int = 0  #: _Round.declined then

    def carry_on(self, state: ClusterRead) -> tuple[int, list[str]] | None:
        """Where a round of `state` may carry on from (the position in its queue after the jobs
        this memo saw), and which of those jobs have left the queue; None if the memo does not hold."""
        quiet = state.dequeued_count - self.dequeued
        if self.state is not state or state.other_changes - self.other_changes != quiet \
                or quiet > len(state.dequeued):
            return None  # something other than the queue changed (or too many left to tell)
        gone = [entry for entry in itertools.islice(state.dequeued, len(state.dequeued) - quiet, None)
                if self.last_key is not None and entry <= self.last_key]
        if any(job_id in self.pivotal for _, job_id in gone):
            return None
        # Every job it saw is still queued but those gone, and none joined ahead of the last one:
        # one that joined ahead and left again is counted as gone, so it voids the memo too (rare).
        start = state.pending.bisect_right(self.last_key) if self.last_key is not None else 0
        if start != self.seen - len(gone):
            return None
        return start, [job_id for _, job_id in gone]

    def valid_for(self, state: ClusterRead) -> bool:
        """Whether a round of `state` may carry on from this memo."""
        return self.carry_on(state) is not None


@dataclass(slots=True)
class RoundResult:
    plans: list[Plan] = field(default_factory=list)
    reservation: Reservation | None = None  #: the head blocked gang's (the leader passes it back)
    reservations: tuple[Reservation, ...] = ()  #: every blocked gang's, in queue order, the head's first
    waiting: dict[str, WaitReason] = field(default_factory=dict)
    memo: RoundMemo | None = None  #: set when the round placed nothing
    #: the jobs this round looked at and left waiting (a round after submissions alone looks only
    #: at the new ones): whoever records reasons need not walk the whole queue
    examined: list[str] = field(default_factory=list)


def _shape(spec: JobSpec, may_use: tuple[bool, ...]) -> Shape:
    """Jobs of the same shape fit or fail alike within one round (claims and blocks only grow). A
    job that holds nodes from a preemption is a shape of its own (see _Round._ask)."""
    r, t = spec.resources, spec.topology
    return (spec.tasks, spec.tasks_min, r.cpu, r.memory, r.gpu, t.pack, t.mode, may_use)


def schedule_round(state: ClusterRead, now: float,
                   previous: Reservation | tuple[Reservation, ...] | None = None,
                   memo: RoundMemo | None = None, tuning: Tuning = TUNING) -> RoundResult:
    """Plans for the pending gangs that can start now, and the blocked gangs' reservations.

    With a `memo` of the round before that still holds, only the jobs queued since are examined.
    `previous`: the last round's reservations (`RoundResult.reservations`; a lone Reservation is
    the head's), kept for their jobs as reservations._reserve says."""
    if isinstance(previous, Reservation):
        previous = (previous,)
    walk = _Round(state, now, previous or (), tuning)
    start = walk.resume(memo)
    # Gangs that preempted others go first: the nodes held for them are theirs alone, and the head
    # reservation must not fall on them for another job.
    holders = [state.jobs[j] for j in sorted(state.holds) if j in state.jobs] if start == 0 else []
    queued = walk.queue_order if walk.queue_order is not None else state.pending_jobs(start)
    walk.walk([*holders, *(j for j in queued if j.id not in state.holds)])
    return walk.finish()


@dataclass(slots=True)
class _Ask:
    """What one job asks of this round: the spec it is placed with, and what it may not use."""

    job: Job
    hold: Hold | None  #: the nodes its preemption holds for it
    restart: bool  #: a lost node ended its last attempt: no locality wait, a shape of its own
    spec: JobSpec  #: what is placed (with a rack wait, the one-rack form; the split test may undo it)
    run: float  #: how long it is expected to run, weighed only by a gang waiting for one domain
    may_use: tuple[bool, ...]  #: per reservation of the round so far: whether it may run on its nodes
    shape: Shape  #: jobs of one shape fit or fail alike in this round
    excluded: frozenset[str]  #: the nodes that ended its earlier attempts
    off_spares: Set[str]  #: the spares it is kept off (a job with a time limit: unless nothing else fits)
    guest: bool  #: it may go on spares where nothing else fits
    depth: int | None = None  #: where a reservation for it may go (None: the lowest domain that holds it)


class _Round:
    """One round's walk down the queue: what it has planned, claimed, reserved and concluded so far."""

    def __init__(self, state: ClusterRead, now: float, previous: tuple[Reservation, ...], tuning: Tuning) -> None:
        self.state, self.now, self.tuning = state, now, tuning
        self.kept = {r.job_id: r for r in previous}  #: the last round's reservations, by job
        self.view = ClusterView(state.nodes, state.index, state.levels, state.jobs)
        self.result = RoundResult()
        self.failed: dict[Shape, WaitReason] = {}  #: the verdict on each shape that failed
        self.reservations: list[Reservation] = []  #: the blocked gangs', in queue order
        #: blocked gangs that had a turn to reserve but whose nodes were expected too far out
        #: (Tuning.reserve_within_s): they count against Tuning.reservations all the same
        self.declined = 0
        self.pivotal: set[str] = set()  #: see RoundMemo.pivotal
        self.held = frozenset(state.held_nodes)  #: nodes kept for preemptors: no one else is placed there
        self.claimed: dict[str, Resources] = {}  #: queue -> what this round's plans add to its usage
        #: (queue, user) -> the GPUs this round's plans add to that user's in the queue (max_per_user.gpu)
        self.user_claimed: dict[tuple[str, str], int] = {}
        self.queue_order = _queue_order(state) if state.queues else None  #: None: the plain queue order
        self.clock = DrainClock(state, now, self.result.plans, tuning.predict, not tuning.drain_by_user,
                                tuning.backfill_user_factor if tuning.drain_user_factor else 0.0)
        #: (tasks, resources, depth) -> some domain of that depth holds such a gang when idle
        self.rack_fit: dict[tuple[int, Resources, int], bool] = {}
        self.gate = Gate(state)  #: array throttles, dependencies and singletons keep jobs out of the round

    def resume(self, memo: RoundMemo | None) -> int:
        """Take over what a memo that still holds concluded: the queue position to go on from (0: all)."""
        if memo is None or (carried := memo.carry_on(self.state)) is None:
            return 0
        start, gone = carried
        if self.queue_order is not None and start:
            return 0  # the order depends on usage: no memo (it assumes the plain queue order)
        self.failed, self.reservations, self.pivotal = dict(memo.failed), list(memo.reservations), set(memo.pivotal)
        self.declined = memo.declined
        self.result.waiting = dict(memo.waiting)
        for job_id in gone:
            del self.result.waiting[job_id]
        return start

    def walk(self, jobs: Iterable[Job]) -> None:
        """Each job in turn: planned if it can start, else why it waits (and a reservation, if it may).
        With `Tuning.shortest_backfill`, once the reservations are taken, the jobs left (the
        backfill) in the order of their expected runs, shortest first (EASY++'s order: the mean of
        their kind's or their user's last runs), those with no run known after them, queue order
        breaking ties (`backfill_order`)."""
        rest = self._walk(iter(jobs), self.tuning.shortest_backfill)
        if rest:
            self._walk(iter(backfill_order(self.state, rest, self.now, self.tuning.predict)), False)

    def _walk(self, jobs: Iterator[Job], backfill_apart: bool) -> list[Job]:
        """`walk`'s loop, in the order given; with `backfill_apart`, up to the first job once the
        reservations are taken: the jobs from there on are returned, not walked.

        First what the job asks of the round: its spec (delay scheduling), the reserved nodes it may
        use, its spares, and the shape it fits or fails as. The gate, the queue's max and the shapes
        that failed already answer most jobs of a long queue, so that path stays in this loop: a
        round walks thousands of waiting jobs, and a call more per job cost 3 % of a round in
        bench/queue_churn.py."""
        state, now, tuning, gate, result = self.state, self.now, self.tuning, self.gate, self.result
        view, rack_fit, failed, reservations, pivotal = self.view, self.rack_fit, self.failed, self.reservations, \
            self.pivotal
        for job in jobs:
            if backfill_apart and len(reservations) + self.declined >= tuning.reservations:
                return [job, *jobs]
            if job.spec.after:  # the gate reads their status: a quiet departure of one changes this job's lot
                pivotal.update(upstream for _, upstream in job.spec.after)
            held_back = gate.held(job) if job.id not in state.holds else None
            if held_back is not None:
                verdict = WaitReason((), held_back.message, held_back.code)
            elif state.queues and (beyond_max := max_block(state, job, self.claimed)):
                verdict = WaitReason((), beyond_max, "QueueAtMax")
            elif state.queues and (beyond_user := user_block(state, job, self.user_claimed)):
                verdict = WaitReason((), beyond_user, "UserLimit")
            else:
                hold = state.holds.get(job.id)
                restart = restarting(job)  # a lost node ended its last attempt: no locality wait, its own shape
                spec = job.spec if hold or restart else _local_spec(view, job, now, tuning, rack_fit)
                run = expected_run(state, job, now, tuning.predict) if spec is not job.spec and tuning.weigh_locality \
                    else math.inf  # only a gang waiting for one domain weighs its run (split_pays)
                if reservations:
                    may_use = may_use_reserved(state, job, now, tuning, reservations)
                else:
                    may_use = ()
                shape = (job.id,) if hold or restart else _shape(spec, may_use)
                excluded = excluded_for(state.nodes, job)  # the nodes that ended its earlier attempts are not for it
                if excluded:
                    shape = (*shape, excluded)
                #: spares: kept for restarts; a job with a time limit may have them where nothing else fits
                off_spares = state.spares if state.spares and not (hold or restart) else frozenset()
                guest = bool(off_spares) and may_use_spares(job)
                if off_spares:
                    shape = (*shape, guest)
                if spec is not job.spec and tuning.weigh_locality and \
                        len(reservations) + self.declined < tuning.reservations:
                    # Whether it splits depends on how long it is expected to run, but only while it could
                    # hold a reservation (the split is weighed only then): predictions differ from job to
                    # job, and a key with them in it would make every waiting gang a shape of its own.
                    shape = (*shape, run)
                same = failed.get(shape)  # a job of its shape failed already: so does this one
                if same is None:
                    self._turn(_Ask(job, hold, restart, spec, run, may_use, shape, excluded, off_spares, guest))
                    continue
                verdict = same
            result.waiting[job.id] = verdict
            result.examined.append(job.id)
        return []

    def _turn(self, ask: _Ask) -> None:
        """A job whose shape has not failed this round: planned if it can start, else why it waits."""
        plan = self._place(ask)
        if plan is not None:
            self._planned(ask.job, ask.spec, plan)
        else:
            self._waits(ask)

    def _blocked(self, ask: _Ask) -> frozenset[str]:
        """The nodes `ask` may not use: others' holds, its excluded nodes, spares, and the nodes of
        the reservations it would not end before."""
        blocked = self.held - frozenset(ask.hold.nodes) if ask.hold else self.held
        blocked = blocked | ask.excluded
        if ask.off_spares and not ask.guest:
            blocked = blocked | ask.off_spares
        for r, may in zip(self.reservations, ask.may_use, strict=True):
            if not may:
                blocked = blocked | r.nodes
        return blocked

    def _place(self, ask: _Ask) -> Plan | None:
        """A plan for `ask`: a preemptor on its held nodes, a restart in its last domain, a guest off
        the spares, then anywhere it may go (an elastic gang at the largest size that fits); a gang
        waiting for one domain splits now if splitting pays."""
        view, job, spec = self.view, ask.job, ask.spec
        blocked = self._blocked(ask)
        plan = None
        if ask.hold is not None:  # on the nodes its preemption freed first: the victims' others stay theirs
            view.set_blocked(frozenset(self.state.nodes) - (frozenset(ask.hold.nodes) - ask.excluded))
            plan = place_largest(view, job.id, job.attempt, spec)
        if ask.restart and plan is None:  # its surviving nodes and replacements in its own domain first
            view.set_blocked(blocked | _outside(self.state, last_domain(self.state, job)))
            plan = place_largest(view, job.id, job.attempt, spec)
        if ask.guest and plan is None:  # off the spares if it fits there
            view.set_blocked(blocked | ask.off_spares)
            plan = place_largest(view, job.id, job.attempt, spec)
        view.set_blocked(blocked)
        plan = plan or place_largest(view, job.id, job.attempt, spec)  # an elastic gang: the largest size that fits
        if plan is None and spec is not job.spec and self.tuning.weigh_locality \
                and len(self.reservations) + self.declined < self.tuning.reservations:  # it would reserve
            plan = self._split_or_wait(ask, blocked)
        return plan

    def _split_or_wait(self, ask: _Ask, blocked: frozenset[str]) -> Plan | None:
        """For a gang waiting for one domain that would hold a reservation: when splitting pays
        (split_pays), its split plan (None: it reserves the nodes that free first anywhere), taking
        its own spec and shape back; else None, and it goes on waiting for one domain."""
        job = ask.job
        split = place_largest(self.view, job.id, job.attempt, job.spec)
        until = dict.fromkeys(blocked, math.inf) | reserved_until(self.reservations)
        if not split_pays(self.state, self.view, job, ask.spec, split is not None, until, self.clock, self.tuning,
                          ask.run):
            return None
        ask.spec, ask.depth = job.spec, 0
        ask.shape = _shape(job.spec, ask.may_use) + ((ask.excluded,) if ask.excluded else ())
        return split

    def _planned(self, job: Job, spec: JobSpec, plan: Plan) -> None:
        """Count a plan: its resources claimed, its queue's usage, the gate told, and the array's
        next elements, under the ids apply gives them, within the queue's max."""
        state, result, claimed = self.state, self.result, self.claimed
        result.plans.append(plan)
        self.view.claim(plan, job.spec.resources)
        name = state.queue_of(job)
        claimed[name] = claimed.get(name, Resources()) + job.spec.total
        user_claimed, key = self.user_claimed, (name, job.user)
        if state.queues:
            user_claimed[key] = user_claimed.get(key, 0) + job.spec.total.gpu
        self.gate.placed(job)

        def within_max(j: Job = job) -> bool:
            return not (state.queues and (max_block(state, j, claimed) or user_block(state, j, user_claimed)))

        for more in self.gate.more_elements(self.view, job, spec, within_max):
            result.plans.append(more)
            claimed[name] = claimed[name] + job.spec.total
            if state.queues:
                user_claimed[key] = user_claimed[key] + job.spec.total.gpu

    def _waits(self, ask: _Ask) -> None:
        """Record why `ask` waits, as the verdict on its shape; reserve for it if it may."""
        job, spec, view, result = ask.job, ask.spec, self.view, self.result
        self.pivotal.add(job.id)  # it fails its shape first: later jobs of that shape take its verdict
        if ask.hold is not None:
            result.examined.append(job.id)
            result.waiting[job.id] = self.failed[ask.shape] = WaitReason(
                (), f"waits for the gangs it preempted ({', '.join(ask.hold.victims)}) to stop; "
                    f"{', '.join(ask.hold.nodes)} held for it", "Preempting", spec, view.blocked)
            return
        if is_elastic(spec):
            spec = at_size(spec, least(spec))  # an elastic gang waits for room for its min
        reservations, tuning = self.reservations, self.tuning
        before = len(reservations)
        message, code = blocked_reason(self.state, view, job, spec, self.now, reservations, self.kept.get(job.id),
                                       self.clock, tuning, ask.depth, ask.restart, self.declined)
        if before and len(reservations) > before and not ask.restart \
                and reservations[-1].starts_at - self.now > tuning.reserve_within_s:
            far = reservations.pop()  # expected too far out to be worth its nodes' backfill (reserve_within_s)
            self.declined += 1
            message, code = (f"does not fit outside the reservations ({reservations[0].describe(self.now)}); "
                             f"its own would start at {format_moment(far.starts_at, self.now)}"), "BehindReservation"
        if ask.excluded:
            message += f"; excluded nodes (they ended earlier attempts): {', '.join(sorted(ask.excluded))}"
        result.waiting[job.id] = self.failed[ask.shape] = WaitReason((), message, code, spec=spec, blocked=view.blocked)
        result.examined.append(job.id)

    def finish(self) -> RoundResult:
        """The round's result: its plans, reservations, reasons, and a memo if it placed nothing."""
        state, result, reservations = self.state, self.result, self.reservations
        result.reservation = reservations[0] if reservations else None
        result.reservations = tuple(reservations)
        if not result.plans and self.queue_order is None:
            seen = len(state.pending)
            result.memo = RoundMemo(state, state.other_changes, state.dequeued_count, seen,
                                    state.pending[seen - 1] if seen else None, self.failed, tuple(reservations),
                                    result.waiting, frozenset(self.pivotal), self.declined)
        return result


def _outside(state: ClusterRead, domain: Domain) -> frozenset[str]:
    """The nodes outside a topology domain (none for the whole cluster)."""
    if not domain:
        return frozenset()
    return frozenset(n.id for n in state.nodes.values() if n.topology[:len(domain)] != domain)


def backfill_order(state: ClusterRead, jobs: list[Job], now: float, predict: bool) -> list[Job]:
    """`jobs` shortest expected run first by the cluster's runs of their kind or their user (the
    mean of the last ones; Tuning.shortest_backfill), the jobs with none known after them, each
    part in queue order. A time limit is not ordered by: users give a two-minute job a three-day
    limit, and by limits (the rule before) the week without recurring jobs (`--recurrence 0`)
    came out 0.006 x EASY's JCT worse, where by known runs it changes nothing
    (docs/evaluation/results.md)."""
    if not predict:
        return jobs

    def expected(job: Job) -> float:
        spec = job.spec
        if not state.run_times.knows(job.user, spec.name, spec.resources.gpu * spec.tasks):
            return math.inf
        return expected_run(state, job, now, predict, own_kind=False)

    return sorted(jobs, key=expected)


def _queue_order(state: ClusterRead) -> list[Job]:
    """With queues defined: gangs within their queue's guarantee first, then by fair share (each
    queue's gangs in their own order)."""
    return admission_order(state, state.pending_jobs())


def _local_spec(view: ClusterView, job: Job, now: float, tuning: Tuning,
                rack_fit: dict[tuple[int, Resources, int], bool]) -> JobSpec:
    """Delay scheduling: the spec to place `job` with this round.

    A multi-task gang with `preferred` packing that one domain of its pack level (a rack when it
    names none) would hold when idle asks for that domain as if `required` for a while after its
    submission (`Tuning.locality_wait_s`); then it takes a split placement. A gang no such domain
    can hold is never delayed. Its own spec is not changed: only this round's view of it."""
    spec = job.spec
    topo = spec.topology
    if topo.mode is not PackMode.PREFERRED or spec.tasks < 2 or topo.pack == "node":
        return spec
    pack = topo.pack or view.levels[-1]
    if now - job.submitted_at >= tuning.locality_wait_s:
        return spec
    depth = pack_depth(view.levels, pack)
    key = (spec.tasks, spec.resources, depth)
    if key not in rack_fit:
        rack_fit[key] = any(view.bound(k, spec.resources, when_empty=True) >= spec.tasks
                            for k in view.index.by_depth[depth])
    if not rack_fit[key]:
        return spec
    return dataclasses.replace(spec, topology=TopologySpec(pack, PackMode.REQUIRED))
