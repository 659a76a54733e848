"""Fencing by lease: a node's tasks die before their gang starts again elsewhere (synapse.worker.fence)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from synapse.core import codec
from synapse.core.model import JobSpec, Resources
from synapse.worker import fence
from synapse.worker.fence import TASK_JOURNAL
from tests.support.helpers import wait_for

# ---- the arithmetic --------------------------------------------------------------------------------


# ---- the fence process, on real processes ------------------------------------------------------------


def _task(data_dir: Path, task: str) -> subprocess.Popen:
    """A stand-in task as the shim leaves it: a process group of its own and a pid file."""
    proc = subprocess.Popen(["sh", "-c", "sleep 600 & wait"], start_new_session=True)
    (data_dir / "tasks").mkdir(exist_ok=True)
    (data_dir / "tasks" / f"{task}.pid").write_text(f"{proc.pid} {fence.process_start_ticks(proc.pid)}\n")
    return proc


@pytest.fixture
def fence_dir(tmp_path):
    procs: list[subprocess.Popen] = []
    yield tmp_path, procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if fence.fence_running(tmp_path):
        pid = int((tmp_path / fence.FENCE_PID_FILE).read_text().split()[0])
        os.kill(pid, signal.SIGKILL)


def test_the_fence_kills_every_task_once_the_lease_ends_and_records_each(fence_dir):
    data_dir, procs = fence_dir
    procs += [_task(data_dir, "j-1.3.0"), _task(data_dir, "j.dotted.1.1")]
    fence.write_lease(data_dir, time.monotonic() + 1.0)
    fence.start_fence(data_dir, [])
    time.sleep(0.5)
    assert all(p.poll() is None for p in procs), "killed while the lease held"
    wait_for(lambda: all(p.poll() is not None for p in procs), timeout=5, what="tasks killed at the lease's end")
    assert not any(fence.group_alive(p.pid) for p in procs)  # the whole group, the task's child too
    journal = data_dir / TASK_JOURNAL
    wait_for(lambda: journal.exists() and len(journal.read_text().splitlines()) == 2, timeout=5,
             what="a record per fenced task")
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    assert sorted((r["event"], r["job"], r["attempt"], r["index"]) for r in records) == [
        ("fenced", "j-1", 3, 0), ("fenced", "j.dotted", 1, 1)]
    wait_for(lambda: not fence.fence_running(data_dir), timeout=5, what="the fence to exit with nothing to guard")


def test_a_renewed_lease_keeps_the_tasks_and_a_second_fence_is_not_started(fence_dir):
    data_dir, procs = fence_dir
    procs.append(_task(data_dir, "j-2.1.0"))
    fence.write_lease(data_dir, time.monotonic() + 0.6)
    assert fence.start_fence(data_dir, []) > 0
    wait_for(lambda: fence.fence_running(data_dir), timeout=5, what="the fence")
    assert fence.start_fence(data_dir, []) == 0
    for _ in range(6):  # renewed as heartbeats would
        time.sleep(0.3)
        fence.write_lease(data_dir, time.monotonic() + 0.6)
    assert procs[0].poll() is None


def test_no_lease_granted_or_masters_that_grant_none_fence_nothing(fence_dir):
    data_dir, procs = fence_dir
    procs.append(_task(data_dir, "j-3.1.0"))
    assert fence.lease_state(data_dir, time.monotonic()) == fence.NO_LEASE
    fence.write_lease(data_dir, None)
    assert fence.lease_state(data_dir, time.monotonic()) == fence.UNFENCED
    fence.start_fence(data_dir, [])
    time.sleep(0.5)
    assert procs[0].poll() is None
    (data_dir / fence.LEASE_FILE).write_text("an-earlier-boot 1.0\n")  # a lease of another boot
    assert fence.lease_state(data_dir, time.monotonic()) == fence.NO_LEASE


# ---- a real cluster --------------------------------------------------------------------------------


def _attempt_pids(cluster, job_id: str, attempt: int) -> list[tuple[int, int]]:
    """(pid, start ticks) of every shim of one attempt of a job, from the workers' shim marks."""
    return [(shim.pid, shim.start_ticks) for w in cluster.state["workers"]
            for shim in fence.shims(cluster.worker_dir(w["id"]) / "tasks") if shim.key()[:2] == (job_id, attempt)]


@pytest.mark.slow
def test_a_killed_agents_tasks_are_dead_before_the_gang_runs_elsewhere(make_cluster):
    """kill -9 of a worker agent (not its tasks) under a running 2-task gang: the node is declared
    DOWN and the gang restarts on other nodes; from then on no process of the first attempt is
    alive (sampled for 10 s), and the fence recorded the killed task."""
    cluster = make_cluster(workers=4, racks=2, gpus=8)
    spec = JobSpec(name="fenced", tasks=2, resources=Resources(1000, 1 << 30, 8), command=("sleep", "600"),
                   max_restarts=1)
    job_id = cluster.client.submit(codec.job_spec_to_proto(spec))
    wait_for(lambda: cluster.client.get_job(job_id).status == "RUNNING", timeout=30, what="the gang running")
    first = wait_for(lambda: (lambda p: p if len(p) == 2 else None)(_attempt_pids(cluster, job_id, 1)),
                     timeout=10, what="attempt 1's shim marks")
    victim = cluster.client.get_job(job_id).tasks[0].node_id
    cluster.kill_worker(victim, with_tasks=False)
    wait_for(lambda: (lambda j: j.attempt == 2 and j.status == "RUNNING")(cluster.client.get_job(job_id)),
             timeout=40, what="attempt 2 running")
    assert victim not in {t.node_id for t in cluster.client.get_job(job_id).tasks}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [pid for pid, ticks in first if fence.running(pid, ticks)]
        assert not alive, f"attempt 1's processes {alive} alive beside attempt 2"
        time.sleep(0.2)
    journal = cluster.worker_dir(victim) / TASK_JOURNAL
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    assert any(r["event"] == "fenced" and r["job"] == job_id and r["attempt"] == 1 for r in records), records
    cluster.client.cancel(job_id, reason="test over")


def test_the_fence_module_runs_as_a_program():
    done = subprocess.run([sys.executable, "-m", "synapse.worker.fence"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "usage" in done.stderr


def test_a_task_the_fence_killed_ends_node_lost_for_whoever_reads_its_end(tmp_path):
    """The agent that reads the end may not be the one that ran the task (it was killed, and its
    successor finds the task gone): the fence's mark makes it NodeLost (a requeue, uncharged), not a
    signal's end that fails the gang's job; a task killed by another signal stays a signal's."""
    from synapse.core.model import Assignment, EndReason
    from synapse.worker.runtime import ProcessRuntime

    runtime = ProcessRuntime(tmp_path)
    tasks = [Assignment(job_id="j-9", attempt=1, index=i, rank=i, world_size=2, local_rank=i, local_world_size=1,
                        node_rank=i, master_addr="127.0.0.1", master_port=29500, gpus=(),
                        command=("sleep", "60"), env=())
             for i in range(2)]
    fenced, other = (runtime.start(a) for a in tasks)
    wait_for(lambda: len(fence.live_shims(tmp_path)) == 2, timeout=10, what="both shims' pid files")
    fence.write_lease(tmp_path, time.monotonic() - 1.0)  # ended: the fence kills both at once
    fence.fence_once(tmp_path, [])
    assert not fence.running(fenced.pid, fenced.start_ticks)
    assert runtime.outcome(fenced, tasks[0]).cause == EndReason.NODE_LOST
    (tmp_path / "tasks" / f"j-9.1.1{fence.FENCED_SUFFIX}").unlink()  # as if a signal of someone else's
    end = runtime.outcome(other, tasks[1])
    assert (end.cause, end.exit_code) == (EndReason.SIGNAL, None)


def test_a_shims_mark_names_it_and_an_earlier_releases_pid_file_is_read_too(tmp_path):
    """A shim marks its start with an empty file whose name holds its pid and start ticks (it
    appears whole); the runtime finds a task's shim by it, a restarted agent and the fence too,
    and still reads the "PID TICKS" file an earlier release's shim wrote."""
    from synapse.core.model import Assignment
    from synapse.worker.runtime import ProcessRuntime

    runtime = ProcessRuntime(tmp_path)
    a = Assignment(job_id="exp.pidgin-1", attempt=2, index=0, rank=0, world_size=1, local_rank=0, local_world_size=1,
                   node_rank=0, master_addr="127.0.0.1", master_port=29500, gpus=(), command=("sleep", "60"), env=())
    handle = runtime.start(a)
    try:
        marks = wait_for(lambda: sorted(p.name for p in (tmp_path / "tasks").glob("*.pid.*")), 10, "the shim's mark")
        assert marks == [f"exp.pidgin-1.2.0.pid.{handle.pid}.{handle.start_ticks}"]
        assert (tmp_path / "tasks" / marks[0]).read_bytes() == b""
        found = runtime.find(a)
        assert found is not None and (found.pid, found.start_ticks) == (handle.pid, handle.start_ticks)
        assert [(s.task, s.pid) for s in fence.live_shims(tmp_path)] == [("exp.pidgin-1.2.0", handle.pid)]
        # The same task's mark from a shim that ended (a created task discarded, then created
        # anew) loses to the one that runs.
        (tmp_path / "tasks" / f"exp.pidgin-1.2.0.pid.{handle.pid + 1}.{handle.start_ticks + 5}").touch()
        assert runtime.find(a).pid == handle.pid
    finally:
        os.killpg(handle.pid, signal.SIGKILL)
    # An earlier release's shim: "PID TICKS" in JOB.ATTEMPT.INDEX.pid.
    b = dataclasses.replace(a, job_id="old", attempt=1)
    (tmp_path / "tasks" / "old.1.0.pid").write_text(f"{os.getpid()} {fence.process_start_ticks(os.getpid())}\n")
    found = runtime.find(b)
    assert found is not None and found.pid == os.getpid()
    assert ("old.1.0", os.getpid()) in [(s.task, s.pid) for s in fence.live_shims(tmp_path)]
