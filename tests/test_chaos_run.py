"""A short chaos run: real cluster, every fault kind, every checker. Run with: pytest -m chaos."""

import pytest

from chaos.nemesis import NEMESES
from chaos.run import run

pytestmark = pytest.mark.chaos


def test_short_chaos_run_holds_every_invariant(tmp_path):
    report = run(masters=3, workers=4, duration=60, seed=1, kinds=sorted(NEMESES), out=tmp_path / "chaos",
                 clients=3, interval=3.0)
    assert report["faults"] >= 8, report
    assert report["acked"] > 50, report
    assert report["lost"] == [] and report["overcommits"] == 0, report
    assert report["partial_gangs"] == [] and report["duplicate_tasks"] == [], report
    assert report["replicas_converged"] and report["linearizable"] == "ok", report
