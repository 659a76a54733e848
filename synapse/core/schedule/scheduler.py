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
  placement now, or reserves the nodes that free first anywhere (`_split_pays`). The queue waits
  behind such a gang, so its rack wait is everyone's.
* The first `Tuning.reservations` gangs that do not fit (but would fit the idle cluster) each get a
  **reservation**: in the lowest-level domain that holds the gang when idle, the nodes expected to
  be empty first by the time limits of their tasks (then those with the most room now). So a gang
  waits for the jobs that end first, not for whatever long job sits on the emptiest nodes. A node
  an earlier reservation holds counts as empty only from when that gang is expected to be done
  with it (its start + time limit; never, without one): with every blocked gang reserving
  (`CONSERVATIVE`), this is conservative backfill. The head's reservation is carried to the next
  round and kept while its nodes accept work, unless another choice is expected to start clearly earlier
  (`Tuning.switch_margin`): reserved nodes only drain, so a kept reservation only gets closer,
  and each move gains the margin — no flip-flop, and the head gang cannot be starved. A kept
  reservation stays in its domain but holds the nodes expected to be empty first there now: jobs
  end before their time limits, and a node that emptied early takes the place of one still
  draining (which would otherwise go on holding the gang back while the empty one is refilled).
* Jobs behind them are **backfilled** on nodes outside the reservations, or inside one when the
  job's `time_limit` ends before that reservation is expected to start (known only when every
  task on its nodes has a time limit itself; otherwise those nodes stay untouched).
* A **restart** after a lost node (synapse.core.schedule.spares.restarting) keeps its place in the queue
  (its original submission: ahead of what arrived since, not of what waited before it, whose
  reservations it respects), is placed in the domain of its last run first (its survivors and
  replacements there), waits for no rack, and always reserves, beyond `Tuning.reservations`;
  waiting for nodes that are DOWN, it keeps the usable nodes of its domain.
  **Spares** take restarts anywhere and other jobs only if they have a time limit and fit nowhere
  else; reservations of other gangs never hold them (the leader evicts their guests for a restart).

"Expected" above is by time limits only with `Tuning.predict` off. With it (the leader's default),
a job is expected to run what the cluster's own runs of its kind predict (synapse.core.schedule.predict,
learned in apply, so every replica expects the same; the limit when nothing is known): the drain
clock, hence which nodes a gang reserves and when it expects to start, and the split test use
that; a job may go on reserved nodes by the longer of the last runs of its own kind only
(`_backfill_run`). Time limits still end jobs and bound what a reservation promises a later one.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from synapse.core.model import (
    Job,
    JobSpec,
    NodeStatus,
    PackMode,
    Plan,
    Resources,
    Shortfall,
    TopologySpec,
    excluded_for,
    topology_path,
)
from synapse.core.quantity import format_moment
from synapse.core.schedule.admission import admission_key, max_block, pool_of
from synapse.core.schedule.elastic import at_size, is_elastic, least, place_largest
from synapse.core.schedule.eligibility import Gate
from synapse.core.schedule.placement import ClusterView, explain, pack_depth
from synapse.core.schedule.spares import last_domain, may_use_spares, restarting
from synapse.core.schedule.topology import Domain
from synapse.core.schedule.view import ClusterRead

#: What makes gangs fit or fail alike within one round (`_shape`, plus what a round adds to it).
Shape = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Reservation:
    """Nodes held back so the head blocked gang can start once they drain."""

    job_id: str
    attempt: int
    domain: Domain
    nodes: frozenset[str]
    starts_at: float  #: when the reserved nodes are expected to be empty; inf when unknown
    chosen_at: float = 0.0  #: when the choice was last weighed against the alternatives
    #: when the gang is expected to be done with them (start + its time limit; inf when unknown):
    #: a later gang's reservation may take the same nodes from then on
    ends_at: float = math.inf

    def describe(self, now: float) -> str:
        """`job J holds 2 node(s) in rack1 (expected free at 14:02 UTC)`, as of `now`."""
        return (f"job {self.job_id} holds {len(self.nodes)} node(s) in "
                f"{topology_path(self.domain)} (expected free at {format_moment(self.starts_at, now)})")


#: Why a gang waits, a closed set ranked from the most to the least lasting (metrics count by it).
PENDING_REASONS = ("DependencyNeverSatisfied", "Unschedulable", "QueueAtMax", "Dependency", "Singleton",
                   "ArrayThrottle", "BehindReservation", "Resources", "Preempting")


@dataclass(frozen=True, slots=True)
class Tuning:
    """The queue policy's knobs; `TUNING` is what the leader runs (the simulator may ablate)."""

    #: blocked gangs, in queue order, that reserve nodes each round (a later one takes nodes an
    #: earlier one holds only from when that one is expected to end: with every blocked gang
    #: reserving, this is conservative backfill)
    reservations: int = 2
    #: a kept reservation moves only for a start expected this much earlier: a share of its own
    #: remaining wait, and at least `switch_min_s`
    switch_share: float = 0.1
    switch_min_s: float = 600.0
    #: a kept reservation is weighed against the alternatives this often (a search over every node
    #: of the candidate domains: ~22 ms for a 64-task gang on 10,240 nodes, too much for every
    #: round of a leader that runs one per change); a switch needs `switch_min_s` anyway, so
    #: nothing is lost in between
    reevaluate_s: float = 5.0
    #: delay scheduling: how long after its submission a preferred gang waits for one domain of
    #: its pack level before it takes a split placement, at most
    locality_wait_s: float = 48 * 3600.0
    #: within that wait, a gang that would hold a reservation splits when, run split, it is
    #: expected to end before it would in one domain (start split + run / spread_factor < start in
    #: one domain + run; see _split_pays); off: the fixed wait alone
    weigh_locality: bool = True
    spread_factor: float = 0.9  #: the speed of a gang split across domains, relative to one packed
    #: expect jobs to run as long as the cluster's own runs predict (synapse.core.schedule.predict; the time
    #: limit when it knows none), not their time limits: when nodes drain, whether a gang should
    #: split, and (by the longer of the last runs of the job's own kind, see _backfill_run) whether
    #: a job may run on reserved nodes. The limit still ends a job, and a reservation is done with
    #: its nodes (what a later reservation is promised) by its limit alone.
    predict: bool = True
    #: a restart waiting for nodes that are DOWN keeps the usable nodes of its domain only while
    #: every DOWN node there went down within this long (a reboot's time): a node not back by then
    #: is being repaired, for hours or for good, and holding a rack's GPUs idle that long costs more
    #: than the drain the gang then waits for once the node is back
    restart_hold_s: float = 900.0

    def switch_margin(self, remaining: float) -> float:
        return self.switch_min_s if math.isinf(remaining) else max(self.switch_min_s, self.switch_share * remaining)


TUNING = Tuning()
#: Conservative backfill (what Slurm's backfill plugin runs), a baseline: every blocked gang
#: reserves, weighed at every round, and no gang waits for one rack.
CONSERVATIVE = Tuning(reservations=1 << 30, switch_share=0.0, switch_min_s=0.0, reevaluate_s=0.0,
                      locality_wait_s=0.0, weigh_locality=False, predict=False)


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
    `now` alone, never from the order a round asks about nodes in (`_DrainClock._free_at`). The
    memo is exact at one `now` only (tests/test_round_memo.py): as time moves, locality waits end
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
    job that holds nodes from a preemption is a shape of its own (see schedule_round)."""
    r, t = spec.resources, spec.topology
    return (spec.tasks, spec.tasks_min, r.cpu, r.memory, r.gpu, t.pack, t.mode, may_use)


def schedule_round(state: ClusterRead, now: float,
                   previous: Reservation | tuple[Reservation, ...] | None = None,
                   memo: RoundMemo | None = None, tuning: Tuning = TUNING) -> RoundResult:
    """Plans for the pending gangs that can start now, and the blocked gangs' reservations.

    With a `memo` of the round before that still holds, only the jobs queued since are examined.
    `previous`: the last round's reservations (`RoundResult.reservations`; a lone Reservation is
    the head's), kept for their jobs as `_reserve` says."""
    if isinstance(previous, Reservation):
        previous = (previous,)
    kept = {r.job_id: r for r in previous or ()}
    view = ClusterView(state.nodes, state.index, state.levels, state.jobs)
    result = RoundResult()
    failed: dict[Shape, WaitReason] = {}
    reservations: list[Reservation] = []
    start = 0
    pivotal: set[str] = set()  #: see RoundMemo.pivotal
    if memo is not None and (carried := memo.carry_on(state)) is not None:
        start, gone = carried
        failed, reservations, pivotal = dict(memo.failed), list(memo.reservations), set(memo.pivotal)
        result.waiting = dict(memo.waiting)
        for job_id in gone:
            del result.waiting[job_id]
    held = frozenset(state.held_nodes)  #: nodes kept for preemptors: no one else is placed there
    claimed: dict[str, Resources] = {}  #: queue -> what this round's plans add to its usage
    queue_order = _queue_order(state) if state.queues else None
    if queue_order is not None and start:
        start = 0  # the order depends on usage: no memo (it assumes the plain queue order)
        failed, reservations, result.waiting, pivotal = {}, [], {}, set()
    clock = _DrainClock(state, now, result.plans, tuning.predict)
    #: (tasks, resources, depth) -> some domain of that depth holds such a gang when idle
    rack_fit: dict[tuple[int, Resources, int], bool] = {}
    # Gangs that preempted others go first: the nodes held for them are theirs alone, and the head
    # reservation must not fall on them for another job.
    holders = [state.jobs[j] for j in sorted(state.holds) if j in state.jobs] if start == 0 else []
    gate = Gate(state)  #: array throttles, dependencies and singletons keep jobs out of the round
    for job in [*holders, *(j for j in (queue_order if queue_order is not None else state.pending_jobs(start))
                            if j.id not in state.holds)]:
        if job.spec.after:  # the gate reads their status: a quiet departure of one changes this job's lot
            pivotal.update(upstream for _, upstream in job.spec.after)
        held_back = gate.held(job) if job.id not in state.holds else None
        if held_back is not None:
            result.waiting[job.id] = WaitReason((), held_back.message, held_back.code)
            result.examined.append(job.id)
            continue
        beyond_max = max_block(state, job, claimed) if state.queues else ""
        if beyond_max:
            result.waiting[job.id] = WaitReason((), beyond_max, "QueueAtMax")
            result.examined.append(job.id)
            continue
        hold = state.holds.get(job.id)
        restart = restarting(job)  # a lost node ended its last attempt: no locality wait, its own shape
        spec = job.spec if hold or restart else _local_spec(view, job, now, tuning, rack_fit)
        run = expected_run(state, job, now, tuning.predict) if spec is not job.spec and tuning.weigh_locality \
            else math.inf  # only a gang waiting for one domain weighs its run (_split_pays)
        if reservations:
            backfill_run = _backfill_run(state, job, now, tuning)
            may_use = tuple(_ends_before(backfill_run, r, now) for r in reservations)
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
        if spec is not job.spec and tuning.weigh_locality and len(reservations) < tuning.reservations:
            # Whether it splits depends on how long it is expected to run, but only while it could
            # hold a reservation (the split is weighed only then): predictions differ from job to
            # job, and a key with them in it would make every waiting gang a shape of its own.
            shape = (*shape, run)
        if shape in failed:
            result.waiting[job.id] = failed[shape]
            result.examined.append(job.id)
            continue
        blocked = held - frozenset(hold.nodes) if hold else held
        blocked = blocked | excluded
        if off_spares and not guest:
            blocked = blocked | off_spares
        for r, may in zip(reservations, may_use, strict=True):
            if not may:
                blocked = blocked | r.nodes
        plan = None
        if hold is not None:  # on the nodes its preemption freed first: the victims' others stay theirs
            view.set_blocked(frozenset(state.nodes) - (frozenset(hold.nodes) - excluded))
            plan = place_largest(view, job.id, job.attempt, spec)
        if restart and plan is None:  # its surviving nodes and replacements in its own domain first
            view.set_blocked(blocked | _outside(state, last_domain(state, job)))
            plan = place_largest(view, job.id, job.attempt, spec)
        if guest and plan is None:  # off the spares if it fits there
            view.set_blocked(blocked | off_spares)
            plan = place_largest(view, job.id, job.attempt, spec)
        view.set_blocked(blocked)
        plan = plan or place_largest(view, job.id, job.attempt, spec)  # an elastic gang: the largest size that fits
        depth = None  #: where a reservation for it may go (None: the lowest domain that holds it)
        if plan is None and spec is not job.spec and tuning.weigh_locality \
                and len(reservations) < tuning.reservations:  # it would hold a reservation
            split = place_largest(view, job.id, job.attempt, job.spec)
            until = dict.fromkeys(blocked, math.inf) | _reserved_until(reservations)
            if _split_pays(state, view, job, spec, split is not None, until, clock, tuning, run):
                spec, plan, depth = job.spec, split, 0
                shape = _shape(spec, may_use) + ((excluded,) if excluded else ())
        if plan is not None:
            result.plans.append(plan)
            view.claim(plan, job.spec.resources)
            name = state.queue_of(job)
            claimed[name] = claimed.get(name, Resources()) + job.spec.total
            gate.placed(job)
            # The array's next elements, under the ids apply gives them, within the queue's max.
            def within_max(j: Job = job) -> bool:
                return not (state.queues and max_block(state, j, claimed))

            for more in gate.more_elements(view, job, spec, within_max):
                result.plans.append(more)
                claimed[name] = claimed[name] + job.spec.total
            continue
        pivotal.add(job.id)  # it fails its shape first: later jobs of that shape take its verdict
        if hold is not None:
            result.examined.append(job.id)
            result.waiting[job.id] = failed[shape] = WaitReason(
                (), f"waits for the gangs it preempted ({', '.join(hold.victims)}) to stop; "
                    f"{', '.join(hold.nodes)} held for it", "Preempting", spec, view.blocked)
            continue
        if is_elastic(spec):
            spec = at_size(spec, least(spec))  # an elastic gang waits for room for its min
        message, code = _blocked_reason(state, view, job, spec, now, reservations, kept.get(job.id), clock, tuning,
                                        depth, restart)
        if excluded:
            message += f"; excluded nodes (they ended earlier attempts): {', '.join(sorted(excluded))}"
        result.waiting[job.id] = failed[shape] = WaitReason((), message, code, spec=spec, blocked=view.blocked)
        result.examined.append(job.id)
    result.reservation = reservations[0] if reservations else None
    result.reservations = tuple(reservations)
    if not result.plans and queue_order is None:
        seen = len(state.pending)
        result.memo = RoundMemo(state, state.other_changes, state.dequeued_count, seen,
                                state.pending[seen - 1] if seen else None, failed, tuple(reservations),
                                result.waiting, frozenset(pivotal))
    return result


def _ends_before(run: float, reservation: Reservation, now: float) -> bool:
    """A job may use reserved nodes only if it is expected to end (`run`: its prediction, or its
    time limit) before the reservation is expected to start."""
    return not math.isinf(run) and not math.isinf(reservation.starts_at) and now + run <= reservation.starts_at


def _backfill_run(state: ClusterRead, job: Job, now: float, tuning: Tuning) -> float:
    """How long a job is taken to run when it asks for reserved nodes, where a wrong guess delays
    the gang the nodes are kept for.

    Only a job its time limit bounds may go there (the limit bounds the delay it can cause). With
    `Tuning.predict` it is judged by the longer of the last runs of its own kind (user, name, size),
    a guess that errs long; a guess from its user's other jobs is too loose to risk the reserved
    gang's start on, and so is no history: then by its limit. (Measured on the recurring traces,
    docs/evaluation/results.md: the mean of the last two, or the user's runs, here lengthened the
    big gangs' waits; the drain clock and the split test still use the mean, where a guess that is
    short only makes the gang wait for nodes that drain later than expected.)"""
    limit = job.spec.time_limit
    if not limit:
        return math.inf
    if not tuning.predict:
        return limit
    elapsed = now - job.started_at if job.started_at else 0.0
    longest = state.run_times.longest_own(job.user, job.spec.name, job.spec.resources.gpu * job.spec.tasks, limit,
                                          elapsed)
    return limit if longest is None else min(limit, longest)


def expected_run(state: ClusterRead, job: Job, now: float, predict: bool = True, own_kind: bool = True) -> float:
    """Seconds the job's current attempt is expected to run in all: as the cluster's runs of its
    kind predict (synapse.core.schedule.predict, never beyond its time limit; raised if it has run longer),
    or its time limit when `predict` is off; inf when neither is known. `own_kind`: only runs of
    its own (user, name, size) count, not its user's other jobs (the policy's choice: those are
    too loose a guess to plan by; EASY++ takes them)."""
    spec = job.spec
    if not predict or not job.user:
        return spec.time_limit or math.inf
    elapsed = now - job.started_at if job.started_at else 0.0
    return state.run_times.expect(job.user, spec.name, spec.resources.gpu * spec.tasks, spec.time_limit, elapsed,
                                  own_kind=own_kind)


def _blocked_reason(state: ClusterRead, view: ClusterView, job: Job, spec: JobSpec, now: float,
                    reservations: list[Reservation], previous: Reservation | None, clock: _DrainClock,
                    tuning: Tuning, depth: int | None = None, restart: bool = False) -> tuple[str, str]:
    """Reserve nodes for a gang that does not fit, if it is among the first blocked ones or a
    restart after a lost node (which always reserves, whatever `Tuning.reservations`: while it
    waits, backfill must not take what it needs); the message and code of why it waits. The new reservation is
    appended to `reservations`; `depth` the level it goes at (None: the lowest domain that holds the
    gang)."""
    local = " (waiting for one " + spec.topology.pack + ")" if spec.topology != job.spec.topology else ""
    if len(reservations) >= tuning.reservations and not restart:
        return (f"does not fit outside the reservations{local} ({reservations[0].describe(now)}, "
                f"and {len(reservations) - 1} more)", "BehindReservation")
    # Its excluded nodes never free for it: a reservation holds none of them; nor spares, but for a restart.
    never = excluded_for(state.nodes, job) | (frozenset() if restart else state.spares)
    until = dict.fromkeys(never, math.inf) | _reserved_until(reservations)
    reservation = _reserve(state, view, job, spec, previous, until, clock, tuning, sticky=not reservations,
                           depth=depth)
    if reservation is None:
        if _closest_depth(view, spec) is None:
            unusable = _unusable_nodes_reason(state, spec)
            if unusable is not None and restart:
                # A restart waiting for nodes that are DOWN keeps the usable nodes of its own domain
                # (its survivors among them) until they are back, if they may be back soon (a
                # reboot, Tuning.restart_hold_s): backfill onto them would make it wait for those
                # jobs too once its nodes return. Nodes under repair would leave them idle for hours.
                kept_nodes = _kept_for_restart(state, job, until)
                down_since = _down_since(state, last_domain(state, job))
                if kept_nodes and 0 <= now - down_since < tuning.restart_hold_s:  # none DOWN: inf
                    domain = last_domain(state, job)
                    reservations.append(Reservation(job.id, job.attempt, domain, kept_nodes, math.inf,
                                                    chosen_at=now))
                    return (f"{unusable[0]}; keeps {len(kept_nodes)} node(s) of {topology_path(domain)} for "
                            f"its restart until {format_moment(down_since + tuning.restart_hold_s, now)}",
                            unusable[1])
                if kept_nodes:
                    why = "they are cordoned" if math.isinf(down_since) else \
                        f"one is DOWN since {format_moment(down_since, now)}, longer than a reboot"
                    return f"{unusable[0]}; keeps no node for its restart ({why})", unusable[1]
            return unusable or (
                "can never fit: no domain it may use is large enough even when idle", "Unschedulable")
        if not reservations:  # no other reservation is in its way: its excluded nodes are (the caller names
            # them), or no domain's nodes hold it when idle after all (the bound is only an upper bound)
            return ("can never fit without the nodes excluded for it" if excluded_for(state.nodes, job) else
                    "can never fit: no domain it may use holds it even when idle"), "Unschedulable"
        return (f"does not fit outside the reservations{local} ({reservations[0].describe(now)})",
                "BehindReservation")
    reservations.append(reservation)
    return "does not fit now" + local + "; " + reservation.describe(now), "Resources"


def _kept_for_restart(state: ClusterRead, job: Job, until: Mapping[str, float]) -> frozenset[str]:
    """The usable nodes of the domain of a restart's last run that no other reservation or hold
    keeps, as many as its gang's tasks at most, its survivors first."""
    domain = last_domain(state, job)
    survivors = set(job.runs[-1].nodes) if job.runs else set()
    nodes = sorted((n for n in state.nodes.values() if n.topology[:len(domain)] == domain and n.accepts_work
                    and n.id not in until), key=lambda n: (n.id not in survivors, n.id))
    return frozenset(n.id for n in nodes[:job.spec.tasks])


def _down_since(state: ClusterRead, domain: Domain) -> float:
    """When the node DOWN longest in a topology domain went down (inf when none is)."""
    return min((n.status_changed_at for n in state.nodes.values()
                if n.status is NodeStatus.DOWN and n.topology[:len(domain)] == domain), default=math.inf)


def _outside(state: ClusterRead, domain: Domain) -> frozenset[str]:
    """The nodes outside a topology domain (none for the whole cluster)."""
    if not domain:
        return frozenset()
    return frozenset(n.id for n in state.nodes.values() if n.topology[:len(domain)] != domain)


def _unusable_nodes_reason(state: ClusterRead, spec: JobSpec) -> tuple[str, str] | None:
    """Why a gang that fits no idle domain of the usable nodes may still start: nodes that are
    DOWN or cordoned now (a cluster whose workers are lost is not one too small). None if every
    node is usable, or if the gang would not fit even with every node back and idle (counting
    tasks per node only: topology is not weighed, so a gang it lets through may still never fit)."""
    down = sum(1 for n in state.nodes.values() if n.status is NodeStatus.DOWN)
    cordoned = sum(1 for n in state.nodes.values() if n.status is not NodeStatus.DOWN and not n.schedulable)
    if not down and not cordoned:
        return None
    per = spec.resources
    slots = 0
    for n in state.nodes.values():
        fits = [have // need for have, need in ((n.capacity.cpu, per.cpu), (n.capacity.memory, per.memory),
                                                (n.capacity.gpu, per.gpu)) if need > 0]
        slots += min(fits) if fits else 0
        if slots >= spec.tasks:
            break
    if slots < spec.tasks:
        return None
    unusable = ", ".join(part for part in (f"{down} DOWN" if down else "", f"{cordoned} cordoned" if cordoned else "")
                         if part)
    return (f"does not fit on the usable nodes: {unusable} of {len(state.nodes)} node(s); it may fit once they "
            "are back", "NodesUnavailable")


def _queue_order(state: ClusterRead) -> list[Job]:
    """With queues defined: gangs within their queue's guarantee first, then by fair share."""
    pool = pool_of(state)
    return sorted(state.pending_jobs(), key=lambda job: admission_key(state, job, pool))


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


class _DrainClock:
    """When each node is expected to be empty: the latest expected end (`expected_run`: by
    prediction, or by time limit) of the tasks on it (inf when one has none), counting this round's
    plans (array elements not yet jobs among them) as started now. Computed per node on demand."""

    def __init__(self, state: ClusterRead, now: float, plans: list[Plan], predict: bool = False) -> None:
        self.state, self.now, self.plans, self.predict = state, now, plans, predict
        #: job id -> how long its attempt is expected to run (a job's, not a task's: its tasks start
        #: apart, and each ends that long after its own start)
        self._runs: dict[str, float] = {}
        self._seen_plans = 0
        self._planned: dict[str, float] = {}  #: node -> latest end of this round's plans on it
        self._at: dict[str, float] = {}  #: node -> expected empty, this round's plans counted

    def empty_at(self, node_id: str) -> float:
        if len(self.plans) > self._seen_plans:
            self._count_plans()
        at = self._at.get(node_id)
        if at is None:
            at = self._at[node_id] = max(self._free_at(node_id),
                                         self._planned.get(node_id, self.now))
        return at

    def _count_plans(self) -> None:
        for plan in self.plans[self._seen_plans:]:
            job = self.state.jobs.get(plan.job_id)
            if job is not None:
                end = self.now + expected_run(self.state, job, self.now, self.predict)
            else:
                spec = self.state.spec_of(plan.job_id)  # an array's next elements are not jobs yet
                limit = spec.time_limit if spec is not None else 0.0
                end = self.now + limit if limit else math.inf
            for p in plan.placements:
                self._planned[p.node_id] = max(self._planned.get(p.node_id, self.now), end)
                if p.node_id in self._at:
                    self._at[p.node_id] = max(self._at[p.node_id], end)
        self._seen_plans = len(self.plans)

    def nodes_empty_at(self, nodes: Iterable[str]) -> float:
        return max((self.empty_at(n) for n in nodes), default=self.now)

    def _free_at(self, node_id: str) -> float:
        """When every live task on the node is expected to have ended (inf if one's end is unknown):
        each task its own start (now, if not started yet) plus its job's expected run. A function of
        the state and `now` alone, whichever node a round asks about first (a kept reservation's
        nodes come first, and the round memo carries the answers of a round that asked in another
        order)."""
        latest = self.now
        for job_id, _attempt, index in self.state.live_tasks.get(node_id, ()):
            job = self.state.jobs[job_id]
            run = self._runs.get(job_id)
            if run is None:
                run = self._runs[job_id] = expected_run(self.state, job, self.now, self.predict)
            if math.isinf(run):
                return math.inf
            latest = max(latest, (job.tasks[index].started_at or self.now) + run)
        return latest


def _reserved_until(reservations: Iterable[Reservation]) -> dict[str, float]:
    """Node -> when the reservations holding it are expected to be done with it."""
    until: dict[str, float] = {}
    for r in reservations:
        for node_id in r.nodes:
            until[node_id] = max(until.get(node_id, r.ends_at), r.ends_at)
    return until


def _reserve(state: ClusterRead, view: ClusterView, job: Job, spec: JobSpec, previous: Reservation | None,
             until: Mapping[str, float], clock: _DrainClock, tuning: Tuning, sticky: bool = True,
             depth: int | None = None) -> Reservation | None:
    """The nodes expected to hold the gang earliest, avoiding other reservations' nodes.

    The previous round's reservation of the same job and attempt is kept unless another choice is
    expected to start clearly earlier (Tuning.switch_margin): reserved nodes only drain, so a kept
    reservation only gets closer, and a switch always gains at least the margin — no flip-flop.
    Kept, it moves to the nodes of its domain expected to be empty first (its start no later).
    The alternatives are weighed every `Tuning.reevaluate_s` only. Only the head's reservation is
    sticky; the others take the best choice whenever the alternatives are weighed. `until`: the
    nodes earlier reservations hold, and until when (inf: for good)."""
    now = clock.now
    limit = job.spec.time_limit or math.inf
    kept = previous if (previous is not None and previous.job_id == job.id and previous.attempt == job.attempt
                        and all(state.index.contains(n) and not math.isinf(until.get(n, 0.0))
                                for n in previous.nodes)) else None
    kept_start = max(clock.nodes_empty_at(kept.nodes), *(until.get(n, now) for n in kept.nodes)) \
        if kept is not None else math.inf
    if kept is not None and now - kept.chosen_at < tuning.reevaluate_s:
        return dataclasses.replace(kept, starts_at=kept_start, ends_at=kept_start + limit)
    best = _earliest(state, view, spec, until, clock, depth)
    if kept is None:
        return None if best is None else Reservation(job.id, job.attempt, *best, chosen_at=now,
                                                     ends_at=best[2] + limit)
    margin = tuning.switch_margin(kept_start - now) if sticky else 0.0
    if best is not None and best[2] < kept_start - margin:
        return Reservation(job.id, job.attempt, *best, chosen_at=now, ends_at=best[2] + limit)
    # Kept in its domain, on the nodes expected to be empty first there now: a node that emptied
    # ahead of its time limit takes the place of one still draining (the start is no later).
    fresh = best if best is not None and best[0] == kept.domain else \
        _earliest(state, view, spec, until, clock, within=kept.domain)
    if fresh is not None and fresh[2] <= kept_start:
        return Reservation(job.id, job.attempt, *fresh, chosen_at=now, ends_at=fresh[2] + limit)
    return Reservation(job.id, job.attempt, kept.domain, kept.nodes, kept_start, chosen_at=now,
                       ends_at=kept_start + limit)


def _split_pays(state: ClusterRead, view: ClusterView, job: Job, local: JobSpec, fits_split: bool,
                until: Mapping[str, float], clock: _DrainClock, tuning: Tuning, run: float) -> bool:
    """Whether a gang waiting for one domain (`local`, its one-domain form) should rather split:
    run split (at `spread_factor` of its speed) from its expected start split (now if
    `fits_split`, else when the nodes that free first anywhere hold it), it would end before it
    would run to its end in one domain. So it waits for a domain only as long as the split would
    slow it, (1 / spread_factor - 1) x its run (at 0.9, a ninth). Expected starts come from the
    expected ends of the tasks running (the drain clock) and the earlier reservations (`until`);
    when that is unknown (a task without a time limit), the fixed wait decides. `run`: how long
    the gang is expected to run (expected_run); a gang with no expectation is taken to run
    `Tuning.locality_wait_s`.

    (It used to split only if it would be done before one domain was even free, a wait of up to
    1 / spread_factor x its run: a 64-GPU gang of unknown kind with a 72 h limit then held a rack
    expected free 39 h later for a 3-minute run, the worst big-gang wait of its week;
    docs/evaluation/results.md.)"""
    limit = run if not math.isinf(run) else tuning.locality_wait_s
    one = _earliest(state, view, local, until, clock)
    if one is None:
        return fits_split
    if math.isinf(one[2]):
        return False  # when one domain frees is unknown: the fixed wait decides
    if fits_split:
        split_at = clock.now
    else:
        anywhere = _earliest(state, view, job.spec, until, clock, 0)
        split_at = anywhere[2] if anywhere is not None else math.inf
    return split_at + limit / tuning.spread_factor < one[2] + limit


def _closest_depth(view: ClusterView, spec: JobSpec) -> int | None:
    """The lowest depth at which some domain the gang may use holds it when idle."""
    leaf = len(view.levels)
    lowest = 0
    if spec.topology.mode is PackMode.REQUIRED and spec.topology.pack:
        lowest = min(pack_depth(view.levels, spec.topology.pack), leaf)
    for depth in range(leaf, lowest - 1, -1):
        if any(view.bound(key, spec.resources, when_empty=True) >= spec.tasks for key in view.index.by_depth[depth]):
            return depth
    return None


def _earliest(state: ClusterRead, view: ClusterView, spec: JobSpec, until: Mapping[str, float],
              clock: _DrainClock, depth: int | None = None,
              within: Domain | None = None) -> tuple[Domain, frozenset[str], float] | None:
    """(domain, nodes, expected start) of the choice expected to hold the gang first.

    From the lowest level where a domain holds the gang when idle upwards (a level up only when
    other reservations leave no domain of that level enough nodes): in each domain, the nodes
    expected to be empty first, then with the most room now; across domains, the earliest start,
    then the most room now, then the domain's name (deterministic). With no time limits known,
    every start is inf and this is "the domain closest to fitting, its emptiest nodes". A node in
    `until` counts as empty no earlier than that (earlier reservations; inf: never). A `depth`
    given starts the search there instead (0: the nodes of the whole cluster that free first); a
    domain `within` searches that domain alone."""
    if within is not None:
        levels: list[tuple[int, Iterable[Domain]]] = [(len(within), (within,))]
    else:
        if depth is None:
            depth = _closest_depth(view, spec)
        if depth is None:
            return None
        lowest = 0
        if spec.topology.mode is PackMode.REQUIRED and spec.topology.pack:
            lowest = min(pack_depth(view.levels, spec.topology.pack), len(view.levels))
        levels = [(d, view.index.by_depth[d]) for d in range(depth, lowest - 1, -1)]
    per_task, n = spec.resources, spec.tasks
    leaf = len(state.levels)
    holds: dict[Resources, int] = {}  #: node capacity -> tasks it holds when empty
    for d, keys in levels:
        options = []
        for key in keys:
            if view.bound(key, per_task, when_empty=True) < n:
                continue
            candidates = []  #: (expected empty, node, tasks it holds when empty)
            racks = [key] if d == leaf else [k for k in state.index.by_depth[leaf] if k[:d] == key]
            for rack in racks:
                for _, _, _, node_id in state.index.domains[rack].entries:  # type: ignore[union-attr]
                    capacity = state.nodes[node_id].capacity
                    when_empty = holds.get(capacity)
                    if when_empty is None:
                        when_empty = holds[capacity] = per_task.count_in(capacity)
                    after = until.get(node_id, clock.now)
                    if when_empty > 0 and not math.isinf(after):
                        candidates.append((max(clock.empty_at(node_id), after), node_id, when_empty))
            found = _first_to_hold(view, per_task, n, candidates)
            if found is not None:
                options.append((max(found[0], clock.now), key, found[1]))
        if options:
            starts = min(o[0] for o in options)
            first = [o for o in options if o[0] == starts]
            if len(first) > 1:  # what fits now breaks the tie (worked out for these alone)
                first.sort(key=lambda o: (-sum(view.tasks_fit(node_id, per_task) for node_id in o[2]), o[1]))
            _, key, nodes = first[0]
            return key, nodes, starts
    return None


def _first_to_hold(view: ClusterView, per_task: Resources, n: int,
                   candidates: list[tuple[float, str, int]]) -> tuple[float, frozenset[str]] | None:
    """The nodes expected to hold `n` tasks first, in the order (expected empty, most tasks that fit
    now, most when empty, id), and their expected start.

    Only the order within the group of nodes that completes the set depends on what fits now, so
    that is worked out for that group alone, not for every candidate."""
    candidates.sort()
    chosen: list[str] = []
    room = i = 0
    while i < len(candidates):
        at = candidates[i][0]
        j = i
        while j < len(candidates) and candidates[j][0] == at:
            j += 1
        group = candidates[i:j]
        group_room = sum(c[2] for c in group)
        if room + group_room < n:  # every node of the group is taken, in any order
            chosen += [node_id for _, node_id, _ in group]
            room += group_room
            i = j
            continue
        for _, neg_empty, node_id in sorted((-view.tasks_fit(node_id, per_task), -when_empty, node_id)
                                            for _, node_id, when_empty in group):
            chosen.append(node_id)
            room -= neg_empty
            if room >= n:
                return at, frozenset(chosen)
    return None
