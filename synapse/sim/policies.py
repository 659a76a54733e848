"""The queue policies a trace is replayed through, all over the same placement code.

`synapse` is the real queue policy (synapse.core.schedule.scheduler.schedule_round), unchanged, and the
leader's preemption step after it (synapse.core.brain.leader_state, which the simulator drives), which
acts only when a queue file defines the queues the trace's jobs use (`run --queues`). The
baselines are what people run instead, written here as other queue policies with the same
signature, so every policy goes through the same state machine and `placement.place`:

* `fifo` — strict first come, first served: the head job blocks everything behind it (YARN-CS).
* `greedy` — anything that fits starts, no reservation: the best packing, and big gangs starve.
* `easy` — EASY backfilling, Slurm's default behaviour roughly: the head job gets one reservation
  on the nodes that free up first by the running jobs' time limits; a job behind it may start
  on those nodes only if its own time limit ends before the reservation starts.
* `conservative` — conservative backfilling, what Slurm's backfill plugin runs: every blocked job
  keeps a reservation (a later one may take an earlier one's nodes only from when that one is
  expected to end), so nothing starts that is expected to delay a job ahead of it; no rack wait.
  It is Synapse's `schedule_round` with those knobs (`reservations.CONSERVATIVE`), so it shares its
  reservation code.
* `synapse-flat` — the ablation: the real policy on a cluster whose topology it cannot see (every
  node registered in one rack, in an order that says nothing about the real racks).
* `synapse-strict` — the other ablation: every gang that fits in a rack requires one rack
  (`topology: {pack: rack, mode: required}`) and waits for it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass

from synapse.core.brain.config import QueuePolicy
from synapse.core.model import Job, PackMode, excluded_for
from synapse.core.schedule.eligibility import Gate
from synapse.core.schedule.placement import ClusterView, place
from synapse.core.schedule.reservations import CONSERVATIVE, TUNING, Reservation, Tuning, expected_run
from synapse.core.schedule.scheduler import RoundMemo, RoundResult, WaitReason, schedule_round
from synapse.core.state.fsm import ClusterState


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    round: QueuePolicy
    summary: str
    topology_visible: bool = True  #: False: nodes are registered without their racks
    strict_racks: bool = False  #: gangs that fit in a rack require one
    #: runs the leader's preemption step too (it acts only on jobs of queues a queue file defines)
    preempts: bool = False
    tuning: Tuning = TUNING  #: the knobs of Synapse's policy (its ablations); unused by the baselines

    @property
    def tunable(self) -> bool:
        return self.round is schedule_round or getattr(self.round, "func", None) is schedule_round


def tuned(policy: Policy, text: str) -> Policy:
    """`policy` with Synapse's queue-policy knobs changed by `KEY=VALUE,...` (Tuning's fields;
    seconds for times, true/false for switches). ValueError naming a bad key or value."""
    if not policy.tunable:
        raise ValueError(f"--tuning applies to Synapse's policies, not {policy.name}")
    fields = {f.name: f for f in dataclasses.fields(Tuning)}
    changes: dict[str, object] = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            raise ValueError(f"--tuning: {item!r} is not KEY=VALUE with KEY one of {', '.join(fields)}")
        default = getattr(TUNING, key)
        try:
            if isinstance(default, bool):
                if raw.strip().lower() not in ("true", "false"):
                    raise ValueError
                value: object = raw.strip().lower() == "true"
            elif isinstance(default, str):
                value = raw.strip()
            elif isinstance(default, int):
                value = int(raw)
            else:
                value = float(raw)
        except ValueError:
            raise ValueError(f"--tuning: {key}={raw!r} is not a {type(default).__name__}") from None
        changes[key] = value
    # Each value was parsed above to the type of its field's default: the checker sees only object.
    tuning = dataclasses.replace(policy.tuning, **changes)  # type: ignore[arg-type]
    if tuning.reservations < 1 or min(tuning.locality_wait_s, tuning.switch_min_s, tuning.reevaluate_s,
                                      tuning.switch_share) < 0 or not 0 < tuning.spread_factor <= 1:
        raise ValueError("--tuning: reservations must be at least 1, times and shares not negative, "
                         "and spread_factor in (0, 1]")
    return dataclasses.replace(policy, round=functools.partial(schedule_round, tuning=tuning), tuning=tuning)


#: A gang's shape: tasks, cpu, memory, gpu per task, topology pack and mode, nodes excluded.
Shape = tuple[int, int, int, int, str, PackMode, tuple[str, ...]]


def _shape(job: Job) -> Shape:
    """What decides whether a job fits: its gang's shape, and the nodes excluded for it."""
    spec, r = job.spec, job.spec.resources
    return (spec.tasks, r.cpu, r.memory, r.gpu, spec.topology.pack, spec.topology.mode, job.excluded_nodes)


def _start(result: RoundResult, view: ClusterView, job: Job, gate: Gate,
           blocked: frozenset[str] = frozenset()) -> bool:
    """Place `job` avoiding `blocked` and the nodes excluded for it (they ended its earlier attempts:
    apply refuses a plan on them, whatever the policy); on success count its plan as used for the
    rest of the round. An array's next elements follow it while they fit, as in Synapse's policy."""
    view.set_blocked(blocked | excluded_for(view.nodes, job))
    placed = place(view, job.id, job.attempt, job.spec)
    if placed.plan is None:
        return False
    result.plans.append(placed.plan)
    view.claim(placed.plan, job.spec.resources)
    gate.placed(job)
    result.plans += gate.more_elements(view, job, job.spec)
    return True


def _eligible(state: ClusterState, gate: Gate, result: RoundResult) -> Iterable[Job]:
    """Pending jobs in queue order that array throttles, dependencies and singletons let run now
    (every policy honours them, as Slurm's do); the others wait in `result` with why, so the
    leader's brain fails those whose dependency can never be met, as for Synapse's policy."""
    for job in state.pending_jobs():
        held = gate.held(job)
        if held is None:
            yield job
        else:
            result.waiting[job.id] = WaitReason((), held.message, held.code)
            result.examined.append(job.id)


def fifo(state: ClusterState, now: float, previous: Reservation | tuple[Reservation, ...] | None = None,
         memo: RoundMemo | None = None) -> RoundResult:
    """Start jobs in queue order until the first that does not fit."""
    view = ClusterView(state.nodes, state.index, state.levels, state.jobs)
    result, gate = RoundResult(), Gate(state)
    for job in _eligible(state, gate, result):
        if not _start(result, view, job, gate):
            break
    return result


def greedy(state: ClusterState, now: float, previous: Reservation | tuple[Reservation, ...] | None = None,
           memo: RoundMemo | None = None) -> RoundResult:
    """Start every job that fits, in queue order, holding nothing back for anyone."""
    view = ClusterView(state.nodes, state.index, state.levels, state.jobs)
    result, gate = RoundResult(), Gate(state)
    failed: set[Shape] = set()  # a shape that failed fails again this round: claims only grow
    for job in _eligible(state, gate, result):
        shape = _shape(job)
        if shape in failed:
            continue
        if not _start(result, view, job, gate):
            failed.add(shape)
            if view.free_total(()).gpu == 0:
                break
    return result


def easy(state: ClusterState, now: float, previous: Reservation | tuple[Reservation, ...] | None = None,
         memo: RoundMemo | None = None, predict: bool = False) -> RoundResult:
    """EASY backfilling: one reservation for the head blocked job, backfill what ends before it.

    By time limits; with `predict` (EASY++, Tsafrir et al.), by the run times the cluster's own
    runs predict (reservations.expected_run, the same predictor as Synapse's), limits still ending jobs."""
    view = ClusterView(state.nodes, state.index, state.levels, state.jobs)
    result, gate = RoundResult(), Gate(state)
    reserved: frozenset[str] | None = None
    shadow = math.inf  #: when the reserved nodes are expected to hold the head job
    failed: set[tuple[Shape, bool]] = set()  # and whether it may go on the reserved nodes
    for job in _eligible(state, gate, result):
        if reserved is None:
            if not _start(result, view, job, gate):
                shadow, reserved = _easy_reservation(state, view, job, now, result, predict)
                result.reservations = (Reservation(job.id, job.attempt, (), reserved, shadow, now),)
                result.reservation = result.reservations[0]
            continue
        # only a job its time limit bounds may go on the reserved nodes (with EASY++ too)
        ends_first = bool(job.spec.time_limit) and \
            now + expected_run(state, job, now, predict, own_kind=False) <= shadow
        shape = (_shape(job), ends_first)
        if shape in failed:
            continue
        if not _start(result, view, job, gate, frozenset() if ends_first else reserved):
            failed.add(shape)
    return result


def _easy_reservation(state: ClusterState, view: ClusterView, job: Job, now: float,
                      result: RoundResult, predict: bool) -> tuple[float, frozenset[str]]:
    """When the head job can start if jobs run to their time limits, and the nodes it will use.

    Counted in GPUs per node, as a topology-unaware backfill scheduler does: replay the running
    jobs' ends (start + time limit; none: never) onto each node's free GPUs until enough nodes hold
    a task each."""
    per_task = job.spec.resources.gpu or 1
    excluded = excluded_for(state.nodes, job)
    free = {n: view.free(n).gpu for n in state.nodes if state.index.contains(n) and n not in excluded}
    ends: list[tuple[float, str, int]] = []
    for node_id in free:
        for task, _ in state.tasks_on_node(node_id):
            run = expected_run(state, state.jobs[task.job_id], now, predict, own_kind=False)
            ends.append(((task.started_at or now) + run, node_id, task.resources.gpu))
    for plan in result.plans:  # started this round: not in the state yet
        planned = state.spec_of(plan.job_id)  # an array's next elements are not jobs yet
        if planned is None:
            continue
        pending = state.jobs.get(plan.job_id)
        at = now + (expected_run(state, pending, now, predict, own_kind=False) if pending is not None else
                    planned.time_limit or math.inf)
        ends += [(at, p.node_id, planned.resources.gpu) for p in plan.placements]
    ends.sort()
    fit = sum(g // per_task for g in free.values())
    shadow = now
    for at, node_id, gpus in ends:
        if fit >= job.spec.tasks:
            break
        if node_id not in free:  # a plan of this round on a node excluded for the head job
            continue
        fit += (free[node_id] + gpus) // per_task - free[node_id] // per_task
        free[node_id] += gpus
        shadow = at
    held, room = [], 0
    for node_id in sorted(free, key=lambda n: (-free[n], n)):
        if room >= job.spec.tasks:
            break
        held.append(node_id)
        room += free[node_id] // per_task
    return shadow, frozenset(held)


#: Synapse's policy by time limits alone (as before the predictor).
LIMITS = dataclasses.replace(TUNING, predict=False)

POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("fifo", fifo, "strict first come, first served: the head job blocks the queue"),
    Policy("greedy", greedy, "anything that fits starts, no reservation"),
    Policy("easy", easy, "EASY backfill: one reservation for the head job, backfill what ends before it"),
    Policy("easy++", functools.partial(easy, predict=True),
           "EASY++: EASY backfill by the run times the cluster's runs predict, limits still ending jobs"),
    Policy("conservative", functools.partial(schedule_round, tuning=CONSERVATIVE),
           "conservative backfill: every blocked job keeps a reservation", tuning=CONSERVATIVE),
    Policy("synapse", schedule_round, "Synapse's queue policy: rack-aware reservation, backfill by predicted run "
           "time", preempts=True),
    Policy("synapse-limits", functools.partial(schedule_round, tuning=LIMITS),
           "ablation: Synapse's policy by time limits alone, no predictions", tuning=LIMITS, preempts=True),
    Policy("synapse-flat", schedule_round, "ablation: Synapse's policy, blind to racks", topology_visible=False,
           preempts=True),
    Policy("synapse-strict", schedule_round, "ablation: Synapse's policy, gangs that fit in a rack require one",
           strict_racks=True, preempts=True),
)}
DEFAULT_POLICIES = ("fifo", "greedy", "easy", "easy++", "synapse", "synapse-flat")


def parse_policies(text: str | Iterable[str]) -> list[Policy]:
    """Policies from `fifo,easy,...`; ValueError naming an unknown one."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    if not names:
        raise ValueError("no policy given")
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {unknown[0]!r} (known: {', '.join(POLICIES)})")
    return [POLICIES[n] for n in dict.fromkeys(names)]
