"""The task lifecycle on the agent's main loop: start a task (or create it, held at its gate for its
gang), open its gate, poll its process until it ends, kill the running ones once the node's lease
has ended, and journal each start and end (TASK_JOURNAL). Each outcome goes to the worker's state
as an event, through the agent's one door (`_handle`)."""

from __future__ import annotations

import json
import logging
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from synapse.core.model import Assignment, EndReason
from synapse.images.model import Image
from synapse.images.store import ImageStore
from synapse.worker import fence
from synapse.worker import state as ws
from synapse.worker.container import ContainerRefused
from synapse.worker.fence import TASK_JOURNAL
from synapse.worker.lease import Lease
from synapse.worker.observe import WorkerMetrics
from synapse.worker.runtime import Handle, ProcessRuntime, alive, port_in_use, task_id

log = logging.getLogger(__name__)

#: An ended task's cgroup is removed this long after its end was noticed (TaskLifecycle._poll_processes),
#: at a moment when no task has started here for RELEASE_QUIET_S (the next gang's start is through),
#: and at the latest RELEASE_LATEST_S after its end.
RELEASE_AFTER_S, RELEASE_QUIET_S, RELEASE_LATEST_S = 0.2, 0.2, 5.0


def due_releases(releases: list[tuple[float, str]], now: float, last_start: float) -> list[str]:
    """The cgroups of `releases` ((when its task's end was noticed, name)) to remove `now`: those
    RELEASE_AFTER_S old when no task started here for RELEASE_QUIET_S, and any RELEASE_LATEST_S old."""
    quiet = now - last_start >= RELEASE_QUIET_S
    return [name for ended, name in releases
            if (quiet and now - ended >= RELEASE_AFTER_S) or now - ended >= RELEASE_LATEST_S]


class TaskLifecycle:
    """The agent's part that starts, opens, polls and fences task processes (main loop only; a mixin
    of synapse.worker.agent.WorkerAgent, whose attributes these are)."""

    node_id: str
    data_dir: Path
    runtime: ProcessRuntime
    images: ImageStore | None  #: the node's image store; None: none
    state: ws.WorkerState
    events: queue.Queue[object]  #: the main loop's queue of events
    metrics: WorkerMetrics
    lease: Lease
    fenced: set[ws.Key]
    releases: list[tuple[float, str]]  #: (when ended, cgroup name): ended tasks' cgroups to remove (_release_due)
    last_start: float  #: when a task last started here (monotonic)
    _handle: Callable[[object], None]
    _save_state: Callable[[], None]

    def _start(self, a: Assignment, image: Image | None = None, gated: bool = False) -> None:
        """Start a task, or (`gated`: a held task, its image here) create it: its sandbox set up now,
        its command waiting at its gate until the gang's release (`_open`), so the set-up's CPU is
        spent while the other nodes still pull, not after the release."""
        # Record the intent first: a crash between the fork and the next save must not leave a
        # task this worker forgets and would start a second time (see _load_state).
        seen = time.monotonic()
        self._save_state()
        self.lease.ensure_fence()  # it exits once it has nothing to guard: a task never starts unguarded
        clash = "" if gated else self._master_port_clash(a)  # a created task is checked as its gate opens
        if clash:
            self._start_failed(a, clash, EndReason.MASTER_PORT_IN_USE)
            return
        try:
            handle = self.runtime.start(a, image, gated=gated)
        except (OSError, ContainerRefused) as exc:
            self._start_failed(a, f"{exc}", getattr(exc, "cause", EndReason.ERROR))
            return
        self.metrics.task_start.observe(time.monotonic() - seen)
        if gated:
            log.info("task created, held for its gang task=%s pid=%d", a.key, handle.pid)
            gate = self.runtime.gates[task_id(a)]
            threading.Thread(target=self._watch_gate, args=(a.key, gate), name="gate", daemon=True).start()
            self._handle(ws.TaskCreated(a.key, handle))
        else:
            self._started(a, handle)

    def _watch_gate(self, key: ws.Key, gate: socket.socket) -> None:
        """(gate thread) Wait until a created task's sandbox is at its gate, or ended or discarded."""
        self.runtime.wait_set_up(gate)
        self.events.put(ws.TaskSetUp(key))

    def _open(self, a: Assignment, handle: Handle) -> None:
        """Start a created task: open its gate (its command runs now; the journal's start is this moment)."""
        clash = self._master_port_clash(a)
        if clash:
            self._start_failed(a, clash, EndReason.MASTER_PORT_IN_USE, handle)
            return
        try:
            self.runtime.open_gate(a)
        except OSError as exc:
            self._start_failed(a, f"gate not opened: {exc}", created=handle)
            return
        self._started(a, handle, " (gate opened)")

    def _started(self, a: Assignment, handle: Handle, how: str = "") -> None:
        log.info("task started job=%s attempt=%d index=%d rank=%d pid=%d%s", a.job_id, a.attempt, a.index,
                 a.rank, handle.pid, how)
        self._journal("start", a, pid=handle.pid)
        self.last_start = time.monotonic()
        self._handle(ws.TaskStarted(a.key, handle))

    def _start_failed(self, a: Assignment, reason: str, cause: str = EndReason.ERROR,
                      created: Handle | None = None) -> None:
        """A task that could not start ends so, its created process (if any) and container gone."""
        self.metrics.exits.labels("start_failed").inc()
        log.warning("task not started task=%s reason=%s", a.key, reason)
        if created is not None:
            self.runtime.discard(a, created)
        self._end_container(a)
        self._handle(ws.TaskStartFailed(a.key, reason, cause))

    def _unpin_forgotten(self) -> None:
        """Unpin the images of tasks this worker no longer knows (pulled or held, never started, when
        it stopped: a task the masters still want is pulled, and pinned, again)."""
        if self.images is None:
            return
        known = {task_id(t.assignment) for t in self.state.tasks.values()}
        forgotten = sorted({h for image in self.images.cached() for h in image.holders} - known)
        for holder in forgotten:
            self.images.release(holder)
        if forgotten:
            log.info("unpinned images of no known task count=%d holders=%s", len(forgotten), ",".join(forgotten[:10]))

    def _end_container(self, a: Assignment) -> None:
        """An ended task in an image: drop its writable layer, unpin its image."""
        if self.runtime.contained(a):
            self.runtime.dispose(a)
            if self.images is not None:
                self.images.release(task_id(a))

    def _master_port_clash(self, a: Assignment) -> str:
        """Why rank 0 must not start here ("" if it may): its MASTER_PORT is taken on this node, by a
        rank 0 of another attempt that this worker started or by any other process."""
        if a.rank != 0 or not a.master_port:
            return ""
        holder = self.state.master_port_holder(a)
        if holder is None and not port_in_use(a.master_port):
            return ""
        by = f" (by task {holder[0]}.{holder[1]}.{holder[2]})" if holder else ""
        return f"MASTER_PORT {a.master_port} in use on node {self.node_id}{by}"

    def _journal(self, event: str, a: Assignment, **fields: object) -> None:
        """Append a task's start or end to the task journal (TASK_JOURNAL)."""
        record = {"at": time.time(), "event": event, "job": a.job_id, "attempt": a.attempt, "index": a.index,
                  **fields}
        try:
            with open(self.data_dir / TASK_JOURNAL, "a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as exc:  # the task runs whether or not its record could be written
            log.warning("task journal not written task=%s error=%s", a.key, exc)

    def _fence_if_lease_ended(self) -> bool:
        """(main loop) Kill every running task once the lease has ended: the masters may be about to
        declare this node DOWN and start its gangs elsewhere. Their ends report NodeLost."""
        until = self.lease.until
        if until is None or time.monotonic() <= until:
            return False
        victims = [t for t in self.state.running() if t.assignment.key not in self.fenced]
        for task in victims:
            assert task.handle is not None
            log.warning("lease ended: killing task=%s pid=%d node=%s (no master answered for %.1fs)",
                        task.assignment.key, task.handle.pid, self.node_id,
                        time.monotonic() - until + self.lease.seconds)
            fence.mark_fenced(self.data_dir, task_id(task.assignment))
            self.runtime.signal(task.handle, signal.SIGKILL)
            self.fenced.add(task.assignment.key)
        return bool(victims)

    def _release_due(self, now: float, every: bool = False) -> None:
        """(main loop) Remove the ended tasks' cgroups whose time has come (`every`: all of them)."""
        due = [name for ended, name in self.releases] if every else due_releases(self.releases, now, self.last_start)
        if due:
            self.releases = [(at, name) for at, name in self.releases if name not in due]
            for name in due:
                self.runtime.release(name)

    def _poll_processes(self) -> bool:
        """(main loop) Notice the tasks whose process ended: journal, count and report each end."""
        self.runtime.reap()
        changed = False
        for task in self.state.running():
            assert task.handle is not None
            if not alive(task.handle):
                self.runtime.reap()
                a = task.assignment
                end = self.runtime.outcome(task.handle, a)  # NodeLost if killed for the lease, by either
                fenced = end.cause == EndReason.NODE_LOST
                self.fenced.discard(a.key)
                code = end.exit_code
                log.info("task exited job=%s attempt=%d index=%d code=%s reason=%s detail=%s", a.job_id, a.attempt,
                         a.index, code, end.cause, end.detail or "-")
                self._journal("exit", a, pid=task.handle.pid, code=code, reason=str(end.cause),
                              **({"fenced": True} if fenced else {}))
                outcome = ("succeeded" if code == 0 else "oom_killed" if end.cause == "OOMKilled"
                           else "killed" if code is None or task.phase == "stopping" else "failed")
                self.metrics.exits.labels(outcome).inc()
                handle = task.handle
                self._handle(ws.TaskExited(a.key, code if code is not None else -9, end.detail, end.cause))
                # Reported first (a waiting gang waits for it), then cleaned up: the container before
                # this loop takes its next event, the cgroup (its OOM count read by now, its processes
                # gone) later, once the gang it makes room for has started (_release_due): removing
                # one takes the kernel's cgroup lock, which every other task's cgroup creation and
                # join (and the forks waiting on those) need, right in the hand-over.
                if handle.cgroup:
                    self.releases.append((time.monotonic(), handle.cgroup))
                self._end_container(a)
                changed = True
        return changed
