"""Tasks inside images for real: the sandbox on a real root file system, a worker that is not root, and
jobs from images on a real local cluster (the runtime's plan is in tests/unit/test_images_run.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from synapse.core.model import Assignment
from synapse.worker import container, fence
from synapse.worker.container import ContainerRefused
from synapse.worker.runtime import ProcessRuntime, alive, task_id
from tests.support import paths
from tests.support.cluster import start_worker
from tests.support.helpers import wait_for
from tests.support.images import (
    APPLETS,
    BUSYBOX_ON_PATH,
    assignment,
    busybox_root,
    finished,
    image,
    needs_root_fs,
    plan,
    submit,
    task_logs,
)


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
    wait_for(lambda: fence.shims(runtime.task_files(b)[0].parent, task_id(b)), 30, "the shim's mark")
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
