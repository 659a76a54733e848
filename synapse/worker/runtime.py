"""Task runtimes: how a worker turns an assignment into a running process, and stops it.

The default runtime runs the task's command as a subprocess (through the shim, `shim.sh`, in its
own process group) with its output in a log file. Exit codes follow the shell: 128+N for a task
killed by signal N; 127 for a command that cannot be found. An external runtime is a command template, e.g.
`carapace run {task_id} {image}` or any OCI runtime's CLI: the template's words, with
`{task_id}`, `{image}`, `{job_id}`, `{attempt}`, `{index}` and `{log_dir}` filled in, come first,
and the task's command is appended after them; the runtime process stays in the foreground for
as long as the task runs and is supervised exactly like a plain command.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from synapse.core.model import Assignment

#: The task shim (POSIX sh): records the task's pid and exit status; see the script's header.
SHIM = Path(__file__).with_name("shim.sh")


def task_id(a: Assignment) -> str:
    return f"{a.job_id}.{a.attempt}.{a.index}"


def task_env(a: Assignment) -> dict[str, str]:
    """The task's environment: the job's env, Synapse's ids and what torch.distributed expects."""
    env = dict(a.env)
    env.update({
        "SYNAPSE_JOB_ID": a.job_id, "SYNAPSE_TASK_INDEX": str(a.index), "SYNAPSE_ATTEMPT": str(a.attempt),
        "SYNAPSE_TASK_ID": task_id(a),
        "RANK": str(a.rank), "WORLD_SIZE": str(a.world_size), "LOCAL_RANK": str(a.local_rank),
        "LOCAL_WORLD_SIZE": str(a.local_world_size), "NODE_RANK": str(a.node_rank),
        "MASTER_ADDR": a.master_addr, "MASTER_PORT": str(a.master_port),
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, a.gpus)),
    })
    return env


@dataclass(frozen=True, slots=True)
class Handle:
    """What the worker keeps about a started task, and writes to its state file."""

    pid: int  #: the shim's pid, which is also the process group id
    start_ticks: int  #: the process's start time in clock ticks since boot: guards against pid reuse
    exit_file: str
    log_file: str


def process_start_ticks(pid: int) -> int:
    """Start time of a process from /proc (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def alive(handle: Handle) -> bool:
    """True while the task's shim runs (a reused pid does not count; zombies do not either)."""
    try:
        with open(f"/proc/{handle.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[19]) == handle.start_ticks


def exit_code(handle: Handle) -> int | None:
    """The task's exit code once its shim recorded it; None if it died without recording."""
    try:
        return int(Path(handle.exit_file).read_text().strip())
    except (OSError, ValueError):
        return None


class ProcessRuntime:
    """Runs each task through the shim in its own process group; optional external runtime template."""

    def __init__(self, work_dir: Path, template: str = "") -> None:
        self.work_dir = work_dir  #: per-task files live under work_dir/tasks and work_dir/logs
        self.template = shlex.split(template) if template else []

    def log_path(self, job_id: str, attempt: int, index: int) -> Path:
        return self.work_dir / "logs" / job_id / f"attempt-{attempt}" / f"task-{index}.log"

    def command(self, a: Assignment) -> list[str]:
        if not self.template:
            return list(a.command)
        fields = {"task_id": task_id(a), "image": a.image, "job_id": a.job_id, "attempt": a.attempt,
                  "index": a.index, "log_dir": str(self.log_path(a.job_id, a.attempt, a.index).parent)}
        return [word.format(**fields) for word in self.template] + list(a.command)

    def task_files(self, a: Assignment) -> tuple[Path, Path]:
        """(exit file, pid file) of a task."""
        tasks = self.work_dir / "tasks"
        return tasks / f"{task_id(a)}.exit", tasks / f"{task_id(a)}.pid"

    def find(self, a: Assignment) -> Handle | None:
        """The handle of a task's shim from the pid file it wrote, if it ever started."""
        exit_file, pid_file = self.task_files(a)
        try:
            pid, ticks = (int(x) for x in pid_file.read_text().split())
        except (OSError, ValueError):
            return None
        return Handle(pid, ticks, str(exit_file), str(self.log_path(a.job_id, a.attempt, a.index)))

    def start(self, a: Assignment) -> Handle:
        """Start the task; raises OSError if even the shim cannot start."""
        log_file = self.log_path(a.job_id, a.attempt, a.index)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        exit_file, pid_file = self.task_files(a)
        exit_file.parent.mkdir(parents=True, exist_ok=True)
        exit_file.unlink(missing_ok=True)
        env = {**os.environ, **task_env(a)}
        with open(log_file, "ab") as log:
            proc = subprocess.Popen(["/bin/sh", str(SHIM), str(exit_file), str(pid_file), *self.command(a)],
                                    stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    cwd=str(log_file.parent))
        return Handle(proc.pid, process_start_ticks(proc.pid), str(exit_file), str(log_file))

    @staticmethod
    def signal(handle: Handle, sig: int) -> None:
        """Signal the task's whole process group, if it is still the same process."""
        if alive(handle):
            try:
                os.killpg(handle.pid, sig)
            except ProcessLookupError:
                pass

    @staticmethod
    def reap() -> None:
        """Collect exited children (shims this worker started) so they leave no zombies."""
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return


def stop_all(runtime: ProcessRuntime, handles: list[Handle], grace: float) -> None:
    """SIGTERM every task's group, SIGKILL what is left after `grace` seconds; blocks until done."""
    for handle in handles:
        runtime.signal(handle, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(h) for h in handles) and time.monotonic() < deadline:
        runtime.reap()
        time.sleep(0.05)
    for handle in handles:
        runtime.signal(handle, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while any(alive(h) for h in handles) and time.monotonic() < deadline:
        runtime.reap()
        time.sleep(0.01)
