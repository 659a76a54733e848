"""Task confinement (issue 16): the cgroup code on fake v1 and v2 trees, the real kernel's cgroups
where this machine lets us write them, and the acceptance test on a real local cluster."""

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
from synapse.worker.isolation import CgroupV1, CgroupV2, IsolationError, Limits, detect
from synapse.worker.runtime import ProcessRuntime, alive, read_outcome

MI = 1 << 20


# ---- parsing /proc ---------------------------------------------------------------------------------

HYBRID_CGROUP = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n2:cpu,cpuacct:/\n0::/\n"
HYBRID_MOUNTS = (
    "30 25 0:26 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n"
    "31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
    "32 25 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    "33 25 0:29 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
    "34 25 0:30 / /proc rw - proc proc rw\n")


def test_proc_files_parse():
    v1, v2 = isolation.parse_proc_cgroup(HYBRID_CGROUP)
    assert v1 == {"name=systemd": "/", "pids": "/", "memory": "/process_api/abc", "cpu": "/", "cpuacct": "/"}
    assert v2 == "/"
    unified, mounts = isolation.parse_mountinfo(HYBRID_MOUNTS)
    assert unified == (Path("/sys/fs/cgroup/unified"), "/")
    assert mounts["cpu"] == (Path("/sys/fs/cgroup/cpu,cpuacct"), "/") and set(mounts) == {"cpu", "memory", "pids"}


def fake_v2(root: Path, own: str = "system.slice/synapse-worker.service", controllers="cpuset cpu io memory pids"):
    """A cgroup2 mount as files: the kernel's side (controllers, procs) written by hand."""
    own_dir = root / own
    own_dir.mkdir(parents=True)
    (own_dir / "cgroup.controllers").write_text(controllers + "\n")
    (own_dir / "cgroup.procs").write_text("")
    (own_dir / "cgroup.subtree_control").write_text("")
    return own_dir


def test_v2_is_chosen_when_it_offers_the_controllers_and_lays_out_task_cgroups(tmp_path):
    own = fake_v2(tmp_path)
    mounts = f"30 25 0:26 / {tmp_path} rw - cgroup2 cgroup2 rw\n"
    cgroups = detect("synapse-w1-x", "0::/system.slice/synapse-worker.service\n", mounts)
    assert isinstance(cgroups, CgroupV2) and cgroups.parents == {"unified": own / "synapse-w1-x"}
    (own / "synapse-w1-x").mkdir()
    procs = cgroups.create("job1.1.0", Limits.of(Resources(cpu=1500, memory=64 * MI), pids=100))
    task = own / "synapse-w1-x" / "job1.1.0"
    assert procs == [task / "cgroup.procs"]
    assert (task / "memory.max").read_text() == str(64 * MI)
    assert (task / "cpu.max").read_text() == "150000 100000"
    assert (task / "pids.max").read_text() == "100"
    (task / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    assert cgroups.oom_kills("job1.1.0") == 1
    assert cgroups.names() == {"job1.1.0"}


def test_v2_swap_is_off_and_no_memory_request_means_no_memory_limit(tmp_path):
    own = fake_v2(tmp_path, own="w")
    cgroups = CgroupV2(tmp_path, own, "g")
    task = own / "g" / "t"
    task.mkdir(parents=True)
    (task / "memory.swap.max").write_text("max")  # the kernel makes these files; the worker only writes them
    (task / "memory.oom.group").write_text("0")
    cgroups.create("t", Limits(memory=0, cpu_millis=0, pids=0))
    assert (task / "memory.max").read_text() == "max" and (task / "memory.swap.max").read_text() == "0"
    assert (task / "memory.oom.group").read_text() == "1"
    assert (task / "cpu.max").read_text() == "max 100000" and (task / "pids.max").read_text() == "max"


def test_v2_agent_leaf_and_missing_controllers(tmp_path):
    own = fake_v2(tmp_path, own="svc/agent")
    (own.parent / "cgroup.controllers").write_text("memory cpu pids\n")
    assert CgroupV2(tmp_path, own, "g").delegated == own.parent  # systemd's DelegateSubgroup=agent
    bare = fake_v2(tmp_path / "b", own="svc", controllers="hugetlb")
    with pytest.raises(IsolationError, match="lacks controller.*memory, cpu, pids"):
        CgroupV2(tmp_path / "b", bare, "g").prepare()


def test_hybrid_machine_without_v2_controllers_falls_back_to_v1(tmp_path):
    unified = tmp_path / "unified"
    fake_v2(unified, own="", controllers="hugetlb")
    mounts = HYBRID_MOUNTS.replace("/sys/fs/cgroup", str(tmp_path))
    cgroups = detect("g", HYBRID_CGROUP, mounts)
    assert isinstance(cgroups, CgroupV1)
    assert cgroups.parents["memory"] == tmp_path / "memory" / "process_api" / "abc" / "g"
    assert cgroups.parents["cpu"] == tmp_path / "cpu,cpuacct" / "g"
    for parent in cgroups.parents.values():
        (parent / "t").mkdir(parents=True)
    (cgroups.parents["memory"] / "t" / "memory.memsw.limit_in_bytes").write_text("")
    cgroups.create("t", Limits(memory=64 * MI, cpu_millis=500, pids=10))
    mem = cgroups.parents["memory"] / "t"
    assert (mem / "memory.limit_in_bytes").read_text() == (mem / "memory.memsw.limit_in_bytes").read_text() \
        == str(64 * MI)
    assert (cgroups.parents["cpu"] / "t" / "cpu.cfs_quota_us").read_text() == "50000"
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert cgroups.oom_kills("t") == 3


def test_nothing_usable_says_what_is_missing(tmp_path):
    with pytest.raises(IsolationError, match="no cgroup v2 hierarchy; cgroup v1 lacks memory, cpu, pids"):
        detect("g", "1:name=systemd:/\n", "")


def test_cpu_quota_has_the_kernels_floor():
    assert Limits(0, 1, 0).cpu_quota_us() == 1000 and Limits(0, 2000, 0).cpu_quota_us() == 200_000
    assert Limits(0, 0, 0).cpu_quota_us() == 0


def test_outcomes_read_from_exit_status_and_oom_count():
    assert read_outcome(137, 1, 64 * MI, "").cause == "OOMKilled"
    assert "64Mi memory limit" in read_outcome(None, 2, 64 * MI, "").detail
    assert read_outcome(0, 0, 0, "").cause == "Completed"
    assert read_outcome(3, 0, 0, "").cause == "Error"
    assert read_outcome(143, 0, 0, "").cause == "Signal"
    assert read_outcome(None, 0, 0, "").cause == "Signal"
    assert read_outcome(125, 0, 0, "cannot join cgroup /x").detail == "cannot join cgroup /x"


# ---- the real kernel -------------------------------------------------------------------------------


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


def fake_proc(tmp_path: Path, mount: Path, own: str) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(f"0::/{own}\n")
    (proc / "mountinfo").write_text(f"30 25 0:26 / {mount} rw - cgroup2 cgroup2 rw\n")
    return proc


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


def test_a_hierarchy_the_worker_may_not_write_is_refused_clearly(tmp_path):
    own = fake_v2(tmp_path / "cg", own="svc")
    (own / "cgroup.subtree_control").unlink()
    (own / "cgroup.subtree_control").mkdir()  # a write there fails, even for root
    proc = fake_proc(tmp_path, tmp_path / "cg", "svc")
    with pytest.raises(IsolationError, match="cannot write '\\+memory \\+cpu \\+pids' to .*subtree_control"):
        isolation.choose("cgroup", "g", proc)
    cgroups, why = isolation.choose("auto", "g", proc)
    assert cgroups is None and why.startswith("none: cgroups unavailable (cannot write")
    assert isolation.choose("none", "g", proc) == (None, "none (--isolation none)")


# ---- acceptance: a local cluster -------------------------------------------------------------------


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
    assert cgroups_of(cgroup, tmp_path, cluster) is None
    cluster.stop()  # a worker that leaves with no task left removes its directory of task cgroups
    assert not any(parent.exists() for parent in isolation.here(
        isolation.group_name("w1", cluster.worker_dir("w1"))).parents.values())


def cgroups_of(name: str, tmp_path: Path, cluster) -> list[int] | None:
    """The pids in worker w1's task cgroup `name`, or None once it is gone."""
    cgroups = isolation.here(isolation.group_name("w1", cluster.worker_dir("w1")))
    return cgroups.pids(name) if cgroups.exists(name) else None
