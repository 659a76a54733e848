"""Goodput: the accounting (synapse.core.goodput), the progress file (synapse.worker.progress), the
log's RecordProgress and the leader's rate limit on the pure core (a real cluster, and the history
store's goodput columns: tests/cluster/test_goodput.py)."""

from __future__ import annotations

import math
import os

import pytest

from synapse.core import codec, goodput, versions
from synapse.core import commands as c
from synapse.core.brain.config import LeaderConfig
from synapse.core.brain.leader_state import LeaderState
from synapse.core.brain.stimuli import Heartbeat, MonitorDue, ProgressReport, Propose, Proposed, Started
from synapse.core.goodput import FAILURE, FINISHED, OTHER, Attempt, Goodput, account
from synapse.core.model import JobStatus, Placement
from synapse.worker.progress import ProgressWatcher, Value, parse_line, read_last
from tests.support.helpers import checked, cluster, spec

V4 = versions.KIND_VERSIONS[c.RecordProgress]


# ---- the accounting -------------------------------------------------------------------------------


def test_an_attempt_a_failure_ended_keeps_what_its_checkpoint_saved():
    g = account([Attempt(16, 100.0, FAILURE, kept_s=60.0), Attempt(16, 50.0, FINISHED, restart_s=5.0, wait_s=7.0)])
    assert g == Goodput(held=16 * 150, kept=16 * (60 + 45), lost_failures=16 * 40, lost_restarts=16 * 5,
                        lost_other=0.0, requeue_wait=16 * 7)
    assert g.goodput == pytest.approx(105 / 150)
    assert g.held == g.kept + g.lost_failures + g.lost_restarts + g.lost_other


def test_other_stops_lose_apart_from_failures_and_a_queue_sums_its_jobs():
    a = account([Attempt(8, 30.0, OTHER, kept_s=10.0), Attempt(8, 10.0, FINISHED)])
    b = account([Attempt(1, 10.0, FAILURE)])  # no checkpoint: all of it lost
    assert (a.lost_other, a.lost_failures, a.kept) == (8 * 20, 0.0, 8 * 20)
    assert (b.lost_failures, b.kept) == (10.0, 0.0)
    total = a + b
    assert (total.held, total.kept, total.lost_failures) == (8 * 40 + 10, 8 * 20, 10.0)
    assert math.isnan(Goodput().goodput) and Goodput().hours()["held_gpu_hours"] == 0


def test_a_checkpoint_later_than_the_attempt_keeps_no_more_than_it_held():
    assert account([Attempt(2, 10.0, FAILURE, kept_s=99.0)]).kept == 20.0
    assert account([Attempt(2, 10.0, FINISHED, restart_s=99.0)]).lost_restarts == 20.0


def _running(state, job_id, nodes, at):
    job = state.jobs[job_id]
    checked(state, c.CommitPlan(at=at, job_id=job_id, attempt=job.attempt, placements=tuple(
        Placement(i, n, tuple(range(8)), i) for i, n in enumerate(nodes))))
    for i, n in enumerate(nodes):
        checked(state, c.TaskStarted(at=at + 2, job_id=job_id, attempt=job.attempt, index=i, node_id=n))


def test_a_job_lost_to_a_node_is_accounted_from_the_log_alone():
    """Attempt 1 runs from 12 (placed 10), checkpoints at 40 and loses its node at 50: 2 x 8 GPUs x
    (50 - 40) since the checkpoint, and its start (10 -> 12), lost to the failure. Attempt 2 waits
    50 -> 60, starts at 62 (its restart) and ends at 100."""
    state = cluster(racks=1, nodes_per_rack=3)
    checked(state, c.SubmitJob(at=1, job_id="j", request_id="j", spec=spec(tasks=2)))
    _running(state, "j", ["r0-n0", "r0-n1"], at=10)
    assert checked(state, c.RecordProgress(at=41, job_id="j", attempt=1, checkpoint_at=40.0, step=7)).ok
    checked(state, c.NodeLost(at=50, node_id="r0-n0"))
    checked(state, c.TaskExited(at=50, job_id="j", attempt=1, index=1, node_id="r0-n1", exit_code=-15))
    job = state.jobs["j"]
    assert job.status is JobStatus.PENDING and job.runs[-1].checkpoint_at == 40.0
    assert goodput.of_job(job, now=55) == Goodput(16 * 40, 16 * 28, 16 * 12, 0.0, 0.0, 16 * 5)
    _running(state, "j", ["r0-n1", "r0-n2"], at=60)
    for i, n in enumerate(["r0-n1", "r0-n2"]):
        checked(state, c.TaskExited(at=100, job_id="j", attempt=2, index=i, node_id=n, exit_code=0))
    g = goodput.of_job(state.jobs["j"], now=1000)
    assert g == Goodput(held=16 * (40 + 40), kept=16 * (28 + 38), lost_failures=16 * 12, lost_restarts=16 * 2,
                        lost_other=0.0, requeue_wait=16 * 10)
    # The snapshot keeps the checkpoint (a new leader accounts the same).
    again = type(state).from_snapshot(state.to_snapshot())
    assert goodput.of_job(again.jobs["j"], now=1000) == g and again.digest() == state.digest()


def test_record_progress_is_a_version_4_kind_refused_for_another_attempt_and_says_garbage_once():
    state = cluster(racks=1, nodes_per_rack=1)
    checked(state, c.SubmitJob(at=1, job_id="j", request_id="j", spec=spec()))
    cmd = c.RecordProgress(at=5, job_id="j", attempt=1, checkpoint_at=4.0)
    assert codec.CURRENT.version_of(cmd) == 4 and codec.decode_command(codec.encode_command(cmd)) == cmd
    assert not state.apply(cmd).ok  # pending: no gang holds the attempt
    _running(state, "j", ["r0-n0"], at=10)
    assert not state.apply(c.RecordProgress(at=11, job_id="j", attempt=2, checkpoint_at=11.0)).ok
    assert state.apply(c.RecordProgress(at=20, job_id="j", attempt=1, checkpoint_at=19.0, checkpoint_step=5,
                                        problem="progress file of task 0 ignored: not key=value")).ok
    assert state.apply(c.RecordProgress(at=21, job_id="j", attempt=1, checkpoint_at=15.0, step=9)).ok
    p = state.jobs["j"].progress
    assert (p.checkpoint_at, p.checkpoint_step, p.step) == (19.0, 5, 9)  # a checkpoint never goes back
    assert [e.kind for e in state.jobs["j"].events].count("ProgressIgnored") == 1
    assert state.to_snapshot()["version"] == 4


# ---- the leader's rate limit ------------------------------------------------------------------------


def _leader_with_running_job(interval=15.0):
    state = cluster(racks=1, nodes_per_rack=2)
    checked(state, c.SubmitJob(at=1, job_id="j", request_id="j", spec=spec()))
    _running(state, "j", ["r0-n0"], at=10)
    brain = LeaderState(LeaderConfig(checkpoint_record_interval=interval))
    brain.handle(state, Started(at=12, mono=12))  # every node gets a full heartbeat timeout from here
    _carry(state, brain, brain.handle(state, MonitorDue(at=12, mono=12, cluster_version=V4)))
    return state, brain


def _report(at, **kw):
    return ProgressReport(job_id="j", attempt=1, index=0, node_id="r0-n0", at=at, **kw)


def _carry(state, brain, out):
    """Apply the proposals, feed back their outcomes; the commands proposed."""
    cmds = [i.cmd for i in out if isinstance(i, Propose)]
    for cmd in cmds:
        brain.handle(state, Proposed(Propose(cmd), state.apply(cmd).ok))
    return cmds


def test_the_leader_logs_a_checkpoint_when_it_changes_not_once_per_report():
    state, brain = _leader_with_running_job()
    proposed = []
    for second in range(100):  # a report every second; the checkpoint changes every 10 s
        brain.handle(state, *(Heartbeat(n, 20 + second, 20 + second) for n in state.nodes))
        out = brain.handle(state, _report(20 + second, step=second, checkpoint_at=20.0 + second // 10 * 10))
        out += brain.handle(state, MonitorDue(at=20 + second, mono=20 + second, cluster_version=V4))
        proposed += _carry(state, brain, out)
    assert all(isinstance(cmd, c.RecordProgress) for cmd in proposed)
    # The first at once, then at most one per 15 s: 100 reports, 10 checkpoints, 7 proposals.
    assert [cmd.at for cmd in proposed] == [20, 35, 50, 65, 80, 95, 110]
    assert state.jobs["j"].progress.checkpoint_at == 110.0
    assert brain.progress_of("j").step == 99
    brain.validate(state)


def test_a_node_declared_down_logs_the_checkpoint_it_held_back_first():
    state, brain = _leader_with_running_job(interval=60.0)
    _carry(state, brain, brain.handle(state, _report(20, checkpoint_at=20.0)))
    assert _carry(state, brain, brain.handle(state, _report(25, checkpoint_at=25.0))) == []  # held back
    out = brain.handle(state, MonitorDue(at=40, mono=40, cluster_version=V4))  # silent since 12: the timeout
    kinds = [type(i.cmd).__name__ for i in out if isinstance(i, Propose)]
    assert kinds == ["RecordProgress", "NodeLost", "NodeLost"], kinds
    _carry(state, brain, out)
    assert state.jobs["j"].runs[-1].checkpoint_at == 25.0


def test_garbage_is_logged_once_per_attempt_and_below_version_4_nothing_is_proposed():
    state, brain = _leader_with_running_job()
    out = _carry(state, brain, brain.handle(state, _report(20, problem="not key=value: 'x'")))
    assert [cmd.problem for cmd in out] == ["progress file of task 0 ignored: not key=value: 'x'"]
    assert _carry(state, brain, brain.handle(state, _report(21, problem="again"))) == []
    older = LeaderState()
    older.handle(state, MonitorDue(at=22, mono=22, cluster_version=3))
    state.cluster_version = 3
    assert older.handle(state, _report(23, checkpoint_at=23.0)) == []
    assert older.progress_of("j").checkpoint_at == 23.0  # kept in memory: describe job shows it
    # Only the task's own node speaks for it.
    assert brain.handle(state, ProgressReport("j", 1, 0, "r0-n1", 30, checkpoint_at=29.0)) == []


# ---- the progress file ------------------------------------------------------------------------------


@pytest.mark.parametrize("line,value", [
    ("step=12", Value(step=12)),
    ("step=12 checkpoint=1735689600", Value(12, 1735689600.0)),
    ("step=12, checkpoint=10", Value(12, 10.0)),
    ('{"step": 3, "checkpoint": 1735689600.5}', Value(3, 1735689600.5)),
    ("checkpoint=7", Value(-1, 7.0)),
])
def test_a_progress_line_reads(line, value):
    assert parse_line(line) == value


@pytest.mark.parametrize("line,why", [
    ("hello", "not key=value"), ("step=-1", "whole number"), ("step=1.5", "whole number"),
    ("checkpoint=soon", "Unix time or a step"), ("epoch=3", "neither step nor checkpoint"),
    ("{not json", "not JSON"), ("[1, 2]", "not key=value"), ('{"step": true}', "whole number"),
    ("step=nan", "whole number"),
])
def test_a_garbage_line_says_why(line, why):
    assert why in parse_line(line)


def test_only_the_last_complete_line_counts(tmp_path):
    path = tmp_path / "p"
    path.write_text("step=1\nstep=2\nstep=3")  # the third is being written
    assert read_last(path) == Value(step=2)
    path.write_text("")
    assert read_last(path) is None and read_last(tmp_path / "none") is None


def test_the_watcher_forwards_a_checkpoint_at_once_a_step_sparingly_and_garbage_once(tmp_path):
    path, key = tmp_path / "p", ("j", 1, 0)
    watcher = ProgressWatcher(poll_s=1.0, step_every_s=10.0)
    path.write_text("step=1\n")
    assert watcher.poll([(key, path)], mono=0.0, wall=1e9 + 5) and [e.step for e in watcher.take()] == [1]
    with open(path, "a") as f:
        f.write("step=2\n")
    os.utime(path, ns=(1, 2))
    assert not watcher.poll([(key, path)], mono=2.0, wall=1e9 + 7)  # a step alone: not yet
    with open(path, "a") as f:
        f.write("step=3 checkpoint=1000000002\n")
    assert watcher.poll([(key, path)], mono=4.0, wall=1e9 + 9)  # a checkpoint: at once
    [event] = watcher.take()
    assert (event.progress, event.step, event.checkpoint_at, event.checkpoint_step) == (True, 3, 1e9 + 2, -1)
    for n in range(2):
        with open(path, "a") as f:
            f.write(f"garbage {n}\n")
        watcher.poll([(key, path)], mono=6.0 + 2 * n, wall=1e9 + 11)
    assert [e.progress_problem for e in watcher.take()] == ["not key=value: 'garbage'"]  # once
    with open(path, "a") as f:
        f.write("checkpoint=40\n")  # a step number: its time is when the file changed
    assert watcher.poll([(key, path)], mono=20.0, wall=2e9)
    [event] = watcher.take()
    assert event.checkpoint_step == 40 and event.checkpoint_at == pytest.approx(os.stat(path).st_mtime)
    watcher.put_back([event])  # not delivered: sent again
    assert [e.checkpoint_step for e in watcher.take()] == [40]
    assert not watcher.poll([], mono=30.0, wall=2e9) and watcher.take() == []


# ---- a real cluster ---------------------------------------------------------------------------------


# ---- the history store: schema version 3 ----------------------------------------------------------


def test_a_gang_a_lost_node_ends_for_good_loses_to_the_failure_and_a_cancelled_one_keeps():
    """The last attempt of a job is kept, unless a node-side cause ended it (no restarts left)."""
    for cancel in (False, True):
        state = cluster(racks=1, nodes_per_rack=1)
        checked(state, c.SubmitJob(at=1, job_id="j", request_id="j", spec=spec()))
        _running(state, "j", ["r0-n0"], at=10)
        checked(state, c.RecordProgress(at=30, job_id="j", attempt=1, checkpoint_at=30.0))
        if cancel:
            checked(state, c.CancelJob(at=40, job_id="j"))
            checked(state, c.TaskExited(at=40, job_id="j", attempt=1, index=0, node_id="r0-n0", exit_code=-15))
        else:
            checked(state, c.NodeDown(at=40, node_id="r0-n0"))  # an older leader's: it fails the gang for good
        job = state.jobs["j"]
        assert job.status.terminal
        g = goodput.of_job(job, now=100)
        assert (g.held, g.kept, g.lost_failures) == ((8 * 30, 8 * 30, 0.0) if cancel else (8 * 30, 8 * 18, 8 * 12))
