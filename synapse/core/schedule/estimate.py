"""When each pending job is expected to start: a walk of the last round's plan. Pure.

The estimate is the scheduler's own plan carried forward, not a second model (Slurm's `squeue
--start` reads its backfill plan the same way). After a round, the pending jobs are walked in the
round's order (`RoundResult.waiting` keeps it; a round after submissions alone appends the new
jobs to the memo's) against a timeline of what each node has free and gets back when: each
task's start plus its job's predicted run (synapse.core.schedule.predict: runs of its kind, else
of its user's, else its time limit); this round's plans counted as started now.

* A job that holds a reservation starts when its reserved nodes are expected to hold it; basis
  `reservation`. (By the predictor's best guess, its user's runs included: the reservation's own
  `starts_at`, which the policy chooses nodes by, takes a job of a kind never seen to run to its
  limit, and limits are mostly far above the runs. A baseline's estimate is its plan's start,
  EASY's shadow time: `reservation_start`.)
* Another job that waits for room starts at the earliest moment enough nodes are expected to be
  empty in one domain it may use (one rack while it waits for one rack, then anywhere once its
  locality wait ends; anywhere for `preferred` packing; one domain of its pack level when
  `required`); basis `queue`.
* Either way, what it takes is then expected busy from its start to its own predicted end, so
  the jobs behind it wait for it, or run before it if they are expected to end in time
  (conservative backfill's profile, which the policy's reservations approach: only the first
  few blocked gangs reserve, so a job behind them may also start earlier than estimated).
* A job the round holds back (a dependency, a throttle, a singleton, its queue's max), one that
  can never fit, one whose nodes run jobs of unknown length (no time limit, no prediction), and
  one beyond the first `DEPTH` the walk reaches, gets no time: `unknown` with the reason.

The walk reads and changes nothing but its own timeline. Its cost is a sort of the running
tasks' ends, then per job a scan of them in time order until a domain holds it: the leader runs
it only when someone reads estimates, once per round (synapse.core.brain.rounds).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedList

from synapse.core.jobs.quantity import format_moment
from synapse.core.model import Job, JobSpec, JobStatus, PackMode, Plan, Resources, excluded_for, topology_path
from synapse.core.schedule.placement import pack_depth
from synapse.core.schedule.reservations import Reservation, expected_run
from synapse.core.schedule.scheduler import WaitReason
from synapse.core.schedule.spares import restarting
from synapse.core.schedule.view import ClusterRead

#: Waiting jobs the walk estimates, at most, in the round's order; those behind are unknown.
DEPTH = 200
#: The jobs an estimate names as what it waits for, at most (those that end last).
MAX_AHEAD = 3
#: Why a job gets no time, by its wait reason's code (scheduler.PENDING_REASONS and the gate's): short,
#: for a table's cell; the wait reason itself is the detail.
UNKNOWN_BY_CODE = {
    "Unschedulable": "can never fit",
    "DependencyNeverSatisfied": "dependency can never be met",
    "Dependency": "dependency not met",
    "Singleton": "another job of its name runs",
    "ArrayThrottle": "array throttle",
    "QueueAtMax": "queue at its max",
    "Preempting": "preempting",
    "NodesUnavailable": "nodes down or cordoned",
    "Held": "held",
}
#: The codes of jobs that wait for room alone: the walk estimates these.
ROOM_CODES = frozenset({"Resources", "BehindReservation"})


@dataclass(frozen=True, slots=True)
class Estimate:
    """When a pending job is expected to start, and what that rests on."""

    at: float | None  #: expected start, epoch seconds; None: unknown
    basis: str  #: "reservation" (the nodes it holds), "queue" (the jobs ahead of it), or "unknown"
    why: str = ""  #: for an unknown estimate, why (short)
    detail: str = ""  #: for people: what it rests on (never a relative time: it is read later)
    ahead: tuple[tuple[str, float], ...] = ()  #: (job, predicted end) of what it waits for, latest first

    @staticmethod
    def unknown(why: str, detail: str = "") -> Estimate:
        return Estimate(None, "unknown", why, detail or why)


def estimate_starts(state: ClusterRead, now: float, waiting: Mapping[str, WaitReason],
                    reservations: Iterable[Reservation] = (), plans: list[Plan] | None = None, *,
                    predict: bool = True, locality_wait_s: float = math.inf, depth: int = DEPTH,
                    until: Collection[str] = (), reservation_start: bool = False) -> dict[str, Estimate]:
    """Every pending job's estimate from a round's `waiting` (job id -> WaitReason, in the round's
    order), its `reservations` and its `plans`, at `now`. A job a reservation holds comes first if
    the round left it out of `waiting` (a baseline policy). `until`: stop once these are estimated.
    `reservation_start`: a reservation's own start is its job's estimate (a baseline's plan, EASY's
    shadow time), not when the walk expects its nodes to hold it."""
    walk = _Walk(state, now, plans or [], predict, locality_wait_s, reservation_start)
    held = {r.job_id: r for r in reservations}
    order = [j for j in held if j not in waiting] + list(waiting)
    out: dict[str, Estimate] = {}
    estimated, left = 0, set(until)
    for job_id in order:
        job = state.jobs.get(job_id)
        if job is None or job.status is not JobStatus.PENDING or job_id in out:
            continue
        if estimated >= depth:
            out[job_id] = Estimate.unknown(f"beyond the first {depth} waiting", f"the estimate walks the first "
                                           f"{depth} waiting jobs of the queue; this one is further back")
        elif job_id in held:
            estimated += 1
            out[job_id] = walk.reserved(job, held[job_id])
        else:
            estimated += 1
            out[job_id] = walk.queued(job, waiting[job_id])
        if left:
            left.discard(job_id)
            if not left:
                break
    return out


#: (cpu, memory, gpu), as the walk does its sums
_Amount = tuple[int, int, int]
_NOTHING: _Amount = (0, 0, 0)  #: what an estimated job's end gives back to the timeline (a moment to look again)


def _amount(r: Resources) -> _Amount:
    return r.cpu, r.memory, r.gpu


@dataclass(slots=True)
class _Scan:
    """One shape's scan of the timeline, and where it stands. A later job of the same shape, run
    and constraints starts no earlier (the jobs estimated in between only took room), so its scan
    goes on from here: a queue of many alike gangs costs one scan of the timeline, not one per gang."""

    need: _Amount  #: per task
    n: int  #: tasks of the gang
    run: float  #: its predicted run: an estimated job overlapping [at, at + run) takes room
    domain_of: dict[str, tuple[str, ...]]  #: node -> its domain at the gang's pack level
    base: dict[str, _Amount]  #: the walk's: node -> free now
    claims: dict[str, list[tuple[float, float, _Amount, str]]]  #: the walk's estimated jobs, by node
    at: float  #: the moment reached
    seen: int  #: claims counted (Walk.claim_log's length then)
    pos: tuple[Any, ...] | None = None  #: the last event taken in
    free: dict[str, _Amount] = field(default_factory=dict)  #: node -> free then (estimated jobs aside), if changed
    fits: dict[tuple[str, ...], dict[str, int]] = field(default_factory=dict)  #: domain -> node -> tasks it holds
    room: dict[tuple[str, ...], int] = field(default_factory=dict)  #: domain -> tasks it holds
    #: domain -> (-tasks, node) of its nodes that hold any, the most first: whom a gang takes
    order: dict[tuple[str, ...], SortedList[tuple[int, str]]] = field(default_factory=dict)
    ends: dict[str, dict[str, float]] = field(default_factory=dict)  #: node -> job -> its end that gave room
    #: (moment, node): when an estimated job on the node comes into the run (a heap)
    entries: list[tuple[float, str]] = field(default_factory=list)

    def count(self, node_id: str, at: float) -> tuple[str, ...]:
        """Bring the node's tasks of this gang up to `at`: what it has free then, less the estimated
        jobs that overlap [at, at + run); its domain."""
        c, m, g = self.free[node_id] if node_id in self.free else self.base[node_id]
        horizon = at + self.run
        for start, end, (cc, cm, cg), _job in self.claims.get(node_id, ()):
            if start < horizon and end > at:
                c, m, g = c - cc, m - cm, g - cg
        n, (pc, pm, pg) = self.n, self.need
        k = 0 if c < 0 or m < 0 or g < 0 else min(n, c // pc if pc else n, m // pm if pm else n,
                                                    g // pg if pg else n)
        domain = self.domain_of[node_id]
        on = self.fits.setdefault(domain, {})
        old = on.get(node_id, 0)
        if k != old:
            ranked = self.order.get(domain)
            if ranked is None:
                ranked = self.order[domain] = SortedList()
            if old:
                ranked.remove((-old, node_id))
            if k:
                ranked.add((-k, node_id))
            self.room[domain] = self.room.get(domain, 0) + k - old
            on[node_id] = k
        return domain

    def fits_in(self, domains: Iterable[tuple[str, ...]]) -> tuple[str, ...] | None:
        """Of `domains`, the one that holds the gang at the moment reached, the first by name if
        several do: not the first met, since the order the nodes were counted in follows sets of
        node ids (string hashes differ from one process to the next, and the estimate must not)."""
        return min((d for d in domains if self.room.get(d, 0) >= self.n), default=None)

    def place(self, domain: tuple[str, ...]) -> _Found:
        """The gang in `domain` at the moment reached: the nodes that hold the most first."""
        taken: dict[str, int] = {}
        n = self.n
        for neg, node_id in self.order[domain]:
            if n <= 0:
                break
            taken[node_id] = min(-neg, n)
            n -= taken[node_id]
        at = self.at
        behind = {x: self.ends.get(x, {}) | {c[3]: c[1] for c in self.claims.get(x, ()) if c[1] <= at}
                  for x in taken}
        return at, taken, _latest(behind, taken)


#: (at, seq, node, what it gets back, job): one moment of the timeline
_Event = tuple[float, int, str, tuple[int, int, int], str]
#: An estimated place: the moment, the tasks per node, and the jobs (with their ends) it waits for.
_Found = tuple[float, dict[str, int], tuple[tuple[str, float], ...]]


class _Walk:
    """The timeline one walk carries: what each node has free now, what it gets back when, and
    what the walk gave the jobs it estimated, from when to when.

    Tasks only end here, so what a node has free, jobs estimated aside, only grows with time. A job
    estimated to start at `s` holds its resources over [s, its predicted end); a job behind it may
    use them before `s` only if it is expected to end by then (backfill, by the predicted run), so
    a job's estimate is the first moment after which one domain holds it for its whole predicted
    run. (Any estimated job overlapping that run counts in full: a safe side, simply worked out.)"""

    def __init__(self, state: ClusterRead, now: float, plans: list[Plan], predict: bool,
                 locality_wait_s: float, reservation_start: bool = False) -> None:
        self.state, self.now, self.predict, self.locality_wait_s = state, now, predict, locality_wait_s
        self.reservation_start = reservation_start  #: a reservation's own start is its estimate
        #: node -> (cpu, memory, gpu) free now (plain ints: the scan's arithmetic is its cost)
        self.free: dict[str, _Amount] = {n: _amount(state.nodes[n].free) for n in state.nodes
                                         if state.index.contains(n)}
        self._domains: dict[int, dict[str, tuple[str, ...]]] = {}  #: depth -> node -> its domain there
        #: (at, seq, node, resources, job): what a node gets back when (nothing: an estimated job's end,
        #: a moment to look again); seq keeps a moment's events in order
        self.events: SortedList[_Event] = SortedList()
        self._seq = 0
        #: node -> (start, end, resources, job) the walk gave the jobs it estimated
        self.claims: dict[str, list[tuple[float, float, _Amount, str]]] = {}
        self.claim_log: list[tuple[str, float]] = []  #: (node, start) of every claim, in the order made
        self.scans: dict[tuple[Any, ...], _Scan] = {}  #: how far each shape's scan went (see _Scan)
        runs: dict[str, float] = {}
        ends: list[_Event] = []  #: sorted once (a SortedList built whole is far cheaper than added to)
        for node_id in self.free:
            for job_id, _attempt, index in state.live_tasks.get(node_id, ()):
                job = state.jobs[job_id]
                run = runs.get(job_id)
                if run is None:
                    run = runs[job_id] = self._run(job)
                task = job.tasks[index]
                at = (task.started_at or now) + run
                if not math.isinf(at):  # a task of unknown length never gives its room back
                    self._seq += 1
                    ends.append((max(at, now), self._seq, node_id, _amount(task.resources), job_id))
        self.events.update(ends)
        for plan in plans:  # this round's, while not yet committed: started now
            job = state.jobs.get(plan.job_id)
            if job is None or job.status is not JobStatus.PENDING:
                continue
            end, (c, m, g) = now + self._run(job), _amount(job.spec.resources)
            for p in plan.placements:
                if p.node_id in self.free:
                    fc, fm, fg = self.free[p.node_id]
                    self.free[p.node_id] = (fc - c, fm - m, fg - g)
                    self._add(end, p.node_id, (c, m, g), job.id)
        #: the nodes with room now (a scan starts from these; the others only gain room at an event)
        self.roomy = frozenset(x for x, have in self.free.items() if have[2] > 0 or have[0] > 0)

    def _run(self, job: Job) -> float:
        """How long `job` is expected to run: the predictor's best guess (runs of its own kind, else of
        its user's, else its limit; never beyond its limit), by its limit alone without `predict`."""
        return expected_run(self.state, job, self.now, self.predict, own_kind=False)

    def domains(self, depth: int) -> dict[str, tuple[str, ...]]:
        """Node -> its domain at `depth` (worked out once a walk per depth)."""
        found = self._domains.get(depth)
        if found is None:
            found = self._domains[depth] = {n: self.state.nodes[n].topology[:depth] for n in self.free}
        return found

    def _add(self, at: float, node_id: str, resources: _Amount, job_id: str) -> None:
        if math.isinf(at):
            return  # never given back
        self._seq += 1
        self.events.add((max(at, self.now), self._seq, node_id, resources, job_id))

    def reserved(self, job: Job, r: Reservation) -> Estimate:
        """A job a reservation holds: when its reserved nodes are expected to hold it."""
        found = self._earliest(job, job.spec, only=r.nodes)
        if found is not None and self.reservation_start:
            found = (r.starts_at, found[1], found[2]) if math.isfinite(r.starts_at) else None
        if found is None:
            return Estimate.unknown("no predicted end on its nodes", "its reserved nodes run jobs with no time limit "
                                    "and no run-time prediction")
        at, taken, ahead = found
        self._claim(job, job.spec.resources, taken, at)
        where = f" in {topology_path(r.domain)}" if r.domain else ""
        return Estimate(at, "reservation", detail=f"holds a reservation of {len(r.nodes)} node(s){where}, expected "
                        f"to hold it at {format_moment(at, self.now)}" + _waits_for(ahead, self.now), ahead=ahead)

    def queued(self, job: Job, reason: WaitReason) -> Estimate:
        """A job without a reservation: unknown if the round held it back, else when it first fits."""
        spec = reason.spec
        if reason.code not in ROOM_CODES or spec is None:
            return Estimate.unknown(UNKNOWN_BY_CODE.get(reason.code, reason.code), reason.message)
        found = self._earliest(job, spec)
        if spec.topology != job.spec.topology:  # waiting for one domain until its locality wait ends
            ends = job.submitted_at + self.locality_wait_s
            if found is None or found[0] > ends:
                split = self._earliest(job, job.spec, after=ends)
                if split is not None and (found is None or split[0] < found[0]):
                    found = split
        if found is None:
            return Estimate.unknown("no predicted end ahead", "the nodes it would need run jobs with no time limit "
                                    "and no run-time prediction")
        at, taken, ahead = found
        self._claim(job, spec.resources, taken, at)
        where = _domain_of(self.state, taken)
        return Estimate(at, "queue", detail=f"fits on {len(taken)} node(s){where} from "
                        f"{format_moment(at, self.now)}" + _waits_for(ahead, self.now), ahead=ahead)

    def _earliest(self, job: Job, spec: JobSpec, only: frozenset[str] | None = None, after: float = -math.inf,
                  ) -> _Found | None:
        """The first moment (none before `after`) from which one domain `spec` may use (or the nodes
        `only`) holds it for its predicted run: the moment, the tasks it puts on each node, and the
        jobs whose ends it waits for.

        A scan of the timeline's events in time order, each node's tasks kept per domain as they
        change: a task's end gives a node room, an estimated job's end gives back what it held, and
        an estimated job's start comes into this job's run (from its start less this run on) and
        takes it."""
        state = self.state
        depth = 0
        if only is None and spec.topology.mode is PackMode.REQUIRED and spec.topology.pack:
            depth = min(pack_depth(state.levels, spec.topology.pack), len(state.levels))
        never = excluded_for(state.nodes, job) | (frozenset() if restarting(job) else state.spares)
        hold = state.holds.get(job.id)
        mine = frozenset(hold.nodes) if hold is not None else frozenset()
        held = state.held_nodes

        def usable(node_id: str) -> bool:
            return node_id in self.free and (only is None or node_id in only) and node_id not in never \
                and (node_id not in held or node_id in mine)

        run = self._run(job)
        key = None if only is not None else (spec.resources, spec.tasks, depth, run, never, mine, after)
        scan = self.scans.get(key) if key is not None else None
        if scan is None:
            scan = _Scan(_amount(spec.resources), spec.tasks, run, self.domains(depth), self.free, self.claims,
                         self.now, len(self.claim_log))
            touched = self._begin(scan, only, usable)
        else:  # a job of this shape was estimated before: it starts no earlier (claims only take room)
            touched = self._catch_up(scan, usable)
        if key is not None:
            self.scans[key] = scan
        domain = scan.fits_in(touched) if scan.at >= after else None
        if domain is not None:
            return scan.place(domain)
        events = self.events.irange(minimum=scan.pos, inclusive=(False, True)) if scan.pos else iter(self.events)
        for event in events:
            at, _seq, node_id, back, job_id = scan.pos = event
            scan.at = at
            while scan.entries and scan.entries[0][0] < at:  # estimated jobs that now overlap [at, at + run)
                scan.count(heapq.heappop(scan.entries)[1], at)
            if not usable(node_id):
                continue
            if back is not _NOTHING:  # a task's end, not an estimated job's
                c, m, g = scan.free[node_id] if node_id in scan.free else self.free[node_id]
                scan.free[node_id] = (c + back[0], m + back[1], g + back[2])
                scan.ends.setdefault(node_id, {})[job_id] = at
            domain = scan.count(node_id, at)
            if at >= after and scan.room.get(domain, 0) >= scan.n:
                return scan.place(domain)
        if math.isfinite(after):  # nothing more frees: it fits once its wait ends, if ever
            scan.at = max(after, scan.at)
            for node_id in [x for on in list(scan.fits.values()) for x in on] + [x for _, x in scan.entries]:
                scan.count(node_id, scan.at)
            scan.entries.clear()
            domain = scan.fits_in(list(scan.room))
            if domain is not None:
                return scan.place(domain)
        return None

    def _begin(self, scan: _Scan, only: frozenset[str] | None,
               usable: Callable[[str], bool]) -> list[tuple[str, ...]]:
        """A fresh scan at now: the nodes with room and those the walk gave estimated jobs counted,
        and when each estimated job comes into the run; the domains counted."""
        claims, run = self.claims, scan.run
        for node_id in (claims if only is None else only & claims.keys()):
            if usable(node_id):
                scan.entries += [(start - run, node_id) for start, _end, _amount, _job in claims[node_id]
                                 if start - run >= self.now]
        heapq.heapify(scan.entries)
        for node_id in (self.roomy | claims.keys() if only is None else only):
            if usable(node_id):
                scan.count(node_id, self.now)
        return list(scan.room)

    def _catch_up(self, scan: _Scan, usable: Callable[[str], bool]) -> set[tuple[str, ...]]:
        """A scan goes on: the jobs estimated since it stopped counted (now, or when they come into
        the run); the domains they changed."""
        changed = set()
        for node_id, start in self.claim_log[scan.seen:]:
            if not usable(node_id):
                continue
            if start - scan.run < scan.at:
                changed.add(scan.count(node_id, scan.at))
            else:
                heapq.heappush(scan.entries, (start - scan.run, node_id))
        scan.seen = len(self.claim_log)
        return changed

    def _claim(self, job: Job, per_task: Resources, taken: dict[str, int], at: float) -> None:
        """The job runs as `taken` from `at` for its predicted run."""
        end = at + self._run(job)
        c, m, g = _amount(per_task)
        for node_id, k in taken.items():
            self.claims.setdefault(node_id, []).append((at, end, (c * k, m * k, g * k), job.id))
            self.claim_log.append((node_id, at))
            self._add(end, node_id, _NOTHING, job.id)


def _latest(ends: Mapping[str, Mapping[str, float]], nodes: Iterable[str]) -> tuple[tuple[str, float], ...]:
    """The jobs whose ends gave `nodes` the room it takes, latest end first, at most MAX_AHEAD."""
    found: dict[str, float] = {}
    for node_id in nodes:
        for job_id, at in ends.get(node_id, {}).items():
            found[job_id] = max(found.get(job_id, at), at)
    return tuple(sorted(found.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_AHEAD])


def _waits_for(ahead: tuple[tuple[str, float], ...], now: float) -> str:
    if not ahead:
        return ""
    return "; waits for " + ", ".join(f"{job_id} (predicted end {format_moment(end, now)})" for job_id, end in ahead)


def _domain_of(state: ClusterRead, nodes: Iterable[str]) -> str:
    """` in z0/b0/r1`: the lowest domain that holds all of `nodes` ('' for the whole cluster)."""
    paths = [state.nodes[n].topology for n in nodes]
    common = paths[0] if paths else ()
    for path in paths[1:]:
        i = 0
        while i < min(len(common), len(path)) and common[i] == path[i]:
            i += 1
        common = common[:i]
    return f" in {topology_path(common)}" if common else ""
