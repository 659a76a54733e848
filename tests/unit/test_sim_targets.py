"""scripts/sim_targets.py: issue 48's ratios, seed by seed, as `synapse-sim run` gives them."""

from __future__ import annotations

import json
import re

from click.testing import CliRunner

from synapse.sim.main import main as sim
from tests.support import paths


def _script():
    return paths.script("sim_targets")


def test_its_ratios_are_runs_and_the_cache_changes_nothing(tmp_path):
    options = ["--days", "2", "--nodes", "32", "--racks", "4"]  # where the policies differ
    trace = tmp_path / "t.csv"
    made = CliRunner().invoke(sim, ["generate", *options, "--seed", "2", "-o", str(trace)])
    assert made.exit_code == 0, made.output
    ran = CliRunner().invoke(sim, ["run", str(trace), "--policies", "easy,easy++,synapse", "--json"])
    assert ran.exit_code == 0, ran.output
    p = json.loads(ran.output)["policies"]
    args = ["--seeds", "2", *options, "--cache", str(tmp_path / "cache")]
    first = CliRunner().invoke(_script().main, args, catch_exceptions=False)
    again = CliRunner().invoke(_script().main, args, catch_exceptions=False)
    assert first.exit_code == 0 and first.output == again.output, first.output
    assert len(list((tmp_path / "cache").iterdir())) == 2  # easy's and easy++'s summaries
    seed = re.search(r"seed  2: JCT/easy ([\d.]+)  JCT/easy\+\+ ([\d.]+)", first.output)
    assert seed is not None, first.output
    assert float(seed[1]) == round(p["synapse"]["mean_jct_s"] / p["easy"]["mean_jct_s"], 3)
    assert float(seed[2]) == round(p["synapse"]["mean_jct_s"] / p["easy++"]["mean_jct_s"], 3)
    assert "mean over 1 seed(s)" in first.output
