"""Every example under examples/, as shipped: `synctl submit examples/…/X.yaml`, run from the checkout
as examples/README.md says, on a local cluster like the one it starts, must end SUCCEEDED.

The job files are read as they are, with nothing rewritten: a path or interpreter that only works
on some machine fails here. Examples that need what this machine may lack (torch) skip, saying so.
A failure shows `synctl describe job` and the tails of the task logs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from synapse.client.cli.main import main
from synapse.client.jobfile import load_job_file
from tests.support.cluster import read_logs, wait_job
from tests.support.paths import ROOT
from tests.support.torch_jobs import SHIPPED_PYTHON, has_torch, lines

pytestmark = pytest.mark.slow


JOB_FILES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").rglob("*.yaml"))
#: How long each example may take on two busy cores; an example missing here fails the test.
TIMEOUT_S = {"examples/torch/ddp.yaml": 120, "examples/torch/elastic.yaml": 240}


def missing(job_file: str) -> str:
    """What this machine lacks to run the example ("" if nothing)."""
    if job_file.startswith("examples/torch/") and not has_torch(SHIPPED_PYTHON):
        return f"the torch examples run {SHIPPED_PYTHON}, which has no torch here (Debian's python3-torch; " \
               "scripts/install-test-packages.sh installs it)"
    return ""


def check_ddp(cluster, job_id: str) -> None:
    done = lines(cluster, job_id, 1, "done")
    assert sorted(d["rank"] for d in done) == ["0", "1"] and {d["world_size"] for d in done} == {"2"}
    assert len({d["weights"] for d in done}) == 1 and {d["steps"] for d in done} == {"40"}


def check_elastic(cluster, job_id: str) -> None:
    info = cluster.client.get_job(job_id)
    size = len(info.attempts[-1].nodes)
    done = lines(cluster, job_id, info.attempt, "done")
    assert 2 <= size <= 4 and len(done) == size and {d["world_size"] for d in done} == {str(size)}
    assert len({d["weights"] for d in done}) == 1 and {d["steps"] for d in done} == {"200"}


#: What an example prints when it worked, beyond ending SUCCEEDED.
CHECKS = {"examples/torch/ddp.yaml": check_ddp, "examples/torch/elastic.yaml": check_elastic}


def test_every_example_has_a_time_budget():
    assert JOB_FILES and set(JOB_FILES) == set(TIMEOUT_S), "give a new example its timeout (and a check)"


@pytest.mark.parametrize("job_file", JOB_FILES)
def test_the_example_succeeds_as_shipped(job_file, make_cluster, monkeypatch):
    why = missing(job_file)
    if why:
        pytest.skip(why)
    cluster = make_cluster(masters=1, workers=2, racks=1, gpus=0)  # one master: two cores are enough for all
    env = dict(cluster.env)

    def synctl(*args: str) -> str:
        out = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
        assert out.exit_code == 0, out.output
        return out.output

    monkeypatch.chdir(ROOT)
    job_id = synctl("submit", job_file).strip()
    try:
        try:
            info = wait_job(cluster, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=TIMEOUT_S[job_file])
            assert info.status == "SUCCEEDED"
        except AssertionError:
            attempt = cluster.client.get_job(job_id).attempt
            tails = "\n".join(log[-1500:] for log in read_logs(cluster, job_id, attempt))
            raise AssertionError(f"{job_file} did not succeed:\n{synctl('describe', 'job', job_id)}\n"
                                 f"task logs (tails):\n{tails}") from None
        CHECKS.get(job_file, lambda *_: None)(cluster, job_id)
    finally:
        checkpoints = dict(load_job_file(ROOT / job_file).env).get("CHECKPOINT_DIR")
        if checkpoints:  # the elastic example's, one directory a job
            shutil.rmtree(Path(checkpoints) / job_id, ignore_errors=True)
