"""Task confinement on the real kernel: cgroups where this machine lets us write them, the shim, the
sandbox, and the acceptance test on a real local cluster (the cgroup code on fake v1 and v2 trees is
in tests/unit/test_isolation.py)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from synapse.client.cli.main import main as synctl
from synapse.core import codec
from synapse.core.model import Assignment, JobSpec, Resources
from synapse.worker import isolation
from synapse.worker.runtime import ProcessRuntime, alive
from tests.support.helpers import wait_for
from tests.support.isolation import MI


@pytest.fixture
def real_cgroups(tmp_path):
    """This machine's cgroups for one test, or a skip saying why they cannot be used."""
    group = isolation.group_name("test", tmp_path)
    cgroups, why = isolation.choose("auto", group)
    if cgroups is None:
        pytest.skip(f"no writable cgroups here: {why}")
    yield cgroups
    for name in cgroups.names():
        cgroups.remove(name)
    cgroups.close()
    assert not any(parent.exists() for parent in cgroups.parents.values())


def assignment(name: str, command: list[str], memory: int = 0) -> Assignment:
    return Assignment(job_id=name, attempt=1, index=0, rank=0, world_size=1, local_rank=0, local_world_size=1,
                      node_rank=0, master_addr="127.0.0.1", master_port=29500, gpus=(), command=tuple(command),
                      env=(), resources=Resources(cpu=1000, memory=memory))


def wait_exit(runtime: ProcessRuntime, handle, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while alive(handle) and time.monotonic() < deadline:
        runtime.reap()
        time.sleep(0.05)
    assert not alive(handle)


ALLOCATE_400MB = [sys.executable, "-c", "b = bytearray(400 << 20); print('survived', len(b))"]


def test_a_task_over_its_memory_limit_is_oom_killed_and_its_cgroup_goes(tmp_path, real_cgroups):
    runtime = ProcessRuntime(tmp_path, cgroups=real_cgroups)
    a = assignment("oom", ALLOCATE_400MB, memory=64 * MI)
    handle = runtime.start(a)
    assert handle.cgroup and real_cgroups.exists(handle.cgroup)
    wait_exit(runtime, handle)
    end = runtime.outcome(handle, a)
    assert end.cause == "OOMKilled", (end, Path(handle.log_file).read_text())
    assert "survived" not in Path(handle.log_file).read_text()
    runtime.release(handle.cgroup)
    assert not real_cgroups.exists(handle.cgroup) and handle.cgroup not in real_cgroups.names()


def test_a_task_and_its_children_are_in_its_cgroup_and_escapees_die_with_it(tmp_path, real_cgroups):
    runtime = ProcessRuntime(tmp_path, cgroups=real_cgroups)
    # The child leaves the task's process group (setsid), as a daemon would; the cgroup still holds it.
    a = assignment("tree", ["sh", "-c", "setsid sleep 300 & sleep 300"], memory=256 * MI)
    handle = runtime.start(a)
    deadline = time.monotonic() + 5
    while len(real_cgroups.pids(handle.cgroup)) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    members = real_cgroups.pids(handle.cgroup)
    assert handle.pid in members and len(members) >= 3
    runtime.signal(handle, 9)
    wait_exit(runtime, handle)
    runtime.release(handle.cgroup)
    assert not any(os.path.exists(f"/proc/{pid}") and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
                   for pid in members)
    assert runtime.outcome(handle, a).cause == "Signal"


def test_the_shim_refuses_to_run_a_task_it_cannot_confine(tmp_path, real_cgroups):
    runtime = ProcessRuntime(tmp_path, cgroups=real_cgroups)
    marker = tmp_path / "ran"
    a = assignment("refused", ["touch", str(marker)], memory=64 * MI)
    handle = runtime.start(a)
    wait_exit(runtime, handle)
    assert runtime.outcome(handle, a).cause == "Completed" and marker.exists()
    # Now a cgroup that vanished between its creation and the shim joining it.
    real_cgroups_create = real_cgroups.create
    real_cgroups.create = lambda name, limits: [tmp_path / "gone" / "cgroup.procs"]  # type: ignore[method-assign]
    try:
        marker.unlink()
        a = assignment("refused2", ["touch", str(marker)])
        handle = runtime.start(a)
        wait_exit(runtime, handle)
    finally:
        real_cgroups.create = real_cgroups_create  # type: ignore[method-assign]
    end = runtime.outcome(handle, a)
    assert (end.exit_code, end.cause) == (125, "Error") and "cannot join cgroup" in end.detail
    assert not marker.exists()


#: The docs' sandbox (docs/operating/workers.md): bubblewrap (Debian's `bubblewrap`;
#: scripts/install-test-packages.sh), the whole machine read-only, a private /tmp, its own pid
#: namespace. It stays in the foreground, so the shim's cgroup holds it and the task inside it.
BWRAP = "bwrap --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp --unshare-pid --die-with-parent --"


#: The docs' memory hog, in the shell alone: tail keeps a line that never ends, 400MB of it. The
#: sandbox's private /tmp hides an interpreter installed there (a venv under /tmp), so the examples that
#: run inside it name no interpreter of this machine's.
ALLOCATE_400MB_SH = ["sh", "-c", "head -c 400000000 /dev/zero | tail | wc -c"]


def needs_bwrap() -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed (bash scripts/install-test-packages.sh)")


def test_an_external_sandbox_runs_the_task_confined_the_same_way(tmp_path, real_cgroups):
    needs_bwrap()
    runtime = ProcessRuntime(tmp_path, template=BWRAP, cgroups=real_cgroups)
    a = assignment("sandboxed", ["sh", "-c", "echo pid=$$; touch /etc/synapse-x || echo ro"], memory=64 * MI)
    handle = runtime.start(a)
    wait_exit(runtime, handle)
    log = Path(handle.log_file).read_text()
    assert "pid=2" in log and "ro" in log.split()  # its own pid namespace, a read-only root
    assert runtime.outcome(handle, a).cause == "Completed"
    runtime.release(handle.cgroup)
    a = assignment("sandboxed-hog", ALLOCATE_400MB_SH, memory=64 * MI)
    handle = runtime.start(a)
    wait_exit(runtime, handle)
    assert runtime.outcome(handle, a).cause == "OOMKilled", Path(handle.log_file).read_text()


def test_a_command_the_runtime_template_hides_ends_command_not_found_saying_so(tmp_path):
    """A venv under /tmp behind the sandbox's private /tmp: the tool exists here, not inside."""
    needs_bwrap()
    hidden = tmp_path / "venv" / "bin"
    hidden.mkdir(parents=True)
    tool = hidden / "python3"
    tool.write_text("#!/bin/sh\necho ran\n")
    tool.chmod(0o755)
    (tmp_path / "other").mkdir()
    a = assignment("hidden", [str(tool)])
    showing = ProcessRuntime(tmp_path / "w1", template=BWRAP.replace("--tmpfs /tmp", f"--tmpfs {tmp_path / 'other'}"))
    handle = showing.start(a)
    wait_exit(showing, handle)
    assert showing.outcome(handle, a).cause == "Completed"
    hiding = ProcessRuntime(tmp_path / "w2", template=BWRAP.replace("--tmpfs /tmp", f"--tmpfs {tmp_path / 'venv'}"))
    handle = hiding.start(a)
    wait_exit(hiding, handle)
    assert "execvp" in Path(handle.log_file).read_text()
    end = hiding.outcome(handle, a)
    assert end.cause == "CommandNotFound" and end.exit_code == 1
    assert end.detail.startswith(f"{tool} exists on this machine but the worker's runtime template (--runtime) "
                                 "hides it")
    # A command that ran and failed on its own stays an Error, template or not.
    a = assignment("fails", ["sh", "-c", "exit 1"])
    handle = hiding.start(a)
    wait_exit(hiding, handle)
    assert hiding.outcome(handle, a).cause == "Error"


def test_a_command_that_is_nowhere_ends_command_not_found(tmp_path):
    runtime = ProcessRuntime(tmp_path)
    for name, command, cause in (("bare", ["no-such-command-x"], "CommandNotFound"),
                                 ("path", [str(tmp_path / "gone")], "CommandNotFound"),
                                 ("own", ["sh", "-c", "exit 127"], "Error")):
        a = assignment(name, command)
        handle = runtime.start(a)
        wait_exit(runtime, handle)
        end = runtime.outcome(handle, a)
        assert (end.exit_code, end.cause) == (127, cause), end
        assert end.detail == (f"{command[0]}: no such command on this machine" if cause == "CommandNotFound" else "")


def test_a_job_naming_a_command_that_is_nowhere_fails_command_not_found(make_cluster):
    """The worker's typed cause reaches the job once every replica knows it (versions.CAUSE_VERSIONS)."""
    cluster = make_cluster(workers=1, racks=1, gpus=0)
    spec = JobSpec(name="typo", tasks=1, resources=Resources(cpu=100), command=("no-such-command-x", "--epochs", "3"))
    job_id = cluster.client.submit(codec.job_spec_to_proto(spec))
    deadline = time.monotonic() + 20
    while cluster.client.get_job(job_id).status != "FAILED" and time.monotonic() < deadline:
        time.sleep(0.1)
    info = cluster.client.get_job(job_id)
    assert info.status == "FAILED" and info.tasks[0].reason == "CommandNotFound", info
    assert info.tasks[0].reason_message == "exit code 127; no-such-command-x: no such command on this machine"


@pytest.mark.slow
def test_oom_killed_task_fails_its_job_and_spares_its_neighbour(make_cluster, tmp_path):
    """Done when: a 1-task job with memory 64Mi allocating 400 MB ends FAILED within 20 s with its
    task's reason OOMKilled, while another job's task on the same node keeps running."""
    probe, why = isolation.choose("auto", isolation.group_name("probe", tmp_path))
    if probe is None:
        pytest.skip(f"no writable cgroups here: {why}")
    probe.close()
    cluster = make_cluster(workers=1, racks=1, gpus=0, heartbeat_timeout=8.0)  # its agent restarts under a task
    node = cluster.client.list_nodes()[0]
    assert node.isolation.startswith("cgroup v"), node.isolation

    def submit(name: str, command: list[str]) -> str:
        spec = JobSpec(name=name, tasks=1, resources=Resources(cpu=500, memory=64 * MI), command=tuple(command))
        return cluster.client.submit(codec.job_spec_to_proto(spec))

    neighbour = submit("neighbour", ["sleep", "300"])
    deadline = time.monotonic() + 20
    while cluster.client.get_job(neighbour).status != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cluster.client.get_job(neighbour).status == "RUNNING"
    hog = submit("hog", ALLOCATE_400MB)
    started = time.monotonic()
    while cluster.client.get_job(hog).status != "FAILED" and time.monotonic() - started < 20:
        time.sleep(0.1)
    info = cluster.client.get_job(hog)
    assert info.status == "FAILED", info
    assert time.monotonic() - started < 20
    assert info.tasks[0].reason == "OOMKilled" and "64Mi memory limit" in info.tasks[0].reason_message
    assert info.failure.startswith("task 0 (rank 0) on w1: OOMKilled")
    assert cluster.client.get_job(neighbour).status == "RUNNING"
    state = json.loads((cluster.worker_dir("w1") / "worker-state.json").read_text())
    (pid,) = [t["handle"]["pid"] for t in state["tasks"] if t["assignment"]["job_id"] == neighbour]
    assert Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    # synctl shows the reason per task, and which task failed first.
    out = CliRunner().invoke(synctl, ["describe", "job", hog, "-o", "json"], env=cluster.env)
    described = json.loads(out.output)
    assert described["tasks"][0]["reason"] == "OOMKilled" and "OOMKilled" in described["failure"]
    table = CliRunner().invoke(synctl, ["describe", "job", hog], env=cluster.env).output
    assert "OOMKilled" in table and "Failed:" in table

    # A restarted agent re-adopts the live task with its cgroup; a cancel then ends it Cancelled and
    # its cgroup goes.
    cgroup = [t["handle"]["cgroup"] for t in state["tasks"] if t["assignment"]["job_id"] == neighbour][0]
    assert cgroup and pid in cgroups_of(cgroup, tmp_path, cluster)
    cluster.kill_worker("w1", with_tasks=False)
    cluster.restart_worker("w1")
    deadline = time.monotonic() + 20
    log = cluster.data_dir / "logs" / "w1.log"
    while f"re-adopting task=('{neighbour}', 1, 0) pid={pid} alive=True cgroup={cgroup}" not in log.read_text() \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"cgroup={cgroup}" in log.read_text()
    cluster.client.cancel(neighbour, "done")
    while cluster.client.get_job(neighbour).status != "CANCELLED" and time.monotonic() < deadline:
        time.sleep(0.1)
    info = cluster.client.get_job(neighbour)
    assert info.status == "CANCELLED" and info.tasks[0].reason == "Cancelled"
    # Removed a moment after the end (tasks.RELEASE_AFTER_S: not inside the next gang's start).
    wait_for(lambda: cgroups_of(cgroup, tmp_path, cluster) is None, 10, "the ended task's cgroup to go")
    cluster.stop()  # a worker that leaves with no task left removes its directory of task cgroups
    assert not any(parent.exists() for parent in isolation.here(
        isolation.group_name("w1", cluster.worker_dir("w1"))).parents.values())


def cgroups_of(name: str, tmp_path: Path, cluster) -> list[int] | None:
    """The pids in worker w1's task cgroup `name`, or None once it is gone."""
    cgroups = isolation.here(isolation.group_name("w1", cluster.worker_dir("w1")))
    return cgroups.pids(name) if cgroups.exists(name) else None
