"""The worker's attach service: a running task's output, stdin, signals and window size
(`synctl run`), or a process started in a task's sandbox (`synctl exec`), over one bidirectional
stream of the worker's existing gRPC service (no port per task). A caller needs a ticket from the
masters' AttachAccess for that very task and purpose (synapse.common.tickets), or the cluster token.

Attach: the task's output is its log file, followed from an offset (stdout and stderr together, as
the log holds them); its stdin (rank 0 of a job `synctl run` started: Assignment.stdin_mode) goes
as frames into the FIFO its stdin host reads (synapse.worker.stdio_host); signals go to its
process group as the worker's own stops do. Everything lives in the task's files and processes,
so a worker restart loses nothing but the stream, and the caller attaches again.

Exec: the command runs in the task's cgroup with the task's environment and working directory;
for a task in an image, inside its namespaces (synapse.worker.sandbox.enter, by the task's pid: its
root, mounts, pids, ipc, hostname, and its user namespace if it has one) as the task's user, with
the task's capability bounding set and no_new_privs, never with the worker's own privileges. It is the caller's:
it ends when the stream does.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc

from synapse.common import tickets
from synapse.core.model import Assignment
from synapse.proto import api_pb2
from synapse.worker import stdio_host
from synapse.worker.fence import process_start_ticks, running
from synapse.worker.logs import LogService, Served, authorize
from synapse.worker.runtime import SANDBOX, Handle, alive, exit_code, task_id
from synapse.worker.state import Key

log = logging.getLogger(__name__)

#: How often a quiet log is read again: soon after its last output, then less often.
POLL_S, IDLE_POLL_S, IDLE_AFTER_S = 0.01, 0.1, 2.0
#: How long an attach waits for its task to have a process here (the gang may be starting).
FIND_S = 30.0
#: How long stdin waits for a task's stdin host to open its FIFO.
HOST_WAIT_S = 10.0
#: The signals a caller may send to a task's (or an exec's) process group.
ALLOWED_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGKILL, signal.SIGHUP, signal.SIGQUIT,
                             signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH, signal.SIGCONT, signal.SIGTSTP})
#: How long an exec's output may go on after it ended (what it left running, or a terminal's last bytes).
EXEC_DRAIN_S = 0.5
#: A task's environment variables that are the shim's, not the task's.
SHIM_ONLY_ENV = ("SYNAPSE_SHIM_CGROUPS", "SYNAPSE_TASK_UMASK")
#: How an exec runs: it joins the cgroups named in SYNAPSE_EXEC_CGROUPS (cgroup.procs files,
#: ':'-separated; none: no cgroup), runs the rest, and writes its status to the file SYNAPSE_EXEC_STATUS
#: names. A file, not the wrapper's wait status: the worker's main loop reaps every child it has
#: (ProcessRuntime.reap), an exec's too, before the exec's own wait could read it.
EXEC_WRAPPER = ('status=$SYNAPSE_EXEC_STATUS; '
                'if [ -n "${SYNAPSE_EXEC_CGROUPS:-}" ]; then IFS=:; for p in $SYNAPSE_EXEC_CGROUPS; do '
                'printf "%s\\n" $$ > "$p" || { echo "cannot join cgroup ${p%/cgroup.procs}" >&2; '
                'printf "125\\n" > "$status"; exit 125; }; done; unset IFS; fi; '
                'unset SYNAPSE_EXEC_CGROUPS SYNAPSE_EXEC_STATUS; "$@"; code=$?; '
                'printf "%s\\n" "$code" > "$status.tmp" && mv -f "$status.tmp" "$status"; exit "$code"')
#: How an exec enters a task in an image: the sandbox's `enter`, started as the sandbox is.
SANDBOX_ENTER = "import os, sys; sys.path.append(sys.argv[1]); import sandbox; os._exit(sandbox.enter(sys.argv[2:]))"


class AttachService(LogService):
    """The Worker service: ReadLog (LogService) and Attach."""

    def __init__(self, agent: Served) -> None:
        super().__init__(agent)

    def Attach(self, request_iterator: Iterator[api_pb2.AttachInput],
               context: grpc.ServicerContext) -> Iterator[api_pb2.AttachOutput]:
        """Attach to a task, or exec in it: the first message opens, the rest are input."""
        try:
            first = next(request_iterator)
        except StopIteration:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must open the stream")
        o = first.open
        if not first.HasField("open"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must open the stream")
        command = tuple(o.command)
        authorize(self.agent, context, o.job_id, o.attempt, o.index, o.ticket,
                  tickets.exec_purpose(command) if command else tickets.ATTACH)
        key = (o.job_id, o.attempt, o.index)
        if command:
            yield from self._exec(key, command, o, request_iterator, context)
        else:
            yield from self._attach(key, o, request_iterator, context)

    def _attach(self, key: Key, o: api_pb2.AttachOpen, request_iterator: Iterator[api_pb2.AttachInput],
                context: grpc.ServicerContext) -> Iterator[api_pb2.AttachOutput]:
        found = self._wait_for_task(key, context)
        runtime = self.agent.runtime
        if found is None:  # ended before: its output and status as they were left; or never here
            log_file = runtime.log_path(*key)
            exit_file = runtime.work_dir / "tasks" / f"{key[0]}.{key[1]}.{key[2]}.exit"
            if not log_file.exists():
                yield api_pb2.AttachOutput(ended=True)  # the masters know how it ended
                return
            handle = Handle(0, 0, str(exit_file), str(log_file))
        else:
            a, handle = found
            yield api_pb2.AttachOutput(ready=True)
            log.info("attach: stream ready task=%s/%d/%d", *key)
            first = [api_pb2.AttachInput(window=o.window)] if o.window.rows and a.stdin_mode == "pty" else []
            threading.Thread(target=self._task_input, args=(a, handle, itertools.chain(first, request_iterator)),
                             name="attach-in", daemon=True).start()
        offset, ended, quiet_since = max(0, o.offset), found is None, time.monotonic()
        with open(handle.log_file, "rb") as f:
            while context.is_active():
                f.seek(offset)
                data = f.read(self.CHUNK)
                if data:
                    offset += len(data)
                    quiet_since = time.monotonic()
                    yield api_pb2.AttachOutput(stdout=data, offset=offset)
                    continue
                if ended:
                    break
                ended = not alive(handle)  # then one more read: what it wrote last
                if not ended:
                    time.sleep(POLL_S if time.monotonic() - quiet_since < IDLE_AFTER_S else IDLE_POLL_S)
        code = exit_code(handle)
        yield api_pb2.AttachOutput(ended=True, offset=offset, exit_code=code or 0, has_exit_code=code is not None)

    def _wait_for_task(self, key: Key, context: grpc.ServicerContext) -> tuple[Assignment, Handle] | None:
        """The task's assignment and process once it has one here; None if it ended already (its exit
        file says so) or none appears within FIND_S."""
        deadline = time.monotonic() + FIND_S
        exit_file = self.agent.runtime.work_dir / "tasks" / f"{key[0]}.{key[1]}.{key[2]}.exit"
        while context.is_active() and time.monotonic() < deadline:
            found = self.agent.view.processes.get(key)
            if found is not None:
                return found
            if key not in self.agent.view.tasks and exit_file.exists():
                return None
            time.sleep(POLL_S)
        return None

    def _task_input(self, a: Assignment, handle: Handle, request_iterator: Iterator[api_pb2.AttachInput]) -> None:
        """(attach-in thread) The caller's signals to the task at once; its stdin and window size to
        the task's stdin host, through a writer of their own (a host still starting must not hold
        up a signal)."""
        frames_out: queue.Queue[list[bytes] | None] = queue.Queue()
        if a.stdin_mode:
            threading.Thread(target=self._frame_writer, args=(a, frames_out), name="attach-stdin",
                             daemon=True).start()
        try:
            for message in request_iterator:
                if message.signal:
                    if message.signal in ALLOWED_SIGNALS:
                        log.info("attach: signal task=%s signal=%d", a.key, message.signal)
                        self.agent.runtime.signal(handle, message.signal)
                    continue
                frames: list[bytes] = []
                if message.stdin:
                    frames += stdio_host.frames(stdio_host.DATA, message.stdin)
                if message.stdin_eof:
                    frames += stdio_host.frames(stdio_host.END)
                if message.HasField("window") and message.window.rows:
                    frames.append(stdio_host.window_frame(message.window.rows, message.window.cols))
                if frames and a.stdin_mode:
                    frames_out.put(frames)
        except Exception:  # the stream went (a cancel, the worker stopping): the task keeps its stdin
            pass
        finally:
            frames_out.put(None)

    def _frame_writer(self, a: Assignment, frames_out: queue.Queue[list[bytes] | None]) -> None:
        """(attach-stdin thread) Frames for the task's stdin host, in order, until None."""
        while (frames := frames_out.get()) is not None:
            self._write_frames(a, frames)

    def _write_frames(self, a: Assignment, frames: list[bytes]) -> None:
        """Write frames into the task's stdin FIFO, once its host reads it (HOST_WAIT_S at most)."""
        fifo = self.agent.runtime.stdin_fifo(a)
        deadline = time.monotonic() + HOST_WAIT_S
        while True:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:
                if exc.errno not in (errno.ENXIO, errno.ENOENT) or time.monotonic() > deadline:
                    log.warning("attach: stdin not delivered task=%s error=%s", a.key, exc)
                    return
                time.sleep(0.01)
        try:
            os.set_blocking(fd, True)
            for frame in frames:
                os.write(fd, frame)
        except OSError as exc:
            log.warning("attach: stdin not delivered task=%s error=%s", a.key, exc)
        finally:
            os.close(fd)

    def _exec(self, key: Key, command: tuple[str, ...], o: api_pb2.AttachOpen,
              request_iterator: Iterator[api_pb2.AttachInput],
              context: grpc.ServicerContext) -> Iterator[api_pb2.AttachOutput]:
        found = self.agent.view.processes.get(key)
        if found is None or not alive(found[1]):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"task {key[2]} of job {key[0]} attempt {key[1]} is not running on {self.agent.node_id}")
            return
        a, handle = found
        try:
            argv, env, cwd = self._exec_plan(a, handle, command, o.pty, o.term)
        except OSError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"cannot exec into the task: {exc}")
        status_file = self.agent.runtime.work_dir / "tasks" / f"{task_id(a)}.exec-{uuid.uuid4().hex[:12]}"
        env["SYNAPSE_EXEC_STATUS"] = str(status_file)
        out: queue.Queue[tuple[str, bytes | None]] = queue.Queue()
        terminal = -1
        try:
            if o.pty:
                terminal, other = os.openpty()
                _set_window(terminal, o.window.rows, o.window.cols)
                proc = subprocess.Popen(argv, stdin=other, stdout=other, stderr=other, env=env, cwd=cwd,
                                        start_new_session=True)
                os.close(other)
                readers = [(terminal, "stdout")]
            else:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        env=env, cwd=cwd, start_new_session=True)
                readers = [(proc.stdout.fileno(), "stdout"), (proc.stderr.fileno(), "stderr")]  # type: ignore[union-attr]
            ticks = process_start_ticks(proc.pid)
        except OSError as exc:
            if terminal >= 0:
                os.close(terminal)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"cannot exec into the task: {exc}")
        log.info("exec started task=%s pid=%d command=%s", a.key, proc.pid, command[0])
        for fd, stream in readers:
            threading.Thread(target=_pump, args=(fd, stream, out), name="exec-out", daemon=True).start()
        threading.Thread(target=_exec_input, args=(proc, terminal, request_iterator), name="exec-in",
                         daemon=True).start()
        yield api_pb2.AttachOutput(ready=True)
        open_streams, ended_at = len(readers), None
        try:
            # Output until every stream has ended; a terminal may not say EOF while something the
            # exec started holds it, so its end is the exec's end and a moment's quiet after it.
            while open_streams and context.is_active():
                try:
                    stream, data = out.get(timeout=0.1)
                except queue.Empty:
                    if ended_at is None and not running(proc.pid, ticks):
                        ended_at = time.monotonic()
                    if ended_at is not None and time.monotonic() - ended_at > EXEC_DRAIN_S:
                        break
                    continue
                if data is None:
                    open_streams -= 1
                    continue
                yield api_pb2.AttachOutput(stdout=data) if stream == "stdout" else api_pb2.AttachOutput(stderr=data)
            deadline = time.monotonic() + EXEC_DRAIN_S
            while running(proc.pid, ticks) and context.is_active() and time.monotonic() < deadline:
                time.sleep(0.01)
            code = _status(status_file)
            if context.is_active() and not running(proc.pid, ticks):
                yield api_pb2.AttachOutput(ended=True, exit_code=code or 0, has_exit_code=code is not None)
        finally:
            if running(proc.pid, ticks):  # the caller went: the exec goes with it
                _killpg(proc.pid, signal.SIGHUP)
                deadline = time.monotonic() + 2.0
                while running(proc.pid, ticks) and time.monotonic() < deadline:
                    time.sleep(0.02)
                _killpg(proc.pid, signal.SIGKILL)
            if terminal >= 0:
                os.close(terminal)
            log.info("exec ended task=%s pid=%d code=%s", a.key, proc.pid, _status(status_file))
            status_file.unlink(missing_ok=True)

    def _exec_plan(self, a: Assignment, handle: Handle, command: tuple[str, ...], pty: bool,
                   term: str) -> tuple[list[str], dict[str, str], str]:
        """(argv, env, cwd) of an exec in the task: its cgroup, environment and working directory;
        in its image, its namespaces and capability bounding set."""
        runtime = self.agent.runtime
        env = _environ(handle.pid)
        for name in SHIM_ONLY_ENV:
            env.pop(name, None)
        cwd = os.readlink(f"/proc/{handle.pid}/cwd")
        argv = list(command)
        if runtime.contained(a):
            target = _contained_process(handle.pid)
            if target is None:
                raise OSError(errno.ESRCH, "the task's sandbox has no running process")
            env, cwd = _environ(target), "/"
            argv = [sys.executable, "-I", "-S", "-c", SANDBOX_ENTER, str(SANDBOX.parent), str(target), "--", *argv]
        if pty:
            env["TERM"] = term or env.get("TERM", "xterm")
            argv = ["setsid", "--ctty", "--", *argv]
        if runtime.cgroups is not None and handle.cgroup:
            env["SYNAPSE_EXEC_CGROUPS"] = ":".join(str(d / "cgroup.procs") for d in runtime.cgroups.dirs(handle.cgroup))
        return ["/bin/sh", "-c", EXEC_WRAPPER, "synapse-exec", *argv], env, cwd


def _status(path: Path) -> int | None:
    """An exec's exit status as its wrapper wrote it; None if it did not (it was killed)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _environ(pid: int) -> dict[str, str]:
    """A process's environment as it was started."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    env = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name:
            env[os.fsdecode(name)] = os.fsdecode(value)
    return env


def _namespace(pid: int, kind: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _contained_process(shim: int) -> int | None:
    """The task's command inside its sandbox (else the sandbox's init): the first process below the
    shim in another pid namespace, and its first child."""
    outside = _namespace(shim, "pid")
    todo = _children(shim)
    while todo:
        pid = todo.pop(0)
        if _namespace(pid, "pid") not in ("", outside):
            inner = _children(pid)
            return inner[0] if inner else pid
        todo += _children(pid)
    return None


def _set_window(fd: int, rows: int, cols: int) -> None:
    if rows and cols:
        import fcntl
        import termios
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


def _pump(fd: int, stream: str, out: queue.Queue[tuple[str, bytes | None]]) -> None:
    """(exec-out thread) An exec's output, chunk by chunk, then None."""
    try:
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: a terminal whose last holder is gone
                break
            if not data:
                break
            out.put((stream, data))
    finally:
        out.put((stream, None))


def _exec_input(proc: subprocess.Popen[bytes], terminal: int, request_iterator: Iterator[api_pb2.AttachInput]) -> None:
    """(exec-in thread) The caller's stdin, signals and window size, to the exec."""
    sink = terminal if terminal >= 0 else proc.stdin.fileno()  # type: ignore[union-attr]
    try:
        for message in request_iterator:
            if message.signal:
                if message.signal in ALLOWED_SIGNALS:
                    _killpg(proc.pid, message.signal)
                continue
            if message.stdin:
                os.write(sink, message.stdin)
            if message.HasField("window") and terminal >= 0:
                _set_window(terminal, message.window.rows, message.window.cols)
            if message.stdin_eof:
                if terminal >= 0:
                    os.write(terminal, b"\x04")
                else:
                    proc.stdin.close()  # type: ignore[union-attr]
                    sink = -1
    except Exception:  # the stream went, or the exec closed its stdin
        return
