"""A short chaos run: real cluster, every fault kind, every checker. Run with: pytest -m chaos."""

import pytest

from chaos.nemesis import NEMESES
from chaos.run import run


@pytest.mark.chaos
def test_short_chaos_run_holds_every_invariant(tmp_path):
    report = run(masters=3, workers=4, duration=60, seed=1, kinds=sorted(NEMESES), out=tmp_path / "chaos",
                 clients=3, interval=3.0)
    assert report["faults"] >= 8, report
    assert report["acked"] > 50, report
    assert report["lost"] == [] and report["overcommits"] == 0, report
    assert report["partial_gangs"] == [] and report["duplicate_tasks"] == [], report
    assert report["replicas_converged"] and report["linearizable"] == "ok", report


@pytest.mark.chaos_long
def test_long_run_seed_7_regression(tmp_path):
    """Seed 7 over 35 minutes made the replicas diverge: pysyncobj applied log entries that a new
    leader then replaced ('truncating already-applied log entries'), first on a leader paused with
    SIGSTOP as it resumed. Kept as the regression test for that bug (not fixed yet)."""
    report = run(masters=3, workers=4, duration=2100, seed=7, kinds=sorted(NEMESES), out=tmp_path / "chaos",
                 clients=3, interval=0.7)
    assert report["replicas_converged"] and report["ok"], report
