"""The task shim: a tiny supervisor between the worker and one task's process.

    python -m synapse.shim --exit-file F --pid-file P -- CMD ARGS...

The worker starts the shim in a new session (so the task has its own process group and outlives a
crash or restart of the worker). The shim starts the command in that same process group, waits
for it, and writes its exit code to F atomically. Its first act is to write its own pid and start
time to P, so a worker that crashed between starting it and recording it still finds it. A worker
that restarts therefore re-adopts a task, or finds out how it ended, as containerd's shim and
Nomad's executor allow.

Signals: a stop is SIGTERM to the whole process group. The shim itself ignores SIGTERM and
SIGINT (the task decides how to react) and records the exit when the task goes. SIGKILL to the
group kills the shim too; the worker then reports the task as killed (no exit file).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def write_exit(path: str, code: int) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{code}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_pid(path: str) -> None:
    with open(f"/proc/{os.getpid()}/stat") as f:
        ticks = f.read().rsplit(")", 1)[1].split()[19]
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()} {ticks}\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 6 or args[0] != "--exit-file" or args[2] != "--pid-file" or args[4] != "--":
        print("usage: python -m synapse.shim --exit-file FILE --pid-file FILE -- CMD [ARGS...]", file=sys.stderr)
        return 2
    exit_file, pid_file, command = args[1], args[3], args[5:]
    write_pid(pid_file)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        # The child gets default signal handling back; it stays in our process group.
        proc = subprocess.Popen(command, restore_signals=True,
                                preexec_fn=lambda: (signal.signal(signal.SIGTERM, signal.SIG_DFL),
                                                    signal.signal(signal.SIGINT, signal.SIG_DFL)))
    except OSError as exc:
        print(f"synapse-shim: cannot start {command[0]!r}: {exc.strerror}", file=sys.stderr)
        write_exit(exit_file, 127)
        return 127
    code = proc.wait()
    write_exit(exit_file, code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
