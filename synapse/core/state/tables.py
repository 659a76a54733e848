"""The tables of the cluster state: what every handler reads and writes, and the reads placement needs.

synapse.core.state.fsm.ClusterState is these tables with the door (`apply`) and the snapshots; the
handlers that change them are the functions of this package's modules, one module per table (see
synapse.core.state). Each attribute's `#:` comment says what it holds and who may change it.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from typing import Any

from sortedcontainers import SortedList

from synapse.core import versions
from synapse.core.jobs.arrays import JobArray, split_element_id
from synapse.core.model import (
    DEFAULT_LEVELS,
    ClusterEvent,
    Hold,
    Job,
    JobSpec,
    JobStatus,
    JoinToken,
    Node,
    Queue,
    Resources,
    Task,
    User,
)
from synapse.core.schedule import fairshare
from synapse.core.schedule.predict import RunTimes
from synapse.core.schedule.topology import CapacityIndex

#: Cluster events kept for `get events` and watchers; an older cursor is refused, never skipped.
MAX_CLUSTER_EVENTS = 5000
#: Quiet departures from the queue remembered for the round memo (`ClusterState.dequeued`): more
#: between two rounds and the next round walks the whole queue, as after any other change.
DEQUEUED_KEPT = 1024


class ClusterTables:
    """Nodes, jobs and tasks, plus the indexes placement needs. Mutated only through apply's handlers."""

    def __init__(self, levels: tuple[str, ...] = DEFAULT_LEVELS) -> None:
        # -- the door (synapse.core.state.fsm: ClusterState.apply)
        self.levels = tuple(levels)  #: topology level names, widest first; fixed for the cluster
        self.applied = 0  #: commands applied (accepted or rejected); apply only
        self.max_term = 0  #: highest proposer term seen in a command; fences stale leaders
        #: commands applied other than submissions and barriers (local: not in snapshots). While it
        #: stands still, only new jobs have joined the queue, and a scheduling round that placed
        #: nothing need not look at the jobs it already saw (see scheduler.RoundMemo).
        self.other_changes = 0
        #: the queue entries of pending jobs that left the queue having changed nothing else (a
        #: cancel or final failure of a PENDING job that holds no nodes and is no array element),
        #: newest last, at most DEQUEUED_KEPT, and how many there were in all. Each is one command
        #: counted in `other_changes` too: while the two counts rise together, only the queue
        #: changed, and a round memo may stand (scheduler.RoundMemo). Local, like other_changes.
        self.dequeued: deque[tuple[Any, ...]] = deque(maxlen=DEQUEUED_KEPT)
        self.dequeued_count = 0
        # -- jobs and gangs (state.jobs, state.arrays, state.gangs, state.tasks, state.transitions)
        self.jobs: dict[str, Job] = {}  #: by job id; apply only
        self.job_by_request: dict[str, str] = {}  #: client request id -> job id; apply only
        #: (queue_key, job id) of PENDING jobs; apply only
        self.pending: SortedList[tuple[tuple[int, float, int], str]] = SortedList()
        self.job_seq = 0  #: submissions accepted so far; gives each job its queue tie-breaker
        self.live_tasks: dict[str, set[tuple[str, int, int]]] = {}  #: node id -> live task keys
        self.arrays: dict[str, JobArray] = {}  #: job arrays by id (their elements are jobs once placed); apply only
        #: each array's elements that are jobs and have not ended; derived, rebuilt on restore
        self.array_live: dict[str, set[str]] = {}
        #: run times learned from attempts that ended on their own (synapse.core.schedule.predict); apply only
        self.run_times = RunTimes()
        # -- nodes (state.nodes, state.node_faults)
        self.nodes: dict[str, Node] = {}  #: by node id; apply only
        self.join_tokens: dict[str, JoinToken] = {}  #: by token id; apply only
        self.join_token_by_hash: dict[str, str] = {}  #: token hash -> token id; derived, rebuilt on restore
        #: the nodes designated spares (Node.spare); derived, replaced whole by apply, rebuilt on restore
        self.spares: frozenset[str] = frozenset()
        self.index = CapacityIndex(len(self.levels))  #: derived; rebuilt on restore
        self.largest = Resources()  #: derived: the largest capacity of any node, per dimension
        # -- queues and usage (state.queues, state.usage)
        self.queues: dict[str, Queue] = {}  #: by name; apply only (the default queue is implicit)
        self.holds: dict[str, Hold] = {}  #: preemptor job id -> nodes held for it alone; apply only
        self.held_nodes: dict[str, str] = {}  #: node id -> preemptor holding it; derived
        #: what the live tasks of each queue's jobs hold (the accounting of admission and preemption);
        #: derived, kept by apply and rebuilt on restore
        self.queue_usage: dict[str, Resources] = {}
        #: what the live tasks of each user's jobs hold in each queue, by (queue, user) (a queue's
        #: max_per_user.gpu); derived, kept by apply and rebuilt on restore
        self.user_usage: dict[tuple[str, str], Resources] = {}
        self.usage_half_life = 0.0  #: seconds; the decayed usage's half-life (0: none); apply only
        #: each queue's and user's decayed GPU usage (synapse.core.schedule.fairshare), from the commands'
        #: own timestamps; apply only
        self.queue_decay: dict[str, fairshare.DecayedUsage] = {}
        self.user_decay: dict[str, fairshare.DecayedUsage] = {}
        self.usage_clock = 0.0  #: the latest time a decayed usage was brought to; apply only
        # -- identities (state.users)
        self.users: dict[str, User] = {}  #: by name; apply only
        self.user_by_token: dict[str, str] = {}  #: token hash -> user name; derived, rebuilt on restore
        # -- history numbering (state.history)
        self.archive_seq = 0  #: jobs finished so far: the archive sequence number of the newest; apply only
        self.archived_upto = 0  #: the history store holds every finished job numbered up to this; apply only
        self.history_dropped = 0  #: finished jobs forgotten before the store held them (the cap); apply only
        #: archive sequence number -> id of each finished job the store does not hold yet, in finishing
        #: order (what the exporter reads, and what retention may not forget); derived, rebuilt on restore
        self.unarchived: dict[int, str] = {}
        #: forgotten jobs' and arrays' final status, for dependencies on them (oldest first, at most
        #: MAX_FINISHED_RECORDS); apply only
        self.finished: dict[str, str] = {}
        # -- the cluster (state.cluster) and its events (ClusterTables.emit, from every table)
        #: the command-set version every member is known to apply (SetClusterVersion); only rises; apply only
        self.cluster_version = versions.BASE_VERSION
        #: master replicas added at run time: id -> (raft address, api address); apply only
        self.replicas: dict[str, tuple[str, str]] = {}
        #: the cluster's typed events, oldest first, at most MAX_CLUSTER_EVENTS; apply only
        self.cluster_events: deque[ClusterEvent] = deque(maxlen=MAX_CLUSTER_EVENTS)
        self.event_seq = 0  #: the cursor of the newest event; apply only

    def _note_capacity(self, capacity: Resources) -> None:
        """Keep `largest` (a hint for rejecting tasks no node could ever hold; it never shrinks)."""
        self.largest = Resources(max(self.largest.cpu, capacity.cpu), max(self.largest.memory, capacity.memory),
                                 max(self.largest.gpu, capacity.gpu))

    # ---- the events log ---------------------------------------------------------------------------

    def emit(self, at: float, severity: str, topic: str, reason: str, object_id: str, message: str) -> None:
        """Record a cluster event (deterministic: called by apply only)."""
        self.event_seq += 1
        self.cluster_events.append(ClusterEvent(self.event_seq, at, severity, topic, reason, object_id, message))

    def events_after(self, cursor: int) -> list[ClusterEvent] | None:
        """Events after `cursor`, oldest first; None when some of them were already dropped."""
        if not self.cluster_events or cursor >= self.event_seq:
            return []
        first = self.cluster_events[0].seq
        if cursor < first - 1:
            return None
        return list(itertools.islice(self.cluster_events, cursor - first + 1, None))

    # ---- reads ----------------------------------------------------------------------------------

    def pending_jobs(self, start: int = 0) -> Iterator[Job]:
        """PENDING jobs in queue order (priority, then submission time), from position `start`."""
        for _, job_id in self.pending.islice(start):
            yield self.jobs[job_id]

    def spec_of(self, job_id: str) -> JobSpec | None:
        """The spec of a job, or of an array element that is not a job yet (a round may plan one)."""
        job = self.jobs.get(job_id)
        if job is not None:
            return job.spec
        element = split_element_id(job_id)
        array = self.arrays.get(element[0]) if element is not None else None
        return array.spec if array is not None else None

    def tasks_on_node(self, node_id: str) -> list[tuple[Task, bool]]:
        """Live tasks on a node with whether each is still wanted (False: it must be stopped)."""
        out = []
        for job_id, _attempt, index in sorted(self.live_tasks.get(node_id, ())):
            job = self.jobs[job_id]
            wanted = job.status in (JobStatus.SCHEDULED, JobStatus.RUNNING)
            out.append((job.tasks[index], wanted))
        return out
