"""GPU discovery with processes: the worker runs the nvidia-smi on its PATH (a fake one), and a worker
started with `--gpus auto` is labelled with its model and gets only that model's jobs (the parsing
and placement are in tests/unit/test_gpu_discovery.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from synapse.client.cli.main import main as synctl
from synapse.worker import gpu_errors, gpus
from tests.support.gpus import SMI_OUTPUT


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


def test_discovery_runs_the_nvidia_smi_on_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path / 'bin')}:{os.environ['PATH']}")
    found, source = gpus.discover()
    if source == "nvml":
        pytest.skip("a real NVML answered on this machine")
    assert (source, len(found), found[0].name) == ("nvidia-smi", 2, "NVIDIA H100 80GB HBM3")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpus.discover() == ([], "none")


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
