"""The worker hears a task process's end as it happens (synapse.worker.exits), not at its next poll."""

from __future__ import annotations

import queue
import subprocess
import time

from synapse.worker.exits import ExitWatcher, ProcessEnded
from synapse.worker.fence import process_start_ticks as start_ticks


def _next(events: queue.Queue, timeout: float) -> object:
    return events.get(timeout=timeout)


def _watching() -> tuple[queue.Queue, ExitWatcher]:
    """An exit watcher running, and the queue it puts ends on."""
    events: queue.Queue = queue.Queue()
    watcher = ExitWatcher(events)
    watcher.start()
    return events, watcher


def test_an_end_is_put_on_the_queue_as_it_happens() -> None:
    events, watcher = _watching()
    proc = subprocess.Popen(["sleep", "0.3"])
    try:
        watcher.track({(proc.pid, start_ticks(proc.pid))})
        assert events.empty()
        began = time.monotonic()
        event = _next(events, 5.0)
        waited = time.monotonic() - began
    finally:
        proc.wait()
    assert event == ProcessEnded(proc.pid)
    assert 0.1 < waited < 2.0, waited  # after the process's 0.3 s, not before
    watcher.track(set())
    assert events.empty()


def test_a_process_already_gone_or_not_the_tracked_one_counts_as_ended_at_once() -> None:
    events, watcher = _watching()
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: no such pid any more
    alive = subprocess.Popen(["sleep", "5"])
    try:
        watcher.track({(gone.pid, 1), (alive.pid, start_ticks(alive.pid) + 1)})  # the second: a reused pid
        ended = {_next(events, 2.0), _next(events, 2.0)}
    finally:
        alive.kill()
        alive.wait()
    assert ended == {ProcessEnded(gone.pid), ProcessEnded(alive.pid)}


def test_untracked_processes_are_not_reported() -> None:
    events, watcher = _watching()
    proc = subprocess.Popen(["sleep", "0.2"])
    try:
        watcher.track({(proc.pid, start_ticks(proc.pid))})
        watcher.track(set())
    finally:
        proc.wait()
    time.sleep(0.3)
    assert events.empty()
