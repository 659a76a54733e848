"""The node's fence: a worker's tasks run only while it holds a lease from the masters.

A task of a node the masters declare DOWN is restarted elsewhere; the old copy must be dead by
then, or one rank runs twice (two copies writing one checkpoint, joining one rendezvous). Borg and
Nomad fence by lease; so does Synapse (synapse.core.brain.heartbeat.Lease has the arithmetic):

- The agent writes its lease's end to DATA_DIR/lease (`write_lease`) at every answered heartbeat:
  the time the heartbeat was sent plus what the answer granted, on the machine's monotonic clock.
- The fence, a process of its own (`python -m synapse.worker.fence DATA_DIR [CGROUP_DIR...]`)
  that the agent starts in a session of its own, outlives the agent. Once the lease has ended
  without renewal (the agent died, hangs, or reaches no master), it SIGKILLs every task's process
  group and what is left in its cgroups, writes a `fenced` record per task to the task journal
  at the moment the task is seen gone, and exits when no task is left and no lease holds (the
  agent starts another before it starts a task, and whenever its lease is renewed).
- The agent itself kills its tasks when its lease ends (it may be alive and cut off), so a task
  dies with the lease whichever of the two notices first.

A lease file that says `unfenced` (masters of an earlier release grant no lease) or none at all
(no lease granted yet) fences nothing. Stdlib only: it runs for the node's whole life.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

#: The lease's end, written by the agent (see the module's docstring).
LEASE_FILE = "lease"
#: What the lease file says when the masters grant no lease (an earlier release): nothing is fenced.
UNFENCED = "unfenced"
#: The fence's pid and start ticks, so an agent finds the one that runs instead of starting another.
FENCE_PID_FILE = "fence.pid"
#: The task journal: one JSON record per line for each task's start and end (the chaos checkers read it).
TASK_JOURNAL = "task-events.jsonl"
#: Beside a task's mark, JOB.ATTEMPT.INDEX.fenced: the task was killed because the node's lease
#: ended (by the fence or by the agent), so it ended NodeLost, whoever reads its end (a restarted agent too).
FENCED_SUFFIX = ".fenced"
#: How often the fence reads the lease; the lease's margin covers it (synapse.core.brain.heartbeat).
FENCE_POLL_S = 0.1
#: How long the fence waits for a killed task to be gone before it records it anyway.
KILL_WAIT_S = 5.0


@functools.cache
def boot_id() -> str:
    """This boot of the machine ('' where the kernel does not say): a restarted machine has another."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def process_start_ticks(pid: int) -> int:
    """Start time of a process from /proc (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


#: A clock tick of /proc/PID/stat's start time, in ns (0: the kernel's tick does not divide a second
#: evenly, so `child_start_ticks` reads /proc instead of working it out).
TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK") if 1_000_000_000 % os.sysconf("SC_CLK_TCK") == 0 else 0


def boot_tick() -> int:
    """The clock tick since boot this is (the unit and clock of a process's start time in /proc)."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // TICK_NS if TICK_NS else -1


def child_start_ticks(pid: int, tick_before: int) -> int:
    """The start time of a child forked after `tick_before` (boot_tick() just before the fork), as
    /proc/PID/stat gives it. The kernel stamps a process's start at its fork, on the boot clock, in
    whole ticks: when no tick began between `tick_before` and now, the child's start is that tick.
    Reading /proc/PID/stat instead (only when a tick began in between, about one fork in thirty)
    blocks until the child's exec is through: 0.8 ms on an idle machine, and as long as the new
    process waits for a CPU on a busy one, while a gang's other workers wait for this one's report."""
    if tick_before >= 0 and boot_tick() == tick_before:
        return tick_before
    return process_start_ticks(pid)


def running(pid: int, start_ticks: int) -> bool:
    """True while process `pid` started at `start_ticks` runs (a reused pid, or a zombie, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[19]) == start_ticks


def group_alive(pgid: int) -> bool:
    """True while a process of group `pgid` runs (zombies do not count: where PID 1 does not reap,
    a killed task's orphans stay zombies, and kill(-pgid, 0) still finds them)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


# ---- the lease file ------------------------------------------------------------------------------


def write_lease(data_dir: Path, until: float | None) -> None:
    """Record the lease's end (`time.monotonic()` seconds), or that none is granted (None: unfenced)."""
    text = UNFENCED if until is None else f"{boot_id()} {until:.3f}"
    tmp = data_dir / (LEASE_FILE + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, data_dir / LEASE_FILE)


#: What a lease file says at a moment (`lease_state`).
NO_LEASE, HELD, ENDED = "none", "held", "ended"


def lease_state(data_dir: Path, now: float) -> str:
    """HELD while a lease of this boot runs at `now` (monotonic), ENDED once it has run out (the
    node's tasks must not run), UNFENCED where the masters grant none, NO_LEASE before any grant
    (or after a reboot: the lease was of another boot, and so were its tasks)."""
    try:
        words = (data_dir / LEASE_FILE).read_text().split()
    except OSError:
        return NO_LEASE
    if words == [UNFENCED]:
        return UNFENCED
    if len(words) != 2 or words[0] != boot_id():
        return NO_LEASE
    try:
        return ENDED if now > float(words[1]) else HELD
    except ValueError:
        return NO_LEASE


# ---- the tasks -----------------------------------------------------------------------------------


#: A shim's mark in DATA_DIR/tasks: JOB.ATTEMPT.INDEX.pid.PID.TICKS, an empty file it makes first
#: thing (shim.sh). Its name says it all, so it appears whole, with no temporary file to rename:
#: renaming one took a process (mv), 1 ms of CPU per task start. Shims of earlier releases wrote
#: "PID TICKS" into JOB.ATTEMPT.INDEX.pid instead; both are read.
MARK = ".pid"


@dataclass(frozen=True, slots=True)
class Shim:
    """A task's shim as its mark names it: its pid is the task's process group."""

    task: str  #: the task id, JOB.ATTEMPT.INDEX (synapse.worker.runtime.task_id)
    pid: int
    start_ticks: int

    def key(self) -> tuple[str, int, int]:
        job, attempt, index = self.task.rsplit(".", 2)
        return job, int(attempt), int(index)


def shims(tasks_dir: Path, task: str = "") -> list[Shim]:
    """The shims whose marks are in `tasks_dir` (of one task, if given), ended or not."""
    out = []
    for path in sorted(tasks_dir.glob(f"{glob.escape(task) if task else '*'}{MARK}*")):
        name, _, rest = path.name.rpartition(MARK)
        if task and name != task:
            continue
        try:
            if rest:  # NAME.pid.PID.TICKS
                _, pid, ticks = rest.split(".")
                out.append(Shim(name, int(pid), int(ticks)))
            else:  # NAME.pid holding "PID TICKS" (an earlier release's shim)
                out.append(Shim(name, *(int(x) for x in path.read_text().split())))
        except (OSError, ValueError, TypeError):
            continue
    return out


def live_shims(data_dir: Path) -> list[Shim]:
    """The shims of the node's tasks that still run: a mark, no exit file, the same process."""
    tasks = data_dir / "tasks"
    return [shim for shim in shims(tasks) if not (tasks / f"{shim.task}.exit").exists()
            and running(shim.pid, shim.start_ticks)]


def kill(shim: Shim, cgroup_dirs: list[Path]) -> None:
    """SIGKILL the task's process group, and whatever of it is left in its cgroups."""
    if running(shim.pid, shim.start_ticks):
        try:
            os.killpg(shim.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for parent in cgroup_dirs:
        try:
            pids = [int(x) for x in (parent / shim.task / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            continue
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def mark_fenced(data_dir: Path, task: str) -> None:
    """Record that `task` (its id, JOB.ATTEMPT.INDEX) is being killed because the lease ended."""
    try:
        (data_dir / "tasks" / f"{task}{FENCED_SUFFIX}").touch()
    except OSError:
        pass  # its end then reads as a signal's: the gang fails it, no worse than before fencing


def was_fenced(exit_file: Path) -> bool:
    """Whether the task whose exit file this is was killed because its node's lease ended."""
    return exit_file.with_suffix(FENCED_SUFFIX).exists()


def journal(data_dir: Path, event: str, key: tuple[str, int, int], **fields: object) -> None:
    """Append one record to the task journal (TASK_JOURNAL); a task's fate never waits on it."""
    job, attempt, index = key
    record = {"at": time.time(), "event": event, "job": job, "attempt": attempt, "index": index, **fields}
    try:
        with open(data_dir / TASK_JOURNAL, "a") as f:
            f.write(json.dumps(record) + "\n")
    except OSError:
        pass


def fence_once(data_dir: Path, cgroup_dirs: list[Path]) -> list[Shim]:
    """Kill every live task of the node, wait (bounded) until each is gone, and record each as
    fenced at the moment it was seen gone. Returns the tasks it killed."""
    shims = live_shims(data_dir)
    for shim in shims:
        mark_fenced(data_dir, shim.task)
        kill(shim, cgroup_dirs)
    left = list(shims)
    deadline = time.monotonic() + KILL_WAIT_S
    while left:
        for shim in [s for s in left if not running(s.pid, s.start_ticks) and not group_alive(s.pid)]:
            journal(data_dir, "fenced", shim.key(), pid=shim.pid)
            left.remove(shim)
        if not left:
            break
        if time.monotonic() >= deadline:
            for shim in left:
                journal(data_dir, "fenced", shim.key(), pid=shim.pid, unconfirmed=True)
            break
        for shim in left:
            kill(shim, cgroup_dirs)
        time.sleep(0.01)
    return shims


# ---- the fence process ---------------------------------------------------------------------------


def fence_running(data_dir: Path) -> bool:
    """True while the fence named by DATA_DIR/fence.pid runs."""
    try:
        pid, ticks = (int(x) for x in (data_dir / FENCE_PID_FILE).read_text().split())
    except (OSError, ValueError):
        return False
    return running(pid, ticks)


def start_fence(data_dir: Path, cgroup_dirs: list[Path], env: dict[str, str] | None = None) -> int:
    """Start the node's fence unless one runs; returns its pid (0: one was running already). Its pid
    file is written here, before this returns: the fence takes a moment to start, and a second
    call meanwhile (the agent asks before each task's start and at each renewal) must find it."""
    if fence_running(data_dir):
        return 0
    with open(data_dir / "fence.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "synapse.worker.fence", str(data_dir),
                                 *map(str, cgroup_dirs)], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)
    _write_pid_file(data_dir, proc.pid)
    return proc.pid


def _write_pid_file(data_dir: Path, pid: int) -> None:
    tmp = data_dir / f"{FENCE_PID_FILE}.{pid}.tmp"
    tmp.write_text(f"{pid} {process_start_ticks(pid)}\n")
    os.replace(tmp, data_dir / FENCE_PID_FILE)


def run(data_dir: Path, cgroup_dirs: list[Path]) -> int:
    """The fence's loop: kill the tasks once the lease has ended; exit when nothing is left to guard."""
    _write_pid_file(data_dir, os.getpid())  # started by hand, or its starter died before writing it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        state = lease_state(data_dir, time.monotonic())
        if state == ENDED:
            killed = fence_once(data_dir, cgroup_dirs)
            if killed:
                print(f"lease ended: fenced {len(killed)} task(s): {' '.join(s.task for s in killed)}", flush=True)
        if state != HELD and not live_shims(data_dir):
            return 0  # nothing to guard: the agent starts another fence before its next task
        time.sleep(FENCE_POLL_S)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m synapse.worker.fence DATA_DIR [CGROUP_DIR...]", file=sys.stderr)
        return 2
    return run(Path(argv[0]), [Path(p) for p in argv[1:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
