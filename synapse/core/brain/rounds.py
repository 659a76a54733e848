"""The leader's scheduling round and what follows it: the queue policy's plans become CommitPlan
commands; the reservations and the memo of the round carry over to the next. Before planning, the
spare set `designate` chooses is proposed when it differs from the state's (`SetSpares`, from
command-set version 4); after it, the guests of spares are evicted for the first restart after a lost
node that waits (`Preempt`, rule `spare`). A round that places nothing may plan one preemption
(synapse.core.brain.preempting), grows running elastic gangs into room, and records why gangs wait
(`PendingReasons`, for those whose reason changed). A pending job a dependency of which can never be
met is failed for good (`FailAttempt`, cause DependencyNeverSatisfied), unless it asked to wait.

Estimated starts (synapse.core.schedule.estimate) are the last round's plan walked forward. They
stay with the leader, worked out when first read after a round and kept until the next: they
change with nearly every round (each task's predicted end, each reservation's start), so putting
them into the log, even beside the pending reasons (recorded only when a reason's code changes),
would grow it with rounds, not with changes, and a walk in every round would cost the rounds
nobody reads. Reads of them go to the leader, as every job read does (`_current_read`)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from synapse.core import commands as c
from synapse.core import versions
from synapse.core.brain.config import LeaderConfig
from synapse.core.brain.inflight import InFlight
from synapse.core.brain.preempting import Preemptions
from synapse.core.brain.stimuli import Instruction, Propose, Reschedule, RoundDue
from synapse.core.jobs import dependencies
from synapse.core.model import Job, JobStatus, excluded_for
from synapse.core.schedule import preemption, spares
from synapse.core.schedule.elastic import at_size, growth, is_elastic, place_largest
from synapse.core.schedule.eligibility import HELD_CODES
from synapse.core.schedule.estimate import Estimate, estimate_starts
from synapse.core.schedule.placement import ClusterView
from synapse.core.schedule.reservations import TUNING, Reservation, Tuning
from synapse.core.schedule.scheduler import RoundMemo, RoundResult, WaitReason
from synapse.core.state.fsm import ClusterState

log = logging.getLogger(__name__)

#: Pending reasons recorded per round, at most (about 100 bytes each in the log entry).
PENDING_BATCH = 1000


class Rounds:
    """The rounds of one term: their memory (the last result, reservations, memo, wait reasons)."""

    def __init__(self, config: LeaderConfig, inflight: InFlight) -> None:
        self.config = config  #: fixed for the term
        self.inflight = inflight  #: the leader's ledger of proposals on their way (shared)
        self.preemptions = Preemptions(config)  #: the preemption step and its memo; handle only
        self.last_round: RoundResult | None = None  #: the last round's result; handle only, replaced whole
        #: the reservations handed to the next round (every blocked gang's, or the head's alone for a
        #: policy that keeps one); handle only
        self.previous: Reservation | tuple[Reservation, ...] | None = None
        self.memo: RoundMemo | None = None  #: lets a round after submissions alone skip the jobs seen; handle only
        #: why each pending job waits, from the last round (with any preemption verdict); handle only,
        #: replaced whole (readers may be on other threads)
        self._waiting: dict[str, WaitReason] = {}
        #: state.other_changes when the spares were last found right (nothing to designate since); handle only
        self.spares_checked = -1
        #: (round, its waiting, the estimates of its plan): worked out when first read after a round;
        #: readers replace it whole
        self._estimates: tuple[RoundResult, dict[str, WaitReason], dict[str, Estimate]] | None = None

    def wait_reason(self, job_id: str) -> WaitReason | None:
        """Why a pending job waited in the last round, or None."""
        return self._waiting.get(job_id)

    def head_reservation(self) -> Reservation | None:
        """The head blocked gang's reservation, from the last round."""
        return self.last_round.reservation if self.last_round is not None else None

    def reservations(self) -> tuple[Reservation, ...]:
        """Every blocked gang's reservation from the last round, the head's first."""
        last = self.last_round
        if last is None:
            return ()
        return last.reservations or ((last.reservation,) if last.reservation is not None else ())

    def waiting(self) -> dict[str, WaitReason]:
        """Every pending job's wait reason from the last round (do not change it)."""
        return self._waiting

    def estimates(self, state: ClusterState, now: float, tuning: Tuning = TUNING) -> dict[str, Estimate]:
        """Each pending job's estimated start from the last round's plan (estimate.estimate_starts),
        worked out once a round, when first asked (call under the state's lock; do not change it)."""
        last, waiting, cached = self.last_round, self._waiting, self._estimates
        if last is None:
            return {}
        if cached is not None and cached[0] is last and cached[1] is waiting:
            return cached[2]
        found = estimate_starts(state, now, waiting, self.reservations(), last.plans, predict=tuning.predict,
                                locality_wait_s=tuning.locality_wait_s)
        self._estimates = (last, waiting, found)
        return found

    def what_if(self, state: ClusterState, job: Job, now: float) -> preemption.PreemptionPlan | str:
        """What the preemption step would do for `job` now: its plan, or why none (changes nothing)."""
        return self.preemptions.what_if(state, job, now, self._waiting)

    def round(self, state: ClusterState, s: RoundDue, version: int) -> list[Instruction]:
        """A scheduling round: the queue policy's plans, or what a round that placed nothing calls for."""
        designation = self._designate(state, s.at, version)
        if designation:  # plan once it applies: a plan of this round could fall on a node it designates
            return designation + [Reschedule("spares designated")]
        result = self.config.policy(state, s.at, self.previous, None if s.full else self.memo)
        self.last_round = result
        self.previous = result.reservations or result.reservation
        self.memo, self._waiting = result.memo, result.waiting
        failures = self._unsatisfiable(state, s.at, result.examined)
        evictions = self._evict(state, s.at, result)  # after the commits: their nodes are none of them
        if result.plans:
            return failures + [Propose(c.CommitPlan(at=s.at, job_id=p.job_id, attempt=p.attempt,
                                                    placements=p.placements)) for p in result.plans] + evictions
        failures += evictions
        out = failures + self._preempt(state, s.at)
        out += self._grow(state, s.at, result)
        return out + self._pending_reasons(state, s.at, result.examined)

    def _designate(self, state: ClusterState, now: float, version: int) -> list[Instruction]:
        """Propose the spares the policy asks for when they differ from the state's (one SetSpares
        in flight at a time; command-set version 4). The choice keeps the spares there are, so a new
        leader agrees with the last one and proposes nothing."""
        policy = self.config.spares
        if (policy is None and not state.spares) or self.inflight.any("spares") \
                or state.other_changes == self.spares_checked or not versions.may_propose(c.SetSpares, version):
            return []
        # A cluster file that no longer asks for spares releases them.
        chosen, notes = spares.designate(state, policy) if policy is not None else (frozenset(), ())
        if chosen == state.spares:
            self.spares_checked = state.other_changes
            return []
        for note in notes:
            log.warning("spares: %s", note)
        reason = "; ".join(filter(None, (spares.change_reason(state, chosen), *notes)))
        log.info("designating spares count=%d change=%s", len(chosen), reason)
        return [self.inflight.propose(c.SetSpares(at=now, node_ids=tuple(sorted(chosen)), reason=reason))]

    def _evict(self, state: ClusterState, now: float, result: RoundResult) -> list[Instruction]:
        """Evict the guests of spares for the first restart after a lost node that waits (one a
        round: the next sees the nodes held for it), on nodes none of this round's plans use."""
        if not state.spares or self.inflight.any("eviction"):
            return []
        planned = {p.node_id for plan in result.plans for p in plan.placements}
        for job_id in result.examined:  # in queue order
            job = state.jobs.get(job_id)
            if job is None or job.id in state.holds or job.status is not JobStatus.PENDING \
                    or not spares.restarting(job):
                continue
            cmd = spares.eviction(state, job, now)
            if cmd is not None and not planned.intersection(cmd.nodes):
                log.info("evicting from spares job=%s attempt=%d victims=%s nodes=%s", job.id, job.attempt,
                         ",".join(v.job_id for v in cmd.victims), ",".join(cmd.nodes))
                return [self.inflight.propose(cmd)]
        return []

    def _grow(self, state: ClusterState, now: float, result: RoundResult) -> list[Instruction]:
        """Grow running elastic gangs that room now allows, in queue order, while nothing waits ahead
        of them (a round that placed nothing; a gang held back by a dependency or throttle does not
        count as waiting for room), at most one resize in flight per gang."""
        # A RUNNING gang has live tasks: look at those, not at every job the state keeps.
        live = {job_id for keys in state.live_tasks.values() for job_id, _attempt, _index in keys}
        growing = [j for j in map(state.jobs.get, live) if j is not None and j.status is JobStatus.RUNNING
                   and is_elastic(j.spec) and len(j.tasks) < j.spec.tasks and not self.inflight.holds("resize", j.id)]
        if not growing:
            return []
        waiting = [state.jobs[j].queue_key() for j, w in result.waiting.items()
                   if w.code not in HELD_CODES and j in state.jobs]
        first_waiting = min(waiting, default=None)
        view = ClusterView(state.nodes, state.index, state.levels, state.jobs)
        blocked = frozenset(state.held_nodes).union(*(r.nodes for r in result.reservations))
        out: list[Instruction] = []
        for job in sorted(growing, key=lambda j: j.queue_key()):
            if first_waiting is not None and first_waiting < job.queue_key():
                continue
            # never grow onto a node that failed it, nor onto spares unless it may be evicted from them
            view.set_blocked(blocked | excluded_for(state.nodes, job)
                             | (frozenset() if spares.may_use_spares(job) else state.spares))
            size = growth(view, job, now)
            if size:
                log.info("growing elastic gang job=%s attempt=%d from=%d to=%d", job.id, job.attempt,
                         len(job.tasks), size)
                out.append(self.inflight.propose(c.ResizeGang(at=now, job_id=job.id, attempt=job.attempt, size=size,
                                                              reason="room for more tasks")))
                extra = place_largest(view, job.id, job.attempt, at_size(job.spec, size - len(job.tasks)))
                if extra is not None:  # what it takes is no longer room for the next one
                    view.claim(extra, job.spec.resources)
        return out

    def _unsatisfiable(self, state: ClusterState, now: float, examined: Iterable[str]) -> list[Instruction]:
        """Fail, for good, each pending job a dependency of which can never be met (unless it asked
        to wait): the cause DependencyNeverSatisfied, the reason naming the upstream job."""
        out: list[Instruction] = []
        for job_id in examined:
            reason, job = self._waiting.get(job_id), state.jobs.get(job_id)
            if reason is None or job is None or reason.code != dependencies.NEVER_SATISFIED \
                    or job.spec.on_unsatisfiable == "wait" \
                    or self.inflight.holds("unsatisfiable", (job_id, job.attempt)):
                continue
            log.info("dependency never satisfied job=%s reason=%s", job_id, reason.message)
            out.append(self.inflight.propose(c.FailAttempt(
                at=now, job_id=job_id, attempt=job.attempt, reason=reason.message, final=True,
                cause=dependencies.NEVER_SATISFIED)))
        return out

    def _preempt(self, state: ClusterState, now: float) -> list[Instruction]:
        """Plan one preemption for the first waiting gang, in queue order, that a rule allows
        (`Preemptions.step`); its wait reason and reservation then name the preemption's domain.

        Only jobs of queues an admin defined preempt (the implicit default queue never does, so a
        cluster without queues schedules as before)."""
        step = self.preemptions.step(state, now, self._waiting)
        self.preemptions.remember(step)
        waiting = dict(self._waiting)
        for (job_id, _attempt, _changes), why in step.no_plan.items():
            waiting[job_id] = dataclasses.replace(waiting[job_id],
                                                  message=f"{waiting[job_id].message}; no preemption: {why}")
        if step.plan is None:
            if step.no_plan:
                self._waiting = waiting
            return []
        cmd = step.plan.command
        # The round's reservation for this gang (the nodes expected to drain first) is not where it
        # will run: the preemption holds other nodes for it. Its wait reason and `describe` say
        # the preemption's domain, as the Preempting event does, and keep no reservation for it.
        waiting[cmd.job_id] = WaitReason(
            (), f"preempting in {step.plan.domain}: stopping {', '.join(v.job_id for v in cmd.victims)} (rule "
                f"{cmd.rule}); {', '.join(cmd.nodes)} to be held for it", "Preempting")
        self._waiting = waiting
        if self.last_round is not None:
            kept = tuple(r for r in self.reservations() if r.job_id != cmd.job_id)
            self.last_round = dataclasses.replace(self.last_round, reservation=kept[0] if kept else None,
                                                  reservations=kept)
        return [Propose(cmd)]

    def _pending_reasons(self, state: ClusterState, now: float, examined: Iterable[str]) -> list[Instruction]:
        """Put into the log why gangs wait, for those whose reason changed since it was recorded
        (at most PENDING_BATCH a round): `describe job` and the event stream then show it on any
        replica, and the log grows with changes, not with rounds."""
        entries = []
        for job_id in examined:
            reason, job = self._waiting.get(job_id), state.jobs.get(job_id)
            if reason is not None and job is not None and job.status is JobStatus.PENDING \
                    and job.pending_reason != reason.code \
                    and not self.inflight.holds("unsatisfiable", (job_id, job.attempt)):
                entries.append(c.PendingReason(job_id, job.attempt, reason.code, reason.message))
                if len(entries) == PENDING_BATCH:
                    break
        if not entries:
            return []
        out: list[Instruction] = [Propose(c.PendingReasons(at=now, entries=tuple(entries)))]
        if len(entries) == PENDING_BATCH:  # more to record: the next round looks at every job again
            self.memo = None
            out.append(Reschedule("more pending reasons to record"))
        return out

    def validate(self) -> None:
        """Raise AssertionError if the rounds' memory contradicts itself."""
        if self.last_round is not None:
            held = self.last_round.reservations
            assert all(not (a.nodes & b.nodes) or a.ends_at <= b.starts_at
                       for i, a in enumerate(held) for b in held[i + 1:]), "reservations overlap in time"
            head = self.last_round.reservation
            assert head is None or head == self.last_round.reservations[0] or not self.last_round.reservations, \
                "the head reservation is not the first"
        assert set(self._waiting).isdisjoint(p.job_id for p in (self.last_round.plans if self.last_round else ())), \
            "a job both planned and waiting"
        self.preemptions.validate()
