"""Gang placement: a pure function of a read-only cluster view and one job.

`place(view, job_id, attempt, spec)` returns a plan (task -> node, GPU indices, rank) for the whole
gang, or the reasons it cannot fit now (per domain: how many tasks fit and what is short). No locks,
no I/O, no clock: the leader calls it on a snapshot, the simulator on its own state.

How a gang is placed:

1. Search from the narrowest domain upwards — one node, then one rack, then one block, … — and stop
   at the first level where some domain holds the whole gang. `mode: required` stops the search at
   the `pack` level (the job waits instead); `preferred` may go up to the whole cluster.
2. Among the domains of that level that hold the gang, take the tightest fit (fewest tasks' worth
   of capacity left over) so that emptier domains stay whole for bigger gangs.
3. Inside the chosen domain, span the fewest children: if one child holds the rest, use the
   tightest such child; otherwise take the child with the most room and repeat. The same rule
   applies down to nodes, so tasks share nodes when resources allow.
4. Ranks follow topology order, so rank neighbours are topology neighbours.
5. A gang in an image prefers, among domains and nodes equally good by the rules above, those that
   hold its image already (`model.image_holders`: what the replicated state knows), so it skips
   the pull; the preference never makes a placement looser.

The capacity index (`topology.py`) bounds each domain's capacity from histograms and totals, so a
decision reads a few hundred domain summaries and only the nodes of the racks it actually fills.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from synapse.core.model import (
    Job,
    JobSpec,
    Node,
    PackMode,
    Placement,
    Plan,
    Resources,
    Shortfall,
    image_holders,
    topology_path,
)
from synapse.core.schedule.topology import CapacityIndex, Domain, DomainStats, NodeEntry

#: Nodes looked at when searching one domain for a single node that holds the rest of a gang.
SINGLE_NODE_SCAN = 64
#: Domains reported as closest to fitting when a gang does not fit.
SHORTFALLS_REPORTED = 3
_NOTHING = Resources()


class ClusterView:
    """What placement may read: nodes and the capacity index, plus per-round claims and blocks.

    `claims` are the resources of plans made earlier in the same scheduling round (not yet
    committed), and `blocked` nodes are held back for a reservation; placement sees both as used.
    The underlying nodes and index are never modified here.
    """

    def __init__(self, nodes: Mapping[str, Node], index: CapacityIndex, levels: tuple[str, ...],
                 jobs: Mapping[str, Job] | None = None) -> None:
        self.nodes = nodes
        self.index = index
        self.levels = levels
        self.jobs = jobs  #: the state's jobs, read for image locality only (None: no preference)
        self._holders: dict[str, frozenset[str]] | None = None  #: image_holders(jobs), made on first use
        #: the nodes, and every domain above them, holding the image of the gang being placed now
        self.preferred: frozenset[str] = frozenset()
        self.preferred_domains: frozenset[Domain] = frozenset()
        self._claimed: dict[str, Resources] = {}  #: node -> resources claimed this round
        self._claimed_gpus: dict[str, set[int]] = {}  #: node -> GPU indices claimed this round
        self._blocked: frozenset[str] = frozenset()  #: nodes placement must not use
        self._touched: dict[Domain, set[str]] = {}  #: domain -> its claimed or blocked nodes

    # -- overlay bookkeeping --

    def claim(self, plan: Plan, per_task: Resources) -> None:
        """Count a plan's resources as used for the rest of this round."""
        for p in plan.placements:
            self._claimed[p.node_id] = self._claimed.get(p.node_id, _NOTHING) + per_task
            self._claimed_gpus.setdefault(p.node_id, set()).update(p.gpus)
            self._touch(p.node_id)

    @property
    def blocked(self) -> frozenset[str]:
        return self._blocked

    def set_blocked(self, nodes: frozenset[str]) -> None:
        """Hold these nodes back from placement until changed again."""
        if nodes == self._blocked:
            return
        self._blocked = nodes
        self._touched = {}
        for node_id in (*self._claimed, *nodes):
            self._touch(node_id)

    def _touch(self, node_id: str) -> None:
        node = self.nodes.get(node_id)
        if node is None:
            return
        for depth in range(len(node.topology) + 1):
            self._touched.setdefault(node.topology[:depth], set()).add(node_id)

    def prefer_image(self, image: str) -> None:
        """Prefer the nodes holding `image` in the placements that follow ("" for none)."""
        if image and self.jobs is not None and self._holders is None:
            self._holders = image_holders(self.jobs.values())
        nodes = (self._holders or {}).get(image, frozenset()) if image else frozenset()
        self.preferred = frozenset(n for n in nodes if n in self.nodes)
        self.preferred_domains = frozenset(self.nodes[n].topology[:depth] for n in self.preferred
                                           for depth in range(len(self.nodes[n].topology) + 1))

    # -- reads --

    def free(self, node_id: str) -> Resources:
        """Free resources of a node as this round sees them."""
        if node_id in self._blocked:
            return _NOTHING
        node = self.nodes[node_id]
        return node.free - self._claimed.get(node_id, _NOTHING)

    def free_gpus(self, node_id: str) -> list[int]:
        taken = self._claimed_gpus.get(node_id, set())
        return [g for g in self.nodes[node_id].free_gpu_indices() if g not in taken]

    def free_total(self, key: Domain) -> Resources:
        """Free resources of a domain as this round sees them."""
        stats = self.index.domains.get(key)
        if stats is None:
            return _NOTHING
        have = Resources(stats.free_cpu, stats.free_memory, stats.free_gpu)
        for node_id in self._touched.get(key, ()):
            if self.index.contains(node_id):
                have = have - (self.nodes[node_id].free - self.free(node_id))
        return have

    def tasks_fit(self, node_id: str, per_task: Resources) -> int:
        k = per_task.count_in(self.free(node_id))
        return k if k >= 0 else 0

    def bound(self, key: Domain, per_task: Resources, *, when_empty: bool = False) -> int:
        """Upper bound on the tasks of this shape that fit in a domain (see DomainStats.fit_bound)."""
        stats = self.index.domains.get(key)
        if stats is None:
            return 0
        touched = () if when_empty else self._touched.get(key, ())
        gpu_drop = cpu_drop = memory_drop = 0
        for node_id in touched:
            if not self.index.contains(node_id):
                continue
            base, eff = self.nodes[node_id].free, self.free(node_id)
            if per_task.gpu:
                gpu_drop += base.gpu // per_task.gpu - eff.gpu // per_task.gpu
            cpu_drop += base.cpu - eff.cpu
            memory_drop += base.memory - eff.memory
        return stats.fit_bound(per_task, when_empty=when_empty, gpu_drop=gpu_drop,
                               cpu_drop=cpu_drop, memory_drop=memory_drop)

    def entries(self, stats: DomainStats, *, start: int = 0, descending: bool = False) -> Iterator[NodeEntry]:
        """Node entries of a rack (or the root) with this round's free values, in GPU order.

        Ascending from `start` free GPUs, or descending over all. Claimed and blocked nodes sit in
        the base list at their committed values, so they are skipped there and merged back in at
        their current values.
        """
        touched = self._touched.get(stats.key, set())
        moved = sorted((self.free(n).gpu, self.free(n).cpu, self.free(n).memory, n)
                       for n in touched if self.index.contains(n))
        assert stats.entries is not None
        if descending:
            base: Iterator[NodeEntry] = (e for e in reversed(stats.entries) if e[3] not in touched)
            return heapq.merge(base, reversed(moved), reverse=True)
        # (start,) is a prefix, before every entry with `start` free GPUs: no entry of the list's type is.
        base = (e for e in stats.entries.irange(minimum=(start,)) if e[3] not in touched)  # type: ignore[arg-type]
        return heapq.merge(base, (e for e in moved if e[0] >= start))


@dataclass(frozen=True, slots=True)
class PlacementResult:
    plan: Plan | None
    shortfalls: tuple[Shortfall, ...] = ()
    level: str = ""  #: the level the gang was packed at ("node", "rack", …), when placed

    @property
    def placed(self) -> bool:
        return self.plan is not None


def pack_depth(levels: tuple[str, ...], pack: str) -> int:
    """Depth of a pack level: 0 is the cluster, len(levels) the leaf level, one more a node."""
    if pack == "node":
        return len(levels) + 1
    return levels.index(pack) + 1


def place(view: ClusterView, job_id: str, attempt: int, spec: JobSpec, *,
          with_reasons: bool = True) -> PlacementResult:
    """A plan for the whole gang, or the reasons it does not fit. Pure: reads `view` only.
    Without `with_reasons`, a failure carries no shortfalls (`explain` gives them later: they cost
    more than the search, and a queue policy only shows them when asked)."""
    if spec.gpu_model:
        return _place_on_model(view, job_id, attempt, spec, with_reasons)
    view.prefer_image(spec.image)
    n, per_task = spec.tasks, spec.resources
    leaf = len(view.levels)
    lowest_allowed = 0
    if spec.topology.mode is PackMode.REQUIRED and spec.topology.pack:
        lowest_allowed = pack_depth(view.levels, spec.topology.pack)
    if view.bound((), per_task) >= n:
        for depth in range(leaf + 1, lowest_allowed - 1, -1):
            fill = _fill_single_node(view, view.index.root(), n, per_task) if depth == leaf + 1 \
                else _fill_at_depth(view, depth, n, per_task)
            if fill:
                name = "node" if depth == leaf + 1 else (view.levels[depth - 1] if depth else "cluster")
                return PlacementResult(_plan(view, job_id, attempt, per_task, fill), level=name)
    return PlacementResult(None, shortfalls(view, spec, lowest_allowed or leaf) if with_reasons else ())


def explain(view: ClusterView, spec: JobSpec) -> tuple[Shortfall, ...]:
    """Why the gang does not fit `view`: the shortfalls a failed `place` reports."""
    return place(view, "", 0, spec).shortfalls if spec.gpu_model else shortfalls(view, spec, _lowest_depth(view, spec))


def _lowest_depth(view: ClusterView, spec: JobSpec) -> int:
    if spec.topology.mode is PackMode.REQUIRED and spec.topology.pack:
        return pack_depth(view.levels, spec.topology.pack)
    return len(view.levels)


def _place_on_model(view: ClusterView, job_id: str, attempt: int, spec: JobSpec,
                    with_reasons: bool) -> PlacementResult:
    """Place a gang that asks for a GPU model on nodes labelled with it alone: the other nodes are
    blocked for this one call (a pass over the nodes; only such jobs pay it)."""
    model = spec.gpu_model.lower()
    others = frozenset(node_id for node_id, node in view.nodes.items() if node.label("gpu_model").lower() != model)
    saved = view.blocked
    view.set_blocked(saved | others)
    try:
        return place(view, job_id, attempt, dataclasses.replace(spec, gpu_model=""), with_reasons=with_reasons)
    finally:
        view.set_blocked(saved)


def _fill_at_depth(view: ClusterView, depth: int, n: int, per_task: Resources) -> list[tuple[str, int]]:
    holding = []
    for key in view.index.by_depth[depth]:
        b = view.bound(key, per_task)
        if b >= n:
            holding.append((b - n, view.index.domains[key].dominant_free(per_task),
                            key not in view.preferred_domains, key))
    for _, _, _, key in sorted(holding):
        fill = _fill(view, key, n, per_task)
        if sum(count for _, count in fill) == n:
            return fill
    return []


def _fill(view: ClusterView, key: Domain, n: int, per_task: Resources) -> list[tuple[str, int]]:
    """Up to `n` tasks inside domain `key`, spanning as few children as possible."""
    stats = view.index.domains[key]
    if len(key) == len(view.levels):
        return _fill_rack(view, stats, n, per_task)
    room = {child: view.bound(child, per_task) for child in stats.children}
    room = {child: b for child, b in room.items() if b > 0}
    out: list[tuple[str, int]] = []
    remaining = n
    while remaining and room:
        holding = [(b - remaining, child not in view.preferred_domains, child) for child, b in room.items()
                   if b >= remaining]
        if holding:
            _, _, child = min(holding)
            got = _fill(view, child, remaining, per_task)
            if sum(c for _, c in got) == remaining:
                return out + got
            room[child] = sum(c for _, c in got)  # the bound was optimistic; now it is exact
            continue
        child = min(room, key=lambda ch: (-room[ch], ch))
        got = _fill(view, child, room.pop(child), per_task)
        out += got
        remaining -= sum(c for _, c in got)
    return out


def _fill_rack(view: ClusterView, stats: DomainStats, n: int, per_task: Resources) -> list[tuple[str, int]]:
    """Up to `n` tasks on the nodes of one rack: one node if any holds them, else fewest nodes."""
    out: list[tuple[str, int]] = []
    used: set[str] = set()
    remaining = n
    largest_first = view.entries(stats, descending=True) if per_task.gpu else view.entries(stats)
    while remaining:
        single = _fill_single_node(view, stats, remaining, per_task, exclude=used)
        if single:
            return out + single
        for entry in largest_first:
            node_id = entry[3]
            if node_id in used:
                continue
            k = min(view.tasks_fit(node_id, per_task), remaining)
            if k > 0:
                out.append((node_id, k))
                used.add(node_id)
                remaining -= k
                break
        else:
            break
    return out


def _fill_single_node(view: ClusterView, stats: DomainStats, n: int, per_task: Resources,
                      exclude: AbstractSet[str] = frozenset()) -> list[tuple[str, int]]:
    """The tightest node of the domain that holds all `n` tasks, looking at a bounded number.

    Across racks (a domain above them), among the nodes as tight as the tightest, the one in the
    rack with the fewest free GPUs: a job that fits one node fills racks already in use and
    leaves the emptier racks whole for the gangs that need one."""
    looked = 0
    #: (free GPUs of its rack, not holding the image, node) of the tightest nodes so far
    best: tuple[int, bool, str] | None = None
    tight = None  #: the free GPUs of the tightest node that holds them
    leaf = len(view.levels)
    for entry in view.entries(stats, start=n * per_task.gpu):
        node_id = entry[3]
        if node_id in exclude:
            continue
        if tight is not None and entry[0] != tight:
            break
        if view.tasks_fit(node_id, per_task) >= n:
            tight = entry[0]
            rack = 0 if len(stats.key) == leaf else view.free_total(view.nodes[node_id].topology[:leaf]).gpu
            candidate = (rack, node_id not in view.preferred, node_id)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
            if len(stats.key) == leaf and not (view.preferred and candidate[1]):
                break  # in one rack the first tightest node will do, unless another may hold the image
        looked += 1
        if looked >= SINGLE_NODE_SCAN:
            break
    return [(best[2], n)] if best is not None else []


def _plan(view: ClusterView, job_id: str, attempt: int, per_task: Resources,
          fill: list[tuple[str, int]]) -> Plan:
    placements: list[Placement] = []
    for node_id, count in sorted(fill, key=lambda nc: (view.nodes[nc[0]].topology, nc[0])):
        gpus = view.free_gpus(node_id)
        for i in range(count):
            rank = len(placements)
            placements.append(Placement(index=rank, node_id=node_id, rank=rank,
                                        gpus=tuple(gpus[i * per_task.gpu:(i + 1) * per_task.gpu])))
    return Plan(job_id=job_id, attempt=attempt, placements=tuple(placements))


def shortfalls(view: ClusterView, spec: JobSpec, depth: int) -> tuple[Shortfall, ...]:
    """Why the gang does not fit: the cluster as a whole, then the domains closest to fitting."""
    n, per_task = spec.tasks, spec.resources
    out = [_shortfall(view, (), n, per_task)]
    if depth <= len(view.levels):
        ranked = sorted(view.index.by_depth[depth], key=lambda k: (-view.bound(k, per_task), k))
        out += [_shortfall(view, key, n, per_task) for key in ranked[:SHORTFALLS_REPORTED]]
    return tuple(out)


def _shortfall(view: ClusterView, key: Domain, n: int, per_task: Resources) -> Shortfall:
    stats = view.index.domains.get(key)
    if stats is None:
        return Shortfall(topology_path(key), 0, n, ("nodes",))
    if stats.entries is not None and key:  # a rack: few nodes, so count exactly
        fits = sum(view.tasks_fit(e[3], per_task) for e in stats.entries)
    else:
        fits = view.bound(key, per_task)
    short = tuple(per_task.scaled(n).short_of(view.free_total(key)))
    return Shortfall(topology_path(key), fits, n, short)
