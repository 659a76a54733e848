"""The PyTorch examples' jobs: whether an interpreter has torch, and the lines their script logs."""

from __future__ import annotations

import shutil
import subprocess

from tests.support.cluster import read_logs

SHIPPED_PYTHON = "/usr/bin/python3"  #: the interpreter the job files name


def has_torch(python: str) -> bool:
    return bool(shutil.which(python)) and subprocess.run([python, "-c", "import torch.distributed"],
                                                         capture_output=True).returncode == 0


def lines(cluster, job_id: str, attempt: int, kind: str) -> list[dict[str, str]]:
    """The script's `kind` lines (start, done) in an attempt's task logs, as dicts."""
    out = []
    for log in read_logs(cluster, job_id, attempt):
        for line in log.splitlines():
            line = line.split("]:", 1)[1] if line.startswith("[") and "]:" in line else line  # torchrun's tee prefix
            if line.startswith(kind + " "):
                out.append(dict(kv.split("=", 1) for kv in line.split()[1:]))
    return out
