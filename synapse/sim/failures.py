"""Node failures for a trace replay: when nodes die and come back, and what a gang loses.

Each node fails after exponential times with mean `mtbf_s` while it is up, and comes back
`repair_s` after each failure. Every node draws from its own stream, seeded by the run's seed and
the node's name, and draws lazily: the times depend on nothing a policy does, so every policy
compared in a run sees the same failures, however far each one's replay runs.

A gang checkpoints every `checkpoint_every_s` of its attempt's run time (the restart counted out);
when one of its nodes fails, the progress since its last checkpoint is lost and its next attempt
runs what was left at that checkpoint, plus `restart_cost_s` (detection, placement, process start,
loading the checkpoint).

`recovery` says where a gang stopped by a failure waits: `front` (the default) is what Synapse does
on a cluster without spares (the `NodeLost` command requeues it at its place, and the scheduler
re-places it first in the next round, in its own rack when it can, reserving for it when it cannot);
`spares` is the same on a cluster that keeps `spares_per_rack` spare nodes per rack, designated and
evicted for restarts by the leader's own code (synapse.core.schedule.spares; Synapse's policies only: a
baseline policy runs as `front`);
`back` is what a scheduler without that rule amounts to, a user resubmitting at the failure time
behind everything that arrived since. `back` is the simulator's alone: the replay cancels the
requeued job and submits a copy, through the ordinary commands. It is not a switch of the
replicated state machine, because the rule there must be one rule for every replica and every
cluster (apply is deterministic and versioned), and the point of `back` is only to measure what
`front` is worth.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass

#: Where a gang stopped by a node failure waits (see the module's docstring).
RECOVERIES = ("front", "back", "spares")
#: The max_restarts each job that succeeds in the trace is submitted with when failures are
#: simulated. The state machine requeues a gang uncharged only so many times for lost nodes
#: (fsm.MAX_UNCHARGED_REQUEUES) and then charges max_restarts; a long training job sets it high,
#: and the replay measures lost work and waits, not that cap. (A job that fails in the trace keeps
#: 0: its failure must not be retried; time limits end attempts for good, as the leader does.)
MAX_RESTARTS = 1000

LOST, UP = "lost", "up"


@dataclass(frozen=True, slots=True)
class FailureModel:
    """The failure options of a run (seconds)."""

    mtbf_s: float  #: mean time between failures of one node, while it is up
    checkpoint_every_s: float  #: a gang checkpoints every this much of its run time (0: never)
    restart_cost_s: float = 0.0  #: added to the run of every attempt after a failure
    repair_s: float = 3600.0  #: a failed node is back after this long
    recovery: str = "front"  #: one of RECOVERIES
    spares_per_rack: int = 1  #: with recovery `spares`: spare nodes kept in each rack
    seed: int = 1
    #: (time, node) of every failure, instead of drawn ones (a crafted scenario; repairs as above)
    script: tuple[tuple[float, str], ...] = ()

    def problem(self) -> str:
        """Why these options cannot be simulated, or ""."""
        if not (math.isfinite(self.mtbf_s) and self.mtbf_s > 0):
            return "--node-mtbf must be above 0"
        if min(self.checkpoint_every_s, self.restart_cost_s, self.repair_s) < 0:
            return "--checkpoint-every, --restart-cost and --repair-time may not be negative"
        if self.recovery not in RECOVERIES:
            return f"--recovery must be one of {', '.join(RECOVERIES)}"
        if self.recovery == "spares" and self.spares_per_rack < 1:
            return "--spares-per-rack must be at least 1 with --recovery spares"
        return ""

    def kept(self, productive_s: float) -> float:
        """Of `productive_s` seconds an attempt ran (its restart counted out), those its last
        checkpoint saved."""
        every = self.checkpoint_every_s
        return math.floor(productive_s / every + 1e-9) * every if every > 0 else 0.0


class NodeFailures:
    """The failure and repair times of a set of nodes, in time order (pop them with `pop`)."""

    def __init__(self, model: FailureModel, nodes: list[str]) -> None:
        self.model = model
        self._streams = {n: random.Random(f"synapse-sim node failures {model.seed} {n}") for n in nodes}
        self._events: list[tuple[float, str, str]] = []  #: (at, LOST or UP, node), a heap
        self.down: set[str] = set()  #: nodes failed and not yet back
        for at, n in model.script:
            heapq.heappush(self._events, (at, LOST, n))
        for n in sorted(nodes) if not model.script else ():
            heapq.heappush(self._events, (self._next_failure(n, 0.0), LOST, n))

    def _next_failure(self, node: str, after: float) -> float:
        return after + self._streams[node].expovariate(1.0 / self.model.mtbf_s)

    def next_at(self) -> float:
        return self._events[0][0] if self._events else math.inf

    def pop(self) -> tuple[float, str, str]:
        """The next event: (time, LOST or UP, node); the node's next one is drawn."""
        at, kind, node = heapq.heappop(self._events)
        if kind == LOST:
            self.down.add(node)
            heapq.heappush(self._events, (at + self.model.repair_s, UP, node))
        else:
            self.down.discard(node)
            if not self.model.script:
                heapq.heappush(self._events, (self._next_failure(node, at), LOST, node))
        return at, kind, node

    def until(self, end: float) -> list[tuple[float, str, str]]:
        """Every event before `end`, popped (for tests and reports)."""
        out = []
        while self.next_at() < end:
            out.append(self.pop())
        return out
