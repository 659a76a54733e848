"""Replaying a trace through one policy on the simulated clock of synapse.sim.engine.

The replay plays the users (it submits each job at its time), the workers (each task ends after
its run time, or at its time limit, as the leader would end it) and the network (a gang placed
across racks runs slower by the spread factor). Everything else — state, queue order, placement,
commits — is the real code. A round runs after every batch of simultaneous events; it is a full
round when a leader would have run its periodic one since the last (a second went by without an
event), and otherwise carries the memo of the last round, as the leader's event-driven rounds do.
A policy that `preempts` (synapse's) also runs the leader's preemption step (synapse.core.brain.leader_state):
victims stop after their grace, lose their work and rerun in full, at the spread penalty of
wherever their new attempt lands.
With a failure model (synapse.sim.failures), nodes die and come back: the replay commits the
leader's NodeLost and NodeUp, and each gang stopped by a failure resumes from its last checkpoint;
with recovery `spares`, so does a guest evicted from a spare for a restart.

Each job's estimated start is recorded once, after the round that follows its submission, from
that round's plan (synapse.core.schedule.estimate, as the leader answers `synctl get jobs`): the
estimate a user sees at submit, to be judged against the start it got. Reading it changes nothing.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
import time
from dataclasses import dataclass, field

from synapse.core import commands as c
from synapse.core.jobs.arrays import element_id, format_ranges, parse_array, split_element_id
from synapse.core.model import EndReason, Job, JobSpec, JobStatus, PackMode, Plan, Queue, Resources, TopologySpec
from synapse.core.schedule.estimate import estimate_starts
from synapse.core.schedule.predict import RunTimes
from synapse.core.schedule.reservations import Reservation
from synapse.core.schedule.scheduler import RoundMemo, RoundResult
from synapse.core.schedule.spares import SPARE_RULE, SparePolicy, restarting
from synapse.core.state.fsm import ClusterState
from synapse.sim.engine import Simulator, TaskEnd
from synapse.sim.failures import LOST, MAX_RESTARTS, FailureModel, NodeFailures
from synapse.sim.policies import Policy
from synapse.sim.trace import CPU_PER_GPU, MEMORY_PER_GPU, ClusterShape, Trace, TraceJob

#: The leader's periodic full round (synapse.master.leader.SCHEDULE_TICK_S).
FULL_ROUND_AFTER_S = 1.0
#: The exit code of a task ended at its time limit (SIGTERM).
TIME_LIMIT_EXIT = 143
#: Default speed of a gang split across racks, relative to one packed in a rack.
SPREAD_FACTOR = 0.9
#: Big gangs: 64 GPUs or more.
BIG_GANG_GPUS = 64
#: Why a GPU sat idle after a round: no job waiting; on nodes reserved for a blocked gang (they
#: drain); a gang waiting for one rack could have started split on them; no waiting job fits them.
IDLE_CAUSES = ("no_demand", "reserved", "rack_wait", "no_fit")
#: Where a big gang's wait went: holding a reservation; waiting for one rack; neither (behind
#: the reservations of others, or no reservation left for it).
BIG_WAIT_STATES = ("reserved", "rack_wait", "queued")


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What happened to one job of the trace."""

    id: str
    gpus: int
    tasks: int
    queue: str
    submit: float
    start: float  #: math.nan if it never started
    end: float  #: math.nan if it never ended
    racks: int  #: racks its gang spanned (0: never placed)
    status: str  #: SUCCEEDED, FAILED, or the state it was left in
    #: (start, stop) of each attempt preempted before the one recorded above: GPUs held, work lost
    preempted: tuple[tuple[float, float], ...] = ()
    #: when its last dependency was met (its upstreams' latest end); math.nan without dependencies
    ready: float = math.nan
    #: (start, stop, seconds kept) of each attempt a node failure ended: GPUs held from start to
    #: stop, of which the seconds up to its last checkpoint became progress
    failures: tuple[tuple[float, float, float], ...] = ()
    restart_s: float = 0.0  #: of the recorded attempt's run, the restart after a failure (no progress)
    #: its estimated start after the first round that saw it pending (math.nan: unknown, or it started
    #: in that round)
    estimate: float = math.nan


@dataclass(slots=True)
class RunResult:
    policy: str
    shape: ClusterShape
    records: list[JobRecord]
    round_seconds: list[float]  #: the policy's own decision time, per round
    events: int  #: arrivals and task ends simulated
    wall_seconds: float
    horizon: float  #: the span of submissions
    spread_factor: float
    queues: tuple[Queue, ...] = ()
    unfinished: list[str] = field(default_factory=list)
    preemptions: int = 0  #: Preempt commands committed
    #: GPU-seconds left idle between the first and the last submission, by cause (IDLE_CAUSES)
    idle: dict[str, float] = field(default_factory=dict)
    #: seconds big gangs spent pending, summed over them, by what they waited in (BIG_WAIT_STATES)
    big_wait: dict[str, float] = field(default_factory=dict)
    failure_model: FailureModel | None = None  #: the failures simulated, if any
    #: when each node failure happened, until the replay ended (the same times for every policy;
    #: a replay that runs longer sees more of them)
    failure_times: list[float] = field(default_factory=list)
    #: GPU-seconds left idle, throughout the replay, on nodes reserved for a gang's attempt after a
    #: failure (a restart, or with recovery `back` its resubmitted copy): what the cluster, not the
    #: gang, spends on waiting for a restart
    restart_held_idle: float = 0.0


class ExactRuns(RunTimes):
    """The predictor as an oracle no scheduler has (`replay(exact_runs=True)`): every job of the
    trace, submitted under its own id as its name (a kind of its own), is known to run exactly its
    trace duration (alone in one rack; a split gang runs longer). It learns nothing: what the
    policies expect is the trace's, not the runs they saw. An upper bound of what any predictor
    could give a policy that plans by predictions (easy++, synapse). Only jobs with a user: the
    predictor asks for none of the others (a trace of `generate --recurrence 0` has no users)."""

    def __init__(self, trace: Trace, shape: ClusterShape) -> None:
        super().__init__(max_keys=max(len(trace.jobs), 1))
        for job in trace.jobs:
            if job.user:
                tasks = job.tasks_on(shape)
                gpus = job.gpus // tasks * tasks  # as the job asks them (spec_of)
                self.keys[("job", job.user, job.id, gpus)] = [1, [job.duration]]

    def learn(self, user: str, name: str, gpus: int, seconds: float) -> None:
        """Nothing: the runs are known from the start."""


class Replay(Simulator):
    """One policy, one cluster, one trace."""

    def __init__(self, trace: Trace, shape: ClusterShape, policy: Policy, *, spread_factor: float = SPREAD_FACTOR,
                 queues: tuple[Queue, ...] = (), failures: FailureModel | None = None,
                 exact_runs: bool = False) -> None:
        spares = SparePolicy("rack", failures.spares_per_rack) \
            if failures is not None and failures.recovery == "spares" and policy.tunable else None
        super().__init__(policy=self._timed, preempt=policy.preempts, spares=spares)
        self.trace, self.shape, self.spec_policy = trace, shape, policy
        self.exact_runs = exact_runs  #: each job submitted under its own id, its run known (ExactRuns)
        if exact_runs:
            self.state.run_times = ExactRuns(trace, shape)
        self.spread_factor = spread_factor
        self.queues = queues
        self.round_seconds: list[float] = []
        self.racks: dict[str, int] = {}  #: job id -> racks its gang spans
        self.rack_of: dict[str, int] = {}  #: node id -> its real rack, whatever was registered
        self._jobs = {j.id: j for j in trace.jobs}
        self.idle = dict.fromkeys(IDLE_CAUSES, 0.0)  #: see RunResult.idle
        self.big_wait = dict.fromkeys(BIG_WAIT_STATES, 0.0)  #: see RunResult.big_wait
        #: what the last round left, held until the next event: (idle GPUs by cause, big gangs by state)
        self._after_round: tuple[dict[str, int], dict[str, int]] = ({}, {})
        # Node names in an order unrelated to racks, so a policy blind to racks is blind indeed
        # (placement breaks ties by node id).
        names = list(range(shape.nodes))
        random.Random(shape.nodes).shuffle(names)
        for i in range(shape.nodes):
            node_id, rack = f"n{names[i]:04d}", shape.rack_of(i)
            self.rack_of[node_id] = rack
            seen = f"r{rack:03d}" if policy.topology_visible else "r000"
            self._must(c.RegisterNode(at=0, node_id=node_id, address=f"{node_id}:7000",
                                      topology=("z0", "b0", seen), capacity=shape.node_capacity()))
        if queues:
            self._must(c.queues_kind(queues)(at=0, queues=queues))
        self.failure_model = failures
        self.failures = NodeFailures(failures, sorted(self.rack_of)) if failures else None
        if failures and failures.recovery == "back" and any(j.after for j in trace.jobs):
            raise ValueError("--recovery back resubmits a gang as a new job, which the trace's dependencies "
                             "(`after`) cannot follow")
        self.failure_times: list[float] = []  #: see RunResult.failure_times
        #: trace job (or element) id -> its run left, seconds at full speed, as of its last checkpoint
        self._work: dict[str, float] = {}
        self._restarted: set[str] = set()  #: trace jobs that lost an attempt to a failure
        #: job id -> (start, speed, restart seconds) of its latest attempt
        self._attempt: dict[str, tuple[float, float, float]] = {}
        #: trace job id -> (start, stop, seconds kept) of its attempts ended by failures
        self._failed_runs: dict[str, list[tuple[float, float, float]]] = {}
        self._origin: dict[str, str] = {}  #: a resubmitted copy's id -> the trace job's (recovery back)
        self._latest: dict[str, str] = {}  #: trace job id -> its latest copy (recovery back)
        self._limited: set[tuple[str, int]] = set()  #: (job, attempt) of attempts that reach their time limit
        self.restart_held_idle = 0.0  #: see RunResult.restart_held_idle
        self.estimates: dict[str, float] = {}  #: job id -> its estimated start at submit (see JobRecord.estimate)
        self._held_for_restarts = 0  #: idle GPUs the last round reserved for attempts after a failure

    def _must(self, cmd: c.Command) -> None:
        result = self.apply(cmd)
        if not result.ok:
            raise ValueError(result.error)

    def _timed(self, state: ClusterState, now: float, previous: Reservation | tuple[Reservation, ...] | None,
               memo: RoundMemo | None) -> RoundResult:
        started = time.perf_counter()
        result = self.spec_policy.round(state, now, previous, memo)
        self.round_seconds.append(time.perf_counter() - started)
        return result

    def spec_of(self, job: TraceJob) -> JobSpec:
        """The job file a user would have submitted for this trace row."""
        tasks = job.tasks_on(self.shape)
        per = job.gpus // tasks
        topology = TopologySpec()
        if tasks > 1 and job.gpus <= self.shape.rack_gpus:
            # A gang that fits in a rack asks for one: `required` in the strict ablation; else
            # `preferred`, which schedules and places exactly as no `pack` does (delay scheduling
            # already waits for a rack) but lets a preemption plan look for its room in one rack
            # before the whole cluster.
            topology = TopologySpec("rack", PackMode.REQUIRED if self.spec_policy.strict_racks else PackMode.PREFERRED)
        ranges, throttle = parse_array(job.array) if job.array else ((), 0)
        return JobSpec(name=job.id if self.exact_runs else job.job_name, tasks=tasks,
                       resources=Resources(CPU_PER_GPU * per, MEMORY_PER_GPU * per, per), command=("train",),
                       topology=topology, time_limit=job.time_limit, queue=job.queue,
                       array=format_ranges(ranges), array_throttle=throttle, after=job.dependencies,
                       max_restarts=MAX_RESTARTS if self.failures and not job.exit_code else 0)

    def row_of(self, job_id: str) -> TraceJob:
        """The trace row a job (or an array's element, or a resubmitted copy) comes from."""
        job_id = self._origin.get(job_id, job_id)
        row = self._jobs.get(job_id)
        if row is None:
            element = split_element_id(job_id)
            row = self._jobs[element[0]] if element else None
        if row is None:
            raise KeyError(job_id)
        return row

    def lifetime(self, plan: Plan) -> tuple[float, int]:
        job = self.row_of(plan.job_id)
        racks = len({self.rack_of[p.node_id] for p in plan.placements})
        self.racks[plan.job_id] = racks
        speed = self.spread_factor if racks > 1 else 1.0
        if self.failures is None:
            run = job.duration / speed
            if job.time_limit and run > job.time_limit:
                return job.time_limit, TIME_LIMIT_EXIT
            return run, job.exit_code
        # The trace's time limit bounds the job's whole run, the progress its checkpoints kept
        # included, so that a job the trace ends at its limit still ends there whatever failures it
        # met (Synapse's leader counts the limit per attempt; with it, a failure would let an
        # over-limit job run on for days, and the replay would measure that, not recovery).
        origin = self._origin.get(plan.job_id, plan.job_id)
        restart = self.failures.model.restart_cost_s if origin in self._restarted else 0.0
        self._attempt[plan.job_id] = (self.now, speed, restart)
        run = self._work.get(origin, job.duration) / speed
        left = job.time_limit - sum(kept for _, _, kept in self._failed_runs.get(origin, ()))
        if job.time_limit and run > left:
            self._limited.add((plan.job_id, plan.attempt))
            return restart + max(0.0, left), TIME_LIMIT_EXIT
        return restart + run, job.exit_code

    def replay(self) -> RunResult:
        started = time.perf_counter()
        jobs, i, events = sorted(self.trace.jobs, key=lambda j: j.submit), 0, 0
        last_round = -math.inf
        # The leader's periodic round would see a gang's locality wait run out within a second;
        # with no ticks here, that moment is an event of its own.
        wakeups: list[float] = []
        arrived: list[str] = []  #: submitted since the last round: their estimates are due
        while True:
            arrival = jobs[i].submit if i < len(jobs) else math.inf
            end = self.next_event_at()
            while wakeups and (wakeups[0] <= self.now or not self.state.pending):
                heapq.heappop(wakeups)
            at = min(arrival, math.inf if end is None else end, wakeups[0] if wakeups else math.inf)
            if self.failures is not None:
                # Failures matter while something is left to run or a node is down (a gang may wait for it).
                if math.isinf(at) and not self.failures.down:
                    break
                at = min(at, self.failures.next_at())
            elif math.isinf(at):
                break
            self._account(at, jobs[0].submit, self.trace.horizon)
            self.restart_held_idle += self._held_for_restarts * (at - self.now)
            events += self.advance(at)
            failed = self._node_events(at)
            events += failed
            while i < len(jobs) and jobs[i].submit <= at:
                if jobs[i].tasks_on(self.shape) > 1:
                    heapq.heappush(wakeups, at + self.spec_policy.tuning.locality_wait_s)
                spec = self.spec_of(jobs[i])
                kind = c.submit_kind(spec)
                result = self.apply(kind(at=at, job_id=jobs[i].id, request_id=jobs[i].id, spec=spec, by=jobs[i].user))
                if not result.ok:
                    raise ValueError(f"job {jobs[i].id}: {result.error}")
                if not spec.array:
                    arrived.append(jobs[i].id)
                i += 1
                events += 1
            self.schedule(full=failed > 0 or self.now - last_round >= FULL_ROUND_AFTER_S)
            if arrived:
                self._estimate(arrived)
                arrived = []
            last_round = self.now
            self._after_round = self._classify()
            self._held_for_restarts = self._idle_held_for_restarts()
        return RunResult(policy=self.spec_policy.name, shape=self.shape, records=self._records(),
                         round_seconds=self.round_seconds, events=events,
                         wall_seconds=time.perf_counter() - started, horizon=self.trace.horizon,
                         spread_factor=self.spread_factor, queues=self.queues,
                         unfinished=[j.id for j in self.state.pending_jobs()], preemptions=len(self.preemptions),
                         idle=self.idle, big_wait=self.big_wait, failure_model=self.failure_model,
                         failure_times=self.failure_times, restart_held_idle=self.restart_held_idle)

    def end_task(self, end: TaskEnd) -> None:
        """With failures simulated, an attempt reaching its time limit ends as the leader ends it (a
        final FailAttempt): the jobs are submitted with restarts to spare for lost nodes, and a time
        limit must not use them up."""
        job = self.state.jobs.get(end.job_id)
        if (self.failures is not None and (end.job_id, end.attempt) in self._limited and job is not None
                and job.attempt == end.attempt and job.status is not JobStatus.STOPPING):
            self._must(c.FailAttempt(at=self.now, job_id=end.job_id, attempt=end.attempt, final=True,
                                     reason=f"time limit of {job.spec.time_limit:.0f}s exceeded",
                                     cause=EndReason.TIME_LIMIT))
        super().end_task(end)

    def _preempt(self, cmd: c.Preempt) -> None:
        """With failures simulated, a guest evicted from a spare for a restart keeps the progress
        up to its last checkpoint, as a failed gang does (its loss counts as the failure's)."""
        super()._preempt(cmd)
        if self.failures is None or cmd.rule != SPARE_RULE:
            return
        model = self.failures.model
        for v in cmd.victims:
            self.lost_runs.pop(next(i for i in range(len(self.lost_runs) - 1, -1, -1)
                                    if self.lost_runs[i][0] == v.job_id))
            origin = self._origin.get(v.job_id, v.job_id)
            start, speed, restart = self._attempt[v.job_id]
            stop = self.now + v.notice + v.grace
            kept = model.kept(max(0.0, self.now - start - restart))
            self._work[origin] = self._work.get(origin, self.row_of(v.job_id).duration) - kept * speed
            self._restarted.add(origin)
            self._failed_runs.setdefault(origin, []).append((start, stop, kept))

    def _node_events(self, at: float) -> int:
        """Fail and restore the nodes due by `at`; how many events that was."""
        count = 0
        while self.failures is not None and self.failures.next_at() <= at:
            when, kind, node_id = self.failures.pop()
            if kind == LOST:
                self._lose(node_id)
                self.failure_times.append(when)
            else:
                self.restore_node(node_id)
                if self.state.nodes[node_id].suspect:
                    # The operator's `synctl uncordon` after the repair: every simulated failure is
                    # drawn independently of the jobs, so no node here is the black hole the suspect
                    # rule is for, and a cluster nobody uncordons would only shrink (at a 50-hour
                    # MTBF, most of it within the week).
                    self._must(c.SetSchedulable(at=when, node_id=node_id, schedulable=True))
            count += 1
        return count

    def _lose(self, node_id: str) -> None:
        """A node fails: each running gang on it keeps the progress up to its last checkpoint, and
        waits at the front or, with recovery `back`, is resubmitted at the back."""
        assert self.failures is not None
        model = self.failures.model
        for job_id in sorted({job_id for job_id, _attempt, _index in self.state.live_tasks.get(node_id, ())}):
            if self.state.jobs[job_id].status is JobStatus.STOPPING:
                continue  # already stopping (a preemption's grace): its loss is counted there
            origin = self._origin.get(job_id, job_id)
            start, speed, restart = self._attempt[job_id]
            kept = model.kept(max(0.0, self.now - start - restart))
            self._work[origin] = self._work.get(origin, self.row_of(job_id).duration) - kept * speed
            self._restarted.add(origin)
            self._failed_runs.setdefault(origin, []).append((start, self.now, kept))
        for job_id in self.lose_node(node_id, "simulated node failure"):
            job = self.state.jobs[job_id]
            if model.recovery == "back" and job.status is JobStatus.PENDING:
                self._resubmit(job)

    def _resubmit(self, job: Job) -> None:
        """Recovery `back`: cancel the requeued job and submit a copy now, behind what arrived since."""
        origin = self._origin.get(job.id, job.id)
        copy_id = f"{origin}-r{sum(1 for o in self._origin.values() if o == origin) + 1}"
        self._must(c.CancelJob(at=self.now, job_id=job.id, reason="resubmitted after a node failure"))
        spec = dataclasses.replace(job.spec, array="", array_throttle=0, after=())
        self._must(c.submit_kind(spec)(at=self.now, job_id=copy_id, request_id=copy_id, spec=spec, by=job.user))
        self._origin[copy_id], self._latest[origin] = origin, copy_id

    def _estimate(self, arrived: list[str]) -> None:
        """Record the estimated start of the jobs just submitted that the round left pending, from
        the round's plan (the walk goes as far down the queue as the last of them)."""
        pending = [j for j in arrived if j in self.state.jobs and self.state.jobs[j].status is JobStatus.PENDING]
        if not pending or self.leader.last_round is None:
            return
        tuning = self.spec_policy.tuning
        found = estimate_starts(self.state, self.now, self.leader.waiting(), self.leader.reservations(),
                                self.leader.last_round.plans, predict=tuning.predict,
                                locality_wait_s=tuning.locality_wait_s, until=pending,
                                reservation_start=not self.spec_policy.tunable)
        for job_id in pending:
            est = found.get(job_id)
            self.estimates[job_id] = math.nan if est is None or est.at is None else est.at

    def _idle_held_for_restarts(self) -> int:
        """Idle GPUs on the nodes the last round reserved for attempts after a failure (a node in two
        reservations counts once, for the first)."""
        last = self.leader.last_round
        if self.failures is None or last is None:
            return 0
        seen: set[str] = set()
        idle = 0
        for r in last.reservations:
            fresh = r.nodes - seen
            seen |= r.nodes
            job = self.state.jobs.get(r.job_id)
            if job is not None and (restarting(job) or r.job_id in self._origin):
                idle += sum(self.state.nodes[n].free.gpu for n in fresh if n in self.state.nodes)
        return idle

    def _classify(self) -> tuple[dict[str, int], dict[str, int]]:
        """Idle GPUs by cause and big pending gangs by state, as the last round left them."""
        state, last = self.state, self.leader.last_round
        free = state.index.root().free_gpu
        if not state.pending:
            return {"no_demand": free}, {}
        reservations = last.reservations if last is not None else ()
        reserved_ids = {r.job_id for r in reservations}
        in_reserve = sum(state.nodes[n].free.gpu for n in set().union(*(r.nodes for r in reservations)))
        rest = free - in_reserve
        waiting = last.waiting if last is not None else {}
        rack_waiting = {job_id for job_id, w in waiting.items()
                        if w.spec is not None and w.spec.topology != state.jobs[job_id].spec.topology}
        split_now = any(state.jobs[j].spec.total.gpu <= rest for j in rack_waiting)
        idle = {"reserved": in_reserve, "rack_wait" if split_now else "no_fit": rest}
        big: dict[str, int] = {}
        for job in state.pending_jobs():
            if job.spec.total.gpu >= BIG_GANG_GPUS:
                key = "reserved" if job.id in reserved_ids else "rack_wait" if job.id in rack_waiting else "queued"
                big[key] = big.get(key, 0) + 1
        return idle, big

    def _account(self, until: float, window_start: float, window_end: float) -> None:
        """Count what the last round left over [now, until): idle GPUs inside the submission window
        (as utilisation counts), big gangs' waits throughout."""
        idle, big = self._after_round
        for what, count in big.items():
            self.big_wait[what] += count * (until - self.now)
        span = min(until, window_end) - max(self.now, window_start)
        for cause, gpus in idle.items() if span > 0 else ():
            self.idle[cause] += gpus * span

    def _records(self) -> list[JobRecord]:
        out = []
        lost: dict[str, list[tuple[float, float]]] = {}
        for job_id, start, stop, _gpus in self.lost_runs:  # a resubmitted copy's go to its trace job
            lost.setdefault(self._origin.get(job_id, job_id), []).append((start, stop))
        for tj in self.trace.jobs:
            array = self.state.arrays.get(tj.id)
            ids = [element_id(tj.id, array.index_at(p)) for p in range(array.count)] if array else [tj.id]
            for job_id in ids:
                first = self.state.jobs.get(job_id)
                job = self.state.jobs.get(self._latest.get(job_id, job_id))
                # an element that never became a job (its array was cancelled or stalled)
                if job is None or first is None:
                    out.append(JobRecord(id=job_id, gpus=tj.gpus, tasks=tj.tasks_on(self.shape),
                                         queue=tj.queue or "default", submit=tj.submit, start=math.nan, end=math.nan,
                                         racks=0, status="PENDING"))
                    continue
                done = job.status.terminal
                # A job that never ran (its dependency could never be met) has no completion time.
                out.append(JobRecord(id=job_id, gpus=tj.gpus, tasks=job.spec.tasks, queue=tj.queue or "default",
                                     submit=first.submitted_at,
                                     start=job.started_at if job.placements else math.nan,
                                     end=job.finished_at if done and job.placements else math.nan,
                                     racks=self.racks.get(job.id, 0), status=job.status.value,
                                     preempted=tuple(lost.get(job_id, ())), ready=self._ready(tj),
                                     failures=tuple(self._failed_runs.get(job_id, ())),
                                     restart_s=self._attempt.get(job.id, (0.0, 1.0, 0.0))[2],
                                     estimate=self.estimates.get(job_id, math.nan)))
        return out

    def _ready(self, tj: TraceJob) -> float:
        """When the last of a row's dependencies was met: the latest end among its upstreams."""
        if not tj.after:
            return math.nan
        ends = []
        for _kind, upstream in tj.dependencies:
            job, array = self.state.jobs.get(upstream), self.state.arrays.get(upstream)
            end = job.finished_at if job is not None and job.status.terminal else \
                array.finished_at if array is not None and array.done else math.nan
            ends.append(end)
        return max(ends) if ends and not any(math.isnan(e) for e in ends) else math.nan


def replay(trace: Trace, shape: ClusterShape, policy: Policy, *, spread_factor: float = SPREAD_FACTOR,
           queues: tuple[Queue, ...] = (), failures: FailureModel | None = None, exact_runs: bool = False) -> RunResult:
    """Replay `trace` through `policy`; the trace must have been checked against `shape`. `exact_runs`:
    the policies that predict know every job's run (ExactRuns)."""
    return Replay(trace, shape, policy, spread_factor=spread_factor, queues=queues, failures=failures,
                  exact_runs=exact_runs).replay()
