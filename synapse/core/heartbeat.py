"""Heartbeat expiry, held in the leader's memory (synapse.core.leader_state): heartbeats are not Raft writes.

Only transitions are proposed (a node silent for longer than the timeout goes DOWN). A new
leader knows nothing of the old one's clock, so it gives every node a full grace period first.
The clock is passed in, so the tracker is tested without sleeping.

Heartbeats also carry the worker's health check result; `health_change` turns a report that
differs from the replicated state into the one command that records it (cordoning the node, or
lifting the cordon its health check set).
"""

from __future__ import annotations

from collections.abc import Iterable

from synapse.core import commands as c
from synapse.core.model import Node

#: Longest health message recorded (the worker sends its check's first line of output).
MAX_HEALTH_MESSAGE = 200


class HeartbeatTracker:
    """Last heartbeat per node, on the leader's monotonic clock."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._last: dict[str, float] = {}  #: node id -> last heartbeat (monotonic seconds)

    def beat(self, node_id: str, now: float) -> None:
        self._last[node_id] = now

    def grace(self, node_ids: Iterable[str], now: float) -> None:
        """Start every node's silence count from now (on gaining leadership)."""
        for node_id in node_ids:
            self._last[node_id] = now

    def expired(self, ready_nodes: Iterable[str], now: float) -> list[tuple[str, float]]:
        """READY nodes silent for longer than the timeout, with how long they have been silent.

        A node never heard of (e.g. registered through another leader an instant ago) starts its
        grace period now rather than expiring at once.
        """
        out = []
        for node_id in ready_nodes:
            last = self._last.setdefault(node_id, now)
            if now - last > self.timeout:
                out.append((node_id, now - last))
        return out

    def forget(self, node_id: str) -> None:
        self._last.pop(node_id, None)


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
