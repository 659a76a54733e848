"""Task confinement (issue 16): the cgroup code on fake v1 and v2 trees (the real kernel's cgroups and
the acceptance test on a real local cluster: tests/cluster/test_isolation.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from synapse.core.model import Resources
from synapse.worker import isolation
from synapse.worker.isolation import CgroupV1, CgroupV2, IsolationError, Limits, detect
from synapse.worker.runtime import read_outcome
from tests.support.isolation import MI

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


def fake_proc(tmp_path: Path, mount: Path, own: str) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(f"0::/{own}\n")
    (proc / "mountinfo").write_text(f"30 25 0:26 / {mount} rw - cgroup2 cgroup2 rw\n")
    return proc


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


