"""The node's health check (Slurm's HealthCheckProgram): a command run every interval.

It passes when it exits 0 within its timeout. Otherwise the node is unhealthy, and the first line
the command printed (stdout or stderr) says why; a command that prints nothing is described by its
exit code, one that hangs by its timeout. The worker reports the result in its heartbeats, at once
when it changes; the leader cordons the node (or drains it, if the operator chose that) and lifts
the cordon when the check passes again.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass

#: Longest failure message kept (it becomes the node's cordon reason).
MAX_MESSAGE = 200


@dataclass(frozen=True, slots=True)
class HealthResult:
    healthy: bool
    message: str  #: "" when healthy


def command_problem(command: str) -> str:
    """Why `command` cannot be a health check ('' if it can): empty, unparsable, or not found."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        return f"--health-check {command!r} does not parse: {exc}"
    if not argv:
        return "--health-check is empty"
    if shutil.which(argv[0]) is None:
        return f"--health-check: command {argv[0]!r} not found (or not executable)"
    return ""


def first_line(output: str) -> str:
    for line in output.splitlines():
        if line.strip():
            return line.strip()[:MAX_MESSAGE]
    return ""


class HealthCheck:
    """Runs the check command; each run gives a HealthResult."""

    def __init__(self, command: str, interval: float, timeout: float) -> None:
        self.argv = shlex.split(command)
        self.interval = interval  #: seconds between the start of one run and the next
        self.timeout = timeout  #: seconds a run may take before it counts as failed

    def run(self) -> HealthResult:
        """Run the check once. A run that outlives its timeout is killed with its process group."""
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            return HealthResult(False, f"health check cannot run: {exc.strerror or exc}")
        try:
            out, _ = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            return HealthResult(False, f"health check gave no answer within {self.timeout:g}s")
        if proc.returncode == 0:
            return HealthResult(True, "")
        line = first_line(out.decode(errors="replace"))
        return HealthResult(False, line or f"health check exited with code {proc.returncode} and printed nothing")
