"""The run-time predictor on a real cluster: it learns from finished runs and get job shows the
prediction (the rule, its learning in apply and the scheduler's use are in tests/unit/test_predict.py)."""

from __future__ import annotations


def test_a_real_cluster_learns_from_finished_runs_and_get_job_shows_the_prediction(make_cluster):
    """One master, one worker: two runs of `train` end, and the third's JobInfo says what the
    scheduler expects of it, learned through the replicated state."""
    from synapse.core import codec
    from synapse.core.model import JobSpec, Resources
    from synapse.core.versions import PREDICT_VERSION
    from tests.support.helpers import wait_for

    cluster = make_cluster(masters=1, workers=1, racks=1)
    wait_for(lambda: len(cluster.client.list_nodes()) == 1, 30, "the worker registers")
    # Apply learns run times once the cluster version says every member does (SetClusterVersion,
    # proposed by the leader's monitor a moment after it starts): a run that ends before is not learned.
    wait_for(lambda: cluster.client.replica_status(cluster.addresses[0]).applied_version >= PREDICT_VERSION, 30,
             "the cluster version that learns run times")

    def submit(command):
        return cluster.client.submit(codec.job_spec_to_proto(JobSpec(
            name="train", tasks=1, resources=Resources(1000, 1 << 30, 8), command=tuple(command), time_limit=3600)))

    for _ in range(2):
        done = submit(["true"])
        wait_for(lambda j=done: cluster.client.get_job(j).status == "SUCCEEDED", 60, f"{done} succeeds")
    later = submit(["sleep", "30"])
    info = cluster.client.get_job(later)
    user = info.user or "-"
    assert "from 2 run(s) of (" + user + ", train, 8 GPU)" in info.prediction, info.prediction
    cluster.client.cancel(later)
