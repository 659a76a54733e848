"""The last resort after a local cluster: find every process it started, by a mark, and stop it.

cluster.json records the masters' and workers' pids, but not a process started a moment before an
interrupt could record it, nor the tasks of a worker that was killed (they run in their own
sessions, on purpose, and outlive it). So every process `synapse.local.cluster` starts carries
MARK=<data dir> in its environment, and its children inherit it: workers pass their environment
on to the task shims and the tasks. /proc/PID/environ keeps the environment a process was started
with, so the mark holds however the process changes its own. `sweep` stops exactly the processes
so marked for one data dir (or, with `under`, for any data dir below a directory), never this
process or its ancestors.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

MARK = "SYNAPSE_LOCAL_DATA_DIR"


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def marked(data_dir: Path, under: bool = False) -> list[int]:
    """Live processes whose environment carries the mark of `data_dir` (with `under`: of it or of
    any directory below it)."""
    root = str(Path(data_dir).resolve())
    exact, below = f"{MARK}={root}".encode(), f"{MARK}={root}/".encode()
    skip = _ancestors()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        if exact in env or (under and any(v.startswith(below) for v in env)):
            if _alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def sweep(data_dir: Path, under: bool = False, grace: float = 2.0) -> list[int]:
    """Stop every marked process: SIGTERM and SIGCONT (a process paused with SIGSTOP handles
    nothing), SIGKILL what is still there `grace` seconds later; repeated while marked processes
    remain (a dying worker may still start a task). Returns the pids it signalled."""
    signalled: list[int] = []
    for _ in range(20):
        pids = marked(data_dir, under)
        if not pids:
            break
        fresh = [p for p in pids if p not in signalled]
        for pid in pids:
            for sig in (signal.SIGTERM if pid in fresh else signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        signalled += fresh
        deadline = time.monotonic() + (grace if fresh else 1.0)
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.02)
        for pid in pids:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
    return signalled
