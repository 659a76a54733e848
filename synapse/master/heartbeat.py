"""Heartbeat expiry, held in the leader's memory: heartbeats are not Raft writes.

Only transitions are proposed (a node silent for longer than the timeout goes DOWN). A new
leader knows nothing of the old one's clock, so it gives every node a full grace period first.
The clock is passed in, so the tracker is tested without sleeping.
"""

from __future__ import annotations

from collections.abc import Iterable


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
