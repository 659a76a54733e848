"""Tasks inside images, the pure part: the built-in container runtime's plan, the job file's image
fields, the worker's bookkeeping of held tasks (the sandbox on a real root file system and jobs from
images on a real local cluster: tests/cluster/test_images_run.py)."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import pytest

from synapse.core.jobs.jobspec import JobFileError
from synapse.core.model import JobStatus
from synapse.worker import container
from synapse.worker.container import ContainerRefused, Mount
from tests.support.images import (
    assignment,
    needs_root_fs,
    parse,
    plan,
)

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
    from synapse.core.model import Placement
    from synapse.master.dispatch import assignments_for_node as assignments_for
    from synapse.master.dispatch import nodes_relisted
    from tests.support.helpers import checked, cluster, spec

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
    assert relisted(state, c.TaskStarted(at=15, job_id="g", attempt=1, index=1, node_id="r0-n1")) == set()  # RUNNING
    assert relisted(state, c.TaskExited(at=16, job_id="g", attempt=1, index=0, node_id="r0-n0", exit_code=1)) == both
    assert nodes_relisted(state, [c.NodeDown(at=17, node_id="r0-n2")], watched) == set(watched)
    # a task started unprepared (an older worker) counts as holding the image: it may release the gang
    state = cluster(racks=1, nodes_per_rack=3)
    checked(state, c.SetClusterVersion(at=1, version=4))
    gang_in_image(state)
    assert relisted(state, c.TaskStarted(at=12, job_id="g", attempt=1, index=0, node_id="r0-n0")) == both
    assert relisted(state, c.TaskStarted(at=13, job_id="g", attempt=1, index=1, node_id="r0-n1")) == both
    # a gang not in an image: its starts wake none of its watchers (RUNNING, with no notice given, changes no list)
    state = cluster(racks=1, nodes_per_rack=3)
    checked(state, c.SetClusterVersion(at=1, version=4))
    checked(state, c.SubmitJob(at=0, job_id="p", request_id="p", spec=spec(tasks=2, gpu=8)))
    assert relisted(state, c.CommitPlan(at=10, job_id="p", attempt=1, placements=(
        Placement(0, "r0-n0", tuple(range(8)), 0), Placement(1, "r0-n1", tuple(range(8)), 1)))) == both
    assert relisted(state, c.TaskStarted(at=12, job_id="p", attempt=1, index=1, node_id="r0-n1")) == set()
    assert relisted(state, c.TaskStarted(at=13, job_id="p", attempt=1, index=0, node_id="r0-n0")) == set()  # RUNNING
    # a clean end that leaves the gang running changes its own node's list only; the last ends the job
    assert relisted(state, c.TaskExited(at=14, job_id="p", attempt=1, index=1, node_id="r0-n1", exit_code=0,
                                        cause="Completed")) == {"r0-n1"}
    assert relisted(state, c.TaskExited(at=15, job_id="p", attempt=1, index=0, node_id="r0-n0", exit_code=0)) == both
    # a failed end stops the gang: every list
    checked(state, c.SubmitJob(at=20, job_id="f", request_id="f", spec=spec(tasks=2, gpu=8)))
    checked(state, c.CommitPlan(at=21, job_id="f", attempt=1, placements=(
        Placement(0, "r0-n0", tuple(range(8)), 0), Placement(1, "r0-n1", tuple(range(8)), 1))))
    assert relisted(state, c.TaskExited(at=22, job_id="f", attempt=1, index=1, node_id="r0-n1", exit_code=1)) == both


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


