"""When each pending job is expected to start: a walk of the last round's plan. Pure.

The estimate is the scheduler's own plan carried forward, not a second model (Slurm's `squeue
--start` reads its backfill plan the same way). After a round, the pending jobs are walked in the
round's order (`RoundResult.waiting` keeps it; a round after submissions alone appends the new
jobs to the memo's) against a timeline of when each node is expected to be empty: the drain clock
the round plans reservations by (each task's start plus its job's predicted run,
synapse.core.schedule.predict; this round's plans counted as started now).

* A job that holds a reservation starts when its reserved nodes are expected to be empty (the
  reservation's own `starts_at`); basis `reservation`.
* Another job that waits for room starts at the earliest moment enough nodes are expected to be
  empty in one domain it may use (one rack while it waits for one rack, then anywhere once its
  locality wait ends; anywhere for `preferred` packing; one domain of its pack level when
  `required`); basis `queue`.
* Either way, the nodes it takes are then expected busy until its own predicted end, so the jobs
  behind it wait for it (conservative backfill's profile, whole nodes: a node counts from when it
  is expected to be empty, as reservations count it, so a job that could fit beside others' tasks
  is estimated late rather than early).
* A job the round holds back (a dependency, a throttle, a singleton, its queue's max), one that
  can never fit, one whose nodes run jobs of unknown length (no time limit, no prediction), and
  one beyond the first `DEPTH` the walk reaches, gets no time: `unknown` with the reason.

The walk reads and changes nothing but its own timeline. Its cost is a sort of the nodes by when
they drain, then per job a scan in that order until a domain holds it (the first nodes, mostly):
the leader runs it only when someone reads estimates, once per round (synapse.core.brain.rounds).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sortedcontainers import SortedList

from synapse.core.model import Job, JobSpec, JobStatus, PackMode, Plan, Resources, excluded_for, topology_path
from synapse.core.quantity import format_moment
from synapse.core.schedule.placement import pack_depth
from synapse.core.schedule.reservations import DrainClock, Reservation, expected_run
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
                    until: str | None = None) -> dict[str, Estimate]:
    """Every pending job's estimate from a round's `waiting` (job id -> WaitReason, in the round's
    order), its `reservations` and its `plans`, at `now`. A job a reservation holds comes first if
    the round left it out of `waiting` (a baseline policy). `until`: stop once that job is estimated."""
    walk = _Walk(state, now, plans or [], predict, locality_wait_s)
    held = {r.job_id: r for r in reservations}
    order = [j for j in held if j not in waiting] + list(waiting)
    out: dict[str, Estimate] = {}
    estimated = 0
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
        if job_id == until:
            break
    return out


class _Walk:
    """The timeline one walk carries: when each node is expected to be empty, and who holds it then."""

    def __init__(self, state: ClusterRead, now: float, plans: list[Plan], predict: bool,
                 locality_wait_s: float) -> None:
        self.state, self.now, self.predict, self.locality_wait_s = state, now, predict, locality_wait_s
        clock = DrainClock(state, now, plans, predict)
        #: node -> when it is expected to be empty (its tasks' predicted ends, then the walk's claims)
        self.free_at = {n: clock.empty_at(n) for n in state.nodes if state.index.contains(n)}
        self.order = SortedList((at, n) for n, at in self.free_at.items())  #: (free_at, node), soonest first
        self.claims: dict[str, tuple[str, float]] = {}  #: node -> (job, its predicted end) the walk put there
        self.planned: dict[str, list[str]] = {}  #: node -> this round's plans on it (not in the state yet)
        for plan in plans:
            for p in plan.placements:
                self.planned.setdefault(p.node_id, []).append(plan.job_id)
        self._fits: dict[tuple[Resources, Resources], int] = {}  #: (capacity, per task) -> tasks it holds

    def reserved(self, job: Job, r: Reservation) -> Estimate:
        """A job a reservation holds: its start is the reservation's."""
        if math.isinf(r.starts_at):
            return Estimate.unknown("no predicted end on its nodes", "its reserved nodes run jobs with no time limit "
                                    "and no run-time prediction")
        at = max(r.starts_at, self.now)
        ahead = self._ahead(r.nodes)
        self._claim(job, r.nodes, at)
        where = f" in {topology_path(r.domain)}" if r.domain else ""
        return Estimate(at, "reservation", detail=f"holds a reservation of {len(r.nodes)} node(s){where}, expected "
                        f"free at {format_moment(at, self.now)}" + _waits_for(ahead, self.now), ahead=ahead)

    def queued(self, job: Job, reason: WaitReason) -> Estimate:
        """A job without a reservation: unknown if the round held it back, else when it first fits."""
        spec = reason.spec
        if reason.code not in ROOM_CODES or spec is None:
            return Estimate.unknown(UNKNOWN_BY_CODE.get(reason.code, reason.code), reason.message)
        found = self._earliest(job, spec)
        if spec.topology != job.spec.topology:  # waiting for one domain until its locality wait ends
            ends = job.submitted_at + self.locality_wait_s
            if found is None or found[0] > ends:
                split = self._earliest(job, job.spec)
                if split is not None and (found is None or max(split[0], ends) < found[0]):
                    found = (max(split[0], ends), split[1])
        if found is None:
            return Estimate.unknown("no predicted end ahead", "the nodes it would need run jobs with no time limit "
                                    "and no run-time prediction, or are held for good")
        at, nodes = found
        ahead = self._ahead(nodes)
        self._claim(job, nodes, at)
        where = _domain_of(self.state, nodes)
        return Estimate(at, "queue", detail=f"fits on {len(nodes)} node(s){where} expected free at "
                        f"{format_moment(at, self.now)}" + _waits_for(ahead, self.now), ahead=ahead)

    def _earliest(self, job: Job, spec: JobSpec) -> tuple[float, frozenset[str]] | None:
        """When enough nodes are first expected empty in one domain `spec` may use, and which."""
        state, per_task, n = self.state, spec.resources, spec.tasks
        depth = 0
        if spec.topology.mode is PackMode.REQUIRED and spec.topology.pack:
            depth = min(pack_depth(state.levels, spec.topology.pack), len(state.levels))
        never = excluded_for(state.nodes, job) | (frozenset() if restarting(job) else state.spares)
        hold = state.holds.get(job.id)
        mine = frozenset(hold.nodes) if hold is not None else frozenset()
        room: dict[tuple[str, ...], int] = {}
        members: dict[tuple[str, ...], list[str]] = {}
        for at, node_id in self.order:
            if math.isinf(at):
                return None
            if node_id in never or (node_id in state.held_nodes and node_id not in mine):
                continue
            node = state.nodes[node_id]
            key = (node.capacity, per_task)
            fits = self._fits.get(key)
            if fits is None:
                fits = self._fits[key] = per_task.count_in(node.capacity)
            if fits == 0:
                continue
            domain = node.topology[:depth]
            got = room[domain] = room.get(domain, 0) + (n if fits < 0 else fits)
            members.setdefault(domain, []).append(node_id)
            if got >= n:
                return max(at, self.now), frozenset(members[domain])
        return None

    def _claim(self, job: Job, nodes: Iterable[str], at: float) -> None:
        """The job runs on `nodes` from `at` for its predicted run: they are busy until then."""
        end = at + expected_run(self.state, job, self.now, self.predict)
        for node_id in nodes:
            old = self.free_at.get(node_id)
            if old is None:
                continue
            self.order.remove((old, node_id))
            self.free_at[node_id] = new = max(old, end)
            self.order.add((new, node_id))
            self.claims[node_id] = (job.id, end)

    def _ahead(self, nodes: Iterable[str]) -> tuple[tuple[str, float], ...]:
        """The jobs whose predicted ends free `nodes`, latest first: what the walk put there, else the
        tasks running on them (and this round's plans)."""
        state, now = self.state, self.now
        ends: dict[str, float] = {}
        for node_id in nodes:
            claim = self.claims.get(node_id)
            if claim is not None:
                ends[claim[0]] = max(ends.get(claim[0], now), claim[1])
                continue
            for job_id, _attempt, index in state.live_tasks.get(node_id, ()):
                job = state.jobs[job_id]
                end = (job.tasks[index].started_at or now) + expected_run(state, job, now, self.predict)
                ends[job_id] = max(ends.get(job_id, now), end)
            for job_id in self.planned.get(node_id, ()):
                planned = state.jobs.get(job_id)
                if planned is not None:
                    ends[job_id] = max(ends.get(job_id, now), now + expected_run(state, planned, now, self.predict))
        later = sorted(((end, job_id) for job_id, end in ends.items() if end > now), reverse=True)
        return tuple((job_id, end) for end, job_id in later[:MAX_AHEAD])


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
