"""Task runtimes: how a worker turns an assignment into a running process, and stops it.

The default runtime runs the task's command as a subprocess (through the shim, `shim.sh`, in its
own process group) with its output in a log file. Exit codes follow the shell: 128+N for a task
killed by signal N; 127 for a command that cannot be found. An external runtime is a command template, e.g.
`carapace run {task_id} {image}` or any OCI runtime's CLI: the template's words, with
`{task_id}`, `{image}`, `{job_id}`, `{attempt}`, `{index}` and `{log_dir}` filled in, come first,
and the task's command is appended after them; the runtime process stays in the foreground for
as long as the task runs and is supervised exactly like a plain command, in the same cgroup.
A task that fails because the command it names is not there ends CommandNotFound, not Error; so
does one whose command the template hides (a sandbox's private /tmp over a venv's interpreter).

With cgroups (`isolation.py`) every task gets a cgroup of its own, made before the shim starts and
joined by the shim before the command runs; the cgroup says whether the OOM killer ended the task,
and is removed once the task's end has been read.

A task whose assignment names an image (and no template is set) runs in the built-in container
runtime: `container.plan` decides what it sees, `sandbox.py` (run by the shim in place of the
command) builds it; the shim, the cgroup, the signals and the exit status work as for a plain task.
A task held for its gang is created gated (`start(..., gated=True)`): the shim and the sandbox run
all their set-up at once and the command waits at a gate until `open_gate` (runc's create/start
split), so a gang's release costs each task one write, not a sandbox's start. The gate is a socket
pair: the sandbox inherits one end through the shim and says on it when its set-up is done
(`wait_set_up`), the worker keeps the other, so its byte waits in the socket even when the gate
opens before the sandbox has started, and a worker that dies closes every gate it holds (the
sandboxes read EOF and end without running their commands). A marker file in the task's container
dir, removed once the gate is opened, is how a restarted worker tells a created task (never run:
`find` kills what is left of it) from a started one.

A task's stdin is /dev/null, except rank 0's of a job `synctl run` attaches (Assignment.stdin_mode):
the stdin host (`stdio_host.py`) feeds the command's stdin (a pipe from the host, which the shim
runs beside the command) or pseudo-terminal (the host runs the command on it) from a FIFO beside the
task's files (`stdin_fifo`) that the attach service writes; the host lives in the task's process
group, so the stdin outlives the worker.

Before it starts a rank 0, the worker checks that the task can bind its MASTER_PORT here
(`port_in_use`; why and what follows: synapse.core.rendezvous).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from synapse.core.jobs.jobspec import NOTICE_SIGNALS
from synapse.core.model import Assignment, EndReason
from synapse.images.model import Image
from synapse.worker import container
from synapse.worker.fence import FENCED_SUFFIX, MARK, boot_tick, child_start_ticks, running, shims, was_fenced
from synapse.worker.isolation import DEFAULT_PIDS_MAX, Cgroups, IsolationError, Limits
from synapse.worker.progress import CONTAINED_PROGRESS_DIR, progress_file

#: How long a probe through the runtime template may take (it runs only after a task failed).
PROBE_TIMEOUT_S = 10.0
#: The task shim (POSIX sh): records the task's pid and exit status; see the script's header.
SHIM = Path(__file__).with_name("shim.sh")
#: The container launcher the shim runs for a task in an image (stdlib only: run without site packages).
SANDBOX = Path(__file__).with_name("sandbox.py")
#: How the shim starts it: imported as a module, so from its cached bytecode (Python compiles a
#: script anew at every run: 3 ms of CPU on each contained task's start path); its directory goes
#: last on the path, behind the standard library. It ends with os._exit: it has nothing left to
#: flush (it writes with os.write), and the interpreter's finalization (a full collection, every
#: module torn down) cost ~2 ms of CPU at each contained task's end, which for a short task falls
#: while the rest of its gang is still being released (bench/images.py).
SANDBOX_LAUNCH = "import os, sys; sys.path.append(sys.argv[1]); import sandbox; os._exit(sandbox.main(sys.argv[1:]))"
#: The stdin host the shim runs in place of rank 0's command when `synctl run` attaches its stdin
#: (Assignment.stdin_mode; stdlib only, started as the sandbox is).
STDIO_HOST = Path(__file__).with_name("stdio_host.py")
STDIO_HOST_LAUNCH = ("import os, sys; sys.path.append(sys.argv[1]); import stdio_host; "
                     "os._exit(stdio_host.main(sys.argv[2:]))")
#: Where Linux keeps the range it takes the local ports of outgoing connections from.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


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


def port_in_use(port: int) -> bool:
    """True if a server could not listen on `port` on this machine now. The probe binds the port
    with the option torch's TCPStore sets (SO_REUSEADDR: a server's own old connections do not
    count, a connection that holds the port as its local one does), on the IPv6 wildcard accepting
    IPv4 too, so a socket on any address of either family is seen; on IPv4's wildcard where the
    machine has no IPv6. It holds the port for a moment only."""
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
                continue  # IPv6 without an address to bind, say: try IPv4
            return False
    return False


def ephemeral_ports(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """This machine's ephemeral port range (low, high), or None where it cannot be read."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


@dataclass(frozen=True, slots=True)
class Handle:
    """What the worker keeps about a started task, and writes to its state file."""

    pid: int  #: the shim's pid, which is also the process group id
    start_ticks: int  #: the process's start time in clock ticks since boot: guards against pid reuse
    exit_file: str
    log_file: str
    cgroup: str = ""  #: the task's cgroup name ("" when unconfined)


#: The signals a task may be sent: every checkpoint notice's, and the stop's.
TASK_SIGNALS = tuple(getattr(signal, f"SIG{name}") for name in (*NOTICE_SIGNALS, "TERM"))


def handle_ignored_signals() -> None:
    """Give each task signal that this process ignores a handler that does nothing instead.

    An ignored signal stays ignored across fork and exec, and a shell cannot trap a signal that
    was ignored when it started. So a worker started with SIGHUP ignored (under `nohup`, say) made
    the shim and every task ignore it: a job whose checkpoint notice is SIGHUP never saw it, and
    with SIGTERM ignored, a stop waited out the whole grace before SIGKILL. A caught signal is
    reset to its default at exec, and a handler that does nothing still lets this process survive
    the signal. Only the main thread may set handlers: elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in TASK_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, _ignore)


def _ignore(signum: int, frame: object) -> None:
    """A handler that does nothing (see handle_ignored_signals)."""


def alive(handle: Handle) -> bool:
    """True while the task's shim runs (a reused pid does not count; zombies do not either)."""
    return running(handle.pid, handle.start_ticks)


def exit_code(handle: Handle) -> int | None:
    """The task's exit code once its shim recorded it; None if it died without recording."""
    try:
        return int(Path(handle.exit_file).read_text().strip())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a task ended, as this worker reads it."""

    exit_code: int | None  #: None: it left no exit status (its shim was killed)
    cause: str  #: an EndReason a worker may report: Completed, Error, Signal, OOMKilled, CommandNotFound
    detail: str  #: free text for the master: the OOM kill, a cgroup the shim could not join…


def read_outcome(code: int | None, oom_kills: int, memory: int, shim_error: str) -> Outcome:
    """Classify a task's end from its exit status and its cgroup's OOM count (pure)."""
    if shim_error:
        return Outcome(code, EndReason.ERROR, shim_error)
    if oom_kills:
        limit = f"{memory >> 20}Mi" if memory else "its"
        return Outcome(code, EndReason.OOM_KILLED, f"{limit} memory limit reached; the OOM killer killed "
                                                   f"{oom_kills} process(es)")
    if code is None:
        return Outcome(None, EndReason.SIGNAL, "killed (no exit status recorded)")
    if code == 0:
        return Outcome(0, EndReason.COMPLETED, "")
    if 128 < code <= 192:
        return Outcome(code, EndReason.SIGNAL, "")
    return Outcome(code, EndReason.ERROR, "")


class ProcessRuntime:
    """Runs each task through the shim in its own process group; optional external runtime template."""

    def __init__(self, work_dir: Path, template: str = "", cgroups: Cgroups | None = None,
                 pids_max: int = DEFAULT_PIDS_MAX, allow_mounts: tuple[str, ...] = (),
                 cdi_dirs: tuple[str, ...] = container.CDI_DIRS) -> None:
        #: per-task files live under work_dir/tasks, work_dir/logs and (in an image) work_dir/containers
        self.work_dir = work_dir
        self.template = shlex.split(template) if template else []
        self.cgroups = cgroups  #: None: tasks run unconfined (--isolation none, or no cgroups here)
        self.pids_max = pids_max
        self.allow_mounts = allow_mounts  #: the prefixes a job's mounts may come from (--allow-mount)
        self.cdi_dirs = cdi_dirs  #: where this node's CDI specs are (--cdi-spec-dir)
        handle_ignored_signals()
        #: created tasks' gates (task id -> the worker's end of the socket pair its command waits at,
        #: held until `open_gate` or `discard`); the agent's main loop only
        self.gates: dict[str, socket.socket] = {}

    def contained(self, a: Assignment) -> bool:
        """True when the task runs in the built-in container runtime: it names an image, and the
        worker has no external runtime template (which then takes the image itself)."""
        return bool(a.image) and not self.template

    def container_dir(self, a: Assignment) -> Path:
        """The task's container files: its spec, its writable layer, the sandbox's end file."""
        return self.work_dir / "containers" / task_id(a)

    def gate_path(self, a: Assignment) -> Path:
        """A created task's marker (outside its root): there from its creation until its gate opens."""
        return self.container_dir(a) / "gated"

    def container_spec(self, a: Assignment, image: Image) -> container.ContainerSpec:
        """What the task sees inside `image` (a store's Image); ContainerRefused if it may not run."""
        config = image.config
        spec = container.plan(
            task_dir=self.container_dir(a), image_root=str(image.root), image_env=config.env,
            working_dir=config.working_dir, entrypoint=config.entrypoint, cmd=config.cmd, command=a.command,
            task_env=task_env(a), gpus=a.gpus, mounts=tuple(container.Mount(*m) for m in a.mounts),
            allowed_mounts=self.allow_mounts, cdi_specs=container.load_cdi_specs(self.cdi_dirs),
            dev_root=os.environ.get(container.DEV_ROOT_HOOK, "/dev"), user=getattr(config, "user", ""))
        # The task's progress file (synapse.worker.progress), which the worker reads on the host.
        progress = progress_file(self.task_files(a)[0]).parent
        return dataclasses.replace(
            spec, mounts=(*spec.mounts, container.Mount(str(progress), CONTAINED_PROGRESS_DIR)),
            env={**spec.env, "SYNAPSE_PROGRESS_FILE": f"{CONTAINED_PROGRESS_DIR}/{progress_file(Path('x')).name}"})

    def log_path(self, job_id: str, attempt: int, index: int) -> Path:
        return self.work_dir / "logs" / job_id / f"attempt-{attempt}" / f"task-{index}.log"

    def command(self, a: Assignment) -> list[str]:
        return self.runtime_words(a, task_id(a)) + list(a.command)

    def runtime_words(self, a: Assignment, name: str) -> list[str]:
        """The template's words for a task, `name` as its {task_id} ([] without a template)."""
        fields = {"task_id": name, "image": a.image, "job_id": a.job_id, "attempt": a.attempt,
                  "index": a.index, "log_dir": str(self.log_path(a.job_id, a.attempt, a.index).parent)}
        return [word.format(**fields) for word in self.template]

    def missing_command(self, a: Assignment, code: int) -> str:
        """Why the command a failed task names could not have run ("" when it could): not on this
        machine (the shim's 127), or, under a runtime template, a path this machine has and a probe
        through the template (`test -e PATH`) does not see, such as a private /tmp hiding a venv."""
        name = a.command[0] if a.command else ""
        if not self.template:
            path = dict(a.env).get("PATH", os.environ.get("PATH", os.defpath))
            if code != 127 or shutil.which(name, path=path) is not None:
                return ""
            return f"{name}: no such command on this machine"
        if not os.path.isabs(name) or not os.path.exists(name):
            return ""  # a bare name is looked up on the runtime's own PATH, where the host's says nothing
        probe = self.runtime_words(a, task_id(a) + "-probe") + ["test", "-e", name]
        try:
            seen = subprocess.run(probe, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=PROBE_TIMEOUT_S).returncode
        except (OSError, subprocess.TimeoutExpired):
            return ""
        if seen != 1:  # 0: the runtime shows it; anything else: the probe itself failed
            return ""
        return (f"{name} exists on this machine but the worker's runtime template (--runtime) hides it: "
                f"name a command inside what the runtime shows, or make the template show {os.path.dirname(name)}")

    def stdin_fifo(self, a: Assignment) -> Path:
        """The named pipe through which the attach service feeds a task's stdin host (stdio_host)."""
        return self.work_dir / "tasks" / f"{task_id(a)}.stdin"

    def task_files(self, a: Assignment) -> tuple[Path, Path]:
        """(exit file, the prefix of the shim's mark: synapse.worker.fence.MARK) of a task."""
        tasks = self.work_dir / "tasks"
        return tasks / f"{task_id(a)}.exit", tasks / f"{task_id(a)}{MARK}"

    def find(self, a: Assignment) -> Handle | None:
        """The handle of a task's shim from the mark it made, if it ever started (the one that runs,
        or else the last). A task created gated whose gate was never opened did not start: its
        process group is killed (its command never ran) and it is not found; the master lists it
        again and it is created anew."""
        exit_file, _ = self.task_files(a)
        found = shims(exit_file.parent, task_id(a))
        if not found:
            return None
        shim = max(found, key=lambda s: (running(s.pid, s.start_ticks), s.start_ticks))
        pid, ticks = shim.pid, shim.start_ticks
        name = task_id(a) if self.cgroups is not None and self.cgroups.exists(task_id(a)) else ""
        handle = Handle(pid, ticks, str(exit_file), str(self.log_path(a.job_id, a.attempt, a.index)), name)
        if self.contained(a) and self.gate_path(a).exists():
            self.discard(a, handle)
            self.dispose(a)
            return None
        return handle

    def start(self, a: Assignment, image: Image | None = None, gated: bool = False) -> Handle:
        """Start the task in its own cgroup (when confining); raises OSError if even the shim cannot
        start, or if the task's cgroup cannot be made (it never runs unconfined instead), and
        ContainerRefused if the task in `image` (the store's Image, for a contained task) may not run
        as it asks. `gated` (a contained task only): create it, its command waiting for `open_gate`."""
        command = self.command(a)
        mine = theirs = None
        if self.contained(a):
            if image is None:
                raise container.ContainerRefused(f"image {a.image} is not on this node")
            spec = self.container_spec(a, image)
            if gated:
                mine, theirs = socket.socketpair()  # neither inheritable: the shim gets its end by pass_fds
                spec = dataclasses.replace(spec, gate_fd=theirs.fileno())
            try:
                command = [sys.executable, "-I", "-S", "-c", SANDBOX_LAUNCH, str(SANDBOX.parent),
                           str(container.prepare(self.container_dir(a), spec))]
                if gated:
                    self.gate_path(a).touch()
            except OSError:
                _close(mine, theirs)
                raise
        log_file = self.log_path(a.job_id, a.attempt, a.index)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        exit_file, mark = self.task_files(a)
        exit_file.parent.mkdir(parents=True, exist_ok=True)
        exit_file.unlink(missing_ok=True)
        exit_file.with_suffix(FENCED_SUFFIX).unlink(missing_ok=True)
        progress_file(exit_file).parent.mkdir(exist_ok=True)
        shim_error_file(exit_file).unlink(missing_ok=True)
        if a.stdin_mode:  # before the cgroup: nothing to undo if the FIFO cannot be made
            fifo = self.stdin_fifo(a)
            fifo.unlink(missing_ok=True)
            try:
                os.mkfifo(fifo, 0o600)
            except OSError:
                _close(mine, theirs)
                raise
            # A pipe: the shim runs the host and the command as a pipeline; a terminal: the host runs it.
            if a.stdin_mode == "pipe":
                command = ["--synapse-stdin", sys.executable, STDIO_HOST_LAUNCH, str(STDIO_HOST.parent), str(fifo),
                           *command]
            else:
                command = [sys.executable, "-I", "-S", "-c", STDIO_HOST_LAUNCH, str(STDIO_HOST.parent), str(fifo),
                           "pty", "--", *command]
        env = {**os.environ, **task_env(a), "SYNAPSE_PROGRESS_FILE": str(progress_file(exit_file))}
        name = ""
        if self.cgroups is not None:
            name = task_id(a)
            try:
                procs = self.cgroups.create(name, Limits.of(a.resources, self.pids_max))
            except IsolationError as exc:
                _close(mine, theirs)
                raise OSError(f"cannot confine the task: {exc}") from None
            env["SYNAPSE_SHIM_CGROUPS"] = ":".join(map(str, procs))
        tick = boot_tick()
        try:
            with open(log_file, "ab") as log:
                proc = subprocess.Popen(["/bin/sh", str(SHIM), str(exit_file), str(mark), *command],
                                        stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                        cwd=str(log_file.parent), pass_fds=(theirs.fileno(),) if theirs else ())
        except OSError:
            if name:
                self.release(name)
            _close(mine, theirs)
            raise
        if mine is not None and theirs is not None:
            theirs.close()
            self.gates[task_id(a)] = mine
        return Handle(proc.pid, child_start_ticks(proc.pid, tick), str(exit_file), str(log_file), name)

    def open_gate(self, a: Assignment) -> None:
        """Let a created task's command run: one byte into its gate, then its marker goes (written
        first: a worker that crashes between the two kills the task on its restart, `find`, rather
        than adopt one that would wait for ever). The byte waits in the pipe for a sandbox still
        setting up; one that already ended (its set-up failed) is left to the exit polling, which
        reads its end. Without the gate (not created by this worker process) there is nothing to
        write: that sandbox read EOF when its creator died, and ended unrun."""
        gate = self.gates.pop(task_id(a), None)
        if gate is not None:
            try:
                gate.send(b"g")
            except OSError:  # the sandbox is gone already: its end says how
                pass
            finally:
                _close(gate)
        self.gate_path(a).unlink(missing_ok=True)

    def wait_set_up(self, gate: socket.socket) -> bool:
        """(any thread) Block until a created task's sandbox is at its gate (True), or ended or
        discarded first (False). `gate`: `self.gates[task_id]`, taken on the main loop."""
        try:
            return gate.recv(1) == b"r"
        except OSError:
            return False

    def discard(self, a: Assignment, handle: Handle, wait: float = 5.0) -> None:
        """End a created task that will never start: close its gate, SIGKILL its group (its command
        never ran, there is nothing to save), wait for it to go, remove its cgroup and its marker."""
        _close(self.gates.pop(task_id(a), None))
        self.signal(handle, signal.SIGKILL)
        deadline = time.monotonic() + wait
        while alive(handle) and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.01)
        self.release(handle.cgroup)
        self.gate_path(a).unlink(missing_ok=True)

    def outcome(self, handle: Handle, a: Assignment) -> Outcome:
        """How an ended task ended: its exit status, its cgroup's OOM count when it has one, and
        whether the command it names could be run at all."""
        oom = self.cgroups.oom_kills(handle.cgroup) if self.cgroups is not None and handle.cgroup else 0
        try:
            shim_error = shim_error_file(Path(handle.exit_file)).read_text().strip()
        except OSError:
            shim_error = ""
        end = read_outcome(exit_code(handle), oom, a.resources.memory, shim_error)
        if end.exit_code is None and was_fenced(Path(handle.exit_file)):
            return Outcome(None, EndReason.NODE_LOST, "killed: the node's lease ended (no master answered)")
        if self.contained(a):
            sandbox_end = container.end_of(self.container_dir(a))
            if sandbox_end is not None and end.cause in (EndReason.ERROR, EndReason.SIGNAL) and not end.detail:
                cause, detail = sandbox_end
                reason = EndReason.COMMAND_NOT_FOUND if cause == EndReason.COMMAND_NOT_FOUND else EndReason.ERROR
                return Outcome(end.exit_code, reason, detail)
            return end
        if end.cause == EndReason.ERROR and not end.detail and end.exit_code is not None:
            missing = self.missing_command(a, end.exit_code)
            if missing:
                return Outcome(end.exit_code, EndReason.COMMAND_NOT_FOUND, missing)
        return end

    def dispose(self, a: Assignment) -> None:
        """Drop an ended task's container files, its writable layer among them."""
        if self.contained(a):
            container.drop(self.container_dir(a))

    def release(self, name: str) -> None:
        """Remove an ended task's cgroup (killing whatever of it is left)."""
        if self.cgroups is not None and name:
            self.cgroups.remove(name)

    def sweep(self, keep: set[str]) -> list[str]:
        """Remove this worker's task cgroups that belong to no task it knows (left by a crash)."""
        if self.cgroups is None:
            return []
        stale = sorted(self.cgroups.names() - keep)
        for name in stale:
            self.cgroups.remove(name)
        return stale

    def signal(self, handle: Handle, sig: int) -> None:
        """Signal the task's whole process group, if it is still the same process; a SIGKILL also
        reaches whatever left the group but not the task's cgroup."""
        if alive(handle):
            try:
                os.killpg(handle.pid, sig)
            except ProcessLookupError:
                pass
        if sig == signal.SIGKILL and self.cgroups is not None and handle.cgroup:
            self.cgroups.kill(handle.cgroup)

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


def _close(*gates: socket.socket | None) -> None:
    """Close gates; shut down first, which wakes a thread blocked in `wait_set_up` on one."""
    for gate in gates:
        if gate is not None:
            try:
                gate.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            gate.close()


def shim_error_file(exit_file: Path) -> Path:
    """Where the shim says why it refused to run a task (it could not join the task's cgroup)."""
    return exit_file.with_name(exit_file.name + ".err")


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
    for handle in handles:
        runtime.release(handle.cgroup)
