"""synapse-sim's --workers: the jittered copies replayed in worker processes give the figures one process gives."""

from __future__ import annotations

import json

from tests.support.sim import invoke


def test_run_with_jitter_on_several_workers_gives_the_same_figures(trace_file):
    """--workers replays the copies in other processes (a tuned policy and queue-less trace pickled
    there and back): every decision-made figure equals the one-process run's."""
    args = ("run", str(trace_file), "--policies", "easy,synapse", "--tuning", "reservations=1", "--json",
            "--jitter", "60", "--repeats", "3")
    one = json.loads(invoke(*args).output)["jitter"]
    two = json.loads(invoke(*args, "--workers", "2").output)["jitter"]
    timing = {"wall_s", "sched_p99_ms", "sched_mean_ms"}
    strip = lambda copies: [{k: v for k, v in c.items() if k not in timing} for c in copies]  # noqa: E731
    for policy in ("easy", "synapse"):
        assert strip(two["copies"][policy]) == strip(one["copies"][policy])
    assert two["ratios"] == one["ratios"]
