"""Tasks inside images: the built-in container runtime's plan (pure), the sandbox on a real root
file system, and jobs from images on a real local cluster."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from synapse.core.jobs.jobspec import JobFileError
from synapse.core.model import Assignment, JobStatus
from synapse.worker import container
from synapse.worker.container import ContainerRefused, Mount
from synapse.worker.runtime import ProcessRuntime, alive
from tests.support import paths
from tests.support.cluster import start_worker
from tests.support.helpers import wait_for
from tests.support.images import (
    APPLETS,
    BUSYBOX_ON_PATH,
    busybox_root,
    finished,
    needs_root_fs,
    parse,
    submit,
    task_logs,
)


def assignment(**kw) -> Assignment:
    fields = dict(job_id="j1", attempt=1, index=0, rank=0, world_size=1, local_rank=0, local_world_size=1,
                  node_rank=0, master_addr="127.0.0.1", master_port=0, gpus=(), command=(), env=(),
                  image="dir:/images/x")
    fields.update(kw)
    return Assignment(**fields)


def image(root: Path, env=(), working_dir="", entrypoint=(), cmd=(), user="") -> SimpleNamespace:
    """What the store's `ensure` returns, as far as the runtime reads it."""
    return SimpleNamespace(root=root, config=SimpleNamespace(env=env, working_dir=working_dir, entrypoint=entrypoint,
                                                             cmd=cmd, user=user))


def plan(tmp_path: Path, **kw) -> container.ContainerSpec:
    args = dict(task_dir=tmp_path / "task", image_root="/images/x", image_env=(), working_dir="", entrypoint=(),
                cmd=(), command=("true",), task_env={}, gpus=(), mounts=(), allowed_mounts=(), cdi_specs=())
    args.update(kw)
    return container.plan(**args)


# ---- the plan (pure) ------------------------------------------------------------------------------

def test_the_jobs_command_replaces_entrypoint_and_cmd_and_without_one_the_image_runs_its_own(tmp_path):
    assert plan(tmp_path, command=("python", "x.py"), entrypoint=("/init",), cmd=("serve",)).argv == ("python", "x.py")
    assert plan(tmp_path, command=(), entrypoint=("/init",), cmd=("serve", "-v")).argv == ("/init", "serve", "-v")
    assert plan(tmp_path, command=(), cmd=("sh",)).argv == ("sh",)
    with pytest.raises(ContainerRefused, match="no command"):
        plan(tmp_path, command=())


def test_env_layers_image_then_job_then_synapse_and_workdir_from_the_image(tmp_path):
    spec = plan(tmp_path, image_env=("PATH=/opt/bin:/bin", "A=image", "B=image"), working_dir="/srv",
                task_env={"B": "job", "RANK": "3"})
    assert spec.env == {"PATH": "/opt/bin:/bin", "A": "image", "B": "job", "RANK": "3"}
    assert spec.cwd == "/srv"
    assert plan(tmp_path).env["PATH"] == container.DEFAULT_PATH and plan(tmp_path).cwd == "/"


def test_mounts_only_under_allowed_prefixes(tmp_path):
    data = tmp_path / "data"
    (data / "set").mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    (data / "link").symlink_to(tmp_path / "secret")
    ok = Mount(str(data / "set"), "/data", True)
    assert plan(tmp_path, mounts=(ok,), allowed_mounts=(str(data),)).mounts == (ok,)
    refusals = [
        (Mount(str(tmp_path / "secret"), "/s"), (str(data),), "not under a prefix this worker allows"),
        (Mount(str(data / "link"), "/s"), (str(data),), "not under a prefix"),  # a link out of the prefix
        (Mount(str(data / "set"), "/data"), (), "allows no mounts"),
        (Mount(str(data / "gone"), "/data"), (str(data),), "no such file"),
        (Mount(str(data / "set"), "/proc/x"), (str(data),), "belongs to the runtime"),
        (Mount(str(data / "set"), "/"), (str(data),), "belongs to the runtime"),
        (Mount("data/set", "/data"), (str(data),), "absolute"),
        (Mount(str(data) + "/../secret", "/data"), (str(data),), "'..'"),
    ]
    for mount, allowed, why in refusals:
        with pytest.raises(ContainerRefused, match=why):
            plan(tmp_path, mounts=(mount,), allowed_mounts=allowed)


def test_gpus_without_cdi_only_the_tasks_own_devices_and_the_control_ones(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (dev / name).write_text("")
    libs = tmp_path / "lib"
    libs.mkdir()
    (libs / "libcuda.so.550.1").write_text("")
    (libs / "libc.so.6").write_text("")
    spec = plan(tmp_path, gpus=(1, 2), dev_root=str(dev), lib_dirs=(str(libs),))
    assert [d.target for d in spec.devices] == ["/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    assert [m.target for m in spec.mounts] == [f"{container.DRIVER_LIB_DIR}/libcuda.so.550.1"]
    assert spec.mounts[0].readonly and spec.env["LD_LIBRARY_PATH"] == container.DRIVER_LIB_DIR
    assert plan(tmp_path, dev_root=str(dev), lib_dirs=(str(libs),)).devices == ()  # no GPUs: no devices


def test_the_driver_libraries_are_scanned_again_once_a_lib_dir_changes(tmp_path):
    libs = tmp_path / "lib"
    libs.mkdir()
    (libs / "libcuda.so.550.1").write_text("")
    settled = time.time_ns() - 10 * container.SETTLED_NS
    os.utime(libs, ns=(settled, settled))  # so the scan is kept
    assert [m.target for m in container.driver_mounts((str(libs),))] == [f"{container.DRIVER_LIB_DIR}/libcuda.so.550.1"]
    assert container._driver_libs[(str(libs),)][0] == (settled,)
    (libs / "libnvidia-ml.so.550.1").write_text("")  # a driver installed beside it
    (libs / "libcuda.so.550.1").unlink()
    assert [m.target for m in container.driver_mounts((str(libs),))] == [
        f"{container.DRIVER_LIB_DIR}/libnvidia-ml.so.550.1"]


def test_a_cdi_spec_decides_devices_mounts_and_env_and_its_hooks_are_skipped(tmp_path):
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.yaml").write_text("""
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
- name: "1"
  containerEdits: {deviceNodes: [{path: /dev/nvidia1, hostPath: /host/dev/nvidia1}]}
containerEdits:
  env: [NVIDIA_VISIBLE_DEVICES=void, CDI_SEEN=yes]
  deviceNodes: [{path: /dev/nvidiactl}]
  mounts: [{hostPath: /host/lib/libcuda.so.1, containerPath: /usr/lib/libcuda.so.1, options: [ro, nosuid]}]
  hooks: [{hookName: createContainer, path: /usr/bin/nvidia-ctk, args: [nvidia-ctk, hook, update-ldcache]}]
""")
    (cdi / "other.json").write_text(json.dumps({"kind": "example.com/nic", "devices": []}))
    (cdi / "broken.json").write_text("{")
    spec = plan(tmp_path, gpus=(1,), cdi_specs=container.load_cdi_specs([str(cdi), str(tmp_path / "none")]),
                task_env={"CDI_SEEN": "job"})
    assert spec.devices == (Mount("/dev/nvidiactl", "/dev/nvidiactl"), Mount("/host/dev/nvidia1", "/dev/nvidia1"))
    assert spec.mounts == (Mount("/host/lib/libcuda.so.1", "/usr/lib/libcuda.so.1", True),)
    assert spec.env["NVIDIA_VISIBLE_DEVICES"] == "void" and spec.env["CDI_SEEN"] == "job"
    assert spec.skipped == ("hook createContainer /usr/bin/nvidia-ctk",)


def test_jobspec_mounts_and_no_command_with_an_image():
    spec = parse("name: x\ntasks: 1\nresources: {cpu: 1}\nimage: dir:/images/x\n"
                             "mounts: [{source: /data/set, target: /data, readonly: true}, {source: /scratch}]\n")
    assert spec.command == () and spec.mounts == (("/data/set", "/data", True), ("/scratch", "/scratch", False))
    assert spec.has_image_run
    bad = {
        "name: x\ntasks: 1\nresources: {cpu: 1}\n": "command",
        "name: x\ntasks: 1\nresources: {cpu: 1}\ncommand: [a]\nmounts: [{source: /d}]\n": "need an image",
        "name: x\ntasks: 1\nresources: {cpu: 1}\nimage: dir:/i\nmounts: [{source: d}]\n": "absolute",
        "name: x\ntasks: 1\nresources: {cpu: 1}\nimage: dir:/i\nmounts: [{source: /d/../e}]\n": "'..'",
        "name: x\ntasks: 1\nresources: {cpu: 1}\nimage: dir:/i\nmounts: [{source: /d, rw: true}]\n": "mounts\\[0\\]",
    }
    for text, why in bad.items():
        with pytest.raises(JobFileError, match=why):
            parse(text)


def test_placement_prefers_nodes_that_hold_the_image_among_equally_good_ones():
    import dataclasses

    from synapse.core import commands as c
    from synapse.core.model import Placement
    from synapse.core.schedule.placement import ClusterView, place
    from tests.support.helpers import checked, cluster, spec

    state = cluster(racks=2, nodes_per_rack=2)
    image = "registry.example/train:1"
    ran = dataclasses.replace(spec(gpu=1), image=image)
    checked(state, c.SubmitJob(at=0, job_id="ran", request_id="ran", spec=ran))
    checked(state, c.CommitPlan(at=0, job_id="ran", attempt=1, placements=(Placement(0, "r1-n1", (0,), 0),)))
    checked(state, c.TaskPrepared(at=1, job_id="ran", attempt=1, index=0, node_id="r1-n1"))
    checked(state, c.TaskExited(at=2, job_id="ran", attempt=1, index=0, node_id="r1-n1", exit_code=0))

    def nodes(job_spec):
        result = place(ClusterView(state.nodes, state.index, state.levels, state.jobs), "j", 1, job_spec)
        return [p.node_id for p in result.plan.placements]

    one_node = dataclasses.replace(spec(gpu=8), image=image)
    assert nodes(one_node) == ["r1-n1"]  # every node is as tight: the one holding the image
    assert nodes(dataclasses.replace(one_node, image="other:1")) == ["r0-n0"]  # no holder: as before
    assert nodes(dataclasses.replace(spec(tasks=2, gpu=8), image=image)) == ["r1-n0", "r1-n1"]  # its rack
    # Never a looser fit for it: a node with exactly the room left wins over the holder.
    checked(state, c.SubmitJob(at=3, job_id="busy", request_id="busy", spec=spec(gpu=4)))
    checked(state, c.CommitPlan(at=3, job_id="busy", attempt=1, placements=(Placement(0, "r0-n1", (0, 1, 2, 3), 0),)))
    assert nodes(dataclasses.replace(spec(gpu=4), image=image)) == ["r0-n1"]


def gang_in_image(state, job_id: str = "g", **kw):
    """A 2-task gang in an image, committed on r0-n0 and r0-n1 at t=10."""
    import dataclasses

    from synapse.core import commands as c
    from synapse.core.model import Placement
    from tests.support.helpers import checked, spec

    job_spec = dataclasses.replace(spec(tasks=2, gpu=8, max_restarts=3), image="registry.example/train:1", **kw)
    checked(state, c.SubmitImageJob(at=0, job_id=job_id, request_id=job_id, spec=job_spec)
            if job_spec.has_image_run else c.SubmitJob(at=0, job_id=job_id, request_id=job_id, spec=job_spec))
    checked(state, c.CommitPlan(at=10, job_id=job_id, attempt=1, placements=(
        Placement(0, "r0-n0", tuple(range(8)), 0), Placement(1, "r0-n1", tuple(range(8)), 1))))
    return state.jobs[job_id]


def test_a_gang_is_held_until_every_task_is_prepared_and_only_from_version_4():
    from synapse.core import commands as c
    from synapse.master.dispatch import assignments_for_node as assignments_for
    from tests.support.helpers import checked, cluster

    state = cluster(racks=1, nodes_per_rack=2)
    job = gang_in_image(state)
    assert not any(a.hold for a in assignments_for(state, "r0-n0"))  # version 1: nothing would release it
    checked(state, c.SetClusterVersion(at=11, version=4))
    assert [a.hold for a in assignments_for(state, "r0-n0")] == [True]
    checked(state, c.TaskPrepared(at=12, job_id="g", attempt=1, index=0, node_id="r0-n0"))
    assert [a.hold for a in assignments_for(state, "r0-n1")] == [True]
    assert checked(state, c.TaskPrepared(at=13, job_id="g", attempt=1, index=1, node_id="r0-n0")).ok is False
    checked(state, c.TaskPrepared(at=13, job_id="g", attempt=1, index=1, node_id="r0-n1"))
    assert [a.hold for a in assignments_for(state, "r0-n0") + assignments_for(state, "r0-n1")] == [False, False]
    assert job.events[-1].kind == "ImageReady"


def test_a_gangs_reports_wake_its_watchers_only_when_they_change_its_lists():
    from synapse.core import commands as c
    from synapse.master.dispatch import assignments_for_node as assignments_for
    from synapse.master.dispatch import nodes_relisted
    from tests.support.helpers import checked, cluster

    watched = ("r0-n0", "r0-n1", "r0-n2")

    def relisted(state, cmd) -> set[str]:
        """The nodes `cmd` wakes; every node whose list it changed must be one of them."""
        before = {n: assignments_for(state, n) for n in watched}
        checked(state, cmd)
        woken = nodes_relisted(state, [cmd], watched)
        assert {n for n in watched if assignments_for(state, n) != before[n]} <= woken
        return woken

    state = cluster(racks=1, nodes_per_rack=3)
    checked(state, c.SetClusterVersion(at=1, version=4))
    gang_in_image(state)  # on r0-n0 and r0-n1
    both = {"r0-n0", "r0-n1"}
    assert relisted(state, c.TaskPrepared(at=12, job_id="g", attempt=1, index=0, node_id="r0-n0")) == set()
    assert relisted(state, c.TaskPrepared(at=13, job_id="g", attempt=1, index=1, node_id="r0-n1")) == both  # release
    assert relisted(state, c.TaskStarted(at=14, job_id="g", attempt=1, index=0, node_id="r0-n0")) == set()
    assert relisted(state, c.TaskStarted(at=15, job_id="g", attempt=1, index=1, node_id="r0-n1")) == both  # RUNNING
    assert relisted(state, c.TaskExited(at=16, job_id="g", attempt=1, index=0, node_id="r0-n0", exit_code=1)) == both
    assert nodes_relisted(state, [c.NodeDown(at=17, node_id="r0-n2")], watched) == set(watched)
    # a task started unprepared (an older worker) counts as holding the image: it may release the gang
    state = cluster(racks=1, nodes_per_rack=3)
    checked(state, c.SetClusterVersion(at=1, version=4))
    gang_in_image(state)
    assert relisted(state, c.TaskStarted(at=12, job_id="g", attempt=1, index=0, node_id="r0-n0")) == both
    assert relisted(state, c.TaskStarted(at=13, job_id="g", attempt=1, index=1, node_id="r0-n1")) == both


def test_a_job_of_one_task_is_never_held_it_starts_as_its_image_arrives():
    import dataclasses

    from synapse.core import commands as c
    from synapse.core.model import Placement
    from synapse.master.dispatch import assignments_for_node as assignments_for
    from tests.support.helpers import checked, cluster, spec

    state = cluster(racks=1, nodes_per_rack=3)
    checked(state, c.SetClusterVersion(at=1, version=4))
    one = dataclasses.replace(spec(tasks=1, gpu=8), image="registry.example/train:1")
    checked(state, c.SubmitJob(at=2, job_id="one", request_id="one", spec=one))
    checked(state, c.CommitPlan(at=3, job_id="one", attempt=1, placements=(Placement(0, "r0-n2", tuple(range(8)), 0),)))
    assert [a.hold for a in assignments_for(state, "r0-n2")] == [False]
    gang_in_image(state, "two")  # on r0-n0 and r0-n1
    assert [a.hold for a in assignments_for(state, "r0-n0")] == [True]


def test_image_pull_failed_fails_a_reference_and_requeues_a_node_uncharged_without_it():
    from synapse.core import commands as c
    from tests.support.helpers import checked, cluster

    state = cluster(racks=1, nodes_per_rack=4)
    job = gang_in_image(state, "ref")
    checked(state, c.TaskExited(at=20, job_id="ref", attempt=1, index=0, node_id="r0-n0", exit_code=127,
                                reason="NOT_FOUND: no such tag", cause="ImagePullFailed"))
    checked(state, c.TaskExited(at=21, job_id="ref", attempt=1, index=1, node_id="r0-n1", exit_code=143))
    assert job.status is JobStatus.FAILED and job.attempt == 1 and "ImagePullFailed" in job.failure
    node = gang_in_image(state, "node")
    checked(state, c.TaskExited(at=30, job_id="node", attempt=1, index=1, node_id="r0-n1", exit_code=127,
                                reason="UNREACHABLE", cause="ImagePullFailed", node_side=True))
    checked(state, c.TaskExited(at=31, job_id="node", attempt=1, index=0, node_id="r0-n0", exit_code=143))
    assert (node.status, node.attempt, node.restarts_used(), node.excluded_nodes) == \
        (JobStatus.PENDING, 2, 0, ("r0-n1",))


def test_the_leader_ends_an_attempt_whose_image_is_late_past_its_pull_timeout():
    from synapse.core import commands as c
    from synapse.core.brain.leader_state import LeaderState
    from synapse.core.brain.stimuli import MonitorDue
    from synapse.core.model import EndReason
    from tests.support.helpers import checked, cluster

    state = cluster(racks=1, nodes_per_rack=2)
    gang_in_image(state, image_pull_timeout=60.0)
    checked(state, c.TaskPrepared(at=12, job_id="g", attempt=1, index=0, node_id="r0-n0"))
    brain = LeaderState()

    def proposed(at: float, version: int = 4):
        return [i.cmd for i in brain.handle(state, MonitorDue(at=at, mono=at, cluster_version=version))
                if isinstance(getattr(i, "cmd", None), c.FailAttempt)]

    assert proposed(70) == [] and proposed(71, version=3) == []  # within its timeout; before version 4
    [fail] = proposed(71)
    assert (fail.job_id, fail.attempt, fail.cause, fail.final) == ("g", 1, EndReason.IMAGE_PULL_FAILED, False)
    assert "TIMEOUT" in fail.reason and "r0-n1" in fail.reason and "r0-n0" not in fail.reason


def test_worker_state_reports_a_held_task_prepared_once_and_a_pull_failure_with_its_side():
    from synapse.worker import state as ws

    s = ws.WorkerState()
    a, b = assignment(hold=True), assignment(index=1, hold=True)
    assert s.handle(ws.AssignmentsReceived(1, 1, (a, b)), now=0) == [ws.Start(a), ws.Start(b)]
    assert s.handle(ws.ImageReady(a.key, "image"), now=1) == [ws.Create(a, "image")]  # held: created, not started
    assert s.handle(ws.TaskCreated(a.key, "created"), now=1) == [] and s.unreported == []
    assert s.handle(ws.TaskSetUp(a.key), now=1) == []  # at its gate
    assert s.unreported == [ws.Report(a.key, started=False, prepared=True)]
    assert s.handle(ws.ImageFailed(b.key, "node n: UNREACHABLE", node_side=True), now=2) == []
    assert s.unreported[-1] == ws.Report(b.key, started=False, exit_code=127, reason="node n: UNREACHABLE",
                                         cause="ImagePullFailed", node_side=True)
    assert s.handle(ws.ImageReady(b.key, "image"), now=3) == [ws.Unpin(b.key)]  # ended: nothing more to say
    assert len(s.unreported) == 2 and b.key in s.done
    s.validate()


# ---- the sandbox on a real root file system -----------------------------------------------------------

def run_task(runtime: ProcessRuntime, a: Assignment, img, timeout: float = 30.0, stop_after: float = 0.0):
    handle = runtime.start(a, img)
    deadline = time.monotonic() + timeout
    if stop_after:
        time.sleep(stop_after)
        runtime.signal(handle, signal.SIGTERM)
    while alive(handle) and time.monotonic() < deadline:
        runtime.reap()
        time.sleep(0.02)
    assert not alive(handle), "the task did not end"
    return runtime.outcome(handle, a), Path(handle.log_file).read_text()


@needs_root_fs
def test_a_task_sees_the_image_its_env_and_workdir_and_writes_to_a_layer_of_its_own(tmp_path):
    root = busybox_root(tmp_path / "root")
    runtime = ProcessRuntime(tmp_path / "w")
    img = image(root, env=("FROM_IMAGE=1", "B=image"), working_dir="/work",
                entrypoint=("sh", "-c"), cmd=("cat /etc/os-release; pwd; echo B=$B I=$FROM_IMAGE R=$RANK; "
                                              "echo scratch > /etc/new; grep NoNewPrivs /proc/self/status; "
                                              "echo pid=$$; ls /dev",))
    a = assignment(env=(("B", "job"),))
    end, log = run_task(runtime, a, img)
    assert end.cause == "Completed", log
    assert "NAME=imgrun-test 1" in log and "/work\n" in log and "B=job I=1 R=0" in log
    assert "NoNewPrivs:\t1" in log and "pid=2" in log  # pid 1 is the sandbox's init
    devices = set(log.split("pid=2\n", 1)[1].split())
    assert {"null", "zero", "full", "random", "urandom", "tty", "shm", "pts"} <= devices
    assert not any(d.startswith("nvidia") or d.startswith("sd") for d in devices)
    assert not (root / "etc" / "new").exists()  # the image stays as it was
    runtime.dispose(a)
    assert not runtime.container_dir(a).exists()


@needs_root_fs
def test_a_missing_command_ends_command_not_found_and_a_sigterm_reaches_the_task(tmp_path):
    root = busybox_root(tmp_path / "root")
    runtime = ProcessRuntime(tmp_path / "w")
    a = assignment(command=("train.py",))
    end, log = run_task(runtime, a, image(root))
    assert (end.exit_code, end.cause) == (127, "CommandNotFound") and "no such command in the image" in end.detail
    # The task's own handler runs and its own exit status is what the shim records.
    b = assignment(attempt=2, command=("sh", "-c", "trap 'echo saved; exit 7' TERM; echo ready; sleep 30 & wait"))
    end, log = run_task(runtime, b, image(root), stop_after=1.5)
    assert (end.exit_code, end.cause) == (7, "Error") and "saved" in log, log


@needs_root_fs
def test_a_created_task_runs_its_command_only_once_its_gate_opens(tmp_path):
    root = busybox_root(tmp_path / "root")
    runtime = ProcessRuntime(tmp_path / "w")
    a = assignment(command=("sh", "-c", "echo ran; echo written > /marker"))
    handle = runtime.start(a, image(root), gated=True)
    gate = runtime.gate_path(a)
    assert gate.exists() and not str(gate).startswith(str(runtime.container_dir(a) / "rootfs"))
    # Its set-up done, it says so and waits there: the command has not run.
    assert runtime.wait_set_up(runtime.gates["j1.1.0"])
    time.sleep(0.5)
    assert alive(handle) and "ran" not in Path(handle.log_file).read_text()
    assert not (runtime.container_dir(a) / "upper" / "marker").exists()
    runtime.open_gate(a)
    assert not gate.exists()
    end, log = run_task_end(runtime, handle, a)
    assert end.cause == "Completed" and log == "ran\n", log
    assert ProcessRuntime(tmp_path / "w").find(a).pid == handle.pid  # opened: a restarted worker adopts it
    # A gate opened before the sandbox has even started its set-up: the byte waits for it.
    b = assignment(index=1, command=("sh", "-c", "echo ran early"))
    early = runtime.start(b, image(root), gated=True)
    runtime.open_gate(b)
    end, log = run_task_end(runtime, early, b)
    assert end.cause == "Completed" and log == "ran early\n", log


def run_task_end(runtime: ProcessRuntime, handle, a: Assignment, timeout: float = 30.0):
    wait_for(lambda: not alive(handle) or runtime.reap(), timeout, "the task to end")
    return runtime.outcome(handle, a), Path(handle.log_file).read_text()


@needs_root_fs
def test_a_created_task_discarded_or_left_by_a_restarted_worker_never_runs(tmp_path):
    root = busybox_root(tmp_path / "root")
    runtime = ProcessRuntime(tmp_path / "w")
    a, b = (assignment(index=i, command=("sh", "-c", "echo ran")) for i in (0, 1))
    handle_a, handle_b = runtime.start(a, image(root), gated=True), runtime.start(b, image(root), gated=True)
    runtime.discard(a, handle_a)  # a stop before its gang started: SIGKILL, nothing to save
    assert not alive(handle_a) and not runtime.gate_path(a).exists() and len(runtime.gates) == 1
    # A restarted worker (a new runtime: it holds no gate) finds b created, never opened: not adopted.
    wait_for(lambda: runtime.task_files(b)[1].exists(), 30, "the shim's pid file")
    assert ProcessRuntime(tmp_path / "w").find(b) is None
    wait_for(lambda: not alive(handle_b) or runtime.reap(), 30, "the created task to be killed")
    assert not runtime.container_dir(b).exists()
    time.sleep(0.3)
    assert "ran" not in Path(handle_a.log_file).read_text() + Path(handle_b.log_file).read_text()
    runtime.discard(b, handle_b)  # the old runtime's gate goes too
    # The worker that created it dies (its end of the gate closes): the sandbox ends, its command unrun.
    c = assignment(index=2, command=("sh", "-c", "echo ran"))
    handle_c = runtime.start(c, image(root), gated=True)
    runtime.gates.pop("j1.1.2").close()
    end, log = run_task_end(runtime, handle_c, c)
    assert (end.exit_code, end.cause) == (125, "Error") and "gate was closed" in end.detail and "ran" not in log


@needs_root_fs
@pytest.mark.skipif(os.geteuid() != 0, reason="a worker that is not root runs every task as root of its namespace")
def test_the_images_user_runs_the_task_and_an_unknown_one_is_refused(tmp_path):
    root = busybox_root(tmp_path / "root")
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\napp:x:1234:1234::/home/app:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\nstaff:x:50:\n")
    runtime = ProcessRuntime(tmp_path / "w")
    probe = ("sh", "-c", "id -u; id -g; echo HOME=$HOME")
    end, log = run_task(runtime, assignment(command=probe), image(root, user="app"))
    assert end.cause == "Completed" and log.split() == ["1234", "1234", "HOME=/home/app"], log
    end, log = run_task(runtime, assignment(attempt=2, command=probe), image(root, user="app:staff"))
    assert log.split() == ["1234", "50", "HOME=/home/app"], log
    end, log = run_task(runtime, assignment(attempt=3, command=probe), image(root, user="4321:4321"))
    assert log.split() == ["4321", "4321", "HOME=/"], log
    end, log = run_task(runtime, assignment(attempt=4, command=probe), image(root, user="ghost"))
    assert (end.exit_code, end.cause) == (125, "Error") and "user ghost: not in the image's /etc/passwd" in end.detail


@needs_root_fs
def test_mounts_and_gpu_devices_inside_the_task(tmp_path, monkeypatch):
    root = busybox_root(tmp_path / "root")
    data = tmp_path / "data"
    data.mkdir()
    (data / "input.txt").write_text("dataset\n")
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (dev / name).write_text(name)
    monkeypatch.setenv(container.DEV_ROOT_HOOK, str(dev))
    runtime = ProcessRuntime(tmp_path / "w", allow_mounts=(str(data),), cdi_dirs=())
    a = assignment(gpus=(1,), mounts=((str(data), "/mnt/data", True),),
                   command=("sh", "-c", "cat /mnt/data/input.txt; ls /dev; touch /mnt/data/x || echo read-only"))
    end, log = run_task(runtime, a, image(root))
    assert end.cause == "Completed", log
    assert "dataset" in log and "read-only" in log and not (data / "x").exists()
    assert "nvidia1" in log and "nvidiactl" in log and "nvidia0" not in log
    refused = assignment(attempt=2, mounts=((str(tmp_path), "/mnt/all", False),), command=("true",))
    with pytest.raises(ContainerRefused, match="not under a prefix"):
        runtime.start(refused, image(root))


@needs_root_fs
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
                    reason="needs root (to become nobody), setpriv and the system's python3")
def test_a_worker_that_is_not_root_runs_tasks_in_a_user_namespace():
    import subprocess
    import tempfile

    from synapse.worker.runtime import SANDBOX
    base = Path(tempfile.mkdtemp(prefix="synapse-userns-"))
    try:
        os.chmod(base, 0o755)
        root = busybox_root(base / "root")
        spec = plan(base, image_root=str(root), task_dir=base / "task",
                    command=("sh", "-c", "id -u; cat /proc/self/uid_map; echo kept > /new; cat /new; "
                                         "grep NoNewPrivs /proc/self/status"))
        spec_file = container.prepare(base / "task", spec)
        launcher = shutil.copy(SANDBOX, base / "sandbox.py")  # readable by nobody wherever the checkout is
        for path in [base, *base.rglob("*")]:
            os.lchown(path, 65534, 65534)
        run = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-I",
                              "-S", str(launcher), str(spec_file)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr
        lines = run.stdout.split()
        assert lines[:4] == ["0", "0", "65534", "1"]  # root inside, the worker's uid outside
        assert "kept" in lines and "NoNewPrivs:" in lines
    finally:
        shutil.rmtree(base, ignore_errors=True)


@needs_root_fs
def test_a_restarted_worker_unpins_the_images_of_tasks_it_forgot(tmp_path):
    from synapse.images.store import ImageStore
    from synapse.worker import state as ws
    from synapse.worker.agent import WorkerAgent
    from tests.support import images as s
    layout = s.write_layout(tmp_path / "layout", {"1": s.busybox_image()})
    store = ImageStore(tmp_path / "images")
    kept, forgotten = assignment(index=0, image=f"oci:{layout}:1"), assignment(index=1, image=f"oci:{layout}:1")
    store.ensure(kept.image, holder="j1.1.0")
    store.ensure(forgotten.image, holder="j1.1.1")  # pulled for a task that never started before the crash
    state = ws.WorkerState()
    state.tasks[kept.key] = ws.LocalTask(kept, phase="running")
    WorkerAgent._unpin_forgotten(SimpleNamespace(images=ImageStore(tmp_path / "images"), state=state))
    assert [image.holders for image in ImageStore(tmp_path / "images").cached()] == [("j1.1.0",)]


# ---- jobs from images on a real local cluster --------------------------------------------------------


def busybox_entries(images_support) -> list:
    E = images_support.E
    return [E("bin", "dir"), E("bin/busybox", data=Path(BUSYBOX_ON_PATH).read_bytes(), mode=0o755),
            *(E(f"bin/{name}", "symlink", target="busybox") for name in APPLETS),
            E("etc", "dir"), E("etc/os-release", data=b"NAME=synapse-test-image\n"), E("srv", "dir")]


@needs_root_fs
def test_jobs_from_a_registry_image_on_a_local_cluster(make_cluster, tmp_path, monkeypatch):
    from tests.support import images as s
    why = s.registry_available()
    if why:
        pytest.skip(why)
    dev = tmp_path / "fake-dev"
    dev.mkdir()
    for name in [f"nvidia{i}" for i in range(8)] + ["nvidiactl", "nvidia-uvm"]:
        (dev / name).write_text("")
    monkeypatch.setenv(container.DEV_ROOT_HOOK, str(dev))  # the workers inherit it
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("shared dataset\n")
    entries = busybox_entries(s)
    train = s.make_image([s.make_layer(entries)], env=("PATH=/bin", "FROM_IMAGE=yes"))
    served = s.make_image([s.make_layer(entries)], env=("PATH=/bin",),
                          cmd=("sh", "-c", "echo entrypoint ran as rank $RANK"))
    with s.Registry(tmp_path / "registry") as registry:
        registry.push("team/train", "1", train)
        registry.push("team/serve", "1", served)
        cluster = make_cluster(workers=0)
        for i in (1, 2):
            start_worker(cluster, f"i{i}", f"rack{i}", "--insecure-registry", registry.host,
                         "--allow-mount", str(data), "--cdi-spec-dir", str(tmp_path / "no-cdi"))
        image = f"{registry.host}/team/train:1"
        gang = (f"name: gang\ntasks: 2\nresources: {{cpu: 1, memory: 1Gi, gpu: 5}}\nimage: {image}\n"
                f"mounts: [{{source: {data}, target: /data, readonly: true}}]\n"
                "command: [sh, -c, 'cat /etc/os-release; echo FROM_IMAGE=$FROM_IMAGE RANK=$RANK WORLD=$WORLD_SIZE; "
                "cat /data/in.txt; echo GPU=$CUDA_VISIBLE_DEVICES; ls /dev; "
                "echo step=7 >> $SYNAPSE_PROGRESS_FILE; sleep 4']\n")
        job_id = submit(cluster, gang)
        # The progress file is reachable inside the image: the worker reads it on the host.
        wait_for(lambda: cluster.client.get_job(job_id).step == 7, 60, "the progress written inside the image")
        assert finished(cluster, job_id).status == "SUCCEEDED", cluster.client.get_job(job_id)
        logs = task_logs(cluster, job_id)
        for rank, log in enumerate(logs):
            assert "NAME=synapse-test-image" in log and f"FROM_IMAGE=yes RANK={rank} WORLD=2" in log, log
            assert "shared dataset" in log
            gpus = log.split("GPU=", 1)[1].split()[0].split(",")
            seen = sorted(w for w in log.split("GPU=", 1)[1].split() if w.startswith("nvidia"))
            assert len(gpus) == 5 and seen == sorted([f"nvidia{g}" for g in gpus] + ["nvidiactl", "nvidia-uvm"]), log
        assert len(set(cluster.client.get_job(job_id).attempts[0].nodes)) == 2  # 5 GPUs each: one task a node
        pulls = len(registry.requests("GET", "/manifests/"))
        assert pulls >= 2  # each node pulled
        from synapse.client import render
        wide = render.nodes_table([render.node_dict(n) for n in cluster.client.list_nodes()], wide=True)
        assert [line.split()[-1] for line in wide.splitlines() if line.startswith(("i1 ", "i2 "))] == [image, image]

        # A second run of the image pulls nothing; a job without a command runs the image's own.
        again = submit(cluster, gang.replace("name: gang", "name: again"))
        assert finished(cluster, again).status == "SUCCEEDED"
        assert len(registry.requests("GET", "/manifests/")) == pulls
        entry = submit(cluster, f"name: entry\ntasks: 1\nresources: {{cpu: 1}}\n"
                                f"image: docker://{registry.host}/team/serve:1\n")
        assert finished(cluster, entry).status == "SUCCEEDED"
        assert "entrypoint ran as rank 0" in task_logs(cluster, entry)[0]
        # get nodes -o wide lists what the node's store holds, as its worker reports it (canonical
        # references: the job's docker:// spelling is the state's, not the store's).
        node = cluster.client.get_job(entry).attempts[0].nodes[0]
        wait_for(lambda: sorted(next(n for n in cluster.client.list_nodes() if n.id == node).images)
                 == [f"{registry.host}/team/serve:1", image], 30, "the store's listing")

        # A mount from outside the allowed prefixes ends the task with that reason.
        refused = submit(cluster, f"name: refused\ntasks: 1\nresources: {{cpu: 1}}\nimage: {image}\n"
                                  f"mounts: [{{source: {tmp_path}}}]\ncommand: [cat, /etc/os-release]\n")
        info = finished(cluster, refused)
        assert info.status == "FAILED" and "not under a prefix this worker allows" in info.failure, info

        # An unknown tag fails the job at once: no node would find it.
        missing = submit(cluster, f"name: missing\ntasks: 1\nresources: {{cpu: 1}}\nmax_restarts: 3\n"
                                  f"image: {registry.host}/team/train:nope\ncommand: [true]\n")
        info = finished(cluster, missing)
        assert info.status == "FAILED" and info.attempt == 1 and "ImagePullFailed" in info.failure, info
        assert "NOT_FOUND" in info.failure and ("on i1" in info.failure or "on i2" in info.failure)

    # The registry is gone: a node-side failure, so the gang is requeued without that node, uncharged.
    unreachable = submit(cluster, f"name: gone\ntasks: 1\nresources: {{cpu: 1}}\nmax_restarts: 0\n"
                                  f"image: {registry.host}/team/other:1\ncommand: [true]\n")
    info = wait_for(lambda: (lambda j: j if j.attempt >= 2 else None)(cluster.client.get_job(unreachable)), 90,
                    "the gang requeued after the pull failed")
    assert info.restarts_used == 0 and info.requeues >= 1 and info.excluded_nodes, info
    assert any("ImagePullFailed" in e.message and "UNREACHABLE" in e.message for e in info.events), info.events
    cluster.client.cancel(unreachable)


#: How much longer the slow worker's pulls take (PULL_DELAY_HOOK).
SLOW_PULL_S = 10


@needs_root_fs
def test_a_gang_starts_only_once_every_node_holds_its_image(make_cluster, tmp_path, monkeypatch):
    from synapse.client import render
    from synapse.worker.fence import TASK_JOURNAL
    from synapse.worker.pulls import PULL_DELAY_HOOK
    root = busybox_root(tmp_path / "rootfs")
    # A worker is restarted under a running task below: a lease of 6.4 s (not 2 s) outlasts a slow restart.
    cluster = make_cluster(workers=0, heartbeat_timeout=8.0)
    start_worker(cluster, "fast", "rack1")
    monkeypatch.setenv(PULL_DELAY_HOOK, str(SLOW_PULL_S))  # this worker's pulls take this much longer
    start_worker(cluster, "slow", "rack2")
    monkeypatch.delenv(PULL_DELAY_HOOK)
    # The gate holds tasks once the applied state says version 4, on every replica (the leader's
    # cluster_version says 4 as soon as every member knows it, before SetClusterVersion applies: a
    # wait on that let a CI run submit while the state was still at 3, and one task start ungated).
    wait_for(lambda: min(cluster.client.replica_status(a).applied_version for a in cluster.addresses) >= 4, 30,
             "version 4 applied on every replica")
    submitted = time.time()
    job_id = submit(cluster, f"name: gated\ntasks: 2\nresources: {{cpu: 1, gpu: 5}}\nimage: dir:{root}\n"
                             "command: [cat, /etc/os-release]\n")
    # The slow node's worker says how far it is (it waits for the hook first: "queued").
    progress = wait_for(lambda: (lambda p: p if "1 of 2" in p and "slow queued" in p else None)(
        render.image_progress(render.job_dict(cluster.client.get_job(job_id)))), 30, "one node to hold the image")
    assert progress == "pulling image: 1 of 2 nodes ready (waiting: slow queued)"
    from tests.support.http import fetch
    leader = cluster.master(cluster.wait_leader())["http_address"]
    page = fetch(leader, f"/jobs/{job_id}", cluster.token, ca=cluster.tls.ca)[2]
    assert "pulling, 1 of 2 nodes ready (waiting: slow queued)" in page and "ASSIGNED (pulling image)" in page
    assert finished(cluster, job_id).status == "SUCCEEDED"
    starts = [json.loads(line)["at"] for w in ("fast", "slow")
              for line in (cluster.worker_dir(w) / TASK_JOURNAL).read_text().splitlines()
              if json.loads(line)["event"] == "start"]
    # Nothing started before the slow node held the image (a check of the journal at one moment
    # raced the slow pull on a loaded machine: the start times say it without a race).
    assert len(starts) == 2 and min(starts) >= submitted + SLOW_PULL_S
    assert any(e.kind == "ImageReady" for e in cluster.client.get_job(job_id).events)

    # Cancelled while it waits for the slow node: neither task ever starts.
    waiting = submit(cluster, f"name: waiting\ntasks: 2\nresources: {{cpu: 1, gpu: 5}}\nimage: dir:{root}\n"
                              "command: [true]\n")
    wait_for(lambda: "1 of 2" in render.image_progress(render.job_dict(cluster.client.get_job(waiting))), 30,
             "one node to hold the image")
    cluster.client.cancel(waiting)
    assert finished(cluster, waiting).status == "CANCELLED"
    assert not any(json.loads(line)["job"] == waiting for w in ("fast", "slow")
                   for line in (cluster.worker_dir(w) / TASK_JOURNAL).read_text().splitlines())

    # A worker restarted under a running task re-adopts it: its root stays, and it ends as it would have.
    adopted = submit(cluster, f"name: adopted\ntasks: 1\nresources: {{cpu: 1, gpu: 5}}\nimage: dir:{root}\n"
                              "command: [sh, -c, 'sleep 3; cat /etc/os-release']\n")
    info = wait_for(lambda: (lambda j: j if j.status == "RUNNING" else None)(cluster.client.get_job(adopted)), 30,
                    "the task to run")
    node = info.tasks[0].node_id
    cluster.restart_worker(node)
    assert finished(cluster, adopted).status == "SUCCEEDED"
    assert "NAME=imgrun-test 1" in task_logs(cluster, adopted)[0]
    assert "re-adopting task" in (cluster.data_dir / "logs" / f"{node}.log").read_text()
    wait_for(lambda: not any((cluster.worker_dir(node) / "containers").iterdir()), 10, "the writable layer dropped")

    # Past its image_pull_timeout the attempt ends ImagePullFailed naming the late node, and requeues.
    late = submit(cluster, f"name: late\ntasks: 2\nresources: {{cpu: 1, gpu: 5}}\nimage: dir:{root}\n"
                           "image_pull_timeout: 2s\ncommand: [true]\n")
    info = wait_for(lambda: (lambda j: j if j.attempt >= 2 or j.status == "FAILED" else None)(
        cluster.client.get_job(late)), 60, "the attempt to time out")
    assert info.restarts_used == 0, info
    assert any("TIMEOUT" in e.message and "on node(s) slow" in e.message and "not charged" in e.message
               for e in info.events), [e.message for e in info.events]
    cluster.client.cancel(late)


#: What the DDP image takes from the host besides /usr (Debian's /bin, /lib… are links into /usr).
HOST_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "passwd", "group", "nsswitch.conf")


@pytest.mark.torch_image
@needs_root_fs
@pytest.mark.skipif(not os.path.exists("/usr/bin/python3")
                    or os.system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0,
                    reason="needs Debian's python3 with torch (python3-torch)")
def test_the_ddp_example_runs_from_an_image_of_the_hosts_python_and_torch(make_cluster, tmp_path):
    """The image is the host's /usr (hard links: no copy) with the example's script in /app; the gang
    trains over gloo on the host's network, as from any image."""
    import subprocess

    root = tmp_path / "torch-image"
    root.mkdir()
    subprocess.run(["cp", "-al", "/usr", str(root / "usr")], check=True)
    for name in ("bin", "sbin", "lib", "lib64"):
        if os.path.islink(f"/{name}"):
            (root / name).symlink_to(os.readlink(f"/{name}"))
    (root / "etc").mkdir()
    for name in HOST_ETC:
        if os.path.exists(f"/etc/{name}"):
            subprocess.run(["cp", "-a", f"/etc/{name}", str(root / "etc" / name)], check=True)
    (root / "app").mkdir()
    shutil.copy(paths.ROOT / "examples" / "torch" / "ddp_train.py", root / "app")
    cluster = make_cluster(workers=2)
    job_id = submit(cluster, f"name: ddp-image\ntasks: 2\nresources: {{cpu: 1, memory: 1Gi}}\nimage: dir:{root}\n"
                             "command: [python3, /app/ddp_train.py, --steps, '40']\nenv: {OMP_NUM_THREADS: '1'}\n")
    info = finished(cluster, job_id, timeout=180)
    logs = task_logs(cluster, job_id)
    assert info.status == "SUCCEEDED", "\n".join(log[-2000:] for log in logs)
    done = [dict(kv.split("=", 1) for kv in line.split()[1:]) for log in logs for line in log.splitlines()
            if line.startswith("done ")]
    assert sorted(d["rank"] for d in done) == ["0", "1"] and len({d["weights"] for d in done}) == 1
