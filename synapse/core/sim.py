"""A discrete-event simulator: the real state machine and queue policy on a simulated clock.

Nothing here is a copy of scheduling logic: the simulator feeds `ClusterState.apply` the same
commands the leader and workers would, runs `schedule_round` exactly as the leader does (with the
memo of the round before, which lapses on any change but a submission), and plays the workers'
part by ending each task after the duration its job was given.

The queue policy is a parameter so that a trace replay (synapse.sim) can run baselines through
the same state machine and placement code; by default it is the real one, `schedule_round`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from synapse.core import commands as c
from synapse.core.fsm import ClusterState
from synapse.core.model import DEFAULT_LEVELS, JobSpec, Plan, Resources
from synapse.core.scheduler import Reservation, RoundMemo, RoundResult, schedule_round

#: A queue policy: (state, now, previous reservation, memo) -> the round's plans, as schedule_round.
QueuePolicy = Callable[[ClusterState, float, Reservation | None, RoundMemo | None], RoundResult]

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

    def __init__(self, levels: tuple[str, ...] = DEFAULT_LEVELS, policy: QueuePolicy = schedule_round) -> None:
        self.state = ClusterState(levels)
        self.policy = policy  #: fixed for the simulator's life
        self.now = 0.0  #: simulated seconds
        #: carried between rounds, as the leader does (every blocked gang's, or the head's alone)
        self.reservation: Reservation | tuple[Reservation, ...] | None = None
        self.memo: RoundMemo | None = None  #: carried between rounds, as the leader does
        self.rounds = 0
        self._ends: list[_TaskEnd] = []
        self._runtime: dict[str, tuple[float, int]] = {}  #: job id -> (task duration, exit code)
        self._ids = itertools.count(1)

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
        self.rounds += 1
        result = self.policy(self.state, self.now, self.reservation, None if full else self.memo)
        self.reservation, self.memo = result.reservations or result.reservation, result.memo
        for plan in result.plans:
            self.commit(plan)
        return result

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
        for p in plan.placements:
            self.apply(c.TaskStarted(at=self.now, job_id=plan.job_id, attempt=plan.attempt,
                                     index=p.index, node_id=p.node_id))
            heapq.heappush(self._ends, _TaskEnd(self.now + duration, plan.job_id, plan.attempt,
                                                p.index, p.node_id, exit_code))

    def next_event_at(self) -> float | None:
        return self._ends[0].at if self._ends else None

    def advance(self, until: float | None = None) -> int:
        """Move the clock to `until` (default: the next task end), ending tasks due by then."""
        target = until if until is not None else self.next_event_at()
        if target is None:
            return 0
        ended = 0
        while self._ends and self._ends[0].at <= target:
            end = heapq.heappop(self._ends)
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
