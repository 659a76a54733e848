"""Spare nodes: a few nodes per topology domain kept for gangs that lost a node. Pure, like placement.

A gang whose node dies must otherwise wait in the queue for a replacement; with a spare in its own
rack it restarts at once (hot spares, as asked for in Kueue #12701 and NVIDIA's resiliency
extension). The operator asks for `spares: {per: rack, nodes: 1}` in the cluster file (a
`SparePolicy`); the leader designates the nodes (`designate`) and proposes the whole set
(`SetSpares`, command-set version 4), so every replica and every later leader sees the same spares.

The rules, one place for the leader and the simulator:

* **Which nodes.** In each domain of the `per` level: the spares it has that are READY, schedulable
  and not taken by a restart are kept (a new leader computes the same set from the same state, and
  proposes nothing); the rest are filled from its usable nodes, idle ones first, then those running
  only work a restart may evict, then the others (which then take no new work and drain), each group
  by registration order. A spare that dies, is cordoned or took a restart stops being one and is
  replaced this way if the domain has a node to spare. A domain with no more nodes than `nodes` gets
  no spare (a rack of spares only could run nothing): `designate` says so.
* **Who runs on them.** A restart (`restarting`: the attempt after one a lost node ended) anywhere;
  besides, only jobs with a time limit (`may_use_spares`), and those only where nothing else fits.
  Such a guest is evicted when a restart needs the node (`eviction`).
* **Eviction** goes through the preemption path (`Preempt`, rule `spare`): the guests get their
  checkpoint notice and grace, requeue at their place uncharged, and the nodes are held for the
  restart alone until they are gone. It never evicts more GPUs of guests than the restart's gang
  has: an evicted gang loses its work since its checkpoint and waits to be placed again, so
  evicting a larger gang than the one restarted costs more than the restart's wait it saves (in
  the simulator, a 64-GPU restart evicted a 256-GPU guest spread over the spares).
"""

from __future__ import annotations

from dataclasses import dataclass

from synapse.core import commands as c
from synapse.core.model import (
    DEFAULT_GRACE_S,
    NODE_FAULTS,
    Job,
    JobStatus,
    Node,
    NodeStatus,
    PackMode,
    Resources,
    excluded_for,
    topology_path,
)
from synapse.core.schedule.admission import queue_of
from synapse.core.schedule.view import ClusterRead

#: The rule a Preempt that evicts guests from spares names.
SPARE_RULE = "spare"
#: The longest `nodes` a cluster file may ask for per domain.
MAX_SPARES_PER_DOMAIN = 64


@dataclass(frozen=True, slots=True)
class SparePolicy:
    """`spares: {per: rack, nodes: 1}`: `nodes` spares in each domain of the level `per`."""

    per: str = "rack"
    nodes: int = 0

    def problem(self, levels: tuple[str, ...]) -> str:
        """Why this policy cannot be used with these topology levels, or ""."""
        if self.per not in levels:
            return f"spares.per: {self.per!r} is not a topology level (levels: {', '.join(levels)})"
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or not 0 <= self.nodes \
                <= MAX_SPARES_PER_DOMAIN:
            return f"spares.nodes: a whole number from 0 to {MAX_SPARES_PER_DOMAIN}, not {self.nodes!r}"
        return ""


def restarting(job: Job) -> bool:
    """True when the job's current attempt follows one that a node's fault ended (pending or placed):
    its node lost, or a GPU error its worker reported (model.NODE_FAULTS)."""
    return bool(job.runs) and job.runs[-1].attempt == job.attempt - 1 \
        and job.runs[-1].outcome in NODE_FAULTS


def may_use_spares(job: Job) -> bool:
    """A restart, or a job with a time limit (it ends by a known time, and may be evicted for a restart)."""
    return restarting(job) or job.spec.time_limit > 0


def _evictable(job: Job) -> bool:
    """A step is not: it frees nothing of its node's (its allocation holds it; synapse.core.steps)."""
    return job.status in (JobStatus.SCHEDULED, JobStatus.RUNNING) and not restarting(job) \
        and job.spec.time_limit > 0 and not job.alloc_id


def _guests(state: ClusterRead, node_id: str) -> tuple[set[str], bool]:
    """The evictable jobs with live tasks on the node, and whether anything else runs there."""
    guests, other = set(), False
    for job_id, _attempt, _index in state.live_tasks.get(node_id, ()):
        job = state.jobs[job_id]
        job = state.jobs.get(job.alloc_id, job) if job.alloc_id else job  # a step goes with its allocation
        if _evictable(job):
            guests.add(job.id)
        else:
            other = True
    return guests, other


def _taken(state: ClusterRead, node: Node) -> bool:
    """A restart runs on the node: it stops being a spare (it became the gang's)."""
    return any(restarting(state.jobs[job_id]) for job_id, _a, _i in state.live_tasks.get(node.id, ()))


def designate(state: ClusterRead, policy: SparePolicy) -> tuple[frozenset[str], tuple[str, ...]]:
    """The spares the cluster should have now (see the module docstring), and the domains that can
    have none, with why."""
    if policy.nodes <= 0 or policy.per not in state.levels:
        return frozenset(), ()
    depth = state.levels.index(policy.per) + 1
    domains: dict[tuple[str, ...], list[Node]] = {}
    for node in state.nodes.values():
        domains.setdefault(node.topology[:depth], []).append(node)
    chosen: set[str] = set()
    notes = []
    for key in sorted(domains):
        members = sorted(domains[key], key=lambda n: (n.registered_at, n.id))
        if len(members) <= policy.nodes:
            notes.append(f"{policy.per} {topology_path(key)} has {len(members)} node(s): too few for "
                         f"{policy.nodes} spare(s) and a node for work; none designated there")
            continue
        kept = [n for n in members if n.spare and n.accepts_work and not _taken(state, n)][:policy.nodes]
        chosen.update(n.id for n in kept)
        if len(kept) < policy.nodes:  # only then are the others weighed (a round per change runs this)
            fresh = sorted((n for n in members if not n.spare and n.accepts_work and not _taken(state, n)),
                           key=lambda n: (_cost(state, n), n.used.gpu))
            chosen.update(n.id for n in fresh[:policy.nodes - len(kept)])
    return frozenset(chosen), tuple(notes)


def _cost(state: ClusterRead, node: Node) -> int:
    """0: idle; 1: runs only work a restart may evict; 2: runs other work (it drains first)."""
    guests, other = _guests(state, node.id)
    return 2 if other else 1 if guests else 0


def change_reason(state: ClusterRead, chosen: frozenset[str]) -> str:
    """Why the spares change from the state's to `chosen`, for the events."""
    parts = []
    for node_id in sorted(state.spares - chosen):
        node = state.nodes.get(node_id)
        why = "unknown" if node is None else "DOWN" if node.status is NodeStatus.DOWN else \
            "cordoned" if not node.schedulable else "taken by a restart" if _taken(state, node) else "not needed"
        parts.append(f"{node_id} released ({why})")
    added = sorted(chosen - state.spares)
    if added:
        parts.append(f"{', '.join(added)} designated")
    return "; ".join(parts)


def last_domain(state: ClusterRead, job: Job) -> tuple[str, ...]:
    """The lowest topology domain that held every node of the job's last run (() for the cluster)."""
    paths = [state.nodes[n].topology for n in (job.runs[-1].nodes if job.runs else ()) if n in state.nodes]
    if not paths:
        return ()
    common = paths[0]
    for path in paths[1:]:
        i = 0
        while i < min(len(common), len(path)) and common[i] == path[i]:
            i += 1
        common = common[:i]
    return common


def eviction(state: ClusterRead, job: Job, now: float) -> c.Preempt | None:
    """For a restart that does not fit now: evict the guests of spares so that it can start, in the
    domain of its last run first, then a level up at a time (not above its required `pack`). The
    nodes it then holds: room it has now there (its surviving nodes), the spares last. None when no
    eviction makes room (two failures in a rack with one spare: the second waits, reserved), or only
    one that evicts more GPUs than the restart's gang has (see the module docstring)."""
    if job.id in state.holds or not state.spares or not restarting(job):
        return None
    excluded = excluded_for(state.nodes, job)
    per, need = job.spec.resources, job.spec.tasks
    domain = last_domain(state, job)
    lowest = 0
    topo = job.spec.topology
    if topo.mode is PackMode.REQUIRED and topo.pack in state.levels:
        lowest = state.levels.index(topo.pack) + 1
    for depth in range(len(domain), lowest - 1, -1):
        scope = domain[:depth]
        nodes = [n for n in state.nodes.values() if n.topology[:depth] == scope and n.accepts_work
                 and n.id not in excluded and n.id not in state.held_nodes]
        plain = sorted(((per.count_in(n.free), n.id) for n in nodes if n.id not in state.spares), reverse=True)
        chosen, room = [], 0
        for fits, node_id in plain:
            if room >= need or fits <= 0:
                break
            chosen.append(node_id)
            room += fits
        victims: dict[str, Job] = {}
        spares = []
        for n in nodes:
            if n.id not in state.spares:
                continue
            guests, _other = _guests(state, n.id)
            freed = n.free + sum((t.resources for g in guests for t in state.jobs[g].tasks
                                  if t.node_id == n.id and t.state.live), Resources())
            spares.append((sum(state.jobs[g].spec.total.gpu for g in guests), n.id, per.count_in(freed), guests))
        evicted = 0  #: GPUs of the gangs evicted so far
        for _cost_gpus, node_id, fits, guests in sorted(spares):
            if room >= need:
                break
            if fits <= 0:
                continue
            more = sum(state.jobs[g].spec.total.gpu for g in guests if g not in victims)
            if evicted + more > job.spec.total.gpu:
                continue  # it would cost gangs larger than the restart what the restart saves
            chosen.append(node_id)
            room += fits
            evicted += more
            victims.update((g, state.jobs[g]) for g in guests)
        if room >= need and victims:
            return c.Preempt(at=now, job_id=job.id, attempt=job.attempt, rule=SPARE_RULE,
                             victims=tuple(c.Victim(v.id, v.attempt, *_grace_and_notice(state, v))
                                           for _, v in sorted(victims.items())),
                             nodes=tuple(sorted(chosen)),
                             explanation=f"restart after a lost node; evicting the guests of spare(s) in "
                                         f"{topology_path(scope)}")
        if room >= need:
            return None  # it fits without evicting anyone: placement's business (GPU indices, a race)
    return None


def _grace_and_notice(state: ClusterRead, job: Job) -> tuple[float, float]:
    """A guest's grace and checkpoint notice, each within its queue's max_grace (as preemption's)."""
    return queue_of(state, job).capped(job.spec.grace or DEFAULT_GRACE_S), state.notice_of(job)
