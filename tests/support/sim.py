"""synapse-sim through its command line, as a user runs it (the `trace_file` fixture of tests/conftest.py too)."""

from __future__ import annotations

from click.testing import CliRunner

from synapse.sim.main import main


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)
