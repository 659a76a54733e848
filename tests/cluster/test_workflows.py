"""Arrays and dependencies on real masters, real workers and real subprocess tasks."""

from __future__ import annotations

import re

import grpc
import pytest

from synapse.client.master_client import ClientError
from synapse.core import codec
from synapse.core.model import JobSpec, Queue, Resources
from synapse.proto import api_pb2
from tests.support.cluster import read_logs, synctl, wait_job
from tests.support.helpers import wait_for

pytestmark = pytest.mark.slow

#: Each task prints its array ids and when it ran (wall clock), then sleeps a little.
ELEMENT = ["sh", "-c", "echo IDX=$SYNAPSE_ARRAY_TASK_ID ARR=$SYNAPSE_ARRAY_JOB_ID COUNT=$SYNAPSE_ARRAY_TASK_COUNT "
                       "START=$(date +%s.%N); sleep 0.4; echo END=$(date +%s.%N)"]


def submit(cluster, name, command, *, tasks=2, gpu=1, array="", throttle=0, after=(), **kw) -> str:
    spec = JobSpec(name=name, tasks=tasks, resources=Resources(100, 64 << 20, gpu), command=tuple(command),
                   array=array, array_throttle=throttle, after=tuple(after), **kw)
    return cluster.client.submit(codec.job_spec_to_proto(spec))


def test_an_array_of_gangs_runs_within_its_throttle_and_dependencies_follow_it(make_cluster):
    cluster = make_cluster(workers=4, racks=2, gpus=8)
    array_id = submit(cluster, "sweep", ELEMENT, array="0-19", throttle=4)
    after_ok = submit(cluster, "merge", ["sh", "-c", "echo merged"], tasks=1, after=[("ok", array_id)])
    after_notok = submit(cluster, "cleanup", ["true"], tasks=1, after=[("notok", array_id)])
    listing = synctl(cluster, "get", "jobs").output
    folded = re.findall(rf"^{re.escape(array_id)}_\[(\d+)-19\]\s", listing, re.M)
    assert len(folded) == 1, listing  # every never-placed element on one line

    info = wait_job(cluster, array_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    assert info.status == "SUCCEEDED" and info.array.succeeded == 20, info
    spans, seen = [], set()
    for index in range(20):
        element = f"{array_id}_{index}"
        done = cluster.client.get_job(element)
        assert done.status == "SUCCEEDED"
        # The attempt that succeeded: on a loaded machine an element may be requeued before its
        # first attempt ever starts (then attempt 1 wrote no log).
        lines = [dict(kv.split("=", 1) for kv in log.split()) for log in read_logs(cluster, element, done.attempt)]
        assert {(x["IDX"], x["ARR"], x["COUNT"]) for x in lines} == {(str(index), array_id, "20")}
        seen.add(index)
        spans.append((min(float(x["START"]) for x in lines), max(float(x["END"]) for x in lines)))
    assert seen == set(range(20))
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert 1 <= most <= 4, spans

    merged = wait_job(cluster, after_ok, {"SUCCEEDED", "FAILED"}, timeout=30)
    assert merged.status == "SUCCEEDED"
    assert merged.started_at >= max(cluster.client.get_job(f"{array_id}_{i}").finished_at for i in range(20))
    assert [(d.kind, d.job_id, d.state) for d in merged.dependencies] == [("ok", array_id, "met")]
    failed = wait_job(cluster, after_notok, {"FAILED"}, timeout=30)
    assert failed.failure_cause == "DependencyNeverSatisfied" and array_id in failed.failure
    described = synctl(cluster, "describe", "job", after_notok).output
    assert f"Depends:    afternotok {array_id} (SUCCEEDED): never" in described
    assert "DependencyNeverSatisfied" in described
    cluster.converged_digest()


def test_arrays_are_cancelled_whole_or_one_element_and_throttled_from_synctl(make_cluster):
    cluster = make_cluster(workers=2, racks=1, gpus=8)
    out = synctl(cluster, "submit", "--name", "long", "--gpu", "1", "--cpu", "100m", "--array", "0-99%2", "--",
                 "sleep", "30")
    assert out.exit_code == 0, out.output
    array_id = out.output.strip()
    after = synctl(cluster, "submit", "--name", "next", "--cpu", "100m", "--after", f"any:{array_id}", "--", "true")
    assert after.exit_code == 0, after.output
    wait_for(lambda: cluster.client.get_job(array_id).array.running == 2, 30, "two elements running")
    out = synctl(cluster, "update", array_id, "--throttle", "3")
    assert out.exit_code == 0 and "at most 3" in out.output, out.output
    wait_for(lambda: cluster.client.get_job(array_id).array.running == 3, 30, "three elements running")
    assert synctl(cluster, "cancel", f"{array_id}_50").exit_code == 0
    assert cluster.client.get_job(f"{array_id}_50").status == "CANCELLED"
    waiting = synctl(cluster, "describe", "job", array_id).output
    assert "throttle 3" in waiting and "49,51-99]" in waiting, waiting
    assert synctl(cluster, "cancel", array_id).exit_code == 0
    info = wait_job(cluster, array_id, {"CANCELLED"}, timeout=30)
    assert info.array.cancelled == 100 and info.array.running == 0
    wait_job(cluster, after.output.strip(), {"SUCCEEDED"}, timeout=30)  # afterany: a cancelled array ended
    assert not [j for j in cluster.client.list_jobs() if j.status in ("PENDING", "SCHEDULED", "RUNNING")]


@pytest.mark.parametrize(("field", "spec", "message"), [
    ("array", {"array": "0-x"}, "array: cannot read '0-x'"),
    ("array", {"array": "0-10000"}, "array: has more than 10000 elements (the cluster's max_array_size)"),
    ("after", {"after": (("ok", "no-such-job"),)}, "after: unknown job no-such-job"),
])
def test_bad_workflow_input_is_refused_and_nothing_is_submitted(make_cluster, field, spec, message):
    cluster = make_cluster(workers=0)
    with pytest.raises(ClientError) as refused:
        cluster.client.submit(codec.job_spec_to_proto(JobSpec(name="bad", tasks=1, resources=Resources(100, 0, 0),
                                                              command=("true",), **spec)))
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT and message in refused.value.message
    assert not cluster.client.list_jobs()


ELASTIC = ["sh", "-c", "echo SIZE=$WORLD_SIZE MIN=$SYNAPSE_TASKS_MIN MAX=$SYNAPSE_TASKS_MAX RDZV=$SYNAPSE_RDZV_ID; "
                       "trap 'exit 0' TERM; sleep 120 & wait"]


def test_an_elastic_gang_starts_small_grows_when_workers_join_and_shrinks_for_a_preemptor(make_cluster):
    cluster = make_cluster(workers=4, racks=1, gpus=8)
    queue = Queue("q", preemption_rules=("priority",))
    cluster.client.call("ApplyQueues", api_pb2.ApplyQueuesRequest(queues=[codec.queue_to_proto(queue)]))
    for worker in ("w3", "w4"):  # two machines away: room for 2
        cluster.kill_worker(worker, with_tasks=True)
    wait_for(lambda: sum(n.status == "READY" for n in cluster.client.list_nodes()) == 2, 30, "two nodes down")
    job_id = submit(cluster, "elastic", ELASTIC, tasks=4, gpu=8, tasks_min=2, resize_interval=1.0, queue="q")

    def sizes() -> list[int]:
        return [len(a.nodes) for a in cluster.client.get_job(job_id).attempts]

    wait_for(lambda: sizes() == [2] and cluster.client.get_job(job_id).status == "RUNNING", 30, "started at 2")
    for worker in ("w3", "w4"):  # they join again: it grows, by a new attempt with notice
        cluster.restart_worker(worker)
    # (One worker may register a moment before the other: then it grows to 3, and to 4 a second later.)
    wait_for(lambda: sizes()[-1] == 4 and cluster.client.get_job(job_id).status == "RUNNING", 60, "grown to 4")
    grown = sizes()
    assert grown[0] == 2 and grown == sorted(grown), grown
    logs = read_logs(cluster, job_id, attempt=len(grown))
    assert {line.split()[0] for line in logs} == {"SIZE=4"}
    assert {tuple(line.split()[1:]) for line in logs} == {("MIN=2", "MAX=4", f"RDZV={job_id}")}

    urgent = submit(cluster, "urgent", ["sleep", "3"], tasks=2, gpu=8, queue="q", priority=10)
    wait_for(lambda: sizes()[len(grown):len(grown) + 1] == [2] and cluster.client.get_job(job_id).status == "RUNNING",
             60, "shrunk to 2")
    assert cluster.client.get_job(urgent).status in ("RUNNING", "SUCCEEDED")
    info = cluster.client.get_job(job_id)
    kinds = [e.kind for e in info.events]
    assert "Shrinking" in kinds and "Preempted" not in kinds  # shrunk, not evicted
    assert {line.split()[0] for line in read_logs(cluster, job_id, attempt=len(grown) + 1)} == {"SIZE=2"}
    cluster.client.cancel(job_id)
    wait_job(cluster, job_id, {"CANCELLED"}, timeout=30)
