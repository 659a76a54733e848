"""A server's data dir is its user's alone: files 0600, directories 0700, whoever starts it.

Each server (`synapse-master`, `synapse-worker`, and `synapse-local` for the cluster it lays out)
sets the process umask to PRIVATE_UMASK first thing, so everything it and its libraries create
from then on is private: pysyncobj's journal and dump (which open with the default mode), the
history store's SQLite file, task logs, state files, credentials. `make_private` then creates the
data dir 0700, or shuts an existing one, and takes the group and other bits off whatever lies
directly in it: an earlier release left its journal 0644 in a 0755 directory, and a job's env
values were found there. Deeper entries are not walked: a 0700 data dir already shuts group and
others out of everything below it, and what is below may be a task's own files or an image's
tree, whose modes are theirs (a task in an image may run as another user).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: The umask of every Synapse server process: files 0600, directories 0700.
PRIVATE_UMASK = 0o077
#: Where synapse-worker puts the umask it was started with, for the task shim (shim.sh) to give each
#: task: a task's own files are its owner's business, as with any program they run.
TASK_UMASK_ENV = "SYNAPSE_TASK_UMASK"
#: The bits no entry directly in a data dir keeps: group's and others'.
_SHARED = stat.S_IRWXG | stat.S_IRWXO


def private_umask() -> int:
    """Make everything this process creates from now on private; returns the umask it had."""
    return os.umask(PRIVATE_UMASK)


def make_private(data_dir: str | Path) -> None:
    """Create `data_dir` 0700 (parents too), or shut an existing one, and take group and other bits
    off every file and directory directly in it (symbolic links are left as they are)."""
    path = Path(data_dir)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, stat.S_IMODE(path.stat().st_mode) & ~_SHARED)
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_symlink():
                continue
            try:
                mode = stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)
                if mode & _SHARED:
                    os.chmod(entry.path, mode & ~_SHARED)
            except FileNotFoundError:  # gone meanwhile
                continue
