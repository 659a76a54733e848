"""scripts/sim_records.py: every job's record of every replay, as JSON lines, the same on every run
(what a change of structure is checked with: docs/development.md)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from synapse.sim.main import main as sim
from tests.support import paths


def _script():
    return paths.script("sim_records")


def test_it_prints_each_jobs_record_per_policy_and_the_same_twice(tmp_path):
    trace = tmp_path / "t.csv"
    made = CliRunner().invoke(sim, ["generate", "--mix", "philly", "--days", "0.5", "--load", "1.0", "--seed", "2",
                                    "--nodes", "8", "--racks", "2", "--recurrence", "0", "-o", str(trace)])
    assert made.exit_code == 0, made.output
    jobs = len(trace.read_text().splitlines()) - 4  # the header lines
    script = _script()
    first = CliRunner().invoke(script.main, ["--policies", "fifo,synapse", str(trace)], catch_exceptions=False)
    again = CliRunner().invoke(script.main, ["--policies", "fifo,synapse", str(trace)], catch_exceptions=False)
    assert first.exit_code == 0, first.output
    assert first.output == again.output
    lines = [json.loads(line) for line in first.output.splitlines()]
    records = [r for r in lines if "id" in r]
    assert [(r["policy"], len([x for x in records if x["policy"] == r["policy"]])) for r in lines if "id" not in r] \
        == [("fifo", jobs), ("synapse", jobs)]
    assert {r["trace"] for r in lines} == {"t.csv"}
    assert all(r["end"] is None or r["end"] >= r["start"] >= r["submit"] for r in records)
