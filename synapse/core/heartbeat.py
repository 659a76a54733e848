"""Heartbeat expiry, held in the leader's memory (synapse.core.leader_state): heartbeats are not Raft writes.

Only transitions are proposed (a node silent for longer than the timeout goes DOWN). A new
leader knows nothing of the old one's clock, so it gives every node a full grace period first.
The clock is passed in, so the tracker is tested without sleeping.

Workers heartbeat to their link shard (synapse.core.shards), a replica that sends the leader a
digest every second: per node heard since its last digest, how long ago. The leader keeps, per
node, its last heartbeat and the shard that vouched for it last. A node's silence counts from its
last heartbeat while that shard's digests keep coming; once they stop (the replica died, or is cut
off from the leader), its nodes get `move_window` from the shard's last digest (at least a full
timeout) for their workers to move to another replica: never a NodeDown for the shard's fault.

A leader whose own view is broken (its network to the workers, a stall of its process) sees every
node fall silent at once; `Silence.late` lets it tell that apart from machines dying
(synapse.core.leader_state's mass-silence guard).

Fencing: a worker's tasks may run only while it holds a lease (`Lease`), renewed by every answered
heartbeat and counted on the worker from the heartbeat's sending. A replica grants the lease less
the time since a digest of its own last reached a leader (`Lease.grant`), so every lease ends
before `lease` has passed since the leader last heard of that replica, and the leader declares no
node DOWN before a full `heartbeat_timeout` (> lease + margin) from its last heartbeat it knows of,
nor within a silent shard's move window: the node's tasks are dead (killed by its fence,
synapse.worker.fence) before their gang can start again elsewhere.

Heartbeats also carry the worker's health check result; `health_change` turns a report that
differs from the replicated state into the one command that records it (cordoning the node, or
lifting the cordon its health check set). They also carry the GPU errors the worker sees
(synapse.worker.gpu_errors), for as long as it sees them; `gpu_fault_change` turns those the state
does not hold yet into a GpuFault.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from synapse.core import commands as c
from synapse.core.model import Node, Task, gpu_fault_hits

#: Longest health message recorded (the worker sends its check's first line of output).
MAX_HEALTH_MESSAGE = 200
#: A GpuErrorReport's `gpu` for an error of the node's GPUs as a whole (nvidia-smi itself fails).
NODE_GPUS = -1
#: GPU errors of one heartbeat taken into account (the rest are the sender's noise).
MAX_GPU_ERRORS = 64


@dataclass(frozen=True, slots=True)
class GpuErrorReport:
    """A GPU error a worker sees, as its heartbeats carry it for as long as it sees it."""

    gpu: int  #: the GPU's index on the node; NODE_GPUS: the node's GPUs as a whole
    message: str


#: The least time between a lease's end and the moment the leader may declare its node DOWN: the
#: fence's poll and kill, a digest in flight, clocks that run at slightly different rates.
LEASE_MARGIN_MIN_S = 1.0
#: The margin as a share of the heartbeat timeout, where that is larger than the minimum.
LEASE_MARGIN_SHARE = 0.2


@dataclass(frozen=True, slots=True)
class Lease:
    """How long a worker's tasks may run without another answered heartbeat (docs/architecture/failover.md)."""

    seconds: float  #: a lease's length, from the sending of the heartbeat that renewed it

    @classmethod
    def of(cls, heartbeat_timeout: float) -> Lease:
        """The lease for a cluster whose nodes go DOWN after `heartbeat_timeout` of silence: the
        timeout less the margin (the larger of 1 s and a fifth of it)."""
        margin = max(LEASE_MARGIN_MIN_S, LEASE_MARGIN_SHARE * heartbeat_timeout)
        return cls(seconds=max(0.0, heartbeat_timeout - margin))

    def grant(self, vouched_age: float | None) -> float:
        """Seconds of lease a replica grants with a heartbeat's answer: the whole lease from the
        leader (vouched_age 0), less the time since its last digest reached a leader from a
        follower (so a replica cut off from the leader grants less and less, never past what the
        leader last heard from it), nothing from one none of whose digests has reached a leader
        yet (None)."""
        if vouched_age is None:
            return 0.0
        return max(0.0, self.seconds - max(0.0, vouched_age))


@dataclass(frozen=True, slots=True)
class Silence:
    """One look at the READY nodes' heartbeats."""

    expired: list[tuple[str, float]]  #: nodes silent past the timeout, with how long
    late: int  #: nodes silent past `late_after` (the expired among them), none excused by its shard's silence


class HeartbeatTracker:
    """Last heartbeat per node, on the leader's monotonic clock."""

    def __init__(self, timeout: float, shard_silence: float = 3.0, move_window: float = 0.0,
                 late_after: float = 0.0) -> None:
        self.timeout = timeout
        #: a node silent this long counts as late (0: half the timeout); see `silence`
        self.late_after = min(late_after or timeout / 2, timeout)
        self.shard_silence = shard_silence  #: a shard whose digests stopped this long is silent
        #: how long after a silent shard's last digest its nodes may take to be heard elsewhere
        self.move_window = max(timeout, move_window)
        self._last: dict[str, float] = {}  #: node id -> last heartbeat (monotonic seconds)
        self._via: dict[str, str] = {}  #: node id -> the shard that reported its last heartbeat
        #: shard -> when its last digest arrived (monotonic); digest and grace only
        self._shard_last: dict[str, float] = {}
        self.since = 0.0  #: when this leader started counting (grace), on the same clock

    def beat(self, node_id: str, now: float) -> None:
        """The leader heard the node itself (its registration, or a heartbeat it absorbed)."""
        self._last[node_id] = now
        self._via.pop(node_id, None)

    def digest(self, shard: str, now: float, ages: Iterable[tuple[str, float]]) -> None:
        """A shard's digest: each node it heard since its last one, and how many seconds ago."""
        self._shard_last[shard] = now
        last, via = self._last, self._via
        for node_id, age in ages:
            at = now - age
            if at >= last.get(node_id, -1e300):
                last[node_id] = at
                via[node_id] = shard

    def grace(self, node_ids: Iterable[str], now: float) -> None:
        """Start every node's silence count afresh (on gaining leadership): none expires before
        `move_window` from now. A worker attached to a replica that the fault cut off (the old
        leader, partitioned) keeps heartbeating there until that replica's cut-off and only then
        moves: a full timeout from the election was too short for it (chaos: a false NodeDown
        3.0 s after a partitioned leader's successor took over, at a 3 s timeout and a 4.25 s
        move window)."""
        counted_from = now + self.move_window - self.timeout
        for node_id in node_ids:
            self._last[node_id] = counted_from
        self._via.clear()
        self._shard_last = {}
        self.since = now

    def shard_silences(self, shards: Iterable[str], now: float) -> dict[str, float]:
        """Seconds since each shard's last digest reached this leader (since it started counting,
        for one that has sent none yet). Safe to call from another thread."""
        last = dict(self._shard_last)  # one copy in C, under the GIL: whole even while a digest lands
        return {shard: now - last.get(shard, self.since) for shard in shards}

    def silence(self, ready_nodes: Iterable[str], now: float) -> Silence:
        """READY nodes silent for longer than the timeout, with how long, and how many are late.

        A node is late once silent for `late_after`: when a fault silences many nodes at once,
        their heartbeats were spread over one interval, so by the time the first of them expires
        every one is late (with `late_after` at most the timeout less the interval), while a
        healthy node is late only for the moment its next heartbeat is on its way. A node never
        heard of (e.g. registered through another leader an instant ago) starts its grace period
        now rather than expiring at once.
        """
        out, late = [], 0
        for node_id in ready_nodes:
            last = self._last.setdefault(node_id, now)
            if now - last <= self.late_after:
                continue
            shard = self._via.get(node_id)
            if shard is not None:
                heard = self._shard_last.get(shard, now)
                if now - heard > self.shard_silence and now - heard <= self.move_window:
                    continue  # its shard went silent: its worker has a full timeout to move
            late += 1
            if now - last > self.timeout:
                out.append((node_id, now - last))
        return Silence(out, late)

    def forget(self, node_id: str) -> None:
        self._last.pop(node_id, None)
        self._via.pop(node_id, None)


def health_change(node: Node | None, unhealthy: bool, message: str, drain: bool,
                  at: float) -> c.SetNodeHealth | None:
    """The command a heartbeat's health report calls for, or None when the state already says so.

    A failing report for a node the state holds healthy (or with another message) records the
    failure, which cordons it; a passing report for a node the state holds failing, or that its
    health check cordoned, lifts that (an admin's cordon is never lifted by a health check).
    """
    if node is None:
        return None
    message = (message or "health check failed")[:MAX_HEALTH_MESSAGE] if unhealthy else ""
    if unhealthy and (node.health != message or (node.schedulable and not node.health_cordon)):
        return c.SetNodeHealth(at=at, node_id=node.id, healthy=False, message=message, drain=drain)
    if not unhealthy and (node.health or node.health_cordon):
        return c.SetNodeHealth(at=at, node_id=node.id, healthy=True)
    return None


def gpu_fault(errors: Iterable[GpuErrorReport]) -> tuple[tuple[int, ...], str]:
    """The GPUs a heartbeat's errors name (none: the node's GPUs as a whole, when any error is the
    node's) and the message that records them, e.g. "GPU 1: uncorrectable ECC errors: 2"."""
    errors = sorted(set(list(errors)[:MAX_GPU_ERRORS]), key=lambda e: (e.gpu, e.message))
    whole = any(e.gpu < 0 for e in errors)
    gpus = () if whole else tuple(sorted({e.gpu for e in errors}))
    message = "; ".join(f"{'GPUs' if e.gpu < 0 else f'GPU {e.gpu}'}: {e.message.strip() or 'error'}" for e in errors)
    return gpus, message[:MAX_HEALTH_MESSAGE]


def gpu_fault_change(node: Node | None, errors: tuple[GpuErrorReport, ...],
                     tasks: Iterable[tuple[Task, bool]], at: float) -> c.GpuFault | None:
    """The GpuFault a heartbeat's GPU errors call for, or None when the state says so already: the
    node holds that very error (its cordon) and no gang it hits is still wanted there (`tasks`: the
    node's live tasks, each with whether it is wanted: ClusterState.tasks_on_node). Level-triggered,
    so a GpuFault lost to a leader change is proposed again by the next heartbeat; an error that
    clears lifts nothing (an admin's uncordon does, once the GPU is repaired)."""
    if node is None or not errors:
        return None
    gpus, message = gpu_fault(errors)
    if node.gpu_error == message and not node.schedulable \
            and not any(wanted and gpu_fault_hits(task.gpus, gpus) for task, wanted in tasks):
        return None
    return c.GpuFault(at=at, node_id=node.id, gpus=gpus, message=message)
