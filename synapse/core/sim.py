"""A discrete-event simulator: the real state machine and queue policy on a simulated clock.

Nothing here is a copy of scheduling logic: the simulator feeds `ClusterState.apply` the same
commands the leader and workers would, runs `schedule_round` exactly as the leader does (with the
memo of the round before, which lapses on any change but a submission), and plays the workers'
part by ending each task after the duration its job was given.

With `preempt=True` it also runs the leader's preemption step (synapse.master.leader,
`preempt_once`): when a round places nothing and admins have defined queues, the first waiting gang
of a defined queue (in queue order, at most PREEMPT_TRIES tried) that `preemption.plan` finds a plan
for gets its `Preempt` command committed through the state machine; the victims' tasks exit after
the grace the command gives them (as the workers report them), the state machine requeues the
victims with their original submission time, and the held nodes go to the preemptor in a later
round, once the victims' tasks are gone. As on the leader, rounds follow one another while they
place gangs (a commit marks the leader's scheduler dirty), and a gang found to have no plan is not
planned again until the state changes otherwise than by submissions.

The queue policy is a parameter so that a trace replay (synapse.sim) can run baselines through
the same state machine and placement code; by default it is the real one, `schedule_round`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from synapse.core import admission, preemption
from synapse.core import commands as c
from synapse.core.fsm import ClusterState
from synapse.core.model import DEFAULT_LEVELS, JobSpec, Plan, Resources
from synapse.core.scheduler import Reservation, RoundMemo, RoundResult, schedule_round

#: A queue policy: (state, now, previous reservation, memo) -> the round's plans, as schedule_round.
QueuePolicy = Callable[[ClusterState, float, Reservation | None, RoundMemo | None], RoundResult]

#: Waiting gangs a round may try to plan a preemption for (synapse.master.leader.PREEMPT_TRIES;
#: the core may not import the leader, a test checks the two agree).
PREEMPT_TRIES = 20
#: Exit code of a task stopped by SIGTERM at the end of its grace.
SIGTERM_EXIT = 143

#: A typical 8-GPU training node: 64 cores, 512 GiB.
GPU_NODE = Resources(64_000, 512 << 30, 8)


def uniform_cluster(*, zones: int = 1, blocks_per_zone: int = 1, racks_per_block: int = 2,
                    nodes_per_rack: int = 4, capacity: Resources = GPU_NODE,
                    at: float = 0.0) -> list[c.RegisterNode]:
    """RegisterNode commands for a regular zone/block/rack tree of identical nodes."""
    cmds = []
    for z, b, r, n in itertools.product(range(zones), range(blocks_per_zone), range(racks_per_block),
                                        range(nodes_per_rack)):
        rack = f"r{(z * blocks_per_zone + b) * racks_per_block + r}"
        node_id = f"{rack}-n{n}"
        cmds.append(c.RegisterNode(at=at, node_id=node_id, address=f"{node_id}:7000",
                                   topology=(f"z{z}", f"b{z * blocks_per_zone + b}", rack),
                                   capacity=capacity))
    return cmds


@dataclass(order=True, slots=True)
class _TaskEnd:
    at: float
    job_id: str
    attempt: int
    index: int
    node_id: str
    exit_code: int


class Simulator:
    """Drives a ClusterState through scheduling rounds and task lifetimes on a simulated clock."""

    def __init__(self, levels: tuple[str, ...] = DEFAULT_LEVELS, policy: QueuePolicy = schedule_round, *,
                 preempt: bool = False) -> None:
        self.state = ClusterState(levels)
        self.policy = policy  #: fixed for the simulator's life
        self.preempt = preempt  #: run the leader's preemption step (only does anything with queues defined)
        self.preemptions: list[c.Preempt] = []  #: every Preempt committed, in order
        #: (victim, start, stop, GPUs) of every attempt preempted: held until its tasks exited, work
        #: lost (the victim reruns from the start)
        self.lost_runs: list[tuple[str, float, float, int]] = []
        self._no_plan: dict[tuple[str, int, int], str] = {}  #: (job, attempt, other_changes) -> why not
        self._run: dict[tuple[str, int], tuple[float, float]] = {}  #: (job, attempt) -> (start, planned end)
        self.now = 0.0  #: simulated seconds
        #: carried between rounds, as the leader does (every blocked gang's, or the head's alone)
        self.reservation: Reservation | tuple[Reservation, ...] | None = None
        self.memo: RoundMemo | None = None  #: carried between rounds, as the leader does
        self.rounds = 0
        self._ends: list[_TaskEnd] = []
        self._runtime: dict[str, tuple[float, int]] = {}  #: job id -> (task duration, exit code)
        self._ids = itertools.count(1)

    @property
    def lost_gpu_seconds(self) -> float:
        """GPU-seconds of work the victims of preemption lost (ran, then reran from the start)."""
        return sum((stop - start) * gpus for _, start, stop, gpus in self.lost_runs)

    def apply(self, cmd: c.Command) -> c.Result:
        return self.state.apply(cmd)

    def submit(self, spec: JobSpec, duration: float, exit_code: int = 0, job_id: str = "") -> str:
        """Submit a job whose tasks each run `duration` simulated seconds once started."""
        job_id = job_id or f"job-{next(self._ids)}"
        result = self.apply(c.SubmitJob(at=self.now, job_id=job_id, request_id=job_id, spec=spec))
        if not result.ok:
            raise ValueError(result.error)
        self._runtime[job_id] = (duration, exit_code)
        return job_id

    def schedule(self, *, full: bool = True) -> RoundResult:
        """One scheduling round: plan, commit each plan, start its tasks.

        `full=False` passes the memo of the previous round, as the leader's event-driven rounds
        do; a full round (the leader's periodic one) looks at every pending job again."""
        result = self._round(full)
        if not (self.preempt and self.state.queues):
            return result
        while True:  # the leader's rounds, one after another while something changes
            if not result.plans and self.preempt_once(result.waiting) is None:
                return result
            result = self._round(False)

    def _round(self, full: bool) -> RoundResult:
        self.rounds += 1
        result = self.policy(self.state, self.now, self.reservation, None if full else self.memo)
        self.reservation, self.memo = result.reservations or result.reservation, result.memo
        for plan in result.plans:
            self.commit(plan)
        return result

    def preempt_once(self, waiting) -> c.Preempt | None:
        """The leader's `preempt_once`: commit one preemption plan for the first waiting gang, in
        queue order, of an admin-defined queue that a rule allows; its victims' tasks exit after
        their grace. Returns the Preempt committed, or None."""
        state = self.state
        if not state.queues:
            return None
        tried, found = 0, None
        for job in state.pending_jobs():
            if tried >= PREEMPT_TRIES:
                break
            if job.id not in waiting or job.id in state.holds:
                continue
            if state.queue_of(job) not in state.queues or admission.max_block(state, job):
                continue
            key = (job.id, job.attempt, state.other_changes)
            if key in self._no_plan:
                continue
            tried += 1
            planned = preemption.plan(state, job, self.now)
            if isinstance(planned, str):
                self._no_plan[key] = planned
                continue
            found = planned.command
            break
        if len(self._no_plan) > 10_000:
            self._no_plan.clear()
        if found is None:
            return None
        victims = [(v, state.jobs[v.job_id]) for v in found.victims]
        committed = self.apply(found)
        if not committed.ok:
            raise AssertionError(f"preemption rejected: {committed.error}")
        self.preemptions.append(found)
        for v, job in victims:
            start, planned_end = self._run.get((v.job_id, v.attempt), (self.now, self.now))
            stop = min(planned_end, self.now + v.grace)  # a task due to end within its grace ends then
            self.lost_runs.append((v.job_id, start, stop, sum(t.resources.gpu for t in job.tasks)))
            for t in job.tasks:
                if t.state.live:  # SIGTERM now; the worker reports the exit when the grace is over
                    heapq.heappush(self._ends, _TaskEnd(self.now + v.grace, v.job_id, v.attempt, t.index,
                                                        t.node_id, SIGTERM_EXIT))
        return found

    def lifetime(self, plan: Plan) -> tuple[float, int]:
        """How long the tasks of a committed plan run, and their exit code (a subclass may make
        this depend on where the plan put them)."""
        return self._runtime[plan.job_id]

    def commit(self, plan: Plan) -> None:
        """Commit a plan and start its tasks, as the leader and the workers would."""
        committed = self.apply(c.CommitPlan(at=self.now, job_id=plan.job_id, attempt=plan.attempt,
                                            placements=plan.placements))
        if not committed.ok:
            raise AssertionError(f"plan rejected: {committed.error}")
        duration, exit_code = self.lifetime(plan)
        self._run[(plan.job_id, plan.attempt)] = (self.now, self.now + duration)
        for p in plan.placements:
            self.apply(c.TaskStarted(at=self.now, job_id=plan.job_id, attempt=plan.attempt,
                                     index=p.index, node_id=p.node_id))
            heapq.heappush(self._ends, _TaskEnd(self.now + duration, plan.job_id, plan.attempt,
                                                p.index, p.node_id, exit_code))

    def _stale(self, end: _TaskEnd) -> bool:
        """A task end already overtaken: its task exited earlier (stopped at the end of a grace, or
        its natural end came first) or its attempt is over."""
        job = self.state.jobs.get(end.job_id)
        if job is None or job.attempt != end.attempt or end.index >= len(job.tasks):
            return True
        return not job.tasks[end.index].state.live

    def next_event_at(self) -> float | None:
        if self.preemptions:  # only preemption leaves a second end behind for a task
            while self._ends and self._stale(self._ends[0]):
                heapq.heappop(self._ends)
        return self._ends[0].at if self._ends else None

    def advance(self, until: float | None = None) -> int:
        """Move the clock to `until` (default: the next task end), ending tasks due by then."""
        target = until if until is not None else self.next_event_at()
        if target is None:
            return 0
        ended = 0
        while self._ends and self._ends[0].at <= target:
            end = heapq.heappop(self._ends)
            if self.preemptions and self._stale(end):
                continue
            self.now = max(self.now, end.at)
            self.apply(c.TaskExited(at=self.now, job_id=end.job_id, attempt=end.attempt,
                                    index=end.index, node_id=end.node_id, exit_code=end.exit_code))
            ended += 1
        self.now = max(self.now, target)
        return ended

    def run(self, *, until: Callable[[], bool], max_rounds: int) -> int:
        """Alternate rounds and clock steps until `until()` or `max_rounds`; returns rounds used."""
        for used in range(1, max_rounds + 1):
            self.schedule()
            if until():
                return used
            if self.advance() == 0 and not self.state.pending:
                return used
        return max_rounds
