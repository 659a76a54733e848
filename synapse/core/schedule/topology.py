"""Indexes of free capacity per topology domain, so placement never scans every node per task.

A domain is a prefix of a node's topology path: `()` is the whole cluster, `("z1",)` a zone,
`("z1", "b2")` a block, `("z1", "b2", "r7")` a rack (the leaf level). For every domain the index
keeps, over the nodes that accept work (READY and schedulable):

* a histogram of nodes by free GPU count and by total GPU count, so the number of tasks of a
  given GPU size that could fit there now, or once the domain is empty, is a sum over a few buckets;
* totals of free and total cpu and memory, which bound the same number for cpu and memory;
* the child domains, and for racks and the root a sorted list of `(free gpu, free cpu, free
  memory, node id)` so a tightest-fit search can start at the first node with enough GPUs.

The index is derived data: the state machine updates it on every change to a node's free capacity
and rebuilds it after a snapshot is loaded; it is never serialized.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sortedcontainers import SortedList, SortedSet

from synapse.core.model import Node, Resources

Domain = tuple[str, ...]
#: How a node sits in the sorted lists: tightest GPU fit first, then cpu, then memory.
NodeEntry = tuple[int, int, int, str]


def node_entry(node_id: str, free: Resources) -> NodeEntry:
    return (free.gpu, free.cpu, free.memory, node_id)


@dataclass(slots=True)
class DomainStats:
    """Aggregates over the nodes of one domain that accept work."""

    key: Domain
    nodes: int = 0
    free_cpu: int = 0
    free_memory: int = 0
    free_gpu: int = 0
    total_cpu: int = 0
    total_memory: int = 0
    total_gpu: int = 0
    free_gpu_hist: list[int] = field(default_factory=list)  #: [g] = nodes with g free GPUs
    total_gpu_hist: list[int] = field(default_factory=list)  #: [g] = nodes with g GPUs in all
    children: SortedSet[Domain] = field(default_factory=SortedSet)  #: child domain keys (not for racks)
    entries: SortedList[NodeEntry] | None = None  #: NodeEntry list, kept for racks and the root only

    def _add(self, free: Resources, capacity: Resources, sign: int) -> None:
        self.nodes += sign
        self.free_cpu += sign * free.cpu
        self.free_memory += sign * free.memory
        self.free_gpu += sign * free.gpu
        self.total_cpu += sign * capacity.cpu
        self.total_memory += sign * capacity.memory
        self.total_gpu += sign * capacity.gpu
        for hist, g in ((self.free_gpu_hist, free.gpu), (self.total_gpu_hist, capacity.gpu)):
            if g >= len(hist):
                hist.extend([0] * (g + 1 - len(hist)))
            hist[g] += sign

    def fit_bound(self, per_task: Resources, *, when_empty: bool = False, gpu_drop: int = 0,
                  cpu_drop: int = 0, memory_drop: int = 0) -> int:
        """An upper bound on the tasks that fit here (now, or once every task here is gone).

        Exact in the GPU dimension (the histogram knows each node's GPUs); cpu and memory are
        bounded by the domain's totals, which fragmentation may make optimistic. The `*_drop`
        arguments subtract what a caller knows is taken beyond the index (tasks' worth of GPUs,
        millicores, bytes).
        """
        hist = self.total_gpu_hist if when_empty else self.free_gpu_hist
        cpu = (self.total_cpu if when_empty else self.free_cpu) - cpu_drop
        memory = (self.total_memory if when_empty else self.free_memory) - memory_drop
        bounds = []
        if per_task.gpu:
            g = per_task.gpu
            bounds.append(sum(count * (size // g) for size, count in enumerate(hist) if size >= g)
                          - gpu_drop)
        if per_task.cpu:
            bounds.append(cpu // per_task.cpu)
        if per_task.memory:
            bounds.append(memory // per_task.memory)
        return max(0, min(bounds)) if bounds else 0

    def dominant_free(self, per_task: Resources) -> int:
        """Free amount of the resource a task of this shape is sized by, for tightest-fit ties."""
        if per_task.gpu:
            return self.free_gpu
        return self.free_cpu if per_task.cpu else self.free_memory


class CapacityIndex:
    """Free and total capacity per topology domain over the nodes that accept work."""

    def __init__(self, levels: int) -> None:
        self.levels = levels  #: number of topology levels; racks are at depth `levels`
        self.domains: dict[Domain, DomainStats] = {(): self._new_domain(())}
        self.by_depth: list[SortedSet[Domain]] = [SortedSet() for _ in range(levels + 1)]
        self.by_depth[0].add(())
        self._indexed: dict[str, tuple[Domain, Resources, Resources]] = {}  #: node -> what was added

    def _new_domain(self, key: Domain) -> DomainStats:
        keeps_entries = len(key) == self.levels or key == ()
        return DomainStats(key=key, entries=SortedList() if keeps_entries else None)

    def update(self, node: Node) -> None:
        """Bring the index in line with `node` (call after any change to it)."""
        self.remove(node.id)
        if node.accepts_work:
            self._insert(node.id, node.topology, node.free, node.capacity)

    def remove(self, node_id: str) -> None:
        previous = self._indexed.pop(node_id, None)
        if previous is None:
            return
        topology, free, capacity = previous
        for depth in range(self.levels, -1, -1):  # children first: an emptied parent goes after
            key = topology[:depth]
            stats = self.domains[key]
            stats._add(free, capacity, -1)
            if stats.entries is not None:
                stats.entries.remove(node_entry(node_id, free))
            if stats.nodes == 0 and key != ():
                del self.domains[key]
                self.by_depth[depth].discard(key)
                self.domains[key[:-1]].children.discard(key)

    def _insert(self, node_id: str, topology: Domain, free: Resources, capacity: Resources) -> None:
        for depth in range(self.levels + 1):
            key = topology[:depth]
            stats = self.domains.get(key)
            if stats is None:
                stats = self.domains[key] = self._new_domain(key)
                self.by_depth[depth].add(key)
                self.domains[key[:-1]].children.add(key)
            stats._add(free, capacity, +1)
            if stats.entries is not None:
                stats.entries.add(node_entry(node_id, free))
        self._indexed[node_id] = (topology, free, capacity)

    def contains(self, node_id: str) -> bool:
        """True when the node accepts work and so counts in the index."""
        return node_id in self._indexed

    def root(self) -> DomainStats:
        return self.domains[()]
