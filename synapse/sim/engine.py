"""A discrete-event simulator: the real state machine and the leader's own brain on a simulated clock.

Nothing here is a copy of scheduling logic: the simulator feeds `ClusterState.apply` the same
commands the leader and workers would, and its rounds are `LeaderState` rounds
(synapse.core.brain.leader_state), the very object the leader drives: the queue policy with the memo and
reservations of the round before, the preemption step, the pending reasons. The simulator plays
the driver's part (it applies what the brain proposes and reports the outcome) and the workers'
(it ends each task after the duration its job was given, or at the end of a preemption's grace).

With `spares` (synapse.core.schedule.spares), the brain designates spare nodes (SetSpares) and evicts
their guests for a restart after a lost node (a Preempt of rule `spare`, whose victims exit after
their notice and grace like any other's).

With `preempt=True` (and queues defined by an admin), a round that places nothing may commit a
`Preempt`: the victims' tasks exit after the grace the command gives them (as the workers report
them), the state machine requeues the victims with their original submission time, and the held
nodes go to the preemptor in a later round, once the victims' tasks are gone. As on the leader,
rounds follow one another while they place gangs or preempt (a commit marks the leader's scheduler
dirty).

`lose_node` and `restore_node` play a node failing and coming back: the command the leader
proposes once a node's heartbeats stop (`NodeLost` from command-set version 3: its gangs requeue at
their place, uncharged) and the `NodeUp` it proposes when the node is heard from again. The other
tasks of a gang that lost a node exit at once, as a collective whose peer vanished does.

The queue policy is a parameter so that a trace replay (synapse.sim) can run baselines through
the same state machine and placement code; by default it is the real one, `schedule_round`.
Heartbeats, time limits and retention are the leader's too, but the simulator needs none of them:
its nodes never fall silent, a trace's task ends where its time limit ended it, and finished jobs
are kept for the replay's records.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from synapse.core import commands as c
from synapse.core import versions
from synapse.core.brain.config import LeaderConfig, QueuePolicy
from synapse.core.brain.leader_state import LeaderState
from synapse.core.brain.stimuli import Propose, Proposed, RoundDue
from synapse.core.model import DEFAULT_LEVELS, JobSpec, Plan, Resources
from synapse.core.schedule.scheduler import RoundResult, schedule_round
from synapse.core.schedule.spares import SparePolicy
from synapse.core.state.fsm import ClusterState

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
class TaskEnd:
    at: float
    job_id: str
    attempt: int
    index: int
    node_id: str
    exit_code: int


class Simulator:
    """Drives a ClusterState through scheduling rounds and task lifetimes on a simulated clock."""

    def __init__(self, levels: tuple[str, ...] = DEFAULT_LEVELS, policy: QueuePolicy = schedule_round, *,
                 preempt: bool = False, spares: SparePolicy | None = None) -> None:
        self.state = ClusterState(levels)
        self.preempt = preempt  #: run the leader's preemption step (only does anything with queues defined)
        #: the leader's brain; the simulator is its driver (heartbeats and retention never come up)
        self.leader = LeaderState(LeaderConfig(preempt=preempt, policy=policy, job_retention=0, spares=spares))
        # Every member of a simulated cluster runs this code, as a real cluster does once upgraded:
        # spares may be designated, run times are learned (synapse.core.schedule.predict).
        self.state.apply(c.SetClusterVersion(at=0.0, version=versions.COMMAND_VERSION))
        self.preemptions: list[c.Preempt] = []  #: every Preempt committed, in order
        #: (victim, start, stop, GPUs) of every attempt preempted: held until its tasks exited, work
        #: lost (the victim reruns from the start)
        self.lost_runs: list[tuple[str, float, float, int]] = []
        self._run: dict[tuple[str, int], tuple[float, float]] = {}  #: (job, attempt) -> (start, planned end)
        self.now = 0.0  #: simulated seconds
        self.rounds = 0
        self._ends: list[TaskEnd] = []
        self._runtime: dict[str, tuple[float, int]] = {}  #: job id -> (task duration, exit code)
        self._ids = itertools.count(1)
        #: a task end in `_ends` may have been overtaken (a preemption or a lost node ended it first)
        self._overtaken = False
        self._designated = False  #: the last round designated spares (its plans are left to the next)

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
        """One scheduling round of the leader's brain: commit what it proposes, start the tasks.

        `full=False` lets the memo of the previous round skip the jobs it saw, as the leader's
        event-driven rounds do; a full round (the leader's periodic one) looks at every pending job
        again. With preemption on, rounds follow one another while they place or preempt; a round
        that designated spares (and placed nothing: see LeaderState) is followed by another."""
        preempted = self._round(full)
        result = self._last_round()
        while (self.preempt and self.state.queues and (result.plans or preempted)) or self._designated:
            preempted = self._round(False)
            result = self._last_round()
        return result

    def _last_round(self) -> RoundResult:
        """The round the brain just ran; an empty one when it ran none (a RoundDue that designated
        spares places nothing: see LeaderState)."""
        return self.leader.last_round or RoundResult()

    def _round(self, full: bool) -> bool:
        """One round; True when it committed a preemption."""
        self.rounds += 1
        preempted = self._designated = False
        for instruction in self.leader.handle(self.state, RoundDue(at=self.now, full=full)):
            if not isinstance(instruction, Propose):
                continue  # a Reschedule: the caller's loop decides when rounds follow
            cmd = instruction.cmd
            if isinstance(cmd, c.CommitPlan):
                self.commit(Plan(cmd.job_id, cmd.attempt, cmd.placements))
            elif isinstance(cmd, c.Preempt):
                self._preempt(cmd)
                preempted = True
            else:
                self.apply(cmd)
                self._designated = self._designated or isinstance(cmd, c.SetSpares)
            self.leader.handle(self.state, Proposed(instruction, True))
        return preempted

    def _preempt(self, cmd: c.Preempt) -> None:
        """Commit a Preempt: its victims' tasks exit after their checkpoint notice (if any) and their
        grace, as the workers report them."""
        state = self.state
        victims = [(v, state.jobs[v.job_id]) for v in cmd.victims]
        committed = self.apply(cmd)
        if not committed.ok:
            raise AssertionError(f"preemption rejected: {committed.error}")
        self.preemptions.append(cmd)
        self._overtaken = True
        for v, job in victims:
            start, planned_end = self._run.get((v.job_id, v.attempt), (self.now, self.now))
            gone = self.now + v.notice + v.grace  # the notice, SIGTERM, then the grace (synapse.worker.state)
            stop = min(planned_end, gone)  # a task due to end within its grace ends then
            self.lost_runs.append((v.job_id, start, stop, sum(t.resources.gpu for t in job.tasks)))
            for t in job.tasks:
                if t.state.live:  # SIGTERM now; the worker reports the exit when the grace is over
                    heapq.heappush(self._ends, TaskEnd(gone, v.job_id, v.attempt, t.index, t.node_id, SIGTERM_EXIT))

    def lose_node(self, node_id: str, reason: str = "node failed") -> list[str]:
        """The node dies: commit the NodeLost the leader would propose, and end the other tasks of
        each gang it stopped (their workers report them gone). Returns the jobs it stopped."""
        hit = sorted({job_id for job_id, _attempt, _index in self.state.live_tasks.get(node_id, ())})
        result = self.apply(c.NodeLost(at=self.now, node_id=node_id, reason=reason))
        if not result.ok:
            raise AssertionError(f"NodeLost rejected: {result.error}")
        self._overtaken = True
        for job_id in hit:
            job = self.state.jobs[job_id]
            attempt = job.attempt
            for t in list(job.tasks) if job.status.has_gang else ():
                if t.state.live:
                    self.apply(c.TaskExited(at=self.now, job_id=job_id, attempt=attempt, index=t.index,
                                            node_id=t.node_id, exit_code=SIGTERM_EXIT))
        return hit

    def restore_node(self, node_id: str) -> None:
        """The node is heard from again: commit the leader's NodeUp."""
        result = self.apply(c.NodeUp(at=self.now, node_id=node_id))
        if not result.ok:
            raise AssertionError(f"NodeUp rejected: {result.error}")

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
            heapq.heappush(self._ends, TaskEnd(self.now + duration, plan.job_id, plan.attempt,
                                                p.index, p.node_id, exit_code))

    def _stale(self, end: TaskEnd) -> bool:
        """A task end already overtaken: its task exited earlier (stopped at the end of a grace, or
        its natural end came first) or its attempt is over."""
        job = self.state.jobs.get(end.job_id)
        if job is None or job.attempt != end.attempt or end.index >= len(job.tasks):
            return True
        return not job.tasks[end.index].state.live

    def next_event_at(self) -> float | None:
        if self._overtaken:  # only preemption and lost nodes leave a second end behind for a task
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
            if self._overtaken and self._stale(end):
                continue
            self.now = max(self.now, end.at)
            self.end_task(end)
            ended += 1
        self.now = max(self.now, target)
        return ended

    def end_task(self, end: TaskEnd) -> None:
        """A task's end is due: report its exit, as its worker would."""
        self.apply(c.TaskExited(at=self.now, job_id=end.job_id, attempt=end.attempt,
                                index=end.index, node_id=end.node_id, exit_code=end.exit_code))

    def run(self, *, until: Callable[[], bool], max_rounds: int) -> int:
        """Alternate rounds and clock steps until `until()` or `max_rounds`; returns rounds used."""
        for used in range(1, max_rounds + 1):
            self.schedule()
            if until():
                return used
            if self.advance() == 0 and not self.state.pending:
                return used
        return max_rounds
