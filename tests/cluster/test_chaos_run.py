"""Chaos runs: real cluster, every fault kind this machine can inject, every checker. The short one
runs with `pytest -m chaos`; the long regression with `pytest -m chaos_long`. (The runner's refusals
that start nothing are in tests/unit/test_chaos_run.py.)"""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import ROOT


def test_a_run_refuses_an_out_dir_that_holds_a_previous_run(tmp_path):
    """A second run into the same --out started its replicas on the first run's journals (the
    members of its last grow-shrink, on other ports): no leader, and the run died at start."""
    out = tmp_path / "chaos"
    (out / "cluster" / "masters").mkdir(parents=True)
    done = subprocess.run([sys.executable, "chaos/run.py", "--duration", "5", "--out", str(out)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2, done
    assert "holds a previous run (cluster)" in done.stderr and "empty or new directory" in done.stderr, done.stderr
    assert not (out / "history.jsonl").exists()
