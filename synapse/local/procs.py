"""Looking at a local cluster's processes from outside: is one alive, is it this cluster's, how did it end.

Pure /proc and waitpid reads; `synapse.local.cluster` starts and stops the processes.
"""

from __future__ import annotations

import os
from pathlib import Path


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def is_ours(pid: int, data_dir: Path) -> bool:
    """True while `pid` is alive and is a process this data dir started (not a reused pid)."""
    return str(data_dir) in _cmdline(pid)


def _end_of(pid: int, data_dir: Path) -> str:
    """How a process of this cluster ended ('' while it runs): its exit status or signal when this
    process started it, else that it is gone. A process whose command line reads empty is starting:
    a child just exec'd has none for a moment (vfork lets the parent go on before the kernel has set
    up the new program's arguments), and taking that for "not ours" failed `up` under load."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not this process's child (started by an earlier `up`): look at /proc
        cmdline = _cmdline(pid)
        return "" if is_alive(pid) and (not cmdline or str(data_dir) in cmdline) else "gone"
    if not done:
        return ""
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


def _log_tail(path: Path, lines: int = 3) -> str:
    """The last lines of a process's log, joined, for an error that says why it stopped."""
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:]) or "(empty)"
    except OSError:
        return "(no log)"


def is_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
