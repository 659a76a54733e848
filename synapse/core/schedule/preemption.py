"""Preemption planning. Pure: reads a state, returns a plan or why there is none. The queue accounting
it relies on (usage, guarantees, shares) is admission's (synapse.core.schedule.admission).

Rules (a queue lists those its jobs may use; by default `reclaim`, `priority` and `backfill`):

* **reclaim** — a job whose queue stays within its guarantee once the job runs may take back
  what other queues borrowed: victims come only from queues above their guarantee. It cannot loop:
  the preemptor's queue is then within its guarantee, so it is never a reclaim victim itself.
* **priority** — inside one queue, a job may evict gangs of lower priority.
* **backfill** — the gang at the head of its queue may evict gangs of its own queue that were
  placed while it waited and queue behind it (backfilled past it): a big gang is never starved by
  the small ones that filled the room it needs, and the gangs that ran before it are never touched.
  It cannot loop: a victim queues behind its preemptor and keeps its submission time on requeue.
* **fair_share** — across queues, only when the preemptor's queue's share once the job runs is no
  higher than the victim's queue's share without the victim (Kueue's rule: it cannot cycle).

A victim gets its checkpoint notice (if its job asks for one), then SIGTERM, then SIGKILL after its
grace; the notice and the grace are each capped by the victim's queue's max_grace, so a preemptor
waits at most twice that for its room.

Victims are whole gangs that have run at least their queue's `min_runtime`, and never an interactive
job (`interactive: true`) while its queue uses no more than its guarantee; a gang preempted
PREEMPTION_BUDGET times within a day is exempt from the priority and fair-share rules for the rest
of it. Planning looks at one
topology domain at a time (the job's `pack` level, or the whole cluster), and never proposes a set
after which the preemptor's whole gang would not fit in that domain. Among feasible domains it takes
the cheapest set, by (highest victim priority, GPUs pushed below a queue's guarantee, GPU-seconds
of work lost, number of gangs, ids), then drops any victim not needed. The nodes the gang will use
are held for it alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from synapse.core import commands as c
from synapse.core.jobs.quantity import format_moment
from synapse.core.model import (
    DEFAULT_GRACE_S,
    Job,
    JobStatus,
    Queue,
    Resources,
    excluded_for,
    topology_path,
)
from synapse.core.schedule.admission import beyond_guarantee, pool_of, queue_of, share, usage_of
from synapse.core.schedule.elastic import is_elastic
from synapse.core.schedule.placement import pack_depth
from synapse.core.schedule.topology import Domain
from synapse.core.schedule.view import ClusterRead
from synapse.core.state.queues import PREEMPTION_BUDGET, PREEMPTION_WINDOW_S

#: A plan's cost, compared as a tuple: (highest victim priority, GPUs pushed below guarantees, GPU-seconds
#: lost, victims, their ids); a lower bound on it, its first three (a prefix compares as a tuple would).
Cost = tuple[int, int, float, int, tuple[str, ...]]
Bound = tuple[int, int, float]

DEFAULT_RULES = ("reclaim", "priority", "backfill")
_LIVE = frozenset({JobStatus.SCHEDULED, JobStatus.RUNNING})


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    """A preemption to propose, the work it loses, and the domain it preempts in (its path)."""

    command: c.Preempt
    lost_gpu_seconds: float
    domain: str = ""


@dataclass(slots=True)  # not frozen: built for thousands of gangs per plan, and frozen init is slow
class _Candidate:
    job: Job
    queue: Queue
    rule: str
    lost: float  #: GPU-seconds of work the gang would lose
    below: int  #: GPUs its going alone would push its queue below its guarantee
    gpus: int  #: GPUs the gang holds

    def cost(self) -> tuple[int, int, float, str]:
        return (self.job.spec.priority, self.below, self.lost, self.job.id)


def plan(state: ClusterRead, job: Job, now: float) -> PreemptionPlan | str:
    """A preemption plan that lets `job` start, or why there is none."""
    queue = queue_of(state, job)
    rules = queue.preemption_rules or DEFAULT_RULES
    within_guarantee = not beyond_guarantee(usage_of(state, queue.name) + job.spec.total, queue.guaranteed)
    candidates, protected, exempt = _candidates(state, job, queue, rules, within_guarantee, now)
    if not candidates:
        if protected:
            until, who = min(protected)
            return (f"the gangs it could preempt are protected by min_runtime (the first, {who}, until "
                    f"{format_moment(until, now)})")
        if exempt:
            return (f"the gangs it could preempt have used their preemption budget ({PREEMPTION_BUDGET} in "
                    f"{PREEMPTION_WINDOW_S / 3600:.0f} h): {', '.join(sorted(exempt)[:5])}")
        return (f"no rule lets queue {queue.name} preempt for it (rules: {', '.join(rules)}; "
                f"{'within' if within_guarantee else 'beyond'} its guarantee)")
    best, considered, alternatives = _cheapest(state, job, candidates)
    if best is None:
        return "evicting every gang it may preempt would still not make room for the whole gang in one domain"
    return _preemption(state, job, queue, now, best, considered, alternatives)


#: The cheapest victim set found: (its cost, the victims, the nodes held for the preemptor, the domain).
_Best = tuple[Cost, tuple[_Candidate, ...], tuple[str, ...], Domain]


def _candidates(state: ClusterRead, job: Job, queue: Queue, rules: tuple[str, ...], within_guarantee: bool,
                now: float) -> tuple[list[_Candidate], list[tuple[float, str]], list[str]]:
    """The gangs a rule lets `job` preempt; those a rule would let it but min_runtime protects
    (until when, and which); and those exempt, having used their preemption budget."""
    need = job.spec.total
    fair = "fair_share" in rules
    pool = pool_of(state) if fair else Resources()
    share_after = share(queue, usage_of(state, queue.name) + need, pool) if fair else 0.0
    backfill = "backfill" in rules and _heads_queue(state, job)
    waited_from = job.pending_since if backfill else 0.0
    candidates: list[_Candidate] = []
    protected: list[tuple[float, str]] = []
    exempt: list[str] = []
    per_queue: dict[str, tuple[Queue, Resources, bool, float]] = {}  # computed once per queue
    reclaim = "reclaim" in rules and within_guarantee
    by_priority = "priority" in rules
    mine, priority, key = queue.name, job.spec.priority, job.queue_key()
    for other in state.jobs.values():
        if other.status not in _LIVE or other.id == job.id or other.alloc_id:
            continue  # a step frees nothing of its node's: its allocation holds it (synapse.core.steps)
        name = state.queue_of(other)
        if name not in per_queue:
            other_queue = state.queues.get(name) or Queue(name)
            used = usage_of(state, name)
            per_queue[name] = (other_queue, used, bool(beyond_guarantee(used, other_queue.guaranteed)),
                               share(other_queue, used, pool) if fair else 0.0)
        other_queue, used, borrowing, current_share = per_queue[name]
        if other.spec.interactive and not borrowing:
            continue  # an interactive session is never preempted while its queue is within its guarantee
        if reclaim and borrowing and name != mine:
            rule = "reclaim"
        elif other.preempted_at and exhausted(other, now):
            exempt.append(other.id)  # preempted often enough lately: only reclaim may take it
            continue
        elif name == mine:
            if by_priority and other.spec.priority < priority:
                rule = "priority"
            elif backfill and other.queue_key() > key and other.placed_at > waited_from:
                rule = "backfill"
            else:
                continue
        elif fair and current_share > 0 and share_after <= share(other_queue, used - other.spec.total, pool):
            # Kueue's rule: the preemptor's share once admitted is no higher than the victim
            # queue's share without the victim, so the victim's queue can never take it back.
            rule = "fair_share"
        else:
            continue
        since = other.started_at or other.placed_at
        if now - since < other_queue.min_runtime:
            protected.append((since + other_queue.min_runtime, other.id))
            continue
        gpus = len(other.tasks) * other.spec.resources.gpu
        below = max(0, min(gpus, other_queue.guaranteed.gpu - (used.gpu - gpus)))
        # An elastic gang above its min shrinks rather than losing its run (synapse.core.state.fsm
        # _preempt): it restarts from its checkpoint at once, so it is the cheapest victim.
        shrinks = is_elastic(other.spec) and len(other.tasks) > other.spec.tasks_min
        lost = 0.0 if shrinks else gpus * max(0.0, now - since)
        candidates.append(_Candidate(other, other_queue, rule, lost, below, gpus))
    return candidates, protected, exempt


def _cheapest(state: ClusterRead, job: Job, candidates: list[_Candidate]
              ) -> tuple[_Best | None, int, list[tuple[float, str, Domain]]]:
    """The cheapest victim set, domain by domain at the job's pack level (then the whole cluster,
    for a preferred pack); how many domains were searched; and what each domain weighed would
    cost (GPU-seconds lost, its description, the domain)."""
    best: _Best | None = None
    considered = 0
    alternatives: list[tuple[float, str, Domain]] = []  # (GPU-seconds lost, description, domain) of each domain
    index, nodes = state.index, state.nodes
    for depth in _depths(state, job):
        by_domain: dict[Domain, list[_Candidate]] = {}  # each candidate under every domain it touches
        gpus_in: dict[Domain, list[tuple[float, int]]] = {}  # domain -> (lost per GPU, GPUs there)
        for candidate in candidates:
            here: dict[Domain, int] = {}
            for t in candidate.job.tasks:
                if index.contains(t.node_id):  # the node accepts work (a victim's tasks are live)
                    key = nodes[t.node_id].topology[:depth]
                    here[key] = here.get(key, 0) + t.resources.gpu
            rate = candidate.lost / candidate.gpus if candidate.gpus else 0.0
            for key, gpus in here.items():
                by_domain.setdefault(key, []).append(candidate)
                gpus_in.setdefault(key, []).append((rate, gpus))
        # Cheapest-looking domains first; a domain whose lower bound already costs more than the
        # best plan found is skipped without the full search (most of them, on a large cluster).
        held = _held_for_others(state, job, depth)
        bounds = sorted((_lower_bound(job, index.domains[d].free_gpu - held.get(d, 0), by_domain[d], gpus_in[d]), d)
                        for d in by_domain)
        for n, (bound, domain) in enumerate(bounds):
            if bound[2] == float("inf") or (best is not None and bound > best[0]):
                alternatives += [(b[2], f"{topology_path(d)} at least {b[2]:.0f} GPU-s", d)
                                 for b, d in bounds[n:n + 3] if b[2] != float("inf")]
                break
            node_ids = _nodes_of(state, domain)
            found = _victims_in(state, job, node_ids, by_domain[domain])
            if found is None:
                continue
            considered += 1
            victims, held_nodes = found
            cost = (max(v.job.spec.priority for v in victims), _pushed_below(state, victims),
                    sum(v.lost for v in victims), len(victims), tuple(sorted(v.job.id for v in victims)))
            below = f", gpu {cost[1]} below guarantees" if cost[1] else ""
            alternatives.append((cost[2], f"{topology_path(domain) or 'cluster'} {cost[2]:.0f} GPU-s in "
                                          f"{cost[3]} gang(s){below}", domain))
            if best is None or cost < best[0]:
                best = (cost, victims, held_nodes, domain)
        if best is not None:
            break
    return best, considered, alternatives


def _preemption(state: ClusterRead, job: Job, queue: Queue, now: float, best: _Best, considered: int,
                alternatives: list[tuple[float, str, Domain]]) -> PreemptionPlan:
    """The Preempt command of the cheapest victim set, explained: the domain it preempts in, the
    queues' facts, and the domains weighed and not chosen."""
    need = job.spec.total
    cost, victims, held, domain = best
    q_usage = usage_of(state, queue.name)
    facts = [f"queue {queue.name} uses gpu {q_usage.gpu} of guaranteed {queue.guaranteed.gpu}, needs {need.gpu}"]
    for name in sorted({v.queue.name for v in victims}):
        vq = next(v.queue for v in victims if v.queue.name == name)
        facts.append(f"queue {name} uses gpu {usage_of(state, name).gpu} of guaranteed {vq.guaranteed.gpu}")
    if any(v.rule == "fair_share" for v in victims):
        pool = pool_of(state)
        facts.append(f"share of queue {queue.name} once admitted {share(queue, q_usage + need, pool):.3f}")
    chosen = topology_path(domain) or "cluster"
    # The domain it preempts in comes first: the queue facts and the domains weighed and not
    # chosen follow, each named as such, so no other domain reads as the one preempted.
    facts.insert(0, f"preempting in {chosen} ({', '.join(held)}), chosen of {considered} domain(s) searched; "
                    f"work lost {cost[2]:.0f} GPU-s" + (f"; pushes gpu {cost[1]} below guarantees" if cost[1] else ""))
    others = [text for _, text, d in sorted(alternatives, key=lambda a: a[:2]) if d != domain][:3]
    if others:
        facts.append("not chosen: " + ", ".join(others))
    rule = victims[0].rule if all(v.rule == victims[0].rule for v in victims) else "+".join(
        sorted({v.rule for v in victims}))
    command = c.Preempt(at=now, job_id=job.id, attempt=job.attempt, rule=rule, nodes=held, explanation="; ".join(facts),
                        victims=tuple(c.Victim(v.job.id, v.job.attempt, _grace(v), _notice(v)) for v in victims))
    return PreemptionPlan(command, cost[2], chosen)


def _pushed_below(state: ClusterRead, victims: tuple[_Candidate, ...]) -> int:
    """GPUs by which taking these victims leaves their queues below their guarantees."""
    taken: dict[str, int] = {}
    for v in victims:
        taken[v.queue.name] = taken.get(v.queue.name, 0) + sum(t.resources.gpu for t in v.job.tasks)
    total = 0
    for name, gpus in taken.items():
        queue = next(v.queue for v in victims if v.queue.name == name)
        used = usage_of(state, name).gpu
        total += max(0, min(gpus, queue.guaranteed.gpu - (used - gpus)))
    return total


def exhausted(job: Job, now: float) -> bool:
    """True when the gang has used its preemption budget within the window."""
    recent = [t for t in job.preempted_at if now - t < PREEMPTION_WINDOW_S]
    return len(recent) >= PREEMPTION_BUDGET


def _grace(victim: _Candidate) -> float:
    return victim.queue.capped(victim.job.spec.grace or DEFAULT_GRACE_S)


def _notice(victim: _Candidate) -> float:
    """The victim's checkpoint notice, within its queue's max_grace (as ClusterState.notice_of): the
    preemptor waits that long more, at most, before its victims' SIGTERM (0 when it asks for none)."""
    spec = victim.job.spec
    return victim.queue.capped(spec.checkpoint.notice) if spec.has_checkpoint else 0.0


def _heads_queue(state: ClusterRead, job: Job) -> bool:
    """True when no pending job of the job's queue is ahead of it in queue order."""
    name = state.queue_of(job)
    for pending in state.pending_jobs():
        if state.queue_of(pending) == name:
            return pending.id == job.id
    return False


def _depths(state: ClusterRead, job: Job) -> list[int]:
    pack = job.spec.topology.pack
    if not pack:
        return [0]
    depth = min(pack_depth(state.levels, pack), len(state.levels))
    return [depth] if job.spec.topology.mode.value == "required" else [depth, 0]


def _nodes_of(state: ClusterRead, domain: Domain) -> list[str]:
    """The nodes of a domain that accept work, from the capacity index."""
    stats = state.index.domains[domain]
    if stats.entries is not None:
        return sorted(entry[3] for entry in stats.entries)
    return sorted(n for child in stats.children for n in _nodes_of(state, child))


def _held_for_others(state: ClusterRead, job: Job, depth: int) -> dict[Domain, int]:
    """Free GPUs per domain on nodes held for other preemptors (out of reach for this job)."""
    out: dict[Domain, int] = {}
    for node_id, holder in state.held_nodes.items():
        if holder != job.id and state.index.contains(node_id):
            node = state.nodes[node_id]
            key = node.topology[:depth]
            out[key] = out.get(key, 0) + node.free.gpu
    return out


def _lower_bound(job: Job, free: int, candidates: list[_Candidate], gpus_in: list[tuple[float, int]]) -> Bound:
    """A bound no victim set in this domain can beat, compared like a plan's cost: the lowest
    candidate priority, no GPUs below a guarantee, and the least GPU-time lost to free the GPUs
    the gang lacks here (a fractional knapsack over the candidates' GPUs in the domain; a gang is
    charged whole, so its real cost is never lower). `free`: GPUs free there and within reach."""
    lacking = job.spec.tasks * job.spec.resources.gpu - free
    lowest = min(v.job.spec.priority for v in candidates)
    if lacking <= 0:
        return (lowest, 0, 0.0)
    lost = 0.0
    for rate, here in sorted(gpus_in):
        take = min(here, lacking)
        lost += rate * take
        lacking -= take
        if lacking <= 0:
            return (lowest, 0, lost)
    return (lowest, 0, float("inf"))  # even all of them free too few GPUs here


class _Room:
    """Free resources per node of one domain and how many of the gang's tasks they hold, kept
    up to date as victims are taken out or put back (each change touches only the victim's nodes)."""

    def __init__(self, state: ClusterRead, job: Job, node_ids: list[str]) -> None:
        self.per_task, self.tasks = job.spec.resources, job.spec.tasks
        self.free = {n: state.nodes[n].capacity - state.nodes[n].used for n in node_ids}
        self.count = {n: self._count(f) for n, f in self.free.items()}
        self.total = sum(self.count.values())

    def _count(self, free: Resources) -> int:
        k = self.per_task.count_in(free)
        return self.tasks if k < 0 else max(0, k)

    def fits(self) -> bool:
        return self.total >= self.tasks

    def give_back(self, victim: _Candidate, sign: int) -> None:
        for task in victim.job.tasks:
            if task.node_id in self.free and task.state.live:
                delta = task.resources if sign > 0 else Resources() - task.resources
                free = self.free[task.node_id] = self.free[task.node_id] + delta
                new = self._count(free)
                self.total += new - self.count[task.node_id]
                self.count[task.node_id] = new


def _victims_in(state: ClusterRead, job: Job, node_ids: list[str],
                candidates: list[_Candidate]) -> tuple[tuple[_Candidate, ...], tuple[str, ...]] | None:
    """The cheapest victims whose going lets the whole gang fit on these nodes, and the nodes to
    hold for it; None if no eligible set does."""
    node_ids = [n for n in node_ids if state.held_nodes.get(n, job.id) == job.id]  # not others' holds
    if job.spec.gpu_model:  # only nodes of the GPU model it asks for
        model = job.spec.gpu_model.lower()
        node_ids = [n for n in node_ids if state.nodes[n].label("gpu_model").lower() == model]
    excluded = excluded_for(state.nodes, job)
    if excluded:  # never the nodes that ended its earlier attempts
        node_ids = [n for n in node_ids if n not in excluded]
    room = _Room(state, job, node_ids)
    if room.fits():
        return None  # it fits without anyone leaving: the scheduler will place it
    chosen: list[_Candidate] = []
    for victim in sorted(candidates, key=_Candidate.cost):
        chosen.append(victim)
        room.give_back(victim, +1)
        if room.fits():
            break
    else:
        return None
    for victim in sorted(chosen, key=_Candidate.cost, reverse=True):  # drop the ones not needed
        room.give_back(victim, -1)
        if room.fits():
            chosen.remove(victim)
        else:
            room.give_back(victim, +1)
    victim_nodes = {t.node_id for v in chosen for t in v.job.tasks if t.node_id in room.free}
    order = sorted(node_ids, key=lambda n: (n not in victim_nodes, -room.count[n], n))
    held, covered = [], 0
    for node_id in order:
        if room.count[node_id] == 0:
            continue
        held.append(node_id)
        covered += room.count[node_id]
        if covered >= job.spec.tasks:
            break
    return tuple(sorted(chosen, key=lambda v: v.job.id)), tuple(sorted(held))
