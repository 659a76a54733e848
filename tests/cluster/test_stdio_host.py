"""The stdin host (synapse.worker.stdio_host) on real processes, as the shim runs it: a task's stdin
fed through its FIFO by one writer after another (a worker and the one after its restart), the
caller's end of input, and a pseudo-terminal of the caller's size."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from synapse.worker import stdio_host
from synapse.worker.runtime import SHIM, STDIO_HOST, STDIO_HOST_LAUNCH


def _fifo(tmp_path: Path) -> Path:
    fifo = tmp_path / "t.stdin"
    os.mkfifo(fifo, 0o600)
    return fifo


def _send(fifo: Path, *frames: bytes, wait: float = 30.0) -> None:
    """Write frames into the FIFO as the attach service does: once the host reads it."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            assert time.monotonic() < deadline, "the stdin host never opened its FIFO"
            time.sleep(0.01)
    try:
        for frame in frames:
            os.write(fd, frame)
    finally:
        os.close(fd)


def _shim(tmp_path: Path, fifo: Path, *command: str) -> subprocess.Popen:
    return subprocess.Popen(["/bin/sh", str(SHIM), str(tmp_path / "x.exit"), str(tmp_path / "x.pid"),
                             "--synapse-stdin", sys.executable, STDIO_HOST_LAUNCH, str(STDIO_HOST.parent), str(fifo),
                             *command], stdout=open(tmp_path / "log", "wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def test_a_pipe_keeps_its_stdin_across_writers_until_the_callers_end(tmp_path):
    fifo = _fifo(tmp_path)
    shim = _shim(tmp_path, fifo, "sh", "-c", "read a; echo got $a; wc -c; exit 3")
    _send(fifo, *stdio_host.frames(stdio_host.DATA, b"one\n"))  # a worker writes, then goes away
    _send(fifo, *stdio_host.frames(stdio_host.DATA, b"x" * 10_000))  # the next one writes on
    _send(fifo, *stdio_host.frames(stdio_host.END))
    assert shim.wait(timeout=60) == 3
    assert (tmp_path / "x.exit").read_text().strip() == "3"
    assert (tmp_path / "log").read_bytes().split() == [b"got", b"one", b"10000"]


def test_a_pipe_host_ends_with_a_command_that_reads_nothing(tmp_path):
    shim = _shim(tmp_path, _fifo(tmp_path), "sh", "-c", "exit 4")
    assert shim.wait(timeout=60) == 4


def test_a_pty_gives_the_command_a_terminal_of_the_callers_size(tmp_path):
    fifo = _fifo(tmp_path)
    host = subprocess.Popen([sys.executable, "-I", "-S", "-c", STDIO_HOST_LAUNCH, str(STDIO_HOST.parent), str(fifo),
                             "pty", "--", "sh"], stdout=open(tmp_path / "log", "wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    _send(fifo, stdio_host.window_frame(33, 101),
          *stdio_host.frames(stdio_host.DATA, b"test -t 0 && echo IS-A-TTY; stty size; exit 5\n"))
    assert host.wait(timeout=60) == 5
    log = (tmp_path / "log").read_bytes()
    assert b"IS-A-TTY" in log and b"33 101" in log, log


