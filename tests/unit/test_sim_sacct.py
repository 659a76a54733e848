"""synapse-sim import-sacct over an export with bad rows: every bad line named, and --skip-bad imports the rest."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from synapse.sim import trace as tracefile
from synapse.sim.main import main
from synapse.sim.sacct import BadRow, BadRows, parse

HEADER = "JobID|JobName|Submit|Start|End|State|AllocTRES|ReqTRES|NNodes|Timelimit|User"
ROWS = [
    "100|train|2024-05-01T10:00:00|2024-05-01T10:05:00|2024-05-01T12:00:00|COMPLETED|gres/gpu=16,node=2||2|04:00:00|al",
    "101|late|2024-05-01T10:00:00|2024-05-01T11:00:00|2024-05-01T10:30:00|COMPLETED|gres/gpu=8,node=1||1|60|bob",
    "100.batch|batch|2024-05-01T10:05:00|2024-05-01T10:05:00|2024-05-01T12:00:00|COMPLETED|gres/gpu=8||1||",
    "102|x|2024-05-01T10:00:00|2024-05-01T10:01:00|2024-05-01T10:30:00|FAILED|gres/gpu=8||two|60|bob",
    "103|early|2024-05-01T10:00:00|2024-05-01T09:00:00|2024-05-01T10:30:00|COMPLETED|gres/gpu=8||1|60|bob",
    "104|ok|2024-05-01T11:00:00|2024-05-01T11:00:10|2024-05-01T11:30:10|TIMEOUT|gres/gpu:a100=4,node=1||1|30|cy",
    "105|x|2024-05-01T10:00:00|2024-05-01T10:01:00|2024-05-01T10:30:00|COMPLETED|gres/gpu=-2||1|60|bob",
    "106|x|2024-05-01T10:00:00",
    "100|again|2024-05-01T13:00:00|2024-05-01T13:05:00|2024-05-01T14:00:00|COMPLETED|gres/gpu=8||1|60|al",
    "107|x|soon|2024-05-01T10:01:00|2024-05-01T10:30:00|COMPLETED|gres/gpu=8||1|60|bob",
    "108|never|2024-05-01T12:00:00|None|2024-05-01T12:10:00|CANCELLED by 7||gres/gpu=8|1|60|dee",
    "109|x|2024-05-01T10:00:00|2024-05-01T10:01:00|2024-05-01T10:30:00|COMPLETED|gres/gpu=8||1|1:2:3:4|bob",
]
EXPORT = "\n".join([HEADER, *ROWS]) + "\n"
#: line in the file -> what its reason says (the header is line 1, ROWS[i] is line i + 2)
BAD = {3: "times out of order", 5: "NNodes 'two'", 6: "times out of order", 8: "'gres/gpu=-2'",
       9: "3 field(s), the header has 11", 10: "job 100 appears twice (first on line 2)", 11: "Submit 'soon'",
       13: "Timelimit '1:2:3:4'"}


def test_every_bad_row_is_named_at_once_and_nothing_is_imported():
    with pytest.raises(BadRows) as err:
        parse(EXPORT, "month.txt")
    assert [r.line for r in err.value.rows] == sorted(BAD)
    for line, reason in BAD.items():
        assert f"\n  month.txt:{line}: " in str(err.value)
        assert reason in next(r.reason for r in err.value.rows if r.line == line)
    assert str(err.value).startswith("month.txt: 8 bad row(s), nothing imported (--skip-bad imports the others):")


def test_given_a_list_the_bad_rows_go_there_and_the_good_ones_are_imported():
    bad: list[BadRow] = []
    trace, skipped = parse(EXPORT, "month.txt", bad)
    assert [r.line for r in bad] == sorted(BAD)
    assert [(j.id, j.submit, j.gpus, j.nodes, j.duration, j.exit_code) for j in trace.jobs] == [
        ("100", 0.0, 16, 2, 6900.0, 0), ("104", 3600.0, 4, 1, 1800.0, 1)]
    assert skipped == {"job steps": 1, "never started": 1, "not ended": 0, "cpu only": 0}
    assert trace.comments[0].endswith("skipped: 1 job steps, 1 never started, 0 not ended, 0 cpu only, 8 bad rows")


def test_an_export_of_bad_rows_only_says_so_when_skipping():
    with pytest.raises(ValueError, match=r"no job that ran on GPUs and ended \(skipped: .*, 2 bad rows\)"):
        parse("\n".join([HEADER, ROWS[1], ROWS[3]]), "month.txt", [])


def test_import_sacct_without_skip_bad_exits_2_naming_every_bad_line(tmp_path):
    export, out = tmp_path / "month.txt", tmp_path / "t.csv"
    export.write_text(EXPORT)
    result = CliRunner().invoke(main, ["import-sacct", str(export), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and not out.exists()
    for line, reason in BAD.items():
        assert f"{export}:{line}: " in result.stderr and reason in result.stderr
    assert result.stderr.count(f"{export}:") == len(BAD) + 1  # the summary names the file too


def test_import_sacct_skip_bad_imports_the_good_rows_and_names_each_skipped_line(tmp_path):
    export, out = tmp_path / "month.txt", tmp_path / "t.csv"
    export.write_text(EXPORT)
    result = CliRunner().invoke(main, ["import-sacct", str(export), "--skip-bad", "--nodes", "4", "--racks", "2",
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output
    skipped = [line for line in result.stderr.splitlines() if ": skipped: " in line]
    assert [int(line.removeprefix(f"{export}:").split(":")[0]) for line in skipped] == sorted(BAD)
    for line, reason in BAD.items():
        assert any(f"{export}:{line}: skipped: " in s and reason in s for s in skipped)
    assert result.stderr.splitlines()[-1] == ("2 jobs; skipped 1 job steps, 1 never started, 0 not ended, "
                                              "0 cpu only, 8 bad rows")
    trace = tracefile.read(out)
    assert [(j.id, j.submit, j.gpus, j.nodes) for j in trace.jobs] == [("100", 0.0, 16, 2), ("104", 3600.0, 4, 1)]
    assert trace.shape is not None and trace.shape.nodes == 4
