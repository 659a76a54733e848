"""GPU discovery (issue 16): `--gpus auto` asks nvidia-smi (a fake one on the PATH here) for the GPUs,
their model and memory; the model is a node label that job files select with `gpu_model`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from synapse.client.cli.main import main as synctl
from synapse.core import commands as c
from synapse.core.jobs.jobspec import JobFileError, parse_job
from synapse.core.model import Resources
from synapse.core.schedule.placement import ClusterView, place
from synapse.core.state.fsm import ClusterState
from synapse.worker import gpu_errors, gpus

SMI_OUTPUT = "0, NVIDIA H100 80GB HBM3, 81559\n1, NVIDIA H100 80GB HBM3, 81559\n"


def fake_nvidia_smi(directory: Path, output: str = SMI_OUTPUT) -> Path:
    """An `nvidia-smi` that answers the worker's two queries, discovery's and the GPU-error watch's
    (healthy GPUs: no uncorrectable ECC error), and fails on anything else, as a check. (Answering
    only discovery's made the watch, after its first 10 s, see a failing nvidia-smi and cordon the
    node: the test then failed whenever a loaded machine made it last that long.)"""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    healthy = "".join(f"{line.split(',')[0]}, 0\n" for line in output.splitlines() if line.strip())
    watch_query = " ".join(gpu_errors.QUERY[1:])
    script.write_text("#!/bin/sh\n"
                      f'if [ "$*" = "{watch_query}" ]; then cat <<\'EOF\'\n{healthy}EOF\nexit 0; fi\n'
                      f'if [ "$*" != "{" ".join(gpus.QUERY[1:])}" ]; then echo "unexpected: $*" >&2; exit 9; fi\n'
                      f"cat <<'EOF'\n{output}EOF\n")
    script.chmod(0o755)
    return directory


def test_nvidia_smi_output_and_model_names():
    found = gpus.parse_nvidia_smi(SMI_OUTPUT + "garbage line\n")
    h100 = "NVIDIA H100 80GB HBM3"
    assert found == [gpus.GPU(0, h100, 81559 << 20), gpus.GPU(1, h100, 81559 << 20)]
    assert gpus.labels_for(found) == {"gpu_model": "H100", "gpu_product": "NVIDIA-H100-80GB-HBM3", "gpu_memory": "80Gi"}
    assert gpus.short_model("NVIDIA A100-SXM4-40GB") == "A100" and gpus.short_model("Tesla T4") == "T4"
    assert gpus.labels_for([]) == {}


def test_discovery_runs_the_nvidia_smi_on_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path / 'bin')}:{os.environ['PATH']}")
    found, source = gpus.discover()
    if source == "nvml":
        pytest.skip("a real NVML answered on this machine")
    assert (source, len(found), found[0].name) == ("nvidia-smi", 2, "NVIDIA H100 80GB HBM3")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpus.discover() == ([], "none")


def test_job_files_take_a_gpu_model():
    assert parse_job({"name": "a", "command": ["x"], "gpu_model": "H100"}).gpu_model == "H100"
    with pytest.raises(JobFileError, match="gpu_model"):
        parse_job({"name": "a", "command": ["x"], "gpu_model": "H100 80GB"})
    with pytest.raises(JobFileError, match="resources.memory: .* below 8Mi"):
        parse_job({"name": "a", "command": ["x"], "resources": {"memory": "4Mi"}})


def test_placement_keeps_a_model_to_its_nodes():
    state = ClusterState()
    for node_id, model in (("a1", "A100"), ("a2", "A100"), ("h1", "H100"), ("x", "")):
        labels = (("gpu_model", model),) if model else ()
        assert state.apply(c.RegisterNode(at=1, node_id=node_id, address=f"{node_id}:1", topology=("r0",),
                                          capacity=Resources(8000, 1 << 36, 8), labels=labels)).ok
    spec = parse_job({"name": "j", "tasks": 2, "command": ["x"], "resources": {"gpu": 8}, "gpu_model": "a100"})
    view = ClusterView(state.nodes, state.index, state.levels)
    result = place(view, "j", 1, spec)
    assert sorted(p.node_id for p in result.plan.placements) == ["a1", "a2"]
    assert view.blocked == frozenset()  # the model's filter is undone after the call
    three = parse_job({"name": "j", "tasks": 3, "command": ["x"], "resources": {"gpu": 8}, "gpu_model": "A100"})
    assert place(view, "j", 1, three).plan is None
    h = parse_job({"name": "j", "command": ["x"], "resources": {"gpu": 1}, "gpu_model": "H100"})
    assert [p.node_id for p in place(view, "j", 1, h).plan.placements] == ["h1"]


@pytest.mark.slow
def test_a_worker_with_gpus_auto_is_labelled_and_gets_only_its_models_jobs(make_cluster, tmp_path):
    cluster = make_cluster(workers=0)
    path = f"{fake_nvidia_smi(tmp_path / 'bin')}:{os.environ['PATH']}"
    argv = [sys.executable, "-m", "synapse.worker", "--masters", ",".join(cluster.addresses), "--token",
            cluster.token, "--node-id", "gpu1", "--data-dir", str(tmp_path / "gpu1"), "--gpus", "auto",
            "--cpus", "4", "--memory", "8Gi", "--address", "127.0.0.1", "--heartbeat-interval", "0.5",
            "--stop-tasks-on-exit", *cluster.worker_tls_argv("gpu1")]
    with open(tmp_path / "gpu1.log", "wb") as log:
        worker = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PATH": path})
    try:
        deadline = time.monotonic() + 20
        while not any(n.id == "gpu1" for n in cluster.client.list_nodes()) and time.monotonic() < deadline:
            time.sleep(0.1)
        (node,) = [n for n in cluster.client.list_nodes() if n.id == "gpu1"]
        assert node.capacity.gpu == 2 and dict(node.labels)["gpu_model"] == "H100"
        listed = CliRunner().invoke(synctl, ["get", "nodes"], env=cluster.env).output
        assert "gpu_model=H100" in listed
        jobs = {}
        for model in ("H100", "A100"):
            job_file = tmp_path / f"{model}.yaml"
            job_file.write_text(f"name: on-{model}\nresources: {{gpu: 1, memory: 64Mi}}\ngpu_model: {model}\n"
                                "command: [sh, -c, 'echo $CUDA_VISIBLE_DEVICES']\n")
            out = CliRunner().invoke(synctl, ["submit", str(job_file)], env=cluster.env)
            assert out.exit_code == 0, out.output
            jobs[model] = out.output.split()[0]
        deadline = time.monotonic() + 20
        while cluster.client.get_job(jobs["H100"]).status != "SUCCEEDED" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cluster.client.get_job(jobs["H100"]).status == "SUCCEEDED"
        a100 = cluster.client.get_job(jobs["A100"])
        assert a100.status == "PENDING", a100
    finally:
        worker.terminate()
        worker.wait(20)
