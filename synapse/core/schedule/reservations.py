"""Reservations and backfill: the nodes a blocked gang holds, when they are expected to drain, and
who may run on them meanwhile. Pure; one scheduling round (synapse.core.schedule.scheduler) asks.

The first `Tuning.reservations` gangs that do not fit (but would fit the idle cluster) each get a
**reservation**: in the lowest-level domain that holds the gang when idle, the nodes expected to
be empty first by the time limits of their tasks (then those with the most room now); a gang
behind the head only if they are expected to hold it within `Tuning.reserve_within_s`. So a gang
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

Jobs behind them are **backfilled** on nodes outside the reservations, or inside one when the
job's `time_limit` ends before that reservation is expected to start (known only when every
task on its nodes has a time limit itself; otherwise those nodes stay untouched).

"Expected" above is by time limits only with `Tuning.predict` off. With it (the leader's default),
a job is expected to run what the cluster's own runs of its kind predict (synapse.core.schedule.predict,
learned in apply, so every replica expects the same; the limit when nothing is known): the drain
clock, hence which nodes a gang reserves and when it expects to start, and the split test use
that; a job may go on reserved nodes by the longer of the last runs of its own kind
(`backfill_run`), or, with none, by four times the longest of its user's last runs
(`guessed_run`), but on the nodes of a gang that has waited 12 h or more by its own kind or limit
alone (`may_use_reserved`); the drain clock counts a running job of no known kind by that guess
too. Time limits still end jobs and bound what a reservation promises a later one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from synapse.core.jobs.quantity import format_moment
from synapse.core.model import Job, JobSpec, NodeStatus, PackMode, Plan, Resources, excluded_for, topology_path
from synapse.core.schedule.placement import ClusterView, pack_depth
from synapse.core.schedule.spares import last_domain
from synapse.core.schedule.topology import Domain
from synapse.core.schedule.view import ClusterRead


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
    #: one domain + run; see split_pays); off: the fixed wait alone
    weigh_locality: bool = True
    spread_factor: float = 0.9  #: the speed of a gang split across domains, relative to one packed
    #: expect jobs to run as long as the cluster's own runs predict (synapse.core.schedule.predict; the time
    #: limit when it knows none), not their time limits: when nodes drain, whether a gang should
    #: split, and (by the longer of the last runs of the job's own kind, see backfill_run) whether
    #: a job may run on reserved nodes. The limit still ends a job, and a reservation is done with
    #: its nodes (what a later reservation is promised) by its limit alone.
    predict: bool = True
    #: a restart waiting for nodes that are DOWN keeps the usable nodes of its domain only while
    #: every DOWN node there went down within this long (a reboot's time): a node not back by then
    #: is being repaired, for hours or for good, and holding a rack's GPUs idle that long costs more
    #: than the drain the gang then waits for once the node is back
    restart_hold_s: float = 900.0
    #: EASY++'s rules, one by one (ablations, off: measured against `easy++` on the gang-heavy
    #: week, docs/evaluation/results.md, none gained JCT without lengthening the big gangs' tail;
    #: `backfill_by_user` and `drain_by_user` are taken with `backfill_user_factor` set to 0).
    #: With `predict`, a job with no runs of its own kind may go on reserved nodes by its user's
    #: runs (the mean of their last two), not only by its time limit (backfill_run)
    backfill_by_user: bool = False
    #: with `predict`, the drain clock expects a running job with no runs of its own kind to run
    #: what its user's runs predict, not its time limit (the split test still weighs its own kind)
    drain_by_user: bool = False
    #: the jobs behind the reserving gangs (the backfill) are tried shortest expected run first by
    #: the cluster's runs of their kind or their user, those with none known after them, not in
    #: queue order (scheduler.backfill_order). Off: on the gang-heavy week it gains 0.014 of JCT
    #: against EASY++, and with noisy run times (`--within-cv 1.0`) it lengthens the big gangs'
    #: tail (worst seed 1.18) and takes the single-rack share under 0.95 (docs/evaluation/results.md)
    shortest_backfill: bool = False
    #: Issue 48 (docs/evaluation/results.md, "Against EASY++"): with `predict`, a job with no runs
    #: of its own kind may go on reserved nodes when this many times the longest of its user's last
    #: runs ends before the reservation starts (0: off, by its time limit then); a margin for a
    #: guess from the user's other jobs (guessed_run)
    backfill_user_factor: float = 4.0
    #: the drain clock expects a running job with no runs of its own kind to run what
    #: `backfill_user_factor` lets such a job onto reserved nodes by, not its time limit: else a job
    #: let on by the guess pushes the reservation's start out to its limit, the slack grows, and
    #: more guessed jobs go on
    drain_user_factor: bool = True
    #: a guess from the user's runs (backfill_user_factor) lets a job onto the nodes of a gang only
    #: while that gang has waited less than this since its submission: the gangs that waited long
    #: are promised their start by the job's own kind or limit alone (inf: no bound)
    guess_wait_s: float = 12 * 3600.0
    #: Issue 48: a blocked gang other than the head (and not a restart) reserves only nodes expected
    #: to hold it within this long; one expected later holds none, but still takes its turn of
    #: `reservations` (so the gangs behind it neither reserve nor weigh a split in its place). A
    #: start expected a day or more away is mostly the time limits' (with no runs of the jobs' kinds
    #: known, all of it), promises little, and keeps every job its limit does not end first off
    #: those nodes all that while: measured, docs/evaluation/results.md (inf: no bound)
    reserve_within_s: float = 24 * 3600.0

    def switch_margin(self, remaining: float) -> float:
        return self.switch_min_s if math.isinf(remaining) else max(self.switch_min_s, self.switch_share * remaining)


TUNING = Tuning()
#: Conservative backfill (what Slurm's backfill plugin runs), a baseline: every blocked gang
#: reserves, weighed at every round, and no gang waits for one rack.
CONSERVATIVE = Tuning(reservations=1 << 30, switch_share=0.0, switch_min_s=0.0, reevaluate_s=0.0,
                      locality_wait_s=0.0, weigh_locality=False, predict=False)


def ends_before(run: float, reservation: Reservation, now: float) -> bool:
    """A job may use reserved nodes only if it is expected to end (`run`: its prediction, or its
    time limit) before the reservation is expected to start."""
    return not math.isinf(run) and not math.isinf(reservation.starts_at) and now + run <= reservation.starts_at


def may_use_reserved(state: ClusterRead, job: Job, now: float, tuning: Tuning,
                     reservations: list[Reservation]) -> tuple[bool, ...]:
    """Per reservation, whether `job` may run on its nodes: whether it is expected to end before
    the reservation starts (ends_before), by `backfill_run`, or by the guess from its user's runs
    (`guessed_run`, with `Tuning.backfill_user_factor`) while the reserving gang has waited less
    than `Tuning.guess_wait_s`."""
    run = backfill_run(state, job, now, tuning)
    guess = guessed_run(state, job, now, tuning.backfill_user_factor) \
        if tuning.predict and tuning.backfill_user_factor > 0 else None
    if guess is None or guess >= run:
        return tuple(ends_before(run, r, now) for r in reservations)
    return tuple(ends_before(guess if _waited(state, r, now) < tuning.guess_wait_s else run, r, now)
                 for r in reservations)


def _waited(state: ClusterRead, reservation: Reservation, now: float) -> float:
    """How long the gang of a reservation has waited since its submission (0 if it is gone)."""
    gang = state.jobs.get(reservation.job_id)
    return now - gang.submitted_at if gang is not None else 0.0


def guessed_run(state: ClusterRead, job: Job, now: float, factor: float) -> float | None:
    """`factor` times the longest of the last runs of the job's user, never beyond its time limit,
    for a job its limit bounds that has no runs of its own kind but whose user has runs; None
    otherwise. A guess from the user's other jobs errs both ways (two of three within ±100 % on the
    recurring traces), so the factor is a margin; `guess_wait_s` bounds who pays for a miss."""
    spec, limit = job.spec, job.spec.time_limit
    if not limit or not job.user:
        return None
    elapsed = now - job.started_at if job.started_at else 0.0
    if state.run_times.longest_own(job.user, spec.name, spec.resources.gpu * spec.tasks, limit, elapsed) is not None:
        return None
    users = state.run_times.longest_user(job.user, limit, elapsed)
    return None if users is None else min(limit, factor * users)


def backfill_run(state: ClusterRead, job: Job, now: float, tuning: Tuning) -> float:
    """How long a job is taken to run when it asks for reserved nodes, where a wrong guess delays
    the gang the nodes are kept for.

    Only a job its time limit bounds may go there (the limit bounds the delay it can cause). With
    `Tuning.predict` it is judged by the longer of the last runs of its own kind (user, name, size),
    a guess that errs long; a guess from its user's other jobs is too loose to risk the reserved
    gang's start on, and so is no history: then by its limit (`guessed_run` is the bounded use of
    the user's runs, may_use_reserved). (Measured on the recurring traces,
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
    if longest is None and tuning.backfill_by_user:
        return expected_run(state, job, now, True, own_kind=False)
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


def blocked_reason(state: ClusterRead, view: ClusterView, job: Job, spec: JobSpec, now: float,
                    reservations: list[Reservation], previous: Reservation | None, clock: DrainClock,
                    tuning: Tuning, depth: int | None = None, restart: bool = False,
                    declined: int = 0) -> tuple[str, str]:
    """Reserve nodes for a gang that does not fit, if it is among the first blocked ones or a
    restart after a lost node (which always reserves, whatever `Tuning.reservations`: while it
    waits, backfill must not take what it needs); the message and code of why it waits. The new reservation is
    appended to `reservations`; `depth` the level it goes at (None: the lowest domain that holds the
    gang); `declined`: the blocked gangs before it that had their turn but reserved nothing
    (Tuning.reserve_within_s, the caller's rule), counted against `Tuning.reservations` too."""
    local = " (waiting for one " + spec.topology.pack + ")" if spec.topology != job.spec.topology else ""
    if len(reservations) + declined >= tuning.reservations and not restart:
        return (f"does not fit outside the reservations{local} ({reservations[0].describe(now)}, "
                f"and {len(reservations) - 1} more)", "BehindReservation")
    # Its excluded nodes never free for it: a reservation holds none of them; nor spares, but for a restart.
    never = excluded_for(state.nodes, job) | (frozenset() if restart else state.spares)
    until = dict.fromkeys(never, math.inf) | reserved_until(reservations)
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


class DrainClock:
    """When each node is expected to be empty: the latest expected end (`expected_run`: by
    prediction, or by time limit; with `user_factor`, the guess of `guessed_run` if shorter) of the
    tasks on it (inf when one has none), counting this round's plans (array elements not yet jobs
    among them) as started now. Computed per node on demand."""

    def __init__(self, state: ClusterRead, now: float, plans: list[Plan], predict: bool = False,
                 own_kind: bool = True, user_factor: float = 0.0) -> None:
        self.state, self.now, self.plans, self.predict, self.own_kind = state, now, plans, predict, own_kind
        self.user_factor = user_factor
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
                end = self.now + self._expected(job)
            else:
                spec = self.state.spec_of(plan.job_id)  # an array's next elements are not jobs yet
                limit = spec.time_limit if spec is not None else 0.0
                end = self.now + limit if limit else math.inf
            for p in plan.placements:
                self._planned[p.node_id] = max(self._planned.get(p.node_id, self.now), end)
                if p.node_id in self._at:
                    self._at[p.node_id] = max(self._at[p.node_id], end)
        self._seen_plans = len(self.plans)

    def _expected(self, job: Job) -> float:
        """How long `job` is expected to run: `expected_run`, or with `user_factor` the guess a job
        of no known kind may go on reserved nodes by (guessed_run), if shorter."""
        run = expected_run(self.state, job, self.now, self.predict, self.own_kind)
        if self.user_factor > 0 and self.predict:
            guess = guessed_run(self.state, job, self.now, self.user_factor)
            if guess is not None:
                run = min(run, guess)
        return run

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
            if job.tasks[index].holder >= 0:
                continue  # a step's task: its allocation's task on the node says when it frees
            run = self._runs.get(job_id)
            if run is None:
                run = self._runs[job_id] = self._expected(job)
            if math.isinf(run):
                return math.inf
            latest = max(latest, (job.tasks[index].started_at or self.now) + run)
        return latest


def reserved_until(reservations: Iterable[Reservation]) -> dict[str, float]:
    """Node -> when the reservations holding it are expected to be done with it."""
    until: dict[str, float] = {}
    for r in reservations:
        for node_id in r.nodes:
            until[node_id] = max(until.get(node_id, r.ends_at), r.ends_at)
    return until


def _reserve(state: ClusterRead, view: ClusterView, job: Job, spec: JobSpec, previous: Reservation | None,
             until: Mapping[str, float], clock: DrainClock, tuning: Tuning, sticky: bool = True,
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


def split_pays(state: ClusterRead, view: ClusterView, job: Job, local: JobSpec, fits_split: bool,
                until: Mapping[str, float], clock: DrainClock, tuning: Tuning, run: float) -> bool:
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
              clock: DrainClock, depth: int | None = None,
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
                for _, _, _, node_id in state.index.domains[rack].entries or ():  # a rack's are always kept
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
