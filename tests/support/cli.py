"""synctl run in this process with no cluster configured, and how long it took."""

from __future__ import annotations

import time

from click.testing import CliRunner

from synapse.client.cli.main import main


def timed(*args, env=None):
    started = time.monotonic()
    out = CliRunner().invoke(main, list(args), env={"SYNAPSE_MASTERS": "", "SYNAPSE_CA": "", **(env or {})})
    return out, time.monotonic() - started
