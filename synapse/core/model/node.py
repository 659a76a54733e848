"""The machines: an amount of resources, a node as the replicated state knows it, and its place in
the topology.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

#: Topology levels from the widest to the narrowest. A node's topology path has one label per level.
DEFAULT_LEVELS: tuple[str, ...] = ("zone", "block", "rack")
#: Label used for a level a node did not name (a worker started with only `--rack r1`).
DEFAULT_LABEL = "default"


@dataclass(frozen=True, slots=True)
class Resources:
    """An amount of cpu (millicores), memory (bytes) and GPUs (whole devices)."""

    cpu: int = 0
    memory: int = 0
    gpu: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpu + other.cpu, self.memory + other.memory, self.gpu + other.gpu)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.cpu - other.cpu, self.memory - other.memory, self.gpu - other.gpu)

    def scaled(self, n: int) -> Resources:
        """These resources times `n`."""
        return Resources(self.cpu * n, self.memory * n, self.gpu * n)

    def fits_in(self, other: Resources) -> bool:
        """True when every dimension is at most the other's."""
        return self.cpu <= other.cpu and self.memory <= other.memory and self.gpu <= other.gpu

    def is_negative(self) -> bool:
        return self.cpu < 0 or self.memory < 0 or self.gpu < 0

    def count_in(self, free: Resources) -> int:
        """How many copies of these (per-task) resources fit in `free`; -1 means unbounded."""
        counts = [free.cpu // self.cpu if self.cpu else -1,
                  free.memory // self.memory if self.memory else -1,
                  free.gpu // self.gpu if self.gpu else -1]
        bounded = [c for c in counts if c >= 0]
        return min(bounded) if bounded else -1

    def short_of(self, free: Resources) -> list[str]:
        """Names of the dimensions in which `free` is below these resources."""
        return [name for name, need, have in (("cpu", self.cpu, free.cpu),
                                               ("memory", self.memory, free.memory),
                                               ("gpu", self.gpu, free.gpu)) if need > have]


class NodeStatus(enum.StrEnum):
    READY = "READY"
    DOWN = "DOWN"


@dataclass(slots=True)
class Node:
    """A worker machine as the replicated state knows it."""

    id: str
    address: str
    topology: tuple[str, ...]  #: one label per level, widest first
    capacity: Resources
    used: Resources = Resources()
    gpus_in_use: set[int] = field(default_factory=set)  #: GPU indices given to live tasks
    status: NodeStatus = NodeStatus.READY
    schedulable: bool = True  #: False when cordoned or draining
    registered_at: float = 0.0
    status_changed_at: float = 0.0
    #: what its worker discovered, e.g. (("gpu_model", "H100"),), sorted; set by RegisterNode
    labels: tuple[tuple[str, str], ...] = ()
    isolation: str = ""  #: how its worker confines tasks, as the worker said when it registered
    cordon_reason: str = ""  #: why it is not schedulable; "" while schedulable
    health_cordon: bool = False  #: cordoned by its failing health check (not by an admin)
    health: str = ""  #: its health check's failure ("" while it passes, or the node has none)
    #: cordoned as a suspect (gangs of different jobs ended here by a node-side cause, see fsm
    #: SUSPECT_WINDOW_S); only an admin's cordon or uncordon lifts it; apply only
    suspect: bool = False
    #: the latest node-side ends of gangs here, oldest first: (at, job id, NODE_SIDE_CAUSES member),
    #: at most fsm.MAX_NODE_FAILURES; an admin's uncordon clears them; apply only
    failures: tuple[tuple[float, str, str], ...] = ()
    #: designated a spare (SetSpares, synapse.core.schedule.spares): only restarts after a lost node and jobs
    #: that may be evicted for one are placed here; apply only
    spare: bool = False
    #: the GPU error its worker reported, as a GpuFault recorded it (cordoning the node); "" when
    #: none; only an admin's uncordon clears it; apply only
    gpu_error: str = ""

    def label(self, name: str) -> str:
        return dict(self.labels).get(name, "")

    @property
    def free(self) -> Resources:
        return self.capacity - self.used

    @property
    def accepts_work(self) -> bool:
        return self.status is NodeStatus.READY and self.schedulable

    def free_gpu_indices(self) -> list[int]:
        return [i for i in range(self.capacity.gpu) if i not in self.gpus_in_use]


def topology_path(labels: tuple[str, ...]) -> str:
    return "/".join(labels) if labels else "cluster"
