"""The stdin host: gives a task started by `synctl run` a stdin that outlives the worker, run by the
shim (before the sandbox, for a task in an image).

    python3 -I -S -c 'import os, sys; sys.path.append(sys.argv[1]); …' DIR FIFO pipe | CMD [ARGS...]
    python3 -I -S -c 'import os, sys; sys.path.append(sys.argv[1]); …' DIR FIFO pty -- CMD [ARGS...]

`pipe`: the shim runs the host and the command as a pipeline, the host's stdout the command's
stdin, so the command starts as soon as a plain task's would (not after an interpreter's start: a
gang's other ranks do not wait for it, nor does a failing one stop it before it ran); the host
ends once the command's stdin is closed by every reader, or once it has passed on the caller's
end of input. `pty`: the host forks the command as the leader of a new session on a
pseudo-terminal (its controlling terminal) and copies the terminal's output to the log.

The worker's attach service (synapse.worker.attach) writes frames into FIFO, a named pipe in the
task's directory that the worker made before the start: `D` bytes for the command's stdin, `E`
its end, `W` the caller's window size (rows, cols). The host keeps a write end of the FIFO open
itself, so a worker that goes away (a restart, a dropped client) is not an end of input: the task
keeps its stdin, and the next attach writes into the same FIFO. A frame is at most PIPE_BUF bytes,
which a pipe writes whole, so frames of two writers never interleave.

Signals: the host sits in the shim's process group and, like the shim, outlives every signal a
task may be sent (a handler, not an ignore: the command gets the default action or its own
handler), so an interrupted command that reads on still gets its input. On a pipe the command
shares the group, so the worker's signals reach it directly; on a pseudo-terminal it has a session
of its own, and the host passes each signal on to the command's process group and ends with the
command's status (128+N for signal N), which the shim records as the task's. Standard library
only.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import struct
import sys
import termios

#: A frame's header: its kind (one byte) and its payload's length.
HEADER = struct.Struct(">cH")
#: The most a frame may hold, header included: what a pipe writes in one piece (POSIX PIPE_BUF).
MAX_FRAME = 4096
DATA, END, WINDOW = b"D", b"E", b"W"
#: The signals the host outlives (and passes on, on a pseudo-terminal): a task's notices and stop,
#: and what a terminal's line discipline or a shell's job control sends.
SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGURG", "SIGWINCH",
           "SIGXCPU", "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGCONT", "SIGTSTP")
#: The most bytes of stdin held for a command that does not read them before the FIFO is left unread.
MAX_PENDING = 1 << 20


def frames(kind: bytes, payload: bytes = b"") -> list[bytes]:
    """`payload` as frames of `kind`, each one atomic write (an empty payload makes one frame)."""
    room = MAX_FRAME - HEADER.size
    chunks = [payload[i:i + room] for i in range(0, len(payload), room)] or [b""]
    return [HEADER.pack(kind, len(chunk)) + chunk for chunk in chunks]


def window_frame(rows: int, cols: int) -> bytes:
    """The frame that sets the terminal's size."""
    return frames(WINDOW, struct.pack(">HH", max(0, min(rows, 65535)), max(0, min(cols, 65535))))[0]


def _spawn(argv: list[str]) -> tuple[int, int]:
    """Fork the command on a new pseudo-terminal; returns (its pid, the terminal's master side)."""
    master, slave = os.openpty()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(master)
            os.setsid()
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
            for fd in (0, 1, 2):
                os.dup2(slave, fd)
            if slave > 2:
                os.close(slave)
        except OSError as exc:
            os.write(2, f"synapse: cannot set up the terminal: {exc}\n".encode())
            os._exit(125)
        _exec(argv)
    os.close(slave)
    return pid, master


def _exec(argv: list[str]) -> None:
    """(the forked child) Become the command; 127 if it is not there, 126 if it cannot run, as a shell says."""
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(2, f"synapse: {argv[0]}: {exc.strerror}\n".encode())
        os._exit(127 if exc.errno == errno.ENOENT else 126)


class Host:
    """The copy loop: frames from the FIFO to the command, the terminal's output to the log. On a
    pipe (`pid` 0) the command is not the host's child: `sink` is the pipe to it."""

    def __init__(self, fifo: str, mode: str, pid: int, sink: int) -> None:
        self.mode, self.pid, self.sink = mode, pid, sink
        # Read end first (non-blocking: no writer yet), then a writer of our own, so no worker's
        # going ever reads as the end of input.
        self.fifo = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        self.keep = os.open(fifo, os.O_WRONLY)
        self.buffer = b""  #: bytes read from the FIFO, not yet a whole frame
        self.pending = b""  #: stdin bytes for the command that it has not taken yet
        self.eof = False  #: the caller's stdin ended: close the command's once `pending` is written
        self.terminal = sink if mode == "pty" else -1  #: the terminal's master side; -1 on a pipe
        self.hung_up = False  #: the terminal's other side is closed by all (its output is all read)
        os.set_blocking(sink, False)

    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        status = None
        while status is None and (self.pid or self.sink >= 0):
            poller = select.poll()
            poller.register(wake_r, select.POLLIN)
            if len(self.pending) < MAX_PENDING:
                poller.register(self.fifo, select.POLLIN)
            if self.terminal >= 0 and not self.hung_up:
                poller.register(self.terminal, select.POLLIN | (select.POLLOUT if self.pending else 0))
            elif self.sink >= 0:  # POLLERR once the command's stdin has no reader left
                poller.register(self.sink, select.POLLOUT if self.pending else 0)
            for fd, events in poller.poll(1000):
                if fd == wake_r:
                    _drain(wake_r)
                elif fd == self.fifo:
                    self._read_fifo()
                elif fd == self.terminal and events & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    self._copy_out()
                if fd == self.sink and self.terminal < 0 and events & (select.POLLERR | select.POLLHUP):
                    os.close(self.sink)
                    self.sink = -1
                elif fd == self.sink and events & select.POLLOUT:
                    self._feed()
            status = _reaped(self.pid) if self.pid else None
        if self.terminal >= 0:
            while self._copy_out():
                pass
        return status or 0

    def _read_fifo(self) -> None:
        try:
            data = os.read(self.fifo, 65536)
        except BlockingIOError:
            return
        self.buffer += data
        while len(self.buffer) >= HEADER.size:
            kind, size = HEADER.unpack_from(self.buffer)
            if len(self.buffer) < HEADER.size + size:
                break
            payload = self.buffer[HEADER.size:HEADER.size + size]
            self.buffer = self.buffer[HEADER.size + size:]
            if kind == DATA and not self.eof:
                self.pending += payload
            elif kind == END:
                self.eof = True
            elif kind == WINDOW and self.terminal >= 0 and size == 4:
                rows, cols = struct.unpack(">HH", payload)
                fcntl.ioctl(self.terminal, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self._feed()

    def _feed(self) -> None:
        """Write what the command's stdin can take now; at the caller's end, end it."""
        if self.sink < 0:
            self.pending = b""
            return
        while self.pending:
            try:
                written = os.write(self.sink, self.pending)
            except BlockingIOError:
                return
            except OSError:  # the command closed its stdin (EPIPE) or the terminal is gone
                self.pending = b""
                break
            self.pending = self.pending[written:]
        if self.eof and not self.pending:
            if self.terminal >= 0:  # a terminal's end of input is its EOF character, at a line's start
                eof_char = termios.tcgetattr(self.terminal)[6][termios.VEOF]
                self.eof = False
                try:
                    os.write(self.terminal, eof_char if isinstance(eof_char, bytes) else bytes([eof_char]))
                except OSError:
                    pass
            else:
                os.close(self.sink)
                self.sink = -1

    def _copy_out(self) -> bool:
        """Copy the terminal's output to the log; False once there is none now (or no terminal any more)."""
        try:
            data = os.read(self.terminal, 65536)
        except BlockingIOError:
            return False
        except OSError:  # EIO: every holder of the terminal's other side is gone
            self.hung_up = True
            return False
        if not data:
            return False
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(1, view):]
            except BlockingIOError:
                select.select([], [1], [], 1.0)
            except OSError:
                return False
        return True


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _reaped(pid: int) -> int | None:
    """The command's exit status as a shell reports it, once it has ended; None while it runs."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return 125
    if done == 0:
        return None
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _wait(pid: int) -> int:
    """The command's exit status once it has ended (blocking)."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return 125
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _outlive_signals(mode: str, child: list[int]) -> None:
    """Survive every task signal; on a terminal, pass it on to the command's process group. (On a
    pipe the shim starts the host with them ignored already, and this changes nothing that matters.)"""
    def forward(signum: int, frame: object) -> None:
        if mode == "pty" and child:
            try:
                os.killpg(child[0], signum)
            except OSError:
                pass
    for name in SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None and not (mode == "pipe" and name == "SIGCONT"):
            signal.signal(sig, forward)


def main(argv: list[str]) -> int:
    """Feed the command's stdin (`pipe`: the host's stdout) or terminal (`pty`: the command after
    `--`) from the FIFO; the command's exit status (`pty`), or 0."""
    mode = argv[1] if len(argv) > 1 else ""
    if mode not in ("pipe", "pty") or (mode == "pty" and (len(argv) < 4 or argv[2] != "--")):
        os.write(2, b"usage: stdio_host FIFO pipe | stdio_host FIFO pty -- CMD [ARGS...]\n")
        return 125
    fifo = argv[0]
    child: list[int] = []
    _outlive_signals(mode, child)  # before the fork: a signal in between must not end the host
    pid, sink = _spawn(argv[3:]) if mode == "pty" else (0, 1)
    if pid:
        child.append(pid)
    try:
        host = Host(fifo, mode, pid, sink)
    except OSError as exc:  # no FIFO: the command runs on, its stdin never written
        os.write(2, f"synapse: stdin not attached: {exc}\n".encode())
        return _wait(pid) if pid else 0
    return host.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
