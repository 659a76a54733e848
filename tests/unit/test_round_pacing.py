"""The pause between scheduling rounds (synapse.master.leader.LeaderLoops._pace): changes batch for
SCHEDULE_MIN_INTERVAL_S, one that may let a waiting gang start ends the pause, though no sooner than
the last round took. The interval is stretched here so the outcomes differ by seconds, not by
what a loaded machine's event loop may add."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from synapse.core import commands as c
from synapse.master import leader
from synapse.master.leader import LeaderLoops
from synapse.master.replica import PACED, QUICK_QUEUE, urgent

INTERVAL = 2.0


def _loops() -> SimpleNamespace:
    return SimpleNamespace(master=SimpleNamespace(scheduler_urgent=asyncio.Event()), stopped=False)


def _paced(loops: SimpleNamespace, started: float, ended: float, urgent_after: float | None) -> float:
    """Seconds `_pace` waited, the urgent event set `urgent_after` seconds in (None: never)."""
    async def run() -> float:
        if urgent_after is not None:
            asyncio.get_running_loop().call_later(urgent_after, loops.master.scheduler_urgent.set)
        t0 = time.monotonic()
        await LeaderLoops._pace(loops, started, ended)  # type: ignore[arg-type]
        return time.monotonic() - t0
    return asyncio.run(run())


def test_without_an_urgent_change_the_pause_runs_out(monkeypatch):
    monkeypatch.setattr(leader, "SCHEDULE_MIN_INTERVAL_S", INTERVAL)
    now = time.monotonic()
    assert _paced(_loops(), now, now, None) >= INTERVAL - 0.05


def test_an_urgent_change_ends_the_pause(monkeypatch):
    monkeypatch.setattr(leader, "SCHEDULE_MIN_INTERVAL_S", INTERVAL)
    now = time.monotonic()
    assert _paced(_loops(), now, now, 0.05) < INTERVAL / 2


def test_an_urgent_change_waits_as_long_as_the_last_round_took(monkeypatch):
    """A round that took 0.6 s: the next one starts no sooner than 0.6 s after it ended, urgent or
    not (rounds take at most half the loop)."""
    monkeypatch.setattr(leader, "SCHEDULE_MIN_INTERVAL_S", INTERVAL)
    ended = time.monotonic()
    waited = _paced(_loops(), ended - 0.6, ended, 0.0)
    assert 0.55 <= waited < INTERVAL - 0.6 - 0.1


def test_submissions_and_reports_batch_while_frees_do_not():
    """Which applied commands end the pause (replica.urgent: unless every one is PACED, or a
    submission finds a short queue)."""
    assert issubclass(c.SubmitAllocJob, PACED) and issubclass(c.TaskStarted, PACED)
    for kind in (c.TaskExited, c.CancelJob, c.ReleaseJob, c.NodeUp, c.Preempt, c.UpdateJob):
        assert not issubclass(kind, PACED)



def test_a_submission_ends_the_pause_while_the_queue_is_short():
    """A submission to a short queue is scheduled at once (its round is cheap, the job may start);
    to a long one it batches with the others for SCHEDULE_MIN_INTERVAL_S."""
    submit = c.SubmitJob(at=1.0, job_id="j", request_id="", spec=None)  # type: ignore[arg-type]
    started = c.TaskStarted(at=1.0, job_id="j", attempt=1, index=0, node_id="n1")
    assert urgent([started, submit], 0) and urgent([submit], QUICK_QUEUE)
    assert not urgent([submit], QUICK_QUEUE + 1) and not urgent([started], 0)
    assert urgent([c.TaskExited(at=1.0, job_id="j", attempt=1, index=0, node_id="n1", exit_code=0)], 10_000)
