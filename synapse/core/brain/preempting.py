"""The leader's preemption step: the first waiting gang, in queue order, that a rule allows and that
has a plan (at most PREEMPT_TRIES tried a round; a gang found to have no plan is not planned again
until the state changes otherwise than by submissions). What-if asks the same question, so it
answers what the leader does. Only jobs of queues an admin defined preempt."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from synapse.core.brain.config import LeaderConfig
from synapse.core.model import Job
from synapse.core.schedule import admission, preemption
from synapse.core.schedule.eligibility import HELD_CODES
from synapse.core.schedule.scheduler import WaitReason
from synapse.core.state.fsm import ClusterState

#: Waiting gangs a round may try to plan a preemption for.
PREEMPT_TRIES = 20
#: Gangs remembered to have no preemption plan, at most (the memo is cleared beyond it).
NO_PLAN_MEMO = 10_000


@dataclass(frozen=True, slots=True)
class PreemptionStep:
    """What the preemption step decides: the gang it preempts for (its plan), or none; and the gangs
    it found without a plan, why, by (job, attempt, state.other_changes)."""

    job_id: str = ""
    plan: preemption.PreemptionPlan | None = None
    no_plan: dict[tuple[str, int, int], str] = dataclasses.field(default_factory=dict)
    cut: bool = False  #: it stopped at PREEMPT_TRIES gangs tried


class Preemptions:
    """The preemption step and its memory of the gangs that have no plan."""

    def __init__(self, config: LeaderConfig) -> None:
        self.config = config  #: fixed for the term
        #: (job, attempt, state.other_changes) found to have no preemption plan, and why; handle only
        self.no_plan: dict[tuple[str, int, int], str] = {}

    def remember(self, step: PreemptionStep) -> None:
        """Keep what `step` found without a plan (the memo is cleared when it outgrows its bound)."""
        for key, why in step.no_plan.items():
            self.no_plan[key] = why
        if len(self.no_plan) > NO_PLAN_MEMO:
            self.no_plan.clear()

    def step(self, state: ClusterState, now: float, waiting: Mapping[str, WaitReason],
             upto: str = "") -> PreemptionStep:
        """What the preemption step decides now (it changes nothing): the first waiting gang, in
        queue order, that may preempt (`gate`) and has a plan, trying at most
        PREEMPT_TRIES gangs not already known to have none. With `upto`, it stops at that job:
        what-if (`what_if`) asks this same question, so it answers what the leader does."""
        if not self.config.preempt or not state.queues:
            return PreemptionStep()  # `gate` passes over every job then: no walk (a fifth of a round's time)
        no_plan: dict[tuple[str, int, int], str] = {}
        tried = 0
        for job in state.pending_jobs():
            if tried >= PREEMPT_TRIES:
                return PreemptionStep(no_plan=no_plan, cut=True)
            if self.gate(state, job, waiting):
                if job.id == upto:
                    break
                continue
            key = (job.id, job.attempt, state.other_changes)
            known = self.no_plan.get(key)
            if known is not None:
                if job.id == upto:
                    return PreemptionStep(job.id, no_plan={key: known})
                continue
            tried += 1
            planned = preemption.plan(state, job, now)
            if isinstance(planned, str):
                no_plan[key] = planned
                if job.id == upto:
                    break
                continue
            return PreemptionStep(job.id, planned, no_plan)
        return PreemptionStep(no_plan=no_plan)

    def gate(self, state: ClusterState, job: Job, waiting_for: Mapping[str, WaitReason]) -> str:
        """Why the leader's preemption step passes over this pending job ("" if it weighs it)."""
        if not self.config.preempt:
            return "this leader does not preempt"
        if not state.queues:
            return "no queue is defined: only jobs of a queue an admin defined preempt"
        waiting = waiting_for.get(job.id)
        if job.id in state.holds:
            return f"it already holds {', '.join(state.holds[job.id].nodes)} from a preemption"
        if waiting is None:
            return "the scheduler has not weighed it yet (it will within a round)"
        if waiting.code in HELD_CODES:  # it may not run now (dependency, throttle, singleton): it takes no room
            return f"it may not run now: {waiting.message}"
        if state.queue_of(job) not in state.queues:
            return f"its queue {state.queue_of(job)} is not one an admin defined: only those preempt"
        return admission.max_block(state, job) or admission.user_block(state, job)

    def what_if(self, state: ClusterState, job: Job, now: float,
                waiting: Mapping[str, WaitReason]) -> preemption.PreemptionPlan | str:
        """What the preemption step would do for `job` now: its plan, or why it preempts nothing
        for it (call under the state's lock; changes nothing)."""
        why = self.gate(state, job, waiting)
        if why:
            return why
        step = self.step(state, now, waiting, upto=job.id)
        if step.job_id == job.id and step.plan is not None:
            return step.plan
        if step.plan is not None:
            return f"job {step.job_id} comes first in queue order and preempts first; this job is weighed after it"
        if step.cut:
            return f"the leader weighs the first {PREEMPT_TRIES} waiting gangs a round that may preempt, and this " \
                   "job is behind them"
        return next(iter(step.no_plan.values()), "no preemption plan")

    def validate(self) -> None:
        """Raise AssertionError if the memo outgrew its bound."""
        assert len(self.no_plan) <= NO_PLAN_MEMO + PREEMPT_TRIES, "the no-plan memo outgrew its bound"
