"""The node's lease as the worker holds it, and the credential it registers with.

Every answered RegisterNode or Heartbeat grants a lease counted from when its request was sent;
the agent writes its end for the node's fence (synapse.worker.fence) and makes sure a fence runs
to enforce it. The credential RegisterNode returns is kept in the data dir, so a restarted worker
needs neither the cluster token nor its join token again.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from synapse.proto import api_pb2
from synapse.worker import fence

log = logging.getLogger(__name__)

#: After a heartbeat that was not answered, the next goes this soon while the lease still holds
#: (never later than the interval): the lease must not end for one lost call.
HEARTBEAT_RETRY_S = 0.25
#: The node's own credential, as RegisterNode returned it ({"node_id", "credential"}, mode 0600): with
#: it the worker needs neither the cluster token nor its join token again.
CREDENTIAL_FILE = "node-credential.json"


def load_credential(data_dir: Path, node_id: str) -> str:
    """The credential this data dir keeps for `node_id` ("" if none, or one for another node)."""
    try:
        saved = json.loads((data_dir / CREDENTIAL_FILE).read_text())
    except (OSError, ValueError):
        return ""
    return str(saved.get("credential", "")) if isinstance(saved, dict) and saved.get("node_id") == node_id else ""


def save_credential(data_dir: Path, node_id: str, credential: str) -> None:
    """Keep the node's credential, readable by this user only (written whole, then renamed)."""
    tmp = data_dir / (CREDENTIAL_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"node_id": node_id, "credential": credential}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, data_dir / CREDENTIAL_FILE)


class Lease:
    """The node's lease: when it ends, the fence that enforces it, and when to ask for more."""

    def __init__(self, node_id: str, data_dir: Path, cgroup_dirs: list[Path]) -> None:
        self.node_id = node_id
        self.data_dir = data_dir
        self.cgroup_dirs = cgroup_dirs  #: where the tasks' cgroups are, for the fence to kill what is left
        #: when the node's lease ends (time.monotonic()); None while the masters grant none (an
        #: earlier release) or before the first grant. Written by the registering and heartbeat
        #: threads (a float, replaced whole), read by the main loop
        self.until: float | None = None
        self.seconds = 0.0  #: the length of the last lease granted (heartbeat thread)
        self.fence_lock = threading.Lock()  #: held while looking for the node's fence and starting it

    def ensure_fence(self) -> None:
        """(any thread) Start the node's fence unless it runs (it exits when it has nothing left to guard)."""
        with self.fence_lock:  # the main loop and the heartbeat thread both ask: one fence
            pid = fence.start_fence(self.data_dir, self.cgroup_dirs)
        if pid:
            log.info("fence started node=%s pid=%d", self.node_id, pid)

    def renew(self, sent: float, reply: api_pb2.RegisterNodeReply | api_pb2.HeartbeatReply) -> None:
        """(registering or heartbeat thread) Take the lease an answer grants, counted from when its
        request was sent: an answer from an earlier release grants none (nothing is fenced then)."""
        if not reply.HasField("lease_ms"):
            if self.until is not None or fence.lease_state(self.data_dir, sent) != fence.UNFENCED:
                log.warning("the masters grant no lease (an earlier release): tasks are not fenced node=%s",
                            self.node_id)
                fence.write_lease(self.data_dir, None)
            self.until = None
            return
        if reply.lease_ms == 0:
            return  # this replica vouches for none: the lease runs on from the last grant
        until = sent + reply.lease_ms / 1000
        if self.until is not None and until <= self.until:
            return
        self.until, self.seconds = until, reply.lease_ms / 1000
        fence.write_lease(self.data_dir, until)
        self.ensure_fence()

    def next_heartbeat_in(self, answered: bool, interval: float) -> float:
        """How long the heartbeat thread waits: the interval, shortened so that a lease never ends
        for want of asking (a quarter of the lease before its end), and after a call that was not
        answered, HEARTBEAT_RETRY_S while the lease still holds."""
        until = self.until
        if until is None:
            return interval
        left = until - time.monotonic()
        if left <= 0:
            return interval
        if not answered:
            return min(interval, HEARTBEAT_RETRY_S)
        return min(interval, max(HEARTBEAT_RETRY_S, left - self.seconds / 4))
