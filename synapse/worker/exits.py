"""The task processes' ends, noticed as they happen rather than at the next poll.

The main loop polls its task processes every `agent.POLL_S` (0.1 s): a task's end waited half of
that on average before it was journalled and reported, and a waiting gang's start after its
blocker waited as long (the hand-over). `ExitWatcher` holds a pidfd (Linux ≥ 5.3) for each running
task's shim and one thread blocked on all of them in `select.epoll`; when one becomes readable (the
shim ended: its exit status is already written), the thread puts `ProcessEnded` on the agent's
event queue, and the main loop polls at once. The poll stays as it is: it is the one place that
reads how a task ended, and the safety net where pidfds are not available (then nothing is
watched and the poll alone notices ends, as before).

A pid may be reused (pid_max wraps): after opening the pidfd the watcher checks the process's
start ticks, and a pid that is no longer the shim counts as ended at once.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import threading
from dataclasses import dataclass

from synapse.worker.fence import running

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProcessEnded:
    """(event) A watched task process ended: poll the task processes now."""

    pid: int


class ExitWatcher:
    """pidfds of the task shims, watched by one daemon thread (see the module's docstring).

    `track` is called by the main loop only; the thread touches only what `_lock` guards."""

    def __init__(self, events: queue.Queue[object]) -> None:
        self.events = events
        self.available = hasattr(os, "pidfd_open")
        self._lock = threading.Lock()
        self._fds: dict[tuple[int, int], int] = {}  #: (pid, start ticks) -> pidfd; under _lock
        #: an fd registered while the thread waits counts at once (unlike select.poll)
        self._epoll = select.epoll() if self.available else None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.available:
            self._thread = threading.Thread(target=self._run, name="exits", daemon=True)
            self._thread.start()

    def track(self, handles: set[tuple[int, int]]) -> None:
        """(main loop) Watch exactly these (pid, start ticks): the running tasks' shims."""
        if not self.available:
            return
        with self._lock:
            gone = [h for h in self._fds if h not in handles]
            new = [h for h in handles if h not in self._fds]
            if not gone and not new:
                return
            for h in gone:
                fd = self._fds.pop(h)
                os.close(fd)  # closing it unregisters it
            for pid, ticks in new:
                try:
                    fd = os.pidfd_open(pid)
                except ProcessLookupError:  # already gone (and reaped): say so now
                    self.events.put(ProcessEnded(pid))
                    continue
                except OSError as exc:  # e.g. a kernel without pidfds: the poll alone notices ends
                    log.info("pidfd_open failed pid=%d error=%s; task ends are noticed by polling", pid, exc)
                    self.available = False
                    return
                if not running(pid, ticks):  # the pid is another process now, or a zombie
                    os.close(fd)
                    self.events.put(ProcessEnded(pid))
                    continue
                self._fds[(pid, ticks)] = fd
                assert self._epoll is not None
                self._epoll.register(fd, select.EPOLLIN)

    def _run(self) -> None:
        assert self._epoll is not None
        while True:
            ready = self._epoll.poll()
            ended: list[int] = []
            with self._lock:
                by_fd = {fd: h for h, fd in self._fds.items()}
                for fd, _ in ready:
                    h = by_fd.get(fd)
                    if h is None:  # untracked meanwhile (and its fd closed, or reused: see below)
                        continue
                    # Readable once the process ended: stop watching it (the main loop's next
                    # `track` no longer names it) and say so.
                    del self._fds[h]
                    os.close(fd)
                    ended.append(h[0])
            for pid in ended:
                self.events.put(ProcessEnded(pid))
