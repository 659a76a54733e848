"""The PyTorch examples' behaviour on a local cluster, against a real torch (CPU, gloo).

`tests/cluster/test_examples.py` runs every example as shipped; here the elastic one is made to grow. They
need an interpreter with torch: this one, or Debian's /usr/bin/python3 with python3-torch
(scripts/install-test-packages.sh installs it); without either they skip, saying so.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest

from synapse.client.jobfile import load_job_file
from synapse.core import codec
from tests.support import paths
from tests.support.cluster import read_logs, wait_job
from tests.support.helpers import wait_for
from tests.support.torch_jobs import SHIPPED_PYTHON, has_torch, lines

pytestmark = pytest.mark.slow

EXAMPLES = paths.ROOT / "examples" / "torch"


PYTHON = next((p for p in (sys.executable, SHIPPED_PYTHON) if has_torch(p)), "")
needs_torch = pytest.mark.skipif(not PYTHON, reason="no interpreter with torch here (scripts/"
                                                    "install-test-packages.sh installs Debian's python3-torch)")


def job_file(name: str, cpu: int = 200, **env: str):
    """An example job file with its interpreter pointed at `PYTHON`, each task asking for `cpu`
    millicores of the workers' (fake) 64 cores."""
    spec = load_job_file(EXAMPLES / name)
    command = tuple(arg.replace(SHIPPED_PYTHON, PYTHON) for arg in spec.command)
    return dataclasses.replace(spec, command=command, env=tuple(sorted({**dict(spec.env), **env}.items())),
                               resources=dataclasses.replace(spec.resources, cpu=cpu))


def ended(cluster, job_id: str, timeout: float):
    """The job once it ended; on a timeout, fail with its events and the tails of its task logs."""
    try:
        return wait_job(cluster, job_id, {"SUCCEEDED", "FAILED"}, timeout=timeout)
    except AssertionError:
        info = cluster.client.get_job(job_id)
        tails = [log[-600:] for a in info.attempts for log in read_logs(cluster, job_id, a.attempt)]
        raise AssertionError(f"{job_id} still {info.status}: {[e.message for e in info.events][-5:]}; "
                             f"logs: {tails}") from None


@needs_torch
def test_the_elastic_torchrun_example_starts_at_its_min_grows_and_resumes(make_cluster, tmp_path):
    cluster = make_cluster(workers=4, racks=1, gpus=0)
    for worker in ("w3", "w4"):  # two machines away: room for its min
        cluster.kill_worker(worker, with_tasks=True)
    wait_for(lambda: sum(n.status == "READY" for n in cluster.client.list_nodes()) == 2, 30, "two nodes down")
    spec = job_file("elastic.yaml", cpu=40_000, CHECKPOINT_DIR=str(tmp_path))  # one task a worker
    script, *rest = spec.command[2:]
    spec = dataclasses.replace(spec, resize_interval=3.0, command=(
        *spec.command[:2], script.replace("--steps 200", "--steps 60 --step-sleep 0.2"), *rest))
    job_id = cluster.client.submit(codec.job_spec_to_proto(spec))

    def sizes() -> list[int]:
        return [len(a.nodes) for a in cluster.client.get_job(job_id).attempts]

    wait_for(lambda: (tmp_path / job_id / "checkpoint.pt").exists(), 120, "the first checkpoint")
    assert sizes() == [2]
    for worker in ("w3", "w4"):
        cluster.restart_worker(worker)
    info = ended(cluster, job_id, 240)
    assert info.status == "SUCCEEDED", [e.message for e in info.events]
    grown = sizes()  # [2, 4], or [2, 3, 4] when one worker registered a moment before the other
    assert grown[0] == 2 and grown[-1] == 4 and grown == sorted(grown), grown
    first, second = lines(cluster, job_id, 1, "start"), lines(cluster, job_id, len(grown), "start")
    assert {s["world_size"] for s in first} == {"2"} and {s["resumed"] for s in first} == {"0"}
    assert {s["world_size"] for s in second} == {"4"} and {s["resumed"] for s in second} == {"1"}
    assert len({s["step"] for s in second}) == 1 and int(second[0]["step"]) > 0  # from the checkpoint
    done = lines(cluster, job_id, len(grown), "done")
    assert len(done) == 4 and len({d["weights"] for d in done}) == 1 and {d["steps"] for d in done} == {"60"}
