"""The cluster state machine: the only source of truth, replicated by Raft, changed only by `apply`.

Every replica applies the same commands in the same order and must reach the same state, so apply
is deterministic: no clock, no randomness, no leadership checks, no I/O. Ids, timestamps and the
proposer's term arrive inside the command.

Apply is a transaction: a command changes the state as a whole or not at all. Every handler
validates first and mutates after, so a rejected command (a refusal the handler expects) changes
nothing but the applied-command counter and the highest term seen (tests/unit/test_apply_transaction.py
drives every kind and compares the whole state before and after each rejection). A handler that
raises instead has failed midway, with the state perhaps half-changed: that is not a rejection but
ApplyFailed, and the replica stops applying (synapse.master.replicated.ReplicatedState), as etcd panics
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

How it is organised: the state is a set of tables, the attributes of ClusterTables
(synapse.core.state.tables), which ClusterState extends with the door (`apply`) and the snapshots.
The handlers are functions `handler(state, cmd) -> Result` in synapse.core.state, one module per
table (jobs, arrays, gangs, tasks, nodes, node_faults, queues, usage, users, history, cluster), and
`synapse.core.state.registry.HANDLERS` is the one map from a command kind to its handler: look the
kind up there (`c.DrainNode: node_faults.drain_node`), or in the "Applied by" column of
docs/architecture/commands.md, which is written from it. What the handlers share (a gang asked to
stop, an attempt ended, a job finished, a job's event) is synapse.core.state.transitions and
synapse.core.state.events.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import MethodType
from typing import Any

from synapse.core import codec
from synapse.core import commands as c
from synapse.core.commands import Result
from synapse.core.model import DEFAULT_LEVELS
from synapse.core.state import jobs, snapshot, transitions, usage
from synapse.core.state.events import MAX_EVENTS_PER_JOB
from synapse.core.state.history import MAX_FINISHED_RECORDS
from synapse.core.state.node_faults import MAX_EXCLUDED_NODES, MAX_NODE_FAILURES, SUSPECT_JOBS, SUSPECT_WINDOW_S
from synapse.core.state.queues import PREEMPTION_BUDGET, PREEMPTION_WINDOW_S
from synapse.core.state.registry import HANDLERS
from synapse.core.state.tables import DEQUEUED_KEPT, MAX_CLUSTER_EVENTS, ClusterTables
from synapse.core.state.tasks import end_reason
from synapse.core.state.transitions import (
    LEARNED_OUTCOMES,
    MAX_RUNS_PER_JOB,
    MAX_UNCHARGED_REQUEUES,
    utc_clock,
)
from synapse.core.versions import PREDICT_VERSION

#: The names other modules import from here (the constants live beside the handlers that use them;
#: PREDICT_VERSION in synapse.core.versions).
__all__ = [
    "DEQUEUED_KEPT", "LEARNED_OUTCOMES", "MAX_CLUSTER_EVENTS", "MAX_EVENTS_PER_JOB", "MAX_EXCLUDED_NODES",
    "MAX_FINISHED_RECORDS", "MAX_NODE_FAILURES", "MAX_RUNS_PER_JOB", "MAX_UNCHARGED_REQUEUES", "PREDICT_VERSION",
    "PREEMPTION_BUDGET", "PREEMPTION_WINDOW_S", "SUSPECT_JOBS", "SUSPECT_WINDOW_S", "ApplyFailed", "ClusterState",
    "end_reason", "utc_clock",
]

log = logging.getLogger(__name__)


class ApplyFailed(Exception):
    """A handler raised while applying a command: the state may be half-changed, so the replica
    must stop applying (see the module docstring). Never a rejection."""


class ClusterState(ClusterTables):
    """The cluster's tables (synapse.core.state.tables) behind one door: `apply`."""

    def __init__(self, levels: tuple[str, ...] = DEFAULT_LEVELS) -> None:
        super().__init__(levels)
        #: each command kind's handler (state.registry.HANDLERS) bound to this state: apply's dispatch
        self._handlers: dict[type, Callable[[Any], Result]] = {
            kind: MethodType(handler, self) for kind, handler in HANDLERS.items()}

    # ---- the one door ---------------------------------------------------------------------------

    def apply_bytes(self, data: bytes) -> Result:
        """Decode a single-command log entry and apply it (CodecError as for `apply_entry`)."""
        return self.apply_entry(data)[0][1]

    def apply_entry(self, data: bytes, commands: codec.CommandSet = codec.CURRENT,
                    decoded: list[c.Command] | None = None) -> list[tuple[c.Command, Result]]:
        """Apply every command of a log entry (one, or a batch's, in order) with its result.

        An entry this code cannot apply (a command kind or version it does not know, an undecodable
        body, a kind without a handler) raises CodecError and changes nothing, not even `applied`.
        It was written by code that knows more: rejecting it would part this state from the states
        of the replicas that apply it, so the replica must stop before it instead (see
        synapse.master.replicated.ReplicatedState) and apply it once upgraded. Rejections of commands it
        knows (validation, a stale term) are results, as ever. `decoded`: the entry's commands as
        the replica that proposed it encoded them (decoding `data` gives them back), not decoded again.
        """
        cmds = codec.decode_entry(data, commands) if decoded is None else decoded
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

    # ---- what other modules ask of the handlers' tables ------------------------------------------

    validate_spec = jobs.validate_spec
    request_conflict = jobs.request_conflict
    notice_of = transitions.notice_of
    queue_of = staticmethod(usage.queue_of)
    #: snapshot.decode rebuilds the derived accounting with apply's own code
    _use = usage.count_usage

    # ---- snapshots and digests (the format is synapse.core.state.snapshot's) -----------------------------

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
