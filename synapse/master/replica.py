"""One master replica's process-local state: leadership, watchers, change notification, watchdog.

`synapse.master.main` assembles a replica (this object, the Raft node, the gRPC endpoints, the
leader loops); the endpoints and the loops receive this object and never import that assembly.

Threads: pysyncobj's tick thread applies commands; everything else runs on one asyncio loop (the
gRPC server, the leader loops, the assignment watchers). The tick thread only ever hands work to
the loop with `call_soon_threadsafe`, so it is never blocked by us, and no synchronous replicated
call is ever made from it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import random
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import grpc
from prometheus_client import Counter, Histogram

from synapse.common.tls import channel_credentials
from synapse.core import commands as c
from synapse.core.brain.leader_state import LeaderView
from synapse.core.brain.stimuli import HealthReport, ProgressReport
from synapse.core.shards import ShardMap
from synapse.core.state.fsm import ClusterState
from synapse.master.config import ClusterConfig
from synapse.master.dispatch import nodes_relisted, relists_any
from synapse.master.durability import free_bytes
from synapse.master.raft import ProposeError, RaftNode
from synapse.proto import api_pb2

if TYPE_CHECKING:  # SQLAlchemy's: imported by masters with a history store only
    from synapse.history.exporter import History

log = logging.getLogger(__name__)

#: How long a replica with no known leader holds a request before answering UNAVAILABLE: a little
#: over the longest election timeout. An election normally ends within it; a replica still without
#: a leader may be cut off from its peers, and the client does better trying the others.
LEADER_WAIT_S = 1.2
#: How often leadership is checked (pysyncobj has no reliable cross-thread notification).
LEADERSHIP_POLL_S = 0.02
#: Writes are refused when the data dir's disk is short of room, as checked at most this long ago.
DISK_CHECK_S = 0.1
#: How often the replica checks its stored data and its disk.
WATCHDOG_S = 0.5



#: The commands whose rounds may batch (leader.LeaderLoops._pace): they come in streams and free
#: nothing (a submission, a task's start or preparation, the leader's own records and placements).
PACED = (c.SubmitJob, c.TaskStarted, c.TaskPrepared, c.CommitPlan, c.Barrier, c.PendingReasons, c.RecordProgress,
         c.RecordExec, c.CheckpointNotice, c.HistoryExported, c.HistoryOverflow)
#: A submission ends the pause too while no more than this many jobs wait: the round is cheap then,
#: and the job may start at once (Slurm schedules at each submission, looking at the first
#: default_queue_depth=100 jobs). A submission right after other changes (a gang's end, say) waited
#: out their round's pause: 15.8 ms to its placement against 7 ms.
QUICK_QUEUE = 100


def urgent(cmds: Sequence[c.Command], waiting: int) -> bool:
    """Whether applied `cmds` end the pause between rounds (LeaderLoops._pace): one that may let a
    waiting gang start (resources freed, a hold released: not PACED), or a submission while at
    most QUICK_QUEUE jobs wait (`waiting`)."""
    return not all(isinstance(cmd, PACED) for cmd in cmds) or (
        waiting <= QUICK_QUEUE and any(isinstance(cmd, c.SubmitJob) for cmd in cmds))


class LeaderWork(Protocol):
    """What the replica, the endpoints, metrics and the dashboard may use of the leader loops it
    starts (see `synapse.master.leader`)."""

    term: int
    ready: asyncio.Event
    view: LeaderView  #: the leader's decisions, read-only

    def start(self) -> None:
        """Start the term's loops (the replica calls it once, on gaining leadership)."""

    def stop(self) -> None: ...

    def progress(self, reports: list[ProgressReport]) -> None:
        """Tasks' progress reports for the brain; returns without waiting for what it proposes."""

    def heard(self, node_id: str, health: HealthReport | None = None) -> str:
        """A node was heard from; its status in the state ('' if unknown)."""

    def digest(self, digest: api_pb2.LivenessDigest) -> None:
        """A link shard's liveness digest (synapse.master.link_shard) for the brain."""


class ShardClock(Protocol):
    """The link shards' clocks (synapse.master.link_shard.ShardTimings)."""

    @property
    def digest(self) -> float: ...

    @property
    def silence(self) -> float: ...


class ShardWork(Protocol):
    """What the endpoints, metrics and health checks may use of this replica's link shard
    (synapse.master.link_shard.LinkShard, which imports this module: hence a protocol)."""

    @property
    def timings(self) -> ShardClock: ...

    map: ShardMap
    absorbed: int  #: heartbeats absorbed
    redirects: int  #: of those, heartbeats of nodes whose shard is another replica's
    delivered: int  #: digests that reached the leader's brain
    failed: int  #: digests that did not
    failures: int  #: digests not delivered since the last one that was
    delivered_at: float  #: monotonic time the last digest reached a leader

    def serving(self) -> bool: ...

    def attached(self) -> int: ...

    def answer(self, request: api_pb2.HeartbeatRequest) -> tuple[api_pb2.HeartbeatReply | None, str]:
        """A heartbeat taken in and answered: (the reply, '') or (None, why not)."""

    def lease_ms(self, status: str) -> int:
        """The lease a heartbeat's answer grants a node of `status`, in milliseconds."""


class BeatCounts(Protocol):
    """What metrics read of the heartbeat (and task report) datagrams' endpoint (synapse.master.beats.BeatEndpoint,
    which imports this module: hence a protocol)."""

    answered: int
    refused: int
    dropped: int
    reports_taken: int  #: task reports by datagram committed and answered
    reports_refused: int


class MetricsWork(Protocol):
    """What the replica and its leader loops record in the process's metrics
    (synapse.master.metrics.Metrics, which imports this module: hence a protocol)."""

    proposals: Counter
    proposals_applied: Counter
    proposals_rejected: Counter
    commit_seconds: Histogram
    round_seconds: Histogram

    def applied(self, master: Master, cmds: list[c.Command]) -> None: ...


class Master:
    """The state of one replica process that is not replicated: leadership, watchers, loops."""

    def __init__(self, config: ClusterConfig, replica_id: str, raft: RaftNode) -> None:
        self.config = config
        self.replica = config.replica(replica_id)
        self.raft = raft
        self.loop: asyncio.AbstractEventLoop | None = None
        self.leader_loops: LeaderWork | None = None  #: the leader loops while this replica leads
        #: soft state while leading: (job, attempt, node) -> (phase, done bytes, total bytes, monotonic
        #: time heard) of the pulls held gangs wait for; written by ReportPullProgress, read by job views
        self.pull_progress: dict[tuple[str, int, str], tuple[str, int, int, float]] = {}
        #: soft state while leading: node -> (the references its image store holds, monotonic time heard)
        self.node_images: dict[str, tuple[tuple[str, ...], float]] = {}
        self._node_events: dict[str, asyncio.Event] = {}  #: node id -> set when its assignments may change
        self._credential_key: tuple[str, bytes] = ("", b"")  #: (Raft password, the node credentials' key)
        self._leadership_lost = asyncio.Event()  #: set whenever this replica stops leading
        self.deposed_at = float("-inf")  #: monotonic time this replica last stopped leading
        self.scheduler_dirty = asyncio.Event()  #: something changed that may let a gang start
        #: set with it by a change that is not only submissions and reports (PACED): resources
        #: freed, a hold released, a node back; the next round need not wait out the batching pause
        self.scheduler_urgent = asyncio.Event()
        self.data_dir = config.data_dir_of(replica_id)
        self._disk_room, self._disk_checked_at = True, float("-inf")  #: disk_has_room's last answer, and when
        self.fatal = ""  #: why the replica stopped itself (corruption, an unknown command, full disk), if it did
        self.leader_changes = 0  #: times this replica saw the leader change (a metric)
        self._job_ids = random.Random(secrets.token_bytes(16))  #: the random part of new job ids
        self._applied = asyncio.Event()  #: set (and replaced) whenever commands changed the state
        #: the process's synapse.master.metrics.Metrics once main has made them (not imported here:
        #: metrics reads this object, so the dependency points one way only)
        self.metrics: MetricsWork | None = None
        self._last_leader: str | None = None
        self.stopping = False  #: set by begin_stop: streams end and new waits give up
        #: the history store and its exporter's status (synapse.history.exporter.History), or None
        #: when the cluster file configures none; set by main
        self.history: History | None = None
        #: this replica's link shard (synapse.master.link_shard.LinkShard, which reads this object):
        #: the heartbeats of its share of the nodes; set by main
        self.shard: ShardWork | None = None
        #: the heartbeat datagrams' endpoint (synapse.master.beats), if this replica takes them
        self.beats: BeatCounts | None = None

    # ---- proposing and reading -----------------------------------------------------------------

    @property
    def state(self) -> ClusterState:
        return self.raft.replicated.state

    @property
    def lock(self) -> threading.RLock:
        return self.raft.replicated.lock

    async def propose(self, cmd: c.Command, timeout: float = 5.0) -> c.Result:
        return (await self.propose_all((cmd,), timeout))[0]

    async def propose_all(self, cmds: tuple[c.Command, ...] | list[c.Command],
                          timeout: float = 5.0) -> list[c.Result]:
        """Propose `cmds` in one log entry (RaftNode.propose_all_async): all commit or none does."""
        if self.stopping:  # begin_stop has failed the proposals before; later ones fail at once
            raise ProposeError("STOPPING", maybe_applied=False)
        started = time.perf_counter()
        try:
            results = await self.raft.propose_all_async(cmds, timeout)
        except ProposeError as exc:
            if self.metrics is not None:
                self.metrics.proposals.labels(exc.kind.lower()).inc(len(cmds))
            raise
        if self.metrics is not None:
            applied = sum(1 for result in results if result.ok)
            if applied:
                self.metrics.proposals_applied.inc(applied)
            if applied < len(results):
                self.metrics.proposals_rejected.inc(len(results) - applied)
            self.metrics.commit_seconds.observe(time.perf_counter() - started)
        return results

    def now(self) -> float:
        """The master's wall clock: the timestamps the endpoints and the history exporter put in
        commands come from here (tests/unit/test_master_clock.py), so one place can stand in for it."""
        return time.time()

    def node_credential(self, node_id: str) -> str:
        """The credential a worker presents to act for `node_id`: an HMAC only masters can make
        (keyed by the Raft password, which clients and workers never see)."""
        password = self.config.raft_password
        if self._credential_key[0] != password:  # worked out once: every worker call checks one
            self._credential_key = (password, hashlib.sha256(b"synapse-node-credential\0" + password.encode()).digest())
        return hmac.new(self._credential_key[1], node_id.encode(), hashlib.sha256).hexdigest()

    def replica_credential(self) -> str:
        """The credential replicas present to each other's API (their liveness digests)."""
        return hashlib.sha256(b"synapse-replica-credential\0" + self.config.raft_password.encode()).hexdigest()

    def api_channel(self, address: str) -> grpc.aio.Channel:
        """An asyncio channel to another replica's API (with this replica's certificate under TLS)."""
        if self.config.tls.enabled:
            return grpc.aio.secure_channel(address, channel_credentials(self.config.tls_of(self.replica.id)))
        return grpc.aio.insecure_channel(address)

    def new_job_id(self, name: str) -> str:
        """The spec's name and 32 random bits. Not secret (every user sees job ids): drawn from a
        generator seeded from the OS once, not a system call per submission as `secrets` made it."""
        return f"{name[:40]}-{self._job_ids.getrandbits(32):08x}"

    def leader_api_address(self) -> str:
        """The API address of the leader this replica follows and is connected to, or ''.

        pysyncobj keeps naming a dead leader until the next election; a hint to it would only send
        clients in circles, so a replica names its leader only while its link to it is up.
        """
        leader = self.raft.leader_if_connected()
        return self.api_of_raft(leader) if leader else ""

    def api_of_raft(self, raft_address: str) -> str:
        """API address of a replica from the cluster file, or from the replicated directory."""
        known = self.config.api_of_raft(raft_address)
        if known:
            return known
        with self.lock:
            return next((api for raft, api in self.state.replicas.values() if raft == raft_address), "")

    def leader_view(self) -> LeaderView | None:
        """The leader's decisions (why gangs wait, its reservation) while this replica leads."""
        loops = self.leader_loops
        return loops.view if loops is not None else None

    def ready_leader_term(self) -> int:
        """The term this replica leads in with its loops ready, or 0."""
        loops = self.leader_loops
        if loops is not None and loops.ready.is_set() and self.raft.role() == (True, loops.term):
            return loops.term
        return 0

    # ---- change notification (tick thread -> loop) ---------------------------------------------

    def on_applied(self, applied: Sequence[tuple[c.Command | None, c.Result]]) -> None:
        """Listener for every applied log entry; runs on pysyncobj's tick thread, so it only hands off."""
        changes = [cmd for cmd, result in applied if result.ok and cmd is not None and not isinstance(cmd, c.Barrier)]
        if changes and self.raft.is_leader() and relists_any(self.state, changes):  # the tick thread's state
            self.raft.sync.commit_at_once()
        inbox = self.raft.inbox
        if inbox is not None and changes:
            inbox.post(self._changed_all, changes)

    def _changed_all(self, cmds: list[c.Command]) -> None:
        if self.metrics is not None:
            self.metrics.applied(self, cmds)
        self.scheduler_dirty.set()
        if urgent(cmds, len(self.state.pending)):
            self.scheduler_urgent.set()
        self._applied.set()
        self._applied = asyncio.Event()
        if self._node_events:  # only when some node's assignments are watched here
            with self.lock:
                touched = nodes_relisted(self.state, cmds, tuple(self._node_events))
            for node_id in touched:
                self.notify_node(node_id)

    def notify_node(self, node_id: str) -> None:
        event = self._node_events.pop(node_id, None)
        if event is not None:
            event.set()

    def node_event(self, node_id: str) -> asyncio.Event:
        """An event set the next time this node's assignments may have changed."""
        event = self._node_events.get(node_id)
        if event is None:
            event = self._node_events[node_id] = asyncio.Event()
        return event

    def disk_has_room(self) -> bool:
        """False once the data dir's file system has less than min_free_disk left, as read at most
        DISK_CHECK_S ago: a statvfs per proposal was a measurable part of a submission's CPU, and
        free space does not move faster than that."""
        now = time.monotonic()
        if now - self._disk_checked_at >= DISK_CHECK_S:
            self._disk_room = free_bytes(self.data_dir) >= self.config.min_free_disk
            self._disk_checked_at = now
        return self._disk_room

    async def watchdog(self, stop: asyncio.Event) -> None:
        """Stop the replica on corrupt data, at a log entry its code cannot apply or whose apply
        failed midway, or before a full disk makes the journal's mmap fail."""
        while not stop.is_set():
            problem = self.raft.corruption()
            cure = f"Rebuild it with: synapse-master rebuild --config FILE --id {self.replica.id}"
            if not problem and self.raft.unknown_entry():
                problem = self.raft.unknown_entry()
                cure = "Start it again with the release its peers run (upgrade it); it applies the entry then"
            if not problem and self.raft.apply_failure():
                problem = self.raft.apply_failure()
                cure = ("Every replica stops at this entry (they run the same code): report it with this log; a "
                        "release that mends the handler replays the journal and applies the entry whole")
            if not problem and free_bytes(self.data_dir) < self.config.min_free_disk // 4:
                problem = (f"less than {self.config.min_free_disk // 4} bytes free under {self.data_dir}; "
                           "stopping before the journal cannot grow")
            if problem:
                log.critical("replica %s stops: %s. %s", self.replica.id, problem, cure)
                self.fatal = problem
                stop.set()
                return
            await asyncio.sleep(WATCHDOG_S)

    def begin_stop(self) -> int:
        """End this replica's streams and waiting proposals with an answer before the server stops.

        A call still running when the gRPC server's grace ends is cancelled, and a cancel that
        races the call's own end is logged by grpc as an unhandled CancelledError with a
        traceback. Woken now, every stream sees `stopping` and aborts with UNAVAILABLE, and every
        waiting proposal (and membership change) fails as after a leader change (its client retries
        elsewhere with the same request id); later ones fail at once (`propose`). Returns how many
        were failed. A stream blocked on a client that reads nothing is still cancelled at the end
        of the grace.
        """
        self.stopping = True
        self._applied.set()
        self._leadership_lost.set()
        for event in self._node_events.values():
            event.set()
        self._node_events.clear()
        return self.raft.abandon()

    def state_changed(self) -> asyncio.Event:
        """An event set the next time applied commands change the state (on any replica)."""
        return self._applied

    def leadership_lost(self) -> asyncio.Event:
        return self._leadership_lost

    # ---- leadership ----------------------------------------------------------------------------

    async def watch_leadership(self, start_loops: Callable[[Master, int], LeaderWork]) -> None:
        """Start `start_loops(self, term)` on gaining leadership and stop them on losing it."""
        while True:
            leading, term = self.raft.role()
            leader = self.raft.leader()
            if leader and leader != self._last_leader:
                if self._last_leader is not None:
                    self.leader_changes += 1
                self._last_leader = leader
            loops = self.leader_loops
            if loops is not None and (not leading or term != loops.term):
                abandoned = self.raft.abandon()
                self.deposed_at = time.monotonic()
                log.info("leadership lost term=%d replica=%s abandoned_proposals=%d", loops.term, self.replica.id,
                         abandoned)
                loops.stop()
                self.leader_loops = None
                self._leadership_lost.set()
                self._leadership_lost = asyncio.Event()
                for event in self._node_events.values():
                    event.set()
                self._node_events.clear()
            if leading and self.leader_loops is None:
                log.info("leadership gained term=%d replica=%s", term, self.replica.id)
                self.leader_loops = start_loops(self, term)
                self.leader_loops.start()
            await asyncio.sleep(LEADERSHIP_POLL_S)

