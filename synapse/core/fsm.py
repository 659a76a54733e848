"""The cluster state machine: the only source of truth, replicated by Raft, changed only by `apply`.

Every replica applies the same commands in the same order and must reach the same state, so apply
is deterministic: no clock, no randomness, no leadership checks, no I/O. Ids, timestamps and the
proposer's term arrive inside the command.

Apply is a transaction: a command changes the state as a whole or not at all. Every handler
validates first and mutates after, so a rejected command (a refusal the handler expects) changes
nothing but the applied-command counter and the highest term seen (tests/test_apply_transaction.py
drives every kind and compares the whole state before and after each rejection). A handler that
raises instead has failed midway, with the state perhaps half-changed: that is not a rejection but
ApplyFailed, and the replica stops applying (synapse.master.raft.ReplicatedState), as etcd panics
and as it stops at a log entry its code does not know. Every replica applies the same entry with the
same code, so they all stop there; restarted with mended code, each replays its journal from the
last snapshot, and the entry applies whole.

Resources are freed only when the work is known to be gone: when a task's worker reports it
stopped (TaskExited) or its node is declared DOWN. Asking a gang to stop (a failed task, a
cancellation) only moves the job to STOPPING; its tasks keep their resources until they are gone.

The checkpoint notice: a job that asks for one (`checkpoint: {signal, notice}`) has every task of a
running attempt signalled `notice` seconds (capped by its queue's max_grace: `notice_of`) before
any stop the cluster plans (NOTICED_CAUSES), and SIGTERM only then. For its time limit the leader
proposes CheckpointNotice that long before the limit and the stop at it; a preemption, a drain or
a resize stops the attempt at once with `stop_notice` set, and its workers signal the tasks, wait,
then send SIGTERM (synapse.worker.state). Each attempt is noticed once (`notice_at`), recorded as a
Notice event that says when the stop comes.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from sortedcontainers import SortedList

from synapse.core import codec, dependencies, elastic, fairshare, snapshot
from synapse.core import commands as c
from synapse.core.arrays import MAX_ARRAY_SIZE, JobArray, element_id, split_element_id
from synapse.core.commands import Result
from synapse.core.identity import groups_problem, user_name_problem
from synapse.core.jobspec import JobFileError, check_checkpoint, check_workflow, notice_capped
from synapse.core.model import (
    DEFAULT_GRACE_S,
    DEFAULT_LABEL,
    DEFAULT_LEVELS,
    DEFAULT_QUEUE,
    HEALTH_CHECK_FAILED,
    JOIN_TOKEN_NODES,
    NODE_FAULTS,
    NOTICED_CAUSES,
    REQUEUED_CAUSES,
    WORKER_REASONS,
    ClusterEvent,
    EndReason,
    Event,
    Hold,
    Job,
    JobSpec,
    JobStatus,
    JoinToken,
    Node,
    NodeStatus,
    PackMode,
    Progress,
    Queue,
    Resources,
    Run,
    Task,
    TaskState,
    User,
    excluded_for,
    gang_unprepared,
    gpu_fault_hits,
)
from synapse.core.predict import RunTimes
from synapse.core.queues import batch_problem
from synapse.core.topology import CapacityIndex

log = logging.getLogger(__name__)

#: Events kept per job; older ones are dropped (the first, "submitted", is always kept).
MAX_EVENTS_PER_JOB = 200
#: Cluster events kept for `get events` and watchers; an older cursor is refused, never skipped.
MAX_CLUSTER_EVENTS = 5000
#: A job event's kind -> the stable reason of the cluster event it also makes, and its type.
_JOB_REASONS = {
    "Submitted": ("JobSubmitted", "Normal"), "Scheduled": ("GangPlaced", "Normal"),
    "Running": ("GangRunning", "Normal"), "Stopping": ("GangStopping", "Warning"),
    "Requeued": ("GangRestarting", "Warning"), "Succeeded": ("JobSucceeded", "Normal"),
    "Failed": ("JobFailed", "Warning"), "Cancelled": ("JobCancelled", "Normal"),
    "Preempted": ("Preempted", "Warning"), "Preempting": ("Preempting", "Normal"),
    "Notice": ("CheckpointNotice", "Normal"), "ProgressIgnored": ("ProgressIgnored", "Warning"),
}
#: How a Notice event names the planned stop it announces.
_PLANNED_STOPS: dict[str, str] = {EndReason.TIME_LIMIT: "its time limit", EndReason.PREEMPTED: "the preemption",
                  EndReason.DRAINED: "the drain", EndReason.RESIZED: "the resize"}
#: Ended attempts kept per job (the first and the latest ones; a gang preempted without end would
#: otherwise grow without bound).
MAX_RUNS_PER_JOB = 100
#: A gang preempted this many times within PREEMPTION_WINDOW_S is exempt from the priority and
#: fair-share rules for the rest of that window (reclaim still applies): no gang thrashes.
PREEMPTION_BUDGET = 3
#: Lost nodes requeue a gang uncharged this many times; after that a lost node counts against its
#: max_restarts, so a job that takes its nodes down cannot walk the cluster for ever (Slurm's
#: MaxBatchRequeue is 5 too). Drains, preemption and resizes stay uncharged: they are the cluster's.
MAX_UNCHARGED_REQUEUES = 5
PREEMPTION_WINDOW_S = 86400.0
#: Nodes a job remembers as having ended an attempt of its (lost, or drained by a failing health
#: check): its later attempts avoid the latest this many (Slurm's --exclude, kept for the user).
MAX_EXCLUDED_NODES = 8
#: A node on which gangs of SUSPECT_JOBS different jobs ended by a node-side cause (model.NODE_SIDE_CAUSES)
#: within this many seconds, by the commands' own `at`, is cordoned as a suspect: a "black hole"
#: that fails every gang placed on it would otherwise drain the queue through it.
SUSPECT_WINDOW_S = 86400.0
SUSPECT_JOBS = 2
#: Node-side ends remembered per node (the oldest beyond it are dropped).
MAX_NODE_FAILURES = 8
#: The ends of an attempt that tell how long its job runs (synapse.core.predict): it ran until it
#: exited, or until its time limit; a stop the cluster chose, or a task that never ran, says nothing.
#: The command-set version from which apply learns run times (SetClusterVersion raises it).
PREDICT_VERSION = 4
LEARNED_OUTCOMES = frozenset({EndReason.COMPLETED, EndReason.ERROR, EndReason.SIGNAL, EndReason.OOM_KILLED,
                              EndReason.TIME_LIMIT})
#: Final states of forgotten jobs kept for dependencies on them (the oldest beyond it are dropped).
MAX_FINISHED_RECORDS = 200_000
#: Quiet departures from the queue remembered for the round memo (`ClusterState.dequeued`): more
#: between two rounds and the next round walks the whole queue, as after any other change.
DEQUEUED_KEPT = 1024


class ApplyFailed(Exception):
    """A handler raised while applying a command: the state may be half-changed, so the replica
    must stop applying (see the module docstring). Never a rejection."""


class ClusterState:
    """Nodes, jobs and tasks, plus the indexes placement needs. Mutated only through `apply`."""

    def __init__(self, levels: tuple[str, ...] = DEFAULT_LEVELS) -> None:
        self.levels = tuple(levels)  #: topology level names, widest first; fixed for the cluster
        self.nodes: dict[str, Node] = {}  #: by node id; apply only
        self.jobs: dict[str, Job] = {}  #: by job id; apply only
        self.job_by_request: dict[str, str] = {}  #: client request id -> job id; apply only
        self.pending: SortedList = SortedList()  #: (queue_key, job id) of PENDING jobs; apply only
        self.live_tasks: dict[str, set[tuple[str, int, int]]] = {}  #: node id -> live task keys
        self.applied = 0  #: commands applied (accepted or rejected); apply only
        #: the command-set version every member is known to apply (SetClusterVersion); only rises; apply only
        self.cluster_version = codec.BASE_VERSION
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
        self.job_seq = 0  #: submissions accepted so far; gives each job its queue tie-breaker
        #: master replicas added at run time: id -> (raft address, api address); apply only
        self.replicas: dict[str, tuple[str, str]] = {}
        self.users: dict[str, User] = {}  #: by name; apply only
        self.user_by_token: dict[str, str] = {}  #: token hash -> user name; derived, rebuilt on restore
        self.join_tokens: dict[str, JoinToken] = {}  #: by token id; apply only
        self.join_token_by_hash: dict[str, str] = {}  #: token hash -> token id; derived, rebuilt on restore
        self.queues: dict[str, Queue] = {}  #: by name; apply only (the default queue is implicit)
        self.holds: dict[str, Hold] = {}  #: preemptor job id -> nodes held for it alone; apply only
        self.held_nodes: dict[str, str] = {}  #: node id -> preemptor holding it; derived
        #: the nodes designated spares (Node.spare); derived, replaced whole by apply, rebuilt on restore
        self.spares: frozenset[str] = frozenset()
        #: what the live tasks of each queue's jobs hold (the accounting of admission and preemption);
        #: derived, kept by apply and rebuilt on restore
        self.queue_usage: dict[str, Resources] = {}
        self.usage_half_life = 0.0  #: seconds; the decayed usage's half-life (0: none); apply only
        #: each queue's and user's decayed GPU usage (synapse.core.fairshare), from the commands'
        #: own timestamps; apply only
        self.queue_decay: dict[str, fairshare.DecayedUsage] = {}
        self.user_decay: dict[str, fairshare.DecayedUsage] = {}
        self.usage_clock = 0.0  #: the latest time a decayed usage was brought to; apply only
        #: the cluster's typed events, oldest first, at most MAX_CLUSTER_EVENTS; apply only
        self.cluster_events: deque[ClusterEvent] = deque(maxlen=MAX_CLUSTER_EVENTS)
        self.event_seq = 0  #: the cursor of the newest event; apply only
        self.arrays: dict[str, JobArray] = {}  #: job arrays by id (their elements are jobs once placed); apply only
        #: each array's elements that are jobs and have not ended; derived, rebuilt on restore
        self.array_live: dict[str, set[str]] = {}
        #: forgotten jobs' and arrays' final status, for dependencies on them (oldest first, at most
        #: MAX_FINISHED_RECORDS); apply only
        self.finished: dict[str, str] = {}
        self.archive_seq = 0  #: jobs finished so far: the archive sequence number of the newest; apply only
        self.archived_upto = 0  #: the history store holds every finished job numbered up to this; apply only
        self.history_dropped = 0  #: finished jobs forgotten before the store held them (the cap); apply only
        #: archive sequence number -> id of each finished job the store does not hold yet, in finishing
        #: order (what the exporter reads, and what retention may not forget); derived, rebuilt on restore
        self.unarchived: dict[int, str] = {}
        #: run times learned from attempts that ended on their own (synapse.core.predict); apply only
        self.run_times = RunTimes()
        self.index = CapacityIndex(len(self.levels))  #: derived; rebuilt on restore
        self.largest = Resources()  #: derived: the largest capacity of any node, per dimension
        self._handlers: dict[type, Callable[[Any], Result]] = {
            c.RegisterNode: self._register_node, c.NodeDown: self._node_down,
            c.NodeUp: self._node_up, c.SetSchedulable: self._set_schedulable,
            c.SubmitJob: self._submit_job, c.CommitPlan: self._commit_plan,
            c.TaskStarted: self._task_started, c.TaskExited: self._task_exited,
            c.CancelJob: self._cancel_job, c.FailAttempt: self._fail_attempt,
            c.Barrier: lambda cmd: Result(True), c.SetReplica: self._set_replica,
            c.ForgetJobs: self._forget_jobs, c.ArchiveJobs: self._archive_jobs, c.AddUser: self._add_user,
            c.SetUserToken: self._set_user_token, c.RemoveUser: self._remove_user,
            c.ApplyQueues: self._apply_queues, c.DeleteQueue: self._delete_queue,
            c.Preempt: self._preempt, c.PendingReasons: self._pending_reasons,
            c.SetNodeHealth: self._set_node_health, c.SubmitWorkflowJob: self._submit_job,
            c.NodeLost: self._node_down, c.DrainNode: self._drain_node,
            c.SetClusterVersion: self._set_cluster_version,
            c.SetArrayThrottle: self._set_array_throttle, c.ResizeGang: self._resize_gang,
            c.CreateJoinToken: self._create_join_token,
            c.RevokeJoinToken: self._revoke_join_token, c.JoinNode: self._join_node,
            c.HistoryExported: self._history_exported,
            c.HistoryOverflow: self._history_overflow, c.SetUsageHalfLife: self._set_usage_half_life,
            c.SubmitCheckpointJob: self._submit_job, c.CheckpointNotice: self._checkpoint_notice,
            c.RecordProgress: self._record_progress,
            c.SetSpares: self._set_spares, c.GpuFault: self._gpu_fault,
            c.SubmitImageJob: self._submit_job, c.TaskPrepared: self._task_prepared,
        }

    # ---- the one door ---------------------------------------------------------------------------

    def apply_bytes(self, data: bytes) -> Result:
        """Decode a single-command log entry and apply it (CodecError as for `apply_entry`)."""
        return self.apply_entry(data)[0][1]

    def apply_entry(self, data: bytes, commands: codec.CommandSet = codec.CURRENT) -> list[tuple[c.Command, Result]]:
        """Apply every command of a log entry (one, or a batch's, in order) with its result.

        An entry this code cannot apply (a command kind or version it does not know, an undecodable
        body, a kind without a handler) raises CodecError and changes nothing, not even `applied`.
        It was written by code that knows more: rejecting it would part this state from the states
        of the replicas that apply it, so the replica must stop before it instead (see
        synapse.master.raft.ReplicatedState) and apply it once upgraded. Rejections of commands it
        knows (validation, a stale term) are results, as ever.
        """
        cmds = codec.decode_entry(data, commands)
        unknown = [type(cmd).__name__ for cmd in cmds if type(cmd) not in self._handlers]
        if unknown:
            raise codec.CodecError(f"no handler for command type {', '.join(unknown)}")
        return [(cmd, self.apply(cmd)) for cmd in cmds]

    def apply(self, cmd: c.Command) -> Result:
        """Apply one command. Deterministic; a rejection changes nothing; ApplyFailed when a handler
        raised (the replica must stop: see the module docstring)."""
        self.applied += 1
        if not isinstance(cmd, (c.SubmitJob, c.Barrier, c.PendingReasons, c.HistoryExported)):  # none changes capacity
            self.other_changes += 1
        try:
            if cmd.term:
                if cmd.term < self.max_term:
                    return Result.rejected(f"stale leader: command from term {cmd.term}, "
                                           f"term {self.max_term} already seen", c.Rejection.STALE)
                self.max_term = cmd.term
            handler = self._handlers.get(type(cmd))
            if handler is None:
                return Result.rejected(f"unknown command type {type(cmd).__name__}")
            return handler(cmd)
        except Exception as exc:
            # Not a refusal: the handler stopped midway. Reporting it as "rejected, nothing changed"
            # would hide a half-applied command; the replica stops here instead.
            log.critical("apply failed cmd=%s applied=%d", type(cmd).__name__, self.applied, exc_info=True)
            raise ApplyFailed(f"applying {type(cmd).__name__} (command {self.applied}) raised {exc!r}") from exc

    # ---- nodes ----------------------------------------------------------------------------------

    def _register_node(self, cmd: c.RegisterNode) -> Result:
        if not cmd.node_id:
            return Result.rejected("node id must not be empty")
        if cmd.capacity.is_negative():
            return Result.rejected(f"node {cmd.node_id}: capacity must not be negative")
        if len(cmd.topology) > len(self.levels):
            return Result.rejected(f"node {cmd.node_id}: topology {'/'.join(cmd.topology)} has more "
                                   f"levels than the cluster's {'/'.join(self.levels)}")
        if any(not label or "/" in label for label in cmd.topology):
            return Result.rejected(f"node {cmd.node_id}: topology labels must be non-empty, without '/'")
        topology = (DEFAULT_LABEL,) * (len(self.levels) - len(cmd.topology)) + tuple(cmd.topology)
        labels = tuple(sorted(cmd.labels))
        node = self.nodes.get(cmd.node_id)
        if node is None:
            node = Node(id=cmd.node_id, address=cmd.address, topology=topology,
                        capacity=cmd.capacity, registered_at=cmd.at, status_changed_at=cmd.at,
                        labels=labels, isolation=cmd.isolation)
            self.nodes[node.id] = node
            self.live_tasks[node.id] = set()
            self.index.update(node)
            self._note_capacity(node.capacity)
            self.emit(cmd.at, "Normal", "node", "NodeRegistered", node.id,
                      f"{node.capacity.gpu} GPU(s) in {'/'.join(topology)}")
            return Result(True, value="registered")
        if not node.used.fits_in(cmd.capacity) or any(g >= cmd.capacity.gpu for g in node.gpus_in_use):
            return Result.rejected(f"node {node.id}: new capacity is below what its live tasks use")
        node.address, node.topology, node.capacity = cmd.address, topology, cmd.capacity
        node.labels, node.isolation = labels, cmd.isolation
        self._note_capacity(node.capacity)
        if node.status is NodeStatus.DOWN:
            node.status, node.status_changed_at = NodeStatus.READY, cmd.at
            self.emit(cmd.at, "Normal", "node", "NodeUp", node.id, "registered again")
        self.index.update(node)
        return Result(True, value="re-registered")

    # ---- join tokens ----------------------------------------------------------------------------

    def _create_join_token(self, cmd: c.CreateJoinToken) -> Result:
        if not cmd.token_id or cmd.token_id in self.join_tokens:
            return Result.rejected(f"join token id {cmd.token_id!r} is empty or taken")
        if not cmd.token_hash or cmd.token_hash in self.join_token_by_hash or cmd.token_hash in self.user_by_token:
            return Result.rejected("join token hash is empty or taken")
        if cmd.max_uses < 0 or cmd.expires_at < 0:
            return Result.rejected("join token: uses and expiry must not be negative")
        self.join_tokens[cmd.token_id] = JoinToken(id=cmd.token_id, token_hash=cmd.token_hash, created_at=cmd.at,
                                                   created_by=cmd.by, expires_at=cmd.expires_at,
                                                   max_uses=cmd.max_uses)
        self.join_token_by_hash[cmd.token_hash] = cmd.token_id
        return Result(True, value=cmd.token_id)

    def _revoke_join_token(self, cmd: c.RevokeJoinToken) -> Result:
        token = self.join_tokens.pop(cmd.token_id, None)
        if token is None:
            return Result.not_found(f"unknown join token {cmd.token_id}")
        del self.join_token_by_hash[token.token_hash]
        return Result(True)

    def _join_node(self, cmd: c.JoinNode) -> Result:
        """A new node by a join token: the token's use and the registration happen together or not
        at all (the expiry is judged at the proposer's time, carried in the command)."""
        token = self.join_tokens.get(cmd.token_id)
        if token is None:
            return Result.not_found(f"unknown join token {cmd.token_id}")
        why = token.unusable(cmd.at)
        if why:
            return Result.rejected(why)
        if cmd.node.node_id in self.nodes:
            return Result.rejected(f"node {cmd.node.node_id} is registered: re-registering it needs an admin or "
                                   "its own credential, not a join token")
        result = self._register_node(cmd.node)
        if result.ok:
            token.uses += 1
            token.nodes = (*token.nodes, cmd.node.node_id)[-JOIN_TOKEN_NODES:]
        return result

    def _note_capacity(self, capacity: Resources) -> None:
        """Keep `largest` (a hint for rejecting tasks no node could ever hold; it never shrinks)."""
        self.largest = Resources(max(self.largest.cpu, capacity.cpu), max(self.largest.memory, capacity.memory),
                                 max(self.largest.gpu, capacity.gpu))

    def _node_down(self, cmd: c.NodeDown) -> Result:
        holder = self.held_nodes.get(cmd.node_id)
        if holder is not None and cmd.node_id in self.nodes:
            self._release_hold(holder)  # the plan lapses; the preemptor is planned afresh
        node = self.nodes.get(cmd.node_id)
        if node is None:
            return Result.not_found(f"unknown node {cmd.node_id}")
        if node.status is NodeStatus.DOWN:
            return Result(True, value="already down")
        node.status, node.status_changed_at = NodeStatus.DOWN, cmd.at
        reason = f"node {node.id} down" + (f": {cmd.reason}" if cmd.reason else "")
        self.emit(cmd.at, "Warning", "node", "NodeDown", node.id, reason)
        # A NodeLost (version 3) requeues the gangs uncharged; a NodeDown of an older leader fails them.
        uncharged = isinstance(cmd, c.NodeLost)
        ended: list[str] = []  #: the jobs whose gangs this loss ends (not those stopping already), in order
        for job_id, _attempt, index in sorted(self.live_tasks[node.id]):
            job = self.jobs[job_id]
            task = job.tasks[index]
            if job.status in (JobStatus.SCHEDULED, JobStatus.RUNNING) and job_id not in ended:
                ended.append(job_id)
            self._end_task(task, TaskState.LOST, None, cmd.at, EndReason.NODE_LOST, reason)
            lost = f"task {index} (rank {task.rank}) on {node.id}: NodeLost: {cmd.reason or 'node declared down'}"
            # An uncharged loss is no failure of the job's: it keeps none (its run records the cause).
            self._stop_attempt(job, f"{'' if uncharged else 'failed: '}task {index} lost ({reason})", cmd.at,
                               cause=EndReason.NODE_LOST if uncharged else "", failure="" if uncharged else lost)
            self._maybe_end_attempt(job, cmd.at)
        if uncharged:  # version 3 only: an older replica applies a NodeDown, which keeps no record
            self._note_node_failures(node, ended, EndReason.NODE_LOST.value, cmd.at)
        self.index.update(node)
        return Result(True)

    def _note_node_failures(self, node: Node, job_ids: list[str], cause: str, at: float) -> None:
        """Gangs of `job_ids` ended on `node` by a node-side `cause`: each job excludes the node from
        its later attempts, and the node's record of such ends grows; with ends of SUSPECT_JOBS
        different jobs within SUSPECT_WINDOW_S of `at`, the node is cordoned as a suspect. Only
        version-3 commands (NodeLost, a health check's DrainNode) and a GpuFault (4) call this."""
        if not job_ids:
            return
        for job_id in job_ids:
            job = self.jobs[job_id]
            job.excluded_nodes = (*(n for n in job.excluded_nodes if n != node.id), node.id)[-MAX_EXCLUDED_NODES:]
        recent = [f for f in node.failures if at - f[0] < SUSPECT_WINDOW_S]
        node.failures = tuple([*recent, *((at, job_id, cause) for job_id in job_ids)][-MAX_NODE_FAILURES:])
        jobs = list(dict.fromkeys(job_id for _, job_id, _ in node.failures))
        if len(jobs) < SUSPECT_JOBS or node.suspect:
            return
        causes = "/".join(sorted({f[2] for f in node.failures}))
        node.schedulable, node.health_cordon, node.suspect = False, False, True
        node.cordon_reason = (f"suspect: tasks of jobs {', '.join(jobs)} ended {causes} here within "
                              f"{SUSPECT_WINDOW_S / 3600:g}h")
        self.emit(at, "Warning", "node", "NodeSuspect", node.id, node.cordon_reason)
        self.index.update(node)

    def _node_up(self, cmd: c.NodeUp) -> Result:
        node = self.nodes.get(cmd.node_id)
        if node is None:
            return Result.not_found(f"unknown node {cmd.node_id}")
        if node.status is NodeStatus.READY:
            return Result(True, value="already ready")
        node.status, node.status_changed_at = NodeStatus.READY, cmd.at
        self.emit(cmd.at, "Normal", "node", "NodeUp", node.id, "heard from again")
        self.index.update(node)
        return Result(True)

    def _set_schedulable(self, cmd: c.SetSchedulable) -> Result:
        """An admin's cordon or uncordon. An admin's cordon replaces a health cordon, so the health
        check passing again never lifts it."""
        node = self.nodes.get(cmd.node_id)
        if node is None:
            return Result.not_found(f"unknown node {cmd.node_id}")
        reason = "" if cmd.schedulable else (cmd.reason or "cordoned") + (f" (by {cmd.by})" if cmd.by else "")
        if node.schedulable != cmd.schedulable or node.health_cordon or node.suspect:
            self.emit(cmd.at, "Normal", "node", "NodeUncordoned" if cmd.schedulable else "NodeCordoned", node.id,
                      ("uncordoned" + (f" by {cmd.by}" if cmd.by else "")) if cmd.schedulable else reason)
        node.schedulable, node.cordon_reason, node.health_cordon = cmd.schedulable, reason, False
        # An admin's cordon replaces a suspect's; an uncordon also forgives the node its record (and
        # its GPU error: the admin says it was repaired).
        node.suspect = False
        if cmd.schedulable:
            node.failures, node.gpu_error = (), ""
        self.index.update(node)
        return Result(True)

    def _set_node_health(self, cmd: c.SetNodeHealth) -> Result:
        """Cordon a failing node (and with `drain` stop its gangs); uncordon a passing one only if
        its health check was what cordoned it."""
        node = self.nodes.get(cmd.node_id)
        if node is None:
            return Result.not_found(f"unknown node {cmd.node_id}")
        if cmd.healthy:
            if not node.health and not node.health_cordon:
                return Result(True, value="already healthy")
            node.health = ""
            self.emit(cmd.at, "Normal", "node", "NodeHealthy", node.id, "health check passes again")
            if node.health_cordon:
                node.schedulable, node.cordon_reason, node.health_cordon = True, "", False
                self.emit(cmd.at, "Normal", "node", "NodeUncordoned", node.id, "uncordoned: health check passes")
                self.index.update(node)
            return Result(True)
        message = cmd.message or "health check failed"
        if node.health != message:
            self.emit(cmd.at, "Warning", "node", "NodeUnhealthy", node.id, f"health check failed: {message}")
        node.health = message
        if node.schedulable or node.health_cordon:
            node.schedulable, node.health_cordon = False, True
            node.cordon_reason = f"health check failed: {message}"
            self.emit(cmd.at, "Warning", "node", "NodeCordoned", node.id, node.cordon_reason)
            self.index.update(node)
        if cmd.drain:
            for task, wanted in self.tasks_on_node(node.id):
                job = self.jobs[task.job_id]
                if wanted:
                    self._stop_attempt(job, f"failed: node {node.id} unhealthy ({message})", cmd.at,
                                       failure=f"node {node.id} of task {task.index} unhealthy: {message}")
        return Result(True)

    def _set_spares(self, cmd: c.SetSpares) -> Result:
        """Designate exactly these nodes spares (all or nothing: an unknown node rejects the set)."""
        unknown = sorted(set(cmd.node_ids) - set(self.nodes))
        if unknown:
            return Result.not_found(f"unknown node(s) {', '.join(unknown)}")
        chosen = frozenset(cmd.node_ids)
        why = f": {cmd.reason}" if cmd.reason else ""
        for node_id in sorted(chosen ^ self.spares):
            node = self.nodes[node_id]
            node.spare = node_id in chosen
            self.emit(cmd.at, "Normal", "node", "NodeSpare" if node.spare else "NodeSpareReleased", node_id,
                      ("designated a spare" if node.spare else "no longer a spare") + why)
        self.spares = chosen
        return Result(True, value=str(len(chosen)))

    def _set_cluster_version(self, cmd: c.SetClusterVersion) -> Result:
        if cmd.version <= self.cluster_version:
            return Result(True, value=f"already at version {self.cluster_version}")
        self.cluster_version = cmd.version
        self.emit(cmd.at, "Normal", "cluster", "ClusterVersion", "", f"every member applies command-set version "
                                                                  f"{cmd.version}")
        return Result(True, value=str(cmd.version))

    def _drain_node(self, cmd: c.DrainNode) -> Result:
        """Cordon the node (with `cordon`) and stop every gang with a wanted task on it, each with
        its grace: it requeues at its place without using up a restart, or, an elastic gang that
        keeps its minimum without the node, shrinks. Returns the ids of the gangs stopped."""
        node = self.nodes.get(cmd.node_id)
        if node is None:
            return Result.not_found(f"unknown node {cmd.node_id}")
        holder = self.held_nodes.get(node.id)
        if holder is not None:
            self._release_hold(holder)  # the preemptor's plan lapses with the node: it is planned afresh
        by = f" by {cmd.by}" if cmd.by else ""
        reason = f"node {node.id} drained{by}" + (f": {cmd.reason}" if cmd.reason else "")
        #: a failing health check's drain (only it leaves the cordon to its SetNodeHealth): the node,
        #: not the job, ended the gangs
        health_drain = not cmd.cordon
        if cmd.cordon:
            if node.schedulable or node.health_cordon or node.suspect:
                self.emit(cmd.at, "Normal", "node", "NodeCordoned", node.id, f"draining{by}")
            node.schedulable, node.cordon_reason, node.health_cordon, node.suspect = False, f"drained{by}", False, False
            self.index.update(node)
        stopped = []
        for job_id in sorted({t.job_id for t, wanted in self.tasks_on_node(node.id) if wanted}):
            job = self.jobs[job_id]
            if job.status not in (JobStatus.SCHEDULED, JobStatus.RUNNING):
                continue
            job.stop_grace = job.spec.grace or DEFAULT_GRACE_S
            kept = sum(1 for t in job.tasks if t.node_id != node.id)
            if elastic.is_elastic(job.spec) and kept >= job.spec.tasks_min:
                self._stop_attempt(job, f"shrinking from {len(job.tasks)} to {kept} task(s): {reason}", cmd.at,
                                   cause=EndReason.RESIZED)
                self._event(job, cmd.at, "Shrinking", f"{reason}: {len(job.tasks)} -> {kept} task(s); "
                                                      f"grace {job.stop_grace:g}s")
            else:
                self._stop_attempt(job, reason, cmd.at, cause=EndReason.DRAINED)
            stopped.append(job_id)
        self.emit(cmd.at, "Normal", "node", "NodeDrained", node.id,
                  reason + (f"; stopping {', '.join(stopped)}" if stopped else "; no gang to stop"))
        if health_drain:
            self._note_node_failures(node, stopped, HEALTH_CHECK_FAILED, cmd.at)
        return Result(True, value=",".join(stopped))

    def _gpu_fault(self, cmd: c.GpuFault) -> Result:
        """A worker's GPU error: stop every gang with a wanted task on the failed GPUs (each requeues at
        its place uncharged and excludes the node: a node-side end, as a lost node's), and cordon the
        node with the error until an admin uncordons it. The whole node, not the GPU alone: a GPU
        that failed this way needs a reset or a reboot, which takes the node's other tasks down too.
        Returns the ids of the gangs stopped."""
        node = self.nodes.get(cmd.node_id)
        if node is None:
            return Result.not_found(f"unknown node {cmd.node_id}")
        message = cmd.message or "GPU error"
        reason = f"GPU error: {message}"
        hit = sorted({t.job_id for t, wanted in self.tasks_on_node(node.id)
                      if wanted and gpu_fault_hits(t.gpus, cmd.gpus)})
        for job_id in hit:
            self._stop_attempt(self.jobs[job_id], f"GPU error on node {node.id}: {message}", cmd.at,
                               cause=EndReason.GPU_ERROR)
        if node.gpu_error != message or hit:
            self.emit(cmd.at, "Warning", "node", "NodeGpuError", node.id,
                      reason + (f"; stopping {', '.join(hit)}" if hit else "; no gang on those GPUs"))
        self._note_node_failures(node, hit, EndReason.GPU_ERROR.value, cmd.at)
        if node.schedulable or node.cordon_reason != reason:
            self.emit(cmd.at, "Warning", "node", "NodeCordoned", node.id, reason)
        # The GPU's error is the reason to give, even on a suspect (which stays one): it says what to repair.
        node.schedulable, node.health_cordon, node.cordon_reason, node.gpu_error = False, False, reason, message
        self.index.update(node)
        return Result(True, value=",".join(hit))

    def _set_replica(self, cmd: c.SetReplica) -> Result:
        if not cmd.id:
            return Result.rejected("replica id must not be empty")
        if cmd.removed:
            self.replicas.pop(cmd.id, None)
            return Result(True)
        if not cmd.raft_address or not cmd.api_address:
            return Result.rejected(f"replica {cmd.id}: raft and api addresses are required")
        self.replicas[cmd.id] = (cmd.raft_address, cmd.api_address)
        return Result(True)

    # ---- jobs -----------------------------------------------------------------------------------

    def validate_spec(self, spec: JobSpec) -> str:
        """Why a job spec can never be accepted, or '' when it is well formed."""
        if not spec.name:
            return "name must not be empty"
        if spec.tasks < 1:
            return f"tasks must be at least 1, not {spec.tasks}"
        if spec.resources.is_negative():
            return "resources must not be negative"
        if spec.resources == Resources():
            return "a task must ask for some cpu, memory or gpu"
        if not spec.command and not spec.image:  # with an image, its entrypoint (a SubmitImageJob alone)
            return "command must not be empty"
        if spec.max_restarts < 0:
            return "max_restarts must not be negative"
        if spec.time_limit < 0:
            return "time_limit must not be negative"
        if spec.topology.pack and spec.topology.pack not in (*self.levels, "node"):
            return (f"topology.pack must be one of {', '.join((*self.levels, 'node'))}, "
                    f"not {spec.topology.pack!r}")
        return ""

    def request_conflict(self, request_id: str, spec: JobSpec) -> str:
        """Why a submission of `spec` under `request_id` is refused, or ''. A request id makes one
        job: sent again with that job's spec it is a retry, which gets that job; with another spec
        it is a reused id, and the new job would be lost silently behind the old one."""
        job_id = self.job_by_request.get(request_id, "") if request_id else ""
        made = self.arrays.get(job_id) or self.jobs.get(job_id)
        if made is None or made.spec == spec:
            return ""
        return (f"request id {request_id} already made job {job_id}, from another spec: "
                "a new job needs a new request id")

    def _submit_job(self, cmd: c.SubmitJob) -> Result:
        if cmd.request_id and cmd.request_id in self.job_by_request:
            conflict = self.request_conflict(cmd.request_id, cmd.spec)
            if conflict:
                return Result.rejected(conflict, c.Rejection.CONFLICT)
            return Result(True, value=self.job_by_request[cmd.request_id])
        if not cmd.job_id:
            return Result.rejected("job id must not be empty")
        if cmd.job_id in self.jobs or cmd.job_id in self.arrays:
            return Result.rejected(f"job id {cmd.job_id} already exists")
        problem = self.validate_spec(cmd.spec) or self._workflow_problem(cmd) or self._checkpoint_problem(cmd)
        if problem:
            return Result.rejected(f"job {cmd.spec.name or cmd.job_id}: {problem}")
        if cmd.spec.queue not in ("", DEFAULT_QUEUE) and cmd.spec.queue not in self.queues:
            return Result.rejected(f"job {cmd.spec.name or cmd.job_id}: queue: unknown queue {cmd.spec.queue}")
        if cmd.spec.array:
            return self._submit_array(cmd)
        self.job_seq += 1
        job = Job(id=cmd.job_id, spec=cmd.spec, request_id=cmd.request_id, submitted_at=cmd.at,
                  seq=self.job_seq, user=cmd.by, pending_since=cmd.at)
        self.jobs[job.id] = job
        if cmd.request_id:
            self.job_by_request[cmd.request_id] = job.id
        self.pending.add((job.queue_key(), job.id))
        capped = notice_capped(cmd.spec, self.queues.get(self.queue_of(job)))
        self._event(job, cmd.at, "Submitted", (f"by {cmd.by}: " if cmd.by else "")
                    + f"{cmd.spec.tasks} task(s), max_restarts {cmd.spec.max_restarts}"
                    + (f"; warning: {capped}" if capped else ""))
        return Result(True, value=job.id)

    @staticmethod
    def _checkpoint_problem(cmd: c.SubmitJob) -> str:
        """Why a submission's checkpoint notice cannot be accepted, or '' (jobspec.check_checkpoint)."""
        if cmd.spec.has_checkpoint and not isinstance(cmd, c.SubmitCheckpointJob):
            return "a checkpoint notice needs a SubmitCheckpointJob command"
        if cmd.spec.has_image_run and not isinstance(cmd, c.SubmitImageJob):
            return "mounts, or a job without a command, need a SubmitImageJob command"
        try:
            check_checkpoint(cmd.spec)
        except JobFileError as exc:
            return str(exc)
        return ""

    def notice_of(self, job: Job) -> float:
        """Seconds of checkpoint notice the job's tasks get before a planned stop: its spec's, within
        its queue's max_grace (as it is now: a larger one later gives more); 0 if it asks for none."""
        if not job.spec.has_checkpoint:
            return 0.0
        queue = self.queues.get(self.queue_of(job))
        return queue.capped(job.spec.checkpoint.notice) if queue is not None else job.spec.checkpoint.notice

    def _running_attempt(self, job_id: str, attempt: int) -> Job | Result:
        """The job if `attempt` is the one it runs now, else the refusal to return."""
        job = self.jobs.get(job_id)
        if job is None:
            return Result.not_found(f"unknown job {job_id}")
        if job.status is not JobStatus.RUNNING or job.attempt != attempt:
            return Result.rejected(f"job {job.id} is {job.status.value} at attempt {job.attempt}, not running "
                                   f"attempt {attempt}")
        return job

    def _checkpoint_notice(self, cmd: c.CheckpointNotice) -> Result:
        """Give a running attempt's tasks their checkpoint notice ahead of the stop planned for
        `stop_at` (the leader's time-limit monitor proposes it). An attempt is noticed once."""
        job = self._running_attempt(cmd.job_id, cmd.attempt)
        if isinstance(job, Result):
            return job
        if not job.spec.has_checkpoint:
            return Result.rejected(f"job {job.id} asks for no checkpoint notice")
        if cmd.cause not in NOTICED_CAUSES or cmd.stop_at < cmd.at:
            return Result.rejected(f"a notice is for a planned stop ahead ({', '.join(sorted(NOTICED_CAUSES))}), "
                                   f"not {cmd.cause or 'none'} at {cmd.stop_at:.0f}")
        if job.notice_at:
            return Result(True, value="already noticed")
        self._give_notice(job, cmd.at, cmd.stop_at, cmd.cause)
        return Result(True)

    def _record_progress(self, cmd: c.RecordProgress) -> Result:
        """Record an attempt's last checkpoint (and step) as its tasks reported it, while its gang
        exists (a stopping one too: it may save on its checkpoint notice); a checkpoint never goes
        back in time. A progress file's garbage becomes a Warning event, once per report."""
        job = self.jobs.get(cmd.job_id)
        if job is None:
            return Result.not_found(f"unknown job {cmd.job_id}")
        if not job.status.has_gang or job.attempt != cmd.attempt:
            return Result.rejected(f"job {job.id} is {job.status.value} at attempt {job.attempt}, not holding "
                                   f"attempt {cmd.attempt}")
        if cmd.checkpoint_at < 0 or not math.isfinite(cmd.checkpoint_at):
            return Result.rejected(f"checkpoint_at must be a time, not {cmd.checkpoint_at}")
        old = job.progress if job.progress is not None and job.progress.attempt == job.attempt else None
        checkpoint_at, checkpoint_step = cmd.checkpoint_at, cmd.checkpoint_step
        if old is not None and old.checkpoint_at > checkpoint_at:
            checkpoint_at, checkpoint_step = old.checkpoint_at, old.checkpoint_step
        step = cmd.step if cmd.step >= 0 or old is None else old.step
        job.progress = Progress(job.attempt, checkpoint_at, checkpoint_step, step, cmd.at)
        if cmd.problem:
            self._event(job, cmd.at, "ProgressIgnored", cmd.problem[:300])
        return Result(True)

    def _give_notice(self, job: Job, at: float, stop_at: float, cause: str) -> None:
        """Record that the attempt's tasks get their notice now (dispatch passes it to the workers)."""
        job.notice_at = at
        live = sum(1 for t in job.tasks if t.state.live)
        self._event(job, at, "Notice", f"SIG{job.spec.checkpoint.signal} to {live} task(s); "
                                       f"{_PLANNED_STOPS.get(cause, cause)} stops them at "
                                       f"{utc_clock(stop_at)} ({stop_at - at:g}s notice)")

    def _workflow_problem(self, cmd: c.SubmitJob) -> str:
        """Why a submission's array or dependencies cannot be accepted against this state, or ''.

        The same rules as the endpoint's (jobspec.check_workflow), but for the array size: the
        cluster file's max_array_size is configuration, not replicated state, so apply holds
        arrays to the absolute MAX_ARRAY_SIZE only (the endpoint refuses beyond the cluster's)."""
        spec = cmd.spec
        if spec.has_workflow and not isinstance(cmd, c.SubmitWorkflowJob):
            return "arrays and dependencies need a SubmitWorkflowJob command"
        try:
            check_workflow(spec, MAX_ARRAY_SIZE)
        except JobFileError as exc:
            return str(exc)
        for _kind, upstream in spec.after:
            if upstream == cmd.job_id or split_element_id(upstream) is not None and \
                    split_element_id(upstream)[0] == cmd.job_id:  # type: ignore[index]
                return f"after: job {upstream} is this job itself"
            if not dependencies.known(self, upstream):
                return f"after: unknown job {upstream}"
        return ""

    def _submit_array(self, cmd: c.SubmitJob) -> Result:
        """One record for the whole array; its first element becomes a job at once (see arrays.py)."""
        self.job_seq += 1
        array = JobArray(id=cmd.job_id, spec=cmd.spec, request_id=cmd.request_id, user=cmd.by,
                         submitted_at=cmd.at, seq=self.job_seq, throttle=cmd.spec.array_throttle)
        self.arrays[array.id] = array
        self.array_live[array.id] = set()
        if cmd.request_id:
            self.job_by_request[cmd.request_id] = array.id
        self.emit(cmd.at, "Normal", "job", "JobSubmitted", array.id,
                  (f"by {cmd.by}: " if cmd.by else "") + f"array of {array.count} element(s) "
                  f"[{cmd.spec.array}]" + (f", at most {array.throttle} running" if array.throttle else "")
                  + f", {cmd.spec.tasks} task(s) each")
        self._next_element(array, cmd.at)
        return Result(True, value=array.id)

    def _next_element(self, array: JobArray, at: float) -> None:
        """Make the array's next index a job (pending), if none is queued unplaced and indices remain."""
        if array.rep or array.cancelled:
            return
        while array.next < array.count:
            index = array.index_at(array.next)
            array.next += 1
            if index in array.skipped:
                continue
            self.job_seq += 1
            job = Job(id=element_id(array.id, index), spec=array.spec, request_id="", submitted_at=array.submitted_at,
                      seq=self.job_seq, user=array.user, pending_since=at, array_id=array.id, array_index=index)
            self.jobs[job.id] = job
            self.array_live[array.id].add(job.id)
            array.rep = job.id
            self.pending.add((job.queue_key(), job.id))
            job.events.append(Event(at, "Submitted", f"element {index} of array {array.id}"))
            return

    def _element_ended(self, job: Job, at: float) -> None:
        """Count an element's end in its array; queue the next element if this one was never placed."""
        array = self.arrays.get(job.array_id)
        if array is None:
            return
        self.array_live.get(array.id, set()).discard(job.id)
        if job.status is JobStatus.SUCCEEDED:
            array.succeeded += 1
        elif job.status is JobStatus.FAILED:
            array.failed += 1
        else:
            array.cancelled_count += 1
        if array.rep == job.id:
            array.rep = ""
            self._next_element(array, at)
        self._array_maybe_done(array, at)

    def _array_maybe_done(self, array: JobArray, at: float) -> None:
        if array.done and not array.finished_at:
            array.finished_at = at
            status = array.status(False)
            self.emit(at, "Normal" if status is JobStatus.SUCCEEDED else "Warning", "job",
                      _JOB_REASONS[status.value.capitalize()][0], array.id,
                      f"array: {array.succeeded} succeeded, {array.failed} failed, {array.cancelled_count} cancelled")

    def _set_array_throttle(self, cmd: c.SetArrayThrottle) -> Result:
        array = self.arrays.get(cmd.job_id)
        if array is None:
            return Result.not_found(f"unknown array {cmd.job_id}")
        if cmd.throttle < 0:
            return Result.rejected("throttle must not be negative (0: no limit)")
        if array.done:
            return Result.rejected(f"array {array.id} has ended")
        array.throttle = cmd.throttle
        self.emit(cmd.at, "Normal", "job", "ArrayThrottled", array.id,
                  (f"at most {cmd.throttle} element(s) running" if cmd.throttle else "no limit on running elements")
                  + (f" (by {cmd.by})" if cmd.by else ""))
        return Result(True, value=str(cmd.throttle))

    def _resize_gang(self, cmd: c.ResizeGang) -> Result:
        """Stop a running elastic gang with its grace so that it restarts at `size` (synapse.core.elastic)."""
        job = self._running_attempt(cmd.job_id, cmd.attempt)
        if isinstance(job, Result):
            return job
        if not elastic.is_elastic(job.spec) or cmd.size == len(job.tasks) \
                or not job.spec.tasks_min <= cmd.size <= job.spec.tasks:
            return Result.rejected(f"job {job.id} cannot resize from {len(job.tasks)} to {cmd.size} task(s) (it takes "
                                   f"{elastic.least(job.spec)} to {job.spec.tasks})")
        job.stop_grace = job.spec.grace or DEFAULT_GRACE_S
        # `size` is what fitted when the leader asked; the next attempt is placed at the largest size
        # that fits then (synapse.core.elastic), which may be larger still: say so, not a promise.
        self._stop_attempt(job, f"resizing from {len(job.tasks)} task(s) (room for {cmd.size} when asked)"
                           + (f": {cmd.reason}" if cmd.reason else ""), cmd.at, cause=EndReason.RESIZED)
        way = "larger" if cmd.size > len(job.tasks) else "smaller"
        self._event(job, cmd.at, "Resizing", f"attempt {job.attempt} stops at {len(job.tasks)} task(s) to restart "
                                             f"{way} (room for {cmd.size} now; the next attempt takes as many as "
                                             f"fit, up to {job.spec.tasks}); grace {job.stop_grace:g}s")
        return Result(True)

    def _cancel_array(self, array: JobArray, cmd: c.CancelJob) -> Result:
        """`cancel ID`: no more elements become jobs, and every element not ended is cancelled."""
        if array.done:
            return Result(True, value=f"already {array.status(False).value}")
        array.cancelled = True
        array.cancelled_count += array.remaining()
        array.next = array.count
        for job_id in sorted(self.array_live.get(array.id, ())):
            self._cancel_job(dataclasses.replace(cmd, job_id=job_id))
        self._array_maybe_done(array, cmd.at)
        return Result(True)

    def _cancel_unplaced_element(self, array_id: str, index: int, cmd: c.CancelJob) -> Result | None:
        """`cancel ID_7` of an element not yet a job: it never becomes one. None if it is not such an element."""
        array = self.arrays.get(array_id)
        if array is None or array.cancelled:
            return None
        position = array.position_of(index)
        if position < array.next or index in array.skipped:
            return None
        array.skipped.add(index)
        array.cancelled_count += 1
        self.emit(cmd.at, "Normal", "job", "JobCancelled", element_id(array_id, index),
                  "cancelled before it started" + (f" by {cmd.by}" if cmd.by else ""))
        self._array_maybe_done(array, cmd.at)
        return Result(True)

    def _commit_plan(self, cmd: c.CommitPlan) -> Result:
        job = self.jobs.get(cmd.job_id)
        if job is None:
            return Result.not_found(f"unknown job {cmd.job_id}")
        problem = self._plan_problem(job, cmd)
        if problem:
            return Result.rejected(f"plan for job {job.id} attempt {cmd.attempt} rejected: {problem}")
        per_task = job.spec.resources
        job.tasks = []
        for p in sorted(cmd.placements, key=lambda p: p.index):
            node = self.nodes[p.node_id]
            task = Task(job_id=job.id, attempt=job.attempt, index=p.index, node_id=node.id,
                        resources=per_task, gpus=tuple(p.gpus), rank=p.rank)
            job.tasks.append(task)
            node.used = node.used + per_task
            node.gpus_in_use.update(p.gpus)
            self.live_tasks[node.id].add(task.key)
        for node_id in {p.node_id for p in cmd.placements}:
            self.index.update(self.nodes[node_id])
        self._use(job, per_task.scaled(len(job.tasks)), cmd.at)
        self._release_hold(job.id)
        job.pending_reason = ""
        self.pending.remove((job.queue_key(), job.id))
        job.status, job.placed_at = JobStatus.SCHEDULED, cmd.at
        job.placements[job.attempt] = tuple(t.node_id for t in job.tasks)
        nodes = sorted({p.node_id for p in cmd.placements})
        self._event(job, cmd.at, "Scheduled",
                    f"attempt {job.attempt}: {len(cmd.placements)} task(s) on {len(nodes)} node(s): "
                    + ", ".join(nodes[:8]) + (" …" if len(nodes) > 8 else ""))
        array = self.arrays.get(job.array_id) if job.array_id else None
        if array is not None and array.rep == job.id:
            array.rep = ""
            self._next_element(array, cmd.at)
        return Result(True)

    def _plan_problem(self, job: Job, cmd: c.CommitPlan) -> str:
        """Everything that makes a gang plan invalid against the current state, or ''."""
        if job.status is not JobStatus.PENDING:
            return f"job is {job.status.value}, not PENDING"
        for p in cmd.placements:
            holder = self.held_nodes.get(p.node_id)
            if holder is not None and holder != job.id:
                return f"node {p.node_id} is held for job {holder}, which preempted gangs to get it"
        if cmd.attempt != job.attempt:
            return f"plan is for attempt {cmd.attempt}, job is at attempt {job.attempt}"
        n = len(cmd.placements)
        if not elastic.least(job.spec) <= n <= job.spec.tasks:
            return (f"plan places {n} task(s), the gang has {job.spec.tasks}" if not elastic.is_elastic(job.spec) else
                    f"plan places {n} task(s), the elastic gang takes {job.spec.tasks_min} to {job.spec.tasks}")
        if sorted(p.index for p in cmd.placements) != list(range(n)):
            return "task indices must be exactly 0..tasks-1"
        if sorted(p.rank for p in cmd.placements) != list(range(n)):
            return "ranks must be exactly 0..tasks-1"
        per_task = job.spec.resources
        demand: dict[str, int] = {}
        gpus: dict[str, set[int]] = {}
        for p in cmd.placements:
            node = self.nodes.get(p.node_id)
            if node is None:
                return f"unknown node {p.node_id}"
            if node.status is not NodeStatus.READY:
                return f"node {node.id} is {node.status.value}"
            if not node.schedulable:
                return f"node {node.id} is cordoned"
            if node.id in excluded_for(self.nodes, job):  # set by version-3 commands alone: no older replica has any
                return f"node {node.id} is excluded for job {job.id}: it ended an earlier attempt"
            if job.spec.gpu_model and node.label("gpu_model").lower() != job.spec.gpu_model.lower():
                return f"node {node.id} has GPU model {node.label('gpu_model') or 'none'}, not {job.spec.gpu_model}"
            if len(p.gpus) != per_task.gpu or len(set(p.gpus)) != len(p.gpus):
                return f"task {p.index} must get {per_task.gpu} distinct GPU index(es)"
            taken = gpus.setdefault(node.id, set())
            for g in p.gpus:
                if not 0 <= g < node.capacity.gpu:
                    return f"node {node.id} has no GPU {g}"
                if g in node.gpus_in_use or g in taken:
                    return f"GPU {g} of node {node.id} is already in use"
                taken.add(g)
            demand[node.id] = demand.get(node.id, 0) + 1
        for node_id, count in demand.items():
            node = self.nodes[node_id]
            need = per_task.scaled(count)
            if not need.fits_in(node.free):
                return (f"node {node_id} lacks {', '.join(need.short_of(node.free))} for "
                        f"{count} task(s)")
        topo = job.spec.topology
        if topo.mode is PackMode.REQUIRED and topo.pack:
            depth = len(self.levels) + 1 if topo.pack == "node" else self.levels.index(topo.pack) + 1
            domains = {(self.nodes[n].topology + (n,))[:depth] for n in demand}
            if len(domains) > 1:
                return f"topology {topo.pack} is required but the plan spans {len(domains)} of them"
        return ""

    def _task_started(self, cmd: c.TaskStarted) -> Result:
        job, task, rejection = self._find_task(cmd.job_id, cmd.attempt, cmd.index, cmd.node_id)
        if rejection is not None:
            return rejection
        if task.state is not TaskState.ASSIGNED:
            return Result(True, value=f"task already {task.state.value}")
        task.state, task.started_at = TaskState.RUNNING, cmd.at
        self.emit(cmd.at, "Normal", "job", "TaskStarted", job.id, f"task {task.index} (rank {task.rank}) of "
                  f"attempt {job.attempt} started on {task.node_id}")
        if job.status is JobStatus.SCHEDULED and all(t.started_at for t in job.tasks):
            job.status, job.started_at = JobStatus.RUNNING, cmd.at
            self._event(job, cmd.at, "Running", f"all {len(job.tasks)} task(s) of attempt "
                                                f"{job.attempt} started")
        return Result(True)

    def _task_prepared(self, cmd: c.TaskPrepared) -> Result:
        job, task, rejection = self._find_task(cmd.job_id, cmd.attempt, cmd.index, cmd.node_id)
        if rejection is not None:
            return rejection
        if task.prepared or task.state is not TaskState.ASSIGNED:
            return Result(True, value="already prepared or started")
        task.prepared = True
        if job.status is JobStatus.SCHEDULED and not gang_unprepared(job):
            self._event(job, cmd.at, "ImageReady", f"every node of attempt {job.attempt} holds image "
                                                   f"{job.spec.image}: its {len(job.tasks)} task(s) start")
        return Result(True)

    def _task_exited(self, cmd: c.TaskExited) -> Result:
        job, task, rejection = self._find_task(cmd.job_id, cmd.attempt, cmd.index, cmd.node_id)
        if rejection is not None:
            return rejection
        if not task.state.live:
            return Result(True, value=f"task already {task.state.value}")
        if not task.started_at:
            task.started_at = cmd.at
        reason, message = end_reason(job, cmd)
        self._end_task(task, TaskState.EXITED, cmd.exit_code, cmd.at, reason, message)
        self.emit(cmd.at, "Normal" if cmd.exit_code == 0 else "Warning", "job", "TaskExited", job.id,
                  f"task {task.index} of attempt {job.attempt} exited with code {cmd.exit_code} on {task.node_id}: "
                  f"{reason}" + (f" ({message})" if message else ""))
        if reason == EndReason.MASTER_PORT_IN_USE:
            # Rank 0 never started; the clash is its node's, so the attempt stops without failing
            # and the job is requeued with the next attempt's port (synapse.core.rendezvous).
            self._stop_attempt(job, message, cmd.at, cause=EndReason.MASTER_PORT_IN_USE)
        elif reason == EndReason.IMAGE_PULL_FAILED:
            # The task never ran. A node-side failure requeues the gang uncharged, without the
            # node; a failure of the reference would fail on every node: the job fails, not retried.
            # (A version-4 cause: an older replica never sees it, see endpoints.ReportTaskEvents.)
            failure = f"task {task.index} (rank {task.rank}) on {task.node_id}: {reason}: {message}"
            if cmd.node_side:
                job.excluded_nodes = (*(n for n in job.excluded_nodes if n != task.node_id),
                                      task.node_id)[-MAX_EXCLUDED_NODES:]
                self._stop_attempt(job, f"{reason} on {task.node_id}: {message}", cmd.at, cause=reason)
            else:
                job.final_failure = True
                self._stop_attempt(job, f"failed: {reason} on {task.node_id}: {message}", cmd.at, failure=failure)
        elif cmd.exit_code != 0:
            why = f"task {task.index} exited with code {cmd.exit_code}: {reason}" + (f" ({message})" if message else "")
            self._stop_attempt(job, f"failed: {why}", cmd.at,
                               failure=f"task {task.index} (rank {task.rank}) on {task.node_id}: {reason}"
                               + (f": {message}" if message else ""))
        self._maybe_end_attempt(job, cmd.at)
        return Result(True)

    def _cancel_job(self, cmd: c.CancelJob) -> Result:
        job = self.jobs.get(cmd.job_id)
        if job is None and cmd.job_id in self.arrays:
            return self._cancel_array(self.arrays[cmd.job_id], cmd)
        element = split_element_id(cmd.job_id) if job is None else None
        if element is not None:
            result = self._cancel_unplaced_element(*element, cmd)
            if result is not None:
                return result
        if job is None:
            return Result.not_found(f"unknown job {cmd.job_id}")
        if job.status.terminal:
            return Result(True, value=f"already {job.status.value}")
        reason = "cancelled" + (f" by {cmd.by}" if cmd.by else "") + (f": {cmd.reason}" if cmd.reason else "")
        job.cancel_requested = True
        job.cancelled_by = cmd.by
        if job.status is JobStatus.PENDING:
            self._end_pending(job, JobStatus.CANCELLED, reason, cmd.at)
            return Result(True)
        self._stop_attempt(job, reason, cmd.at, cause=EndReason.CANCELLED)
        self._maybe_end_attempt(job, cmd.at)
        return Result(True)

    def _fail_attempt(self, cmd: c.FailAttempt) -> Result:
        job = self.jobs.get(cmd.job_id)
        if job is None:
            return Result.not_found(f"unknown job {cmd.job_id}")
        if cmd.attempt != job.attempt or job.status.terminal:
            return Result.rejected(f"job {job.id} is {job.status.value} at attempt {job.attempt}, "
                                   f"not at attempt {cmd.attempt}")
        if job.status is JobStatus.PENDING:
            if not cmd.final:
                return Result.rejected(f"job {job.id} is PENDING; only a final failure applies")
            if cmd.cause:  # e.g. DependencyNeverSatisfied (a version-2 job: see codec.KIND_VERSIONS)
                job.failure_cause, job.failure = cmd.cause, f"{cmd.cause}: {cmd.reason}"
            array = self.arrays.get(job.array_id) if job.array_id else None
            if array is not None and cmd.cause == dependencies.NEVER_SATISFIED:
                # Every element shares the dependency: the array ends with it, not one element a round.
                array.never_satisfied = True
                array.failed += array.remaining()
                array.next = array.count
            self._end_pending(job, JobStatus.FAILED, f"failed: {cmd.reason}", cmd.at)
            return Result(True)
        if cmd.final:
            job.final_failure = True
        self._stop_attempt(job, f"failed: {cmd.reason}", cmd.at, cause=cmd.cause,
                           failure=(f"{cmd.cause}: " if cmd.cause else "") + cmd.reason)
        self._maybe_end_attempt(job, cmd.at)
        return Result(True)

    def _forget_jobs(self, cmd: c.ForgetJobs) -> Result:
        """Version 1, as every release applies it: drop ended jobs, keep nothing of them."""
        return Result(True, value=str(sum(1 for job_id in cmd.job_ids if self._drop_ended(job_id) is not None)))

    def _archive_jobs(self, cmd: c.ArchiveJobs) -> Result:
        """Drop ended jobs and arrays, keeping each one's final status for dependencies on it."""
        forgotten = 0
        for job_id in cmd.job_ids:
            array = self.arrays.get(job_id)
            if array is not None and array.done:
                del self.arrays[job_id]
                self.array_live.pop(job_id, None)
                if array.request_id and self.job_by_request.get(array.request_id) == job_id:
                    del self.job_by_request[array.request_id]
                self._record_final(job_id, array.status(False).value)
                forgotten += 1
                continue
            job = self._drop_ended(job_id)
            if job is not None:
                self._record_final(job_id, job.status.value)
                forgotten += 1
        return Result(True, value=str(forgotten))

    def _drop_ended(self, job_id: str) -> Job | None:
        """Remove an ended job and free its request id; None (nothing changed) if it is not one."""
        job = self.jobs.get(job_id)
        if job is None or not job.status.terminal:
            return None
        self._drop_job(job)
        return job

    def _record_final(self, job_id: str, status: str) -> None:
        """Keep a forgotten job's final status for dependencies on it (bounded, oldest dropped first)."""
        self.finished[job_id] = status
        while len(self.finished) > MAX_FINISHED_RECORDS:
            del self.finished[next(iter(self.finished))]

    def _drop_job(self, job: Job) -> None:
        """Remove a job, its place among the unarchived (derived) and its request id."""
        del self.jobs[job.id]
        self.unarchived.pop(job.archive_seq, None)
        if job.request_id and self.job_by_request.get(job.request_id) == job.id:
            del self.job_by_request[job.request_id]

    # ---- history ----------------------------------------------------------------------------------

    def _history_exported(self, cmd: c.HistoryExported) -> Result:
        """The store holds every finished job numbered up to `upto`: mark them archived (retention
        counts from now). A cursor at or below the known one changes nothing."""
        if cmd.upto > self.archive_seq:
            return Result.rejected(f"history cursor {cmd.upto} is beyond the last finished job ({self.archive_seq})")
        marked = 0
        while self.unarchived:
            seq = next(iter(self.unarchived))
            if seq > cmd.upto:
                break
            self.jobs[self.unarchived.pop(seq)].archived_at = cmd.at
            marked += 1
        self.archived_upto = max(self.archived_upto, cmd.upto)
        return Result(True, value=str(marked))

    def _history_overflow(self, cmd: c.HistoryOverflow) -> Result:
        """Forget finished jobs the store does not hold (the unarchived cap was reached), loudly."""
        dropped = []
        for job_id in cmd.job_ids:
            job = self.jobs.get(job_id)
            if job is not None and job.status.terminal and job.archive_seq in self.unarchived:
                self._drop_job(job)
                dropped.append(job_id)
        if dropped:
            self.history_dropped += len(dropped)
            self.emit(cmd.at, "Warning", "history", "HistoryDropped", dropped[0],
                      f"{len(dropped)} finished job(s) forgotten before the history store held them "
                      f"({self.history_dropped} in all): {', '.join(dropped[:5])}" + (" …" if len(dropped) > 5 else ""))
        return Result(True, value=str(len(dropped)))

    # ---- transitions shared by the handlers ------------------------------------------------------

    # ---- users ----------------------------------------------------------------------------------

    def _add_user(self, cmd: c.AddUser) -> Result:
        problem = user_name_problem(cmd.name) or groups_problem(cmd.groups)
        if problem:
            return Result.rejected(problem)
        if cmd.name in self.users:
            return Result.rejected(f"user {cmd.name} already exists")
        if not cmd.token_hash or cmd.token_hash in self.user_by_token:
            return Result.rejected("token hash missing or already in use")
        self.users[cmd.name] = User(name=cmd.name, role=cmd.role, groups=cmd.groups, token_hash=cmd.token_hash,
                                    created_at=cmd.at, created_by=cmd.by, token_set_at=cmd.at)
        self.user_by_token[cmd.token_hash] = cmd.name
        return Result(True, value=cmd.name)

    def _set_user_token(self, cmd: c.SetUserToken) -> Result:
        user = self.users.get(cmd.name)
        if user is None:
            return Result.not_found(f"unknown user {cmd.name}")
        if not cmd.token_hash or cmd.token_hash in self.user_by_token:
            return Result.rejected("token hash missing or already in use")
        del self.user_by_token[user.token_hash]
        user.token_hash, user.token_set_at = cmd.token_hash, cmd.at
        self.user_by_token[cmd.token_hash] = cmd.name
        return Result(True, value=cmd.name)

    def _remove_user(self, cmd: c.RemoveUser) -> Result:
        user = self.users.pop(cmd.name, None)
        if user is None:
            return Result.not_found(f"unknown user {cmd.name}")
        del self.user_by_token[user.token_hash]
        return Result(True, value=cmd.name)

    # ---- preemption -----------------------------------------------------------------------------

    def _preempt(self, cmd: c.Preempt) -> Result:
        """Stop the victims' whole gangs and hold the nodes for the preemptor. The leader planned
        from a snapshot; this re-checks what the plan relies on, and applies all of it or nothing."""
        job = self.jobs.get(cmd.job_id)
        if job is None or job.status is not JobStatus.PENDING or job.attempt != cmd.attempt:
            return Result.rejected(f"preemptor {cmd.job_id} is not pending at attempt {cmd.attempt}")
        if cmd.job_id in self.holds:
            return Result.rejected(f"job {cmd.job_id} already holds nodes from an earlier preemption")
        if not cmd.victims or not cmd.nodes:
            return Result.rejected("a preemption needs victims and nodes")
        for node_id in cmd.nodes:
            node = self.nodes.get(node_id)
            if node is None or node.status is not NodeStatus.READY:
                return Result.rejected(f"node {node_id} is not READY")
            if node_id in self.held_nodes:
                return Result.rejected(f"node {node_id} is already held for job {self.held_nodes[node_id]}")
        victims = []
        for v in cmd.victims:
            victim = self.jobs.get(v.job_id)
            if victim is None or victim.attempt != v.attempt or victim.status not in (JobStatus.SCHEDULED,
                                                                                     JobStatus.RUNNING):
                return Result.rejected(f"victim {v.job_id} is not running at attempt {v.attempt}")
            victims.append((victim, v))
        for victim, v in victims:
            victim.stop_grace = v.grace
            kept = sum(1 for t in victim.tasks if t.node_id not in cmd.nodes)
            if elastic.is_elastic(victim.spec) and kept >= victim.spec.tasks_min:
                # An elastic gang shrinks instead of being evicted: it restarts at once without the
                # held nodes (a version-2 job: see codec.KIND_VERSIONS).
                self._stop_attempt(victim, f"shrinking from {len(victim.tasks)} to {kept} task(s) for job "
                                           f"{cmd.job_id} (rule {cmd.rule})", cmd.at, cause=EndReason.RESIZED,
                                   notice=v.notice)
                self._event(victim, cmd.at, "Shrinking", f"for job {cmd.job_id} of queue {self.queue_of(job)}: "
                                                         f"{len(victim.tasks)} -> {kept} task(s); grace {v.grace:g}s")
                continue
            victim.preempted_at = (*victim.preempted_at, cmd.at)[-PREEMPTION_BUDGET:]
            reason = f"preempted by job {cmd.job_id} (rule {cmd.rule})"
            self._stop_attempt(victim, reason, cmd.at, cause=EndReason.PREEMPTED, notice=v.notice)
            self._event(victim, cmd.at, "Preempted",
                        f"by job {cmd.job_id} of queue {self.queue_of(job)} (user {job.user or '-'}), rule "
                        f"{cmd.rule}; grace {v.grace:g}s" + (f"; {cmd.explanation}" if cmd.explanation else ""))
        self.holds[cmd.job_id] = Hold(cmd.job_id, cmd.attempt, tuple(cmd.nodes), tuple(v.job_id for v in cmd.victims),
                                      cmd.rule, cmd.at)
        for node_id in cmd.nodes:
            self.held_nodes[node_id] = cmd.job_id
        self._event(job, cmd.at, "Preempting",
                    f"rule {cmd.rule}: stopping {', '.join(v.job_id for v in cmd.victims)}; holding "
                    f"{', '.join(cmd.nodes)}" + (f"; {cmd.explanation}" if cmd.explanation else ""))
        return Result(True)

    def _pending_reasons(self, cmd: c.PendingReasons) -> Result:
        """Record why gangs wait; an entry for a job no longer pending at that attempt is ignored."""
        recorded = 0
        for e in cmd.entries:
            job = self.jobs.get(e.job_id)
            if job is None or job.status is not JobStatus.PENDING or job.attempt != e.attempt \
                    or job.pending_reason == e.code:
                continue
            job.pending_reason = e.code
            job.events.append(Event(cmd.at, "Waiting", f"{e.code}: {e.message[:300]}"))
            if len(job.events) > MAX_EVENTS_PER_JOB:
                del job.events[1]
            self.emit(cmd.at, "Normal", "job", "JobPending", job.id, f"{e.code}: {e.message[:300]}")
            recorded += 1
        return Result(True, value=str(recorded))

    def _release_hold(self, job_id: str) -> None:
        hold = self.holds.pop(job_id, None)
        if hold is not None:
            for node_id in hold.nodes:
                self.held_nodes.pop(node_id, None)

    def _use(self, job: Job, delta: Resources, at: float | None = None) -> None:
        """Count what the job's live tasks take (or give back) in its queue's usage; with `at` (in
        apply, not when a snapshot rebuilds it), in the decayed usage of its queue and user too."""
        name = self.queue_of(job)
        self.queue_usage[name] = self.queue_usage.get(name, Resources()) + delta
        if at is not None:
            half_life = self.usage_half_life
            self.queue_decay[name] = fairshare.accrue(self.queue_decay.get(name), delta.gpu, at, half_life)
            self.user_decay[job.user] = fairshare.accrue(self.user_decay.get(job.user), delta.gpu, at, half_life)
            self.usage_clock = max(self.usage_clock, at)

    def _set_usage_half_life(self, cmd: c.SetUsageHalfLife) -> Result:
        if cmd.half_life < 0:
            return Result.rejected("the usage half-life must not be negative")
        for table in (self.queue_decay, self.user_decay):  # decayed up to now under the old half-life
            for key, entry in table.items():
                table[key] = fairshare.accrue(entry, 0, cmd.at, self.usage_half_life)
        self.usage_half_life = cmd.half_life
        return Result(True)

    # ---- queues ---------------------------------------------------------------------------------

    def _apply_queues(self, cmd: c.ApplyQueues) -> Result:
        problem = batch_problem(self.queues, list(cmd.queues)) if cmd.queues else "no queues given"
        if problem:
            return Result.rejected(problem)
        for queue in cmd.queues:
            self.queues[queue.name] = queue
        return Result(True, value=",".join(q.name for q in cmd.queues))

    def _delete_queue(self, cmd: c.DeleteQueue) -> Result:
        if cmd.name not in self.queues:
            return Result.not_found(f"unknown queue {cmd.name}")
        children = sorted(q.name for q in self.queues.values() if q.parent == cmd.name)
        if children:
            return Result.rejected(f"queue {cmd.name} has child queues: {', '.join(children)}")
        holding = sum(1 for j in self.jobs.values() if not j.status.terminal and self.queue_of(j) == cmd.name)
        if holding:
            return Result.rejected(f"queue {cmd.name} holds {holding} unfinished job(s); cancel them or let them end")
        del self.queues[cmd.name]
        return Result(True, value=cmd.name)

    @staticmethod
    def queue_of(job: Job) -> str:
        return job.spec.queue or DEFAULT_QUEUE

    def _find_task(self, job_id: str, attempt: int, index: int,
                   node_id: str) -> tuple[Job, Task, Result | None]:
        """The job and task a worker's report names, or the rejection of the report."""
        job = self.jobs.get(job_id)
        if job is None:
            return None, None, Result.not_found(f"unknown job {job_id}")  # type: ignore[return-value]
        if attempt != job.attempt or not job.tasks:
            return job, None, Result.rejected(  # type: ignore[return-value]
                f"stale report: job {job_id} is at attempt {job.attempt} ({job.status.value}), report is for "
                f"attempt {attempt}")
        if not 0 <= index < len(job.tasks):
            return job, None, Result.not_found(f"job {job_id} has no task {index}")  # type: ignore[return-value]
        task = job.tasks[index]
        if task.node_id != node_id:
            return job, task, Result.rejected(f"task {index} of job {job_id} runs on {task.node_id}, not {node_id}")
        return job, task, None

    def _end_task(self, task: Task, state: TaskState, exit_code: int | None, at: float, reason: str,
                  message: str) -> None:
        """The task is gone: give its resources back, and record why it ended."""
        job = self.jobs.get(task.job_id)
        if job is not None:
            self._use(job, Resources() - task.resources, at)
        node = self.nodes[task.node_id]
        node.used = node.used - task.resources
        node.gpus_in_use.difference_update(task.gpus)
        self.live_tasks[node.id].discard(task.key)
        task.state, task.exit_code, task.ended_at = state, exit_code, at
        task.reason, task.reason_message = str(reason), message
        self.index.update(node)

    def _stop_attempt(self, job: Job, reason: str, at: float, cause: str = "", failure: str = "",
                      notice: float | None = None) -> None:
        """Ask every task of the attempt to stop; they keep their resources until gone. `cause` is
        the EndReason of the tasks stopped (Preempted, Cancelled, TimeLimit; "" when a failure stops
        them); `failure`, the first failure of the attempt, which the job keeps.

        A planned stop (`cause` in NOTICED_CAUSES) of a running attempt whose job asks for a
        checkpoint notice gives its tasks the notice first: `stop_notice` seconds (`notice`, else
        the job's: notice_of) from the signal to SIGTERM, counted from the attempt's notice if it
        had one already (its time limit's). An attempt not yet fully started has made no progress
        to save: it stops at once. Neither does anything else: a cancellation, a failure, a lost node."""
        if job.status in (JobStatus.SCHEDULED, JobStatus.RUNNING):
            running = job.status is JobStatus.RUNNING
            job.status, job.stop_reason, job.stop_cause = JobStatus.STOPPING, reason, str(cause)
            if failure:
                job.failure = failure
            self._event(job, at, "Stopping", f"attempt {job.attempt} {reason}")
            if running and cause in NOTICED_CAUSES and job.spec.has_checkpoint:
                job.stop_notice = self.notice_of(job) if notice is None else notice
                if job.stop_notice and not job.notice_at:
                    self._give_notice(job, at, at + job.stop_notice, cause)

    def _maybe_end_attempt(self, job: Job, at: float) -> None:
        """Once no task of the attempt is live: succeed, fail, cancel or requeue the job."""
        if not job.status.has_gang or any(t.state.live for t in job.tasks):
            return
        self._record_run(job)
        if job.status is not JobStatus.STOPPING:
            self._finish(job, JobStatus.SUCCEEDED, f"all {len(job.tasks)} task(s) exited 0", at)
        elif job.cancel_requested:
            self._finish(job, JobStatus.CANCELLED, job.stop_reason, at)
        elif job.stop_cause == EndReason.RESIZED:
            job.resizes += 1
            self._requeue_unfailed(job, at, f"to resize from {len(job.tasks)} task(s)")
        elif job.stop_cause == EndReason.PREEMPTED:
            job.preemptions += 1
            self._requeue_unfailed(job, at, f"after preemption {job.preemptions}")
        elif (job.stop_cause in REQUEUED_CAUSES or job.stop_cause == EndReason.IMAGE_PULL_FAILED) \
                and not ((job.stop_cause in NODE_FAULTS or job.stop_cause == EndReason.IMAGE_PULL_FAILED)
                         and job.requeues >= MAX_UNCHARGED_REQUEUES):
            job.requeues += 1
            self._requeue_unfailed(job, at, f"after {job.stop_reason}")
        elif job.final_failure:
            self._finish(job, JobStatus.FAILED, f"{job.stop_reason}; not retried", at)
        elif job.restarts_used() >= job.restarts_allowed():
            self._finish(job, JobStatus.FAILED, f"{job.stop_reason}; no restarts left (max_restarts "
                                                f"{job.restarts_allowed()}, all used)", at)
        else:
            job.attempt += 1
            job.status, job.tasks, job.stop_reason, job.started_at = JobStatus.PENDING, [], "", 0.0
            job.stop_cause, job.pending_since, job.stop_notice, job.notice_at = "", at, 0.0, 0.0
            self.pending.add((job.queue_key(), job.id))
            self._event(job, at, "Requeued", f"attempt {job.attempt}: restart {job.restarts_used()} of "
                                             f"{job.restarts_allowed()}")

    def _requeue_unfailed(self, job: Job, at: float, why: str) -> None:
        """Requeue an attempt that did not fail (preempted, resized, its MASTER_PORT taken): the next
        attempt keeps the job's place in its queue (the queue key is the original submission time)
        and uses up none of its restarts."""
        job.attempt += 1
        job.status, job.tasks, job.stop_reason, job.started_at = JobStatus.PENDING, [], "", 0.0
        job.stop_grace, job.stop_cause, job.pending_since = 0.0, "", at
        job.stop_notice, job.notice_at = 0.0, 0.0
        self.pending.add((job.queue_key(), job.id))
        self._event(job, at, "Requeued", f"attempt {job.attempt} {why}; not charged to max_restarts")

    def _record_run(self, job: Job) -> None:
        """Keep the accounting record of the attempt whose tasks are all gone."""
        ended = sorted(job.tasks, key=lambda t: (t.ended_at, t.index))
        failed = [t for t in ended if t.reason != EndReason.COMPLETED]
        if job.status is not JobStatus.STOPPING:
            outcome, why = EndReason.COMPLETED, ""
        elif job.stop_cause:
            outcome, why = job.stop_cause, job.stop_reason
        else:
            outcome, why = (failed[0].reason if failed else EndReason.ERROR), job.failure or job.stop_reason
        held = [(t.resources, max(0.0, t.ended_at - job.placed_at)) for t in job.tasks]
        job.runs.append(Run(
            attempt=job.attempt, placed_at=job.placed_at, started_at=job.started_at,
            ended_at=max((t.ended_at for t in job.tasks), default=job.placed_at),
            nodes=tuple(t.node_id for t in job.tasks), resources=job.spec.resources, outcome=str(outcome),
            reason=why, exit_code=next((t.exit_code for t in ended if t.exit_code), 0) or 0,
            gpu_seconds=sum(r.gpu * s for r, s in held), cpu_seconds=sum(r.cpu / 1000 * s for r, s in held),
            checkpoint_at=job.progress.checkpoint_at if job.progress and job.progress.attempt == job.attempt else 0.0))
        if len(job.runs) > MAX_RUNS_PER_JOB:
            del job.runs[1]
        run = job.runs[-1]
        # Learned from command-set version 4 on only (the cluster version is replicated): a replica
        # of an older release does not learn, and while one is a member their states must not part.
        if outcome in LEARNED_OUTCOMES and run.ended_at >= run.started_at and self.cluster_version >= PREDICT_VERSION:
            self.run_times.learn(job.user, job.spec.name, job.spec.total.gpu, run.ended_at - run.started_at)

    def _end_pending(self, job: Job, status: JobStatus, reason: str, at: float) -> None:
        """End a job still in the queue. One that holds no nodes for a preemption and is no array
        element (whose array would queue its next) changes nothing a placement reads but the queue
        and its own status: it is noted in `dequeued` (the command's handler does nothing else)."""
        quiet = job.id not in self.holds and not job.array_id
        self._finish(job, status, reason, at)
        if quiet:
            self.dequeued.append((job.queue_key(), job.id))
            self.dequeued_count += 1

    def _finish(self, job: Job, status: JobStatus, reason: str, at: float) -> None:
        if job.status is JobStatus.PENDING:
            self.pending.discard((job.queue_key(), job.id))
        self._release_hold(job.id)
        job.status, job.finished_at = status, at
        self.archive_seq += 1
        job.archive_seq = self.archive_seq
        self.unarchived[job.archive_seq] = job.id
        self._event(job, at, status.value.capitalize(), reason)
        if job.array_id:
            self._element_ended(job, at)

    def _event(self, job: Job, at: float, kind: str, message: str) -> None:
        job.events.append(Event(at, kind, message))
        if len(job.events) > MAX_EVENTS_PER_JOB:
            del job.events[1]
        reason, severity = _JOB_REASONS.get(kind, (kind, "Normal"))
        self.emit(at, severity, "job", reason, job.id, message)

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

    # ---- snapshots and digests (the format is synapse.core.snapshot's) -----------------------------

    def to_snapshot(self) -> dict[str, Any]:
        """The whole state as plain data (JSON-able); indexes are left out and rebuilt on load."""
        return snapshot.encode(self)

    @classmethod
    def from_snapshot(cls, data: dict[str, Any]) -> ClusterState:
        """The state a snapshot holds, its derived indexes rebuilt."""
        state: ClusterState = snapshot.decode(data, cls)
        return state

    def digest(self) -> str:
        """A hash of the whole state: equal on replicas that applied the same commands."""
        return snapshot.snapshot_digest(snapshot.encode(self))


def utc_clock(at: float) -> str:
    """A time of day as HH:MM:SS UTC (apply may format a timestamp it was given, never read a clock)."""
    s = int(at) % 86400
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d} UTC"


def end_reason(job: Job, cmd: c.TaskExited) -> tuple[str, str]:
    """Why a reported task ended, and the detail. An OOM kill is a fact and always wins; a task the
    cluster stopped (preemption, cancellation, time limit) ends for that reason; otherwise the
    worker's reading stands (derived from the exit code when an older worker sent none)."""
    code = cmd.exit_code
    if cmd.cause == EndReason.OOM_KILLED:
        return EndReason.OOM_KILLED, cmd.reason
    if job.status is JobStatus.STOPPING and job.stop_cause:
        return job.stop_cause, job.stop_reason
    if cmd.cause in (EndReason.MASTER_PORT_IN_USE, EndReason.IMAGE_PULL_FAILED):
        return cmd.cause, cmd.reason  # it never ran: its exit code means nothing
    if cmd.cause in WORKER_REASONS:
        cause = cmd.cause
    else:
        cause = EndReason.COMPLETED if code == 0 else EndReason.SIGNAL if 128 < code <= 192 else EndReason.ERROR
    if cause == EndReason.SIGNAL:
        detail = f"signal {code - 128}" if 128 < code <= 192 else "killed"
    else:
        detail = f"exit code {code}"
    return cause, detail + (f"; {cmd.reason}" if cmd.reason else "")
