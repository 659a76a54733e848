"""One clock for the master: the API endpoints and the history exporter read the wall clock only
through `Master.now`, so a test (or a simulated clock) can stand in for it in one place."""

from __future__ import annotations

import ast

from tests.support import paths

ROOT = paths.ROOT / "synapse"
#: Modules that take their timestamps from Master.now, never from time.time.
ONE_CLOCK = (*sorted(str(p.relative_to(ROOT)) for p in (ROOT / "master" / "api").glob("*.py")),
             "history/exporter.py")


def wall_clock_reads(source: str) -> list[int]:
    """Lines that call time.time() (or a bare time() imported from time)."""
    tree = ast.parse(source)
    from_time = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.module == "time" for alias in node.names if alias.name == "time"}
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Attribute) and node.func.attr == "time" and isinstance(node.func.value, ast.Name)
         and node.func.value.id == "time")
        or (isinstance(node.func, ast.Name) and node.func.id in from_time))]


def test_endpoints_and_exporter_read_the_clock_through_master_now():
    assert "master/api/jobs.py" in ONE_CLOCK
    found = {name: wall_clock_reads((ROOT / name).read_text()) for name in ONE_CLOCK}
    assert not any(found.values()), found


def test_the_check_finds_both_spellings():
    assert wall_clock_reads("import time\nx = time.time()\ny = time.monotonic()\n") == [2]
    assert wall_clock_reads("from time import time as now\nx = now()\n") == [2]
    assert wall_clock_reads("def f(self):\n    return self.m.now()\n") == []
