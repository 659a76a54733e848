"""What scheduling reads of the cluster: `ClusterRead`, a read-only view. Pure.

The modules of synapse.core.schedule plan from this view and never from the state machine itself
(tests/unit/test_layout.py holds it): as Nomad's schedulers plan on a state snapshot, a round needs
only something that answers these reads. `synapse.core.state.fsm.ClusterState` satisfies it as it
stands (structurally: it does not name this protocol); a frozen snapshot taken under the leader's
lock could, so that a round plans without holding up apply. Every member is read-only here: the
mappings and sets are the state's own, and a round must not change them (apply alone does).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Set
from typing import Any, Protocol

from synapse.core.jobs.arrays import JobArray
from synapse.core.model import Hold, Job, JobSpec, Node, Queue, Resources
from synapse.core.schedule.fairshare import DecayedUsage
from synapse.core.schedule.predict import RunTimes
from synapse.core.schedule.topology import CapacityIndex


class ClusterRead(Protocol):
    """The cluster as a scheduling round reads it: nodes, jobs, the queue, queues, usage and holds."""

    # -- nodes and capacity
    @property
    def levels(self) -> tuple[str, ...]:
        """Topology level names, widest first."""

    @property
    def nodes(self) -> Mapping[str, Node]:
        """Nodes by id."""

    @property
    def index(self) -> CapacityIndex:
        """Free capacity per node and per topology domain, of the nodes that accept work."""

    @property
    def live_tasks(self) -> Mapping[str, Set[tuple[str, int, int]]]:
        """Node id -> (job id, attempt, task index) of the live tasks on it."""

    @property
    def spares(self) -> Set[str]:
        """The nodes designated spares."""

    # -- jobs, the pending queue and arrays
    @property
    def jobs(self) -> Mapping[str, Job]:
        """Jobs by id."""

    @property
    def pending(self) -> Any:
        """The queue: a SortedList of (queue key, job id) of PENDING jobs (bisect, index, len)."""

    @property
    def arrays(self) -> Mapping[str, JobArray]:
        """Job arrays by id."""

    @property
    def array_live(self) -> Mapping[str, Set[str]]:
        """Each array's elements that are jobs and have not ended."""

    @property
    def finished(self) -> Mapping[str, str]:
        """Forgotten jobs' and arrays' final status (what dependencies on them read)."""

    @property
    def run_times(self) -> RunTimes:
        """Run times learned from attempts that ended on their own (the predictor)."""

    # -- the round memo's change counters
    @property
    def other_changes(self) -> int:
        """Commands applied other than submissions and barriers."""

    @property
    def dequeued(self) -> Sequence[tuple[Any, ...]]:
        """Queue entries of the pending jobs that left the queue quietly, newest last."""

    @property
    def dequeued_count(self) -> int:
        """How many pending jobs left the queue quietly in all."""

    # -- queues, usage and preemptors' holds
    @property
    def queues(self) -> Mapping[str, Queue]:
        """Queues by name (the default queue is implicit)."""

    @property
    def queue_usage(self) -> Mapping[str, Resources]:
        """What the live tasks of each queue's jobs hold."""

    @property
    def user_usage(self) -> Mapping[tuple[str, str], Resources]:
        """What the live tasks of each user's jobs hold in each queue, by (queue, user)."""

    @property
    def queue_decay(self) -> Mapping[str, DecayedUsage]:
        """Each queue's decayed GPU usage."""

    @property
    def usage_clock(self) -> float:
        """The latest time a decayed usage was brought to."""

    @property
    def usage_half_life(self) -> float:
        """The decayed usage's half-life in seconds (0: none)."""

    @property
    def holds(self) -> Mapping[str, Hold]:
        """Preemptor job id -> the nodes held for it alone."""

    @property
    def held_nodes(self) -> Mapping[str, str]:
        """Node id -> the preemptor holding it."""

    def pending_jobs(self, start: int = 0) -> Iterator[Job]:
        """PENDING jobs in queue order, from position `start`."""

    def spec_of(self, job_id: str) -> JobSpec | None:
        """The spec of a job, or of an array element that is not a job yet."""

    def queue_of(self, job: Job) -> str:
        """The queue a job is counted in."""

    def notice_of(self, job: Job) -> float:
        """Seconds of checkpoint notice the job's tasks get before a planned stop."""
