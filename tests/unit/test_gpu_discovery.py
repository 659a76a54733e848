"""GPU discovery (issue 16): `--gpus auto` asks nvidia-smi (a fake one on the PATH here) for the GPUs,
their model and memory; the model is a node label that job files select with `gpu_model`.
The parsing and placement; a worker running it: tests/cluster/test_gpu_discovery.py."""

from __future__ import annotations

import pytest

from synapse.core import commands as c
from synapse.core.jobs.jobspec import JobFileError, parse_job
from synapse.core.model import Resources
from synapse.core.schedule.placement import ClusterView, place
from synapse.core.state.fsm import ClusterState
from synapse.worker import gpus
from tests.support.gpus import SMI_OUTPUT


def test_nvidia_smi_output_and_model_names():
    found = gpus.parse_nvidia_smi(SMI_OUTPUT + "garbage line\n")
    h100 = "NVIDIA H100 80GB HBM3"
    assert found == [gpus.GPU(0, h100, 81559 << 20), gpus.GPU(1, h100, 81559 << 20)]
    assert gpus.labels_for(found) == {"gpu_model": "H100", "gpu_product": "NVIDIA-H100-80GB-HBM3", "gpu_memory": "80Gi"}
    assert gpus.short_model("NVIDIA A100-SXM4-40GB") == "A100" and gpus.short_model("Tesla T4") == "T4"
    assert gpus.labels_for([]) == {}


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


