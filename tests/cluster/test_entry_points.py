"""`python -m` runs the same command as the console script, in a process of its own (the scripts'
conventions are checked in tests/unit/test_entry_points.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import synapse


@pytest.mark.parametrize("module, name", [("synapse.master", "synapse-master"), ("synapse.worker", "synapse-worker")])
def test_python_dash_m_runs_the_same_command(module, name):
    """synapse-local starts masters and workers as `python -m synapse.master|worker`."""
    out = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"{name} {synapse.__version__}", out.stderr
