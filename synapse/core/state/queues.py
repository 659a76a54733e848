"""The queue table and what it decides: queues applied and deleted, a preemption (victims stopped,
nodes held for the preemptor), why pending gangs wait.

State: `queues`, `holds`, `held_nodes`. Commands: ApplyQueues, DeleteQueue, Preempt, PendingReasons.
"""

from __future__ import annotations

from synapse.core import commands as c
from synapse.core.commands import Result
from synapse.core.model import EndReason, Event, Hold, Job, JobStatus, NodeStatus, Queue, Resources
from synapse.core.queues import batch_problem
from synapse.core.schedule import elastic
from synapse.core.schedule.admission import beyond_guarantee
from synapse.core.state.events import MAX_EVENTS_PER_JOB, job_event
from synapse.core.state.tables import ClusterTables
from synapse.core.state.transitions import stop_attempt
from synapse.core.state.usage import queue_of

#: A gang preempted this many times within PREEMPTION_WINDOW_S is exempt from the priority and
#: fair-share rules for the rest of that window (reclaim still applies): no gang thrashes.
PREEMPTION_BUDGET = 3
PREEMPTION_WINDOW_S = 86400.0


def apply_queues(state: ClusterTables, cmd: c.ApplyQueues) -> Result:
    """Create or replace these queues, all or none (synapse.core.queues.batch_problem judges the
    batch)."""
    problem = batch_problem(state.queues, list(cmd.queues)) if cmd.queues else "no queues given"
    if problem:
        return Result.rejected(problem)
    for queue in cmd.queues:
        state.queues[queue.name] = queue
    return Result(True, value=",".join(q.name for q in cmd.queues))


def delete_queue(state: ClusterTables, cmd: c.DeleteQueue) -> Result:
    """Delete a queue that has no child queues and holds no unfinished job."""
    if cmd.name not in state.queues:
        return Result.not_found(f"unknown queue {cmd.name}")
    children = sorted(q.name for q in state.queues.values() if q.parent == cmd.name)
    if children:
        return Result.rejected(f"queue {cmd.name} has child queues: {', '.join(children)}")
    holding = sum(1 for j in state.jobs.values() if not j.status.terminal and queue_of(j) == cmd.name)
    if holding:
        return Result.rejected(f"queue {cmd.name} holds {holding} unfinished job(s); cancel them or let them end")
    del state.queues[cmd.name]
    return Result(True, value=cmd.name)


def preempt(state: ClusterTables, cmd: c.Preempt) -> Result:
    """Stop the victims' whole gangs and hold the nodes for the preemptor. The leader planned
    from a snapshot; this re-checks what the plan relies on, and applies all of it or nothing."""
    job = state.jobs.get(cmd.job_id)
    if job is None or job.status is not JobStatus.PENDING or job.attempt != cmd.attempt:
        return Result.rejected(f"preemptor {cmd.job_id} is not pending at attempt {cmd.attempt}")
    if cmd.job_id in state.holds:
        return Result.rejected(f"job {cmd.job_id} already holds nodes from an earlier preemption")
    if job.held_by:
        return Result.rejected(f"preemptor {cmd.job_id} is held by {job.held_by}: it preempts nothing until released")
    if not cmd.victims or not cmd.nodes:
        return Result.rejected("a preemption needs victims and nodes")
    for node_id in cmd.nodes:
        node = state.nodes.get(node_id)
        if node is None or node.status is not NodeStatus.READY:
            return Result.rejected(f"node {node_id} is not READY")
        if node_id in state.held_nodes:
            return Result.rejected(f"node {node_id} is already held for job {state.held_nodes[node_id]}")
    victims = []
    for v in cmd.victims:
        victim = state.jobs.get(v.job_id)
        if victim is None or victim.attempt != v.attempt or victim.status not in (JobStatus.SCHEDULED,
                                                                                  JobStatus.RUNNING):
            return Result.rejected(f"victim {v.job_id} is not running at attempt {v.attempt}")
        if victim.spec.interactive and not _borrowing(state, victim):
            return Result.rejected(f"victim {v.job_id} is interactive and its queue {queue_of(victim)} is within its "
                                   "guarantee")
        victims.append((victim, v))
    for victim, v in victims:
        victim.stop_grace = v.grace
        kept = sum(1 for t in victim.tasks if t.node_id not in cmd.nodes)
        if elastic.is_elastic(victim.spec) and kept >= victim.spec.tasks_min:
            # An elastic gang shrinks instead of being evicted: it restarts at once without the
            # held nodes (a version-2 job: see versions.KIND_VERSIONS).
            stop_attempt(state, victim, f"shrinking from {len(victim.tasks)} to {kept} task(s) for job "
                                        f"{cmd.job_id} (rule {cmd.rule})", cmd.at, cause=EndReason.RESIZED,
                         notice=v.notice)
            job_event(state, victim, cmd.at, "Shrinking", f"for job {cmd.job_id} of queue {queue_of(job)}: "
                                                          f"{len(victim.tasks)} -> {kept} task(s); grace {v.grace:g}s")
            continue
        victim.preempted_at = (*victim.preempted_at, cmd.at)[-PREEMPTION_BUDGET:]
        reason = f"preempted by job {cmd.job_id} (rule {cmd.rule})"
        stop_attempt(state, victim, reason, cmd.at, cause=EndReason.PREEMPTED, notice=v.notice)
        job_event(state, victim, cmd.at, "Preempted",
                  f"by job {cmd.job_id} of queue {queue_of(job)} (user {job.user or '-'}), rule "
                  f"{cmd.rule}; grace {v.grace:g}s" + (f"; {cmd.explanation}" if cmd.explanation else ""))
    state.holds[cmd.job_id] = Hold(cmd.job_id, cmd.attempt, tuple(cmd.nodes), tuple(v.job_id for v in cmd.victims),
                                   cmd.rule, cmd.at)
    for node_id in cmd.nodes:
        state.held_nodes[node_id] = cmd.job_id
    job_event(state, job, cmd.at, "Preempting",
              f"rule {cmd.rule}: stopping {', '.join(v.job_id for v in cmd.victims)}; holding "
              f"{', '.join(cmd.nodes)}" + (f"; {cmd.explanation}" if cmd.explanation else ""))
    return Result(True)


def _borrowing(state: ClusterTables, job: Job) -> bool:
    """Whether the job's queue uses more than it is guaranteed (an interactive job of a queue within its
    guarantee is never preempted: synapse.core.schedule.preemption; only version-7 submissions are
    interactive, so the rule changes nothing an older replica applies)."""
    name = queue_of(job)
    queue = state.queues.get(name) or Queue(name)
    return bool(beyond_guarantee(state.queue_usage.get(name, Resources()), queue.guaranteed))


def pending_reasons(state: ClusterTables, cmd: c.PendingReasons) -> Result:
    """Record why gangs wait; an entry for a job no longer pending at that attempt is ignored."""
    recorded = 0
    for e in cmd.entries:
        job = state.jobs.get(e.job_id)
        if job is None or job.status is not JobStatus.PENDING or job.attempt != e.attempt \
                or job.pending_reason == e.code:
            continue
        job.pending_reason = e.code
        job.events.append(Event(cmd.at, "Waiting", f"{e.code}: {e.message[:300]}"))
        if len(job.events) > MAX_EVENTS_PER_JOB:
            del job.events[1]
        state.emit(cmd.at, "Normal", "job", "JobPending", job.id, f"{e.code}: {e.message[:300]}")
        recorded += 1
    return Result(True, value=str(recorded))
