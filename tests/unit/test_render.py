"""What synctl prints, from replies built by hand: exact tables, descriptions and json shapes."""

from __future__ import annotations

import json
import time

import pytest

from synapse.client import render
from synapse.core import codec
from synapse.core import commands as c
from synapse.core.jobs.quantity import format_duration
from synapse.core.model import Placement, Queue, Resources
from synapse.proto import api_pb2, types_pb2
from synapse.rpc import convert
from tests.support.core import running_job
from tests.support.helpers import GI, checked, cluster, spec


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """Times show in local time: pin it to UTC, and restore the zone afterwards."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_table_pads_each_column_to_its_widest_cell():
    # Cells are left-aligned to the widest in their column; trailing blanks are cut.
    assert render.table(["A", "LONG"], [["xyz", 1], ["q", ""]]).split("\n") == ["A    LONG", "xyz  1", "q"]
    assert render.when(None) == "-" and render.when(0.0) == "-" and render.when(3661.0) == "01:01:01"


def test_formatted_gives_json_yaml_or_the_table():
    data = {"id": "j-1", "tasks": [1, 2]}
    assert render.formatted(data, "json", str) == '{\n  "id": "j-1",\n  "tasks": [\n    1,\n    2\n  ]\n}'
    assert render.formatted(data, "yaml", str) == "id: j-1\ntasks:\n- 1\n- 2"
    assert render.formatted(data, "table", lambda d: d["id"]) == "j-1"
    assert render.submitted(["j-1"], ["r-1"], "table") == "j-1"
    assert json.loads(render.submitted(["j-1"], ["r-1"], "json")) == {"id": "j-1", "request_id": "r-1"}
    assert render.submitted(["j-1", "j-2"], ["r-1", "r-2"], "table") == "j-1\nj-2"  # one id a line
    assert json.loads(render.submitted(["j-1", "j-2"], ["r-1", "r-2"], "json")) == [
        {"id": "j-1", "request_id": "r-1"}, {"id": "j-2", "request_id": "r-2"}]


def test_describe_job_shows_tasks_with_their_end_and_the_events():
    job = render.job_dict(running_job())
    assert job["tasks"][1] == {"index": 1, "rank": 1, "node": "n2", "gpus": [], "state": "exited", "exit_code": 137,
                               "reason": "OOMKilled", "reason_message": "memory limit 4Gi"}
    assert job["tasks"][0]["exit_code"] is None and job["finished_at"] is None and job["queue"] == "default"
    assert render.job_description(job) == """\
Job:        j-1 (train)
Status:     RUNNING
User:       alice   Queue: default
Attempt:    1 (restarts used 0 of max_restarts 1)
Gang:       2 task(s) x cpu 2, memory 4Gi, gpu 4
Topology:   pack rack (required)
Priority:   0
Command:    true
Submitted:  01:00:00   Started: 01:01:01   Finished: -
Tasks:
  INDEX  RANK  NODE  GPUS     STATE    EXIT  REASON
  0      0     n1    0,1,2,3  running  -     -
  1      1     n2    -        exited   137   OOMKilled (memory limit 4Gi)
Events:
  01:00:00  Submitted  queued
  01:01:01  Scheduled  on n1,n2"""
    assert render.jobs_table([job]).split("\n") == [
        "ID   NAME   TYPE   USER   STATUS   ATTEMPT  TASKS  GPU/TASK  SUBMITTED  WAIT  START",
        "j-1  train  batch  alice  RUNNING  1        2      4         01:00:00   1m    -"]
    session = {**job, "type": "interactive", "held_by": "alice", "status": "PENDING"}
    assert render.jobs_table([session]).split("\n")[1].split()[2:5] == ["interactive", "alice", "PENDING"]
    assert "PENDING (held)" in render.jobs_table([session])
    assert "Status:     PENDING (held by alice: `synctl release j-1`)" in render.job_description(session)
    assert "Type: interactive" in render.job_description(session)
    assert render.job_event_line(running_job().events[1]) == "01:01:01  Scheduled  on n1,n2"


def test_describe_a_failed_job_says_where_to_read_the_failing_tasks_output():
    info = running_job()
    info.status, info.failure = "STOPPING", "task 1 (rank 1) on n2: OOMKilled: memory limit 4Gi"
    lines = render.job_description(render.job_dict(info)).split("\n")
    assert lines[9:11] == ["Failed:     task 1 (rank 1) on n2: OOMKilled: memory limit 4Gi",
                           "Output:     synctl logs j-1 --attempt 1 --task 1"]
    info.tasks[0].reason = "Error"  # two tasks failed of themselves: no one task to point at
    assert "Output:     synctl logs j-1 --attempt 1" in render.job_description(render.job_dict(info)).split("\n")


def test_describe_a_pending_job_says_why_it_waits():
    info = api_pb2.JobInfo(id="j-2", spec=codec.job_spec_to_proto(spec(tasks=3, gpu=8, name="big")),
                           status="PENDING", waiting="short of gpu in every rack", shortfalls=["r1: 8 gpu"],
                           reservation="nodes n1,n2", cancelled_by="bob")
    lines = render.job_description(render.job_dict(info)).split("\n")
    assert lines[1] == "Status:     PENDING (cancelled by bob)"
    assert lines[-4:] == ["Waiting:    short of gpu in every rack", "  - r1: 8 gpu", "Reserved:   nodes n1,n2",
                          "Events:"]


def test_get_jobs_and_describe_show_the_estimated_start_of_a_pending_job():
    """START: "in ~25 min" within two hours, "at HH:MM UTC" later, "unknown: <why>"; json keeps the epoch."""
    now = 1_699_920_000.0  # midnight UTC

    def pending(**fields):
        return render.job_dict(api_pb2.JobInfo(id="j-6", spec=codec.job_spec_to_proto(spec(tasks=2, name="g")),
                                               status="PENDING", submitted_at=now - 60, **fields))

    soon = pending(estimated_start=now + 25 * 60, estimate_basis="reservation",
                   estimate_detail="holds a reservation of 2 node(s) in z0/b0/r1",
                   estimate_ahead=[api_pb2.EstimateAhead(job_id="j-1", ends_at=now + 25 * 60)])
    later = pending(estimated_start=now + 5 * 3600, estimate_basis="queue")
    never = pending(estimate_basis="unknown", estimate_why="can never fit")
    assert [render.start_column(j, now) for j in (soon, later, never)] == [
        "in ~25 min", "at 05:00 UTC", "unknown: can never fit"]
    assert soon["estimated_start"] == now + 1500 and soon["estimate_basis"] == "reservation"
    assert soon["estimate_ahead"] == [{"job": "j-1", "ends_at": now + 1500}]
    assert never["estimated_start"] is None and never["estimate_why"] == "can never fit"
    assert render.jobs_table([never], now=now).split("\n")[1].endswith("1m    unknown: can never fit")
    assert any(line.startswith("Start:      ") and "holds a reservation of 2 node(s) in z0/b0/r1" in line
               for line in render.job_description(soon).split("\n"))
    running = render.job_dict(api_pb2.JobInfo(id="j-7", spec=codec.job_spec_to_proto(spec()), status="RUNNING",
                                              estimated_start=now))
    assert running["estimated_start"] is None and render.start_column(running, now) == "-"


def test_describe_a_job_names_the_nodes_excluded_for_it():
    state = cluster(racks=1, nodes_per_rack=2)
    checked(state, c.SubmitJob(at=10, job_id="j1", request_id="j1", spec=spec(tasks=1)))
    checked(state, c.CommitPlan(at=20, job_id="j1", attempt=1,
                                placements=(Placement(0, "r0-n0", tuple(range(8)), 0),)))
    checked(state, c.NodeLost(at=50, node_id="r0-n0"))
    job = render.job_dict(convert.job_to_info(state.jobs["j1"]))
    assert job["excluded_nodes"] == ["r0-n0"]
    assert "Excluded:   r0-n0 (they ended earlier attempts: never placed there again)" \
        in render.job_description(job).split("\n")
    assert "Excluded" not in render.job_description(render.job_dict(running_job()))


def test_get_jobs_shows_how_long_each_job_waits():
    """WAIT: a pending job's wait so far (up to `now`), a started one's wait until it started."""
    base = render.job_dict(api_pb2.JobInfo(id="j-3", spec=codec.job_spec_to_proto(spec(tasks=1, name="p")),
                                           status="PENDING", submitted_at=1000.0))
    rows = [base, {**base, "id": "j-4", "status": "RUNNING", "started_at": 1045.0},
            {**base, "id": "j-5", "status": "CANCELLED"}]
    waits = [line.split()[-2] for line in render.jobs_table(rows, now=1000.0 + 2 * 86400 + 4 * 3600 + 59).split("\n")]
    assert waits == ["WAIT", "2d04h", "45s", "-"]
    assert [format_duration(s) for s in (-3, 59, 61, 3599, 3600 + 5 * 60, 86399)] == ["0s", "59s", "1m", "59m",
                                                                                   "1h05m", "23h59m"]


def test_nodes_show_use_over_capacity_and_why_they_take_no_tasks():
    cordoned = api_pb2.NodeInfo(
        id="n1", address="10.0.0.1:7000", topology=["z1", "r1"], status="READY", schedulable=False, live_tasks=1,
        capacity=types_pb2.Resources(cpu_millis=64000, memory_bytes=512 * GI, gpu=8),
        used=types_pb2.Resources(cpu_millis=2500, memory_bytes=4 * GI, gpu=4), gpus_in_use=[0, 1, 2, 3],
        labels={"zone": "a", "gpu_model": "H100"}, isolation="cgroup v2", cordon_reason="maintenance")
    sick = api_pb2.NodeInfo(id="n22", address="10.0.0.22:7000", topology=["r2"], status="READY", schedulable=True,
                            capacity=types_pb2.Resources(cpu_millis=500, memory_bytes=GI), health="nvidia-smi failed")
    nodes = [render.node_dict(cordoned), render.node_dict(sick)]
    assert nodes[0]["labels"] == {"gpu_model": "H100", "zone": "a"} and nodes[1]["health"] == "nvidia-smi failed"
    assert render.nodes_table(nodes).split("\n") == [
        "ID   STATUS  SCHEDULABLE  TOPOLOGY  GPUS  LABELS          CPU       MEMORY     TASKS  ADDRESS         REASON",
        "n1   READY   no           z1/r1     4/8   gpu_model=H100  2500m/64  4Gi/512Gi  1      10.0.0.1:7000   "
        "maintenance",
        "n22  READY   yes          r2        0/0   -               0/500m    0/1Gi      0      10.0.0.22:7000  "
        "unhealthy: nvidia-smi failed"]
    assert render.node_description(nodes[0]) == """\
Node:         n1   Address: 10.0.0.1:7000
Status:       READY
Schedulable:  no: maintenance
Health:       passing (or no health check)
Topology:     z1/r1
Labels:       gpu_model=H100, zone=a
Isolation:    cgroup v2
GPUs:         4/8 in use (indices 0,1,2,3)
CPU:          2500m/64
Memory:       4Gi/512Gi
Tasks:        1"""
    assert render.drained("n1", ["j-1", "j-5"]) == "n1: drained; stopped 2 job(s): j-1, j-5"
    assert render.drained("n2", []) == "n2: drained; stopped 0 job(s)"


def test_a_queue_leaves_out_the_limits_it_does_not_set():
    queue = Queue(name="research", parent="root", weight=2.0, guaranteed=Resources(8000, 64 * GI, 8),
                  max=Resources(-1, -1, 16), lending_limit=Resources(-1, -1, -1), users=("alice",), groups=("ml",))
    info = api_pb2.QueueInfo(spec=codec.queue_to_proto(queue), usage=types_pb2.Resources(gpu=4, cpu_millis=1000),
                             pending=2, running=1, decayed_gpu_hours=12.34)
    implicit = api_pb2.QueueInfo(spec=types_pb2.QueueSpec(name="default", weight=1.0), implicit=True)
    research = render.queue_dict(info)
    assert research == {
        "name": "research", "parent": "root", "weight": 2.0,
        "guaranteed": {"gpu": 8, "cpu": "8", "memory": "64Gi"}, "max": {"gpu": 16}, "lending_limit": {},
        "users": ["alice"], "groups": ["ml"], "preemption": {"rules": [], "min_runtime_s": 0.0, "max_grace_s": 0.0},
        "usage": {"gpu": 4, "cpu": "1", "memory": "0"}, "decayed_gpu_hours": 12.34, "pending": 2, "running": 1}
    assert render.queue_dict(implicit)["implicit"] is True
    assert render.queues_table([research]).split("\n") == [
        "NAME      PARENT  WEIGHT  GPU USED  GPU-H DECAYED  GPU GUARANTEED  GPU MAX  PENDING  RUNNING",
        "research  root    2       4         12.3           8               16       2        1"]
    assert render.applied(api_pb2.ApplyQueuesReply(created=["a"], changed=["b"], unchanged=["c"])) == [
        "queue/a created", "queue/b configured", "queue/c unchanged"]


def test_an_event_as_a_table_row_a_watched_line_and_a_json_line():
    event = render.event_dict(api_pb2.ClusterEventInfo(seq=12, at=7200.0, type="Normal", topic="job",
                                                       reason="JobSubmitted", object_id="j-1", message="by alice"))
    assert render.events_table([event]).split("\n") == ["SEQ  TIME      TYPE    REASON        OBJECT   MESSAGE",
                                                        "12   02:00:00  Normal  JobSubmitted  job/j-1  by alice"]
    assert render.watched_event(event, "table") == "12      02:00:00  Normal   JobSubmitted     job/j-1  by alice"
    assert json.loads(render.watched_event(event, "json")) == {
        "seq": 12, "at": 7200.0, "type": "Normal", "topic": "job", "reason": "JobSubmitted", "object": "j-1",
        "message": "by alice"}


def test_cluster_status_names_the_leader_and_its_match_index_for_each_follower():
    leader = api_pb2.ReplicaStatusReply(id="m1", state="leader", term=3, commit_index=10, applied_index=10,
                                        digest="abcdef0123456789", raft_address="r:1", match_index={"r:2": 9},
                                        command_version=2, cluster_version=1)
    follower = api_pb2.ReplicaStatusReply(id="m2", state="follower", term=3, commit_index=9, applied_index=8,
                                          digest="abcdef0123456789", raft_address="r:2", leader_api="a:1",
                                          command_version=1)
    replicas = [render.replica_dict("a:1", leader), render.replica_dict("a:2", follower),
                render.unreachable_replica("a:3", "down")]
    status = render.cluster_dict(replicas, dict(leader.match_index))
    assert status["leader"] == {"id": "m1", "address": "a:1"} and status["term"] == 3
    assert "matched_index" not in status["replicas"][0] and status["replicas"][1]["matched_index"] == 9
    assert render.cluster_text(status).split("\n") == [
        "leader: m1 at a:1 (term 3)",
        "cluster version: 1",
        "ID  ADDRESS  STATE     TERM  COMMIT  APPLIED  MATCHED  DIGEST        VERSION  REACHABLE",
        "m1  a:1      leader    3     10      10       -        abcdef012345  2        yes",
        "m2  a:2      follower  3     9       8        9        abcdef012345  1        yes",
        "?   a:3      -         -     -       -        -        -             -        no"]
    leaderless = render.cluster_dict([render.replica_dict("a:2", follower)], {})
    assert leaderless["leader"] is None and render.cluster_text(leaderless).startswith("leader: none\n")


def test_preemption_plan_and_its_refusal():
    plan = render.preempt_dict("j-2", api_pb2.PreemptWhatIfReply(
        possible=True, rule="priority", victims=["j-3", "j-4"], nodes=["n1", "n2"], explanation="j-2 outranks them",
        lost_gpu_seconds=12.5))
    assert plan["lost_gpu_seconds"] == 12.5
    assert render.preempt_text(plan) == "would preempt j-3, j-4 (rule priority) and hold n1, n2\nj-2 outranks them"
    none = render.preempt_dict("j-1", api_pb2.PreemptWhatIfReply(explanation="job j-1 is RUNNING, not PENDING"))
    assert none["rule"] is None and none["lost_gpu_seconds"] is None
    assert render.preempt_text(none) == "no preemption for j-1: job j-1 is RUNNING, not PENDING"


def test_users_and_a_token_shown_once():
    alice = api_pb2.UserInfo(name="alice", groups=["ml", "ops"], role="user", created_at=3600.0, created_by="admin",
                             token_set_at=3600.0)
    assert render.users_table([render.user_dict(alice)]).split("\n") == [
        "NAME   ROLE  GROUPS  CREATED   BY     TOKEN SET", "alice  user  ml,ops  01:00:00  admin  01:00:00"]
    assert render.whoami_text(render.user_dict(alice)) == "alice (role user, groups ml,ops)"
    assert render.whoami_text(render.user_dict(api_pb2.UserInfo(name="admin", role="admin", bootstrap=True))) == \
        "admin (role admin, the cluster token's built-in admin)"
    token = render.token_dict(api_pb2.UserToken(user=api_pb2.UserInfo(name="bob", role="user"), token="s3cret"))
    assert token["token"] == "s3cret" and token["name"] == "bob"
    assert render.token_text(token, "added") == (
        "user bob added (role user, groups -).\n"
        "Its token, shown this once (the cluster keeps only a keyed hash):\n\n"
        "export SYNAPSE_TOKEN=s3cret")
    assert render.task_log("a\nb\n", 1, prefix=True) == "[task 1] a\n[task 1] b\n"
    assert render.task_log("a\nb", 1, prefix=False) == "a\nb"


def usage_reply() -> api_pb2.GetUsageReply:
    day1 = api_pb2.ClusterUsage(day="2026-11-01", allocated_gpu_hours=96.0, idle_gpu_hours=24.0, down_gpu_hours=72.0,
                                allocated_cpu_hours=100.0, idle_cpu_hours=300.0)
    day2 = api_pb2.ClusterUsage(day="2026-11-02", allocated_gpu_hours=180.5, idle_gpu_hours=11.5,
                                allocated_cpu_hours=50.0, idle_cpu_hours=50.0, down_cpu_hours=100.0)
    total = api_pb2.ClusterUsage(allocated_gpu_hours=276.5, idle_gpu_hours=35.5, down_gpu_hours=72.0,
                                 allocated_cpu_hours=150.0, idle_cpu_hours=350.0, down_cpu_hours=100.0)
    return api_pb2.GetUsageReply(rows=[api_pb2.UsageRow(key="research", gpu_hours=276.5, cpu_hours=150.0, jobs=12)],
                                 cluster_days=[day1, day2], cluster_total=total)


def test_usage_shows_the_cluster_utilisation_per_day_and_over_the_period():
    from synapse.client import accounting

    report = accounting.usage_report(usage_reply())
    assert accounting.usage_report_table(report, "queue").split("\n") == [
        "QUEUE     GPU-HOURS  CPU-HOURS  JOBS",
        "research  276.500    150.000    12",
        "TOTAL     276.500    150.000    12",
        "",
        "Cluster utilisation (GPU-hours, sampled by the leader)",
        "DAY (UTC)   ALLOCATED  IDLE    DOWN    GPU ALLOC  CPU ALLOC",
        "2026-11-01  96.000     24.000  72.000  50.0%      25.0%",
        "2026-11-02  180.500    11.500  0.000   94.0%      25.0%",
        "TOTAL       276.500    35.500  72.000  72.0%      25.0%"]
    assert report["cluster"]["total"] == {
        "gpu": {"allocated_hours": 276.5, "idle_hours": 35.5, "down_hours": 72.0, "allocated_percent": 72.0},
        "cpu": {"allocated_hours": 150.0, "idle_hours": 350.0, "down_hours": 100.0, "allocated_percent": 25.0}}
    assert json.loads(render.formatted(report, "json", str))["cluster"]["days"][1] == {
        "day": "2026-11-02",
        "gpu": {"allocated_hours": 180.5, "idle_hours": 11.5, "down_hours": 0.0, "allocated_percent": 94.0},
        "cpu": {"allocated_hours": 50.0, "idle_hours": 50.0, "down_hours": 100.0, "allocated_percent": 25.0}}
    assert render.formatted(report, "yaml", str).split("\n")[:12] == [
        "usage:", "- key: research", "  gpu_hours: 276.5", "  cpu_hours: 150.0", "  jobs: 12", "cluster:",
        "  days:", "  - day: '2026-11-01'", "    gpu:", "      allocated_hours: 96.0", "      idle_hours: 24.0",
        "      down_hours: 72.0"]
    empty = accounting.usage_report(api_pb2.GetUsageReply())
    assert accounting.usage_report_table(empty, "user").split("\n") == [
        "USER  GPU-HOURS  CPU-HOURS  JOBS", "", "Cluster utilisation: no samples in the period"]


def test_history_shows_a_job_that_never_ran_without_start_or_exit_code_and_sacct_as_cancelled():
    from synapse.client import accounting

    never = api_pb2.HistoryJob(job_id="dep", name="report", user="ann", queue="default", submit=1_700_000_000,
                               eligible=1_700_000_000, end=1_700_000_060, state="FAILED",
                               reason="DependencyNeverSatisfied", detail="failed: afterok up: it ended FAILED",
                               attempts=1, tasks=1, resources=types_pb2.Resources(gpu=1))
    d = accounting.history_dict(never)
    assert (d["reason"], d["start"], d["exit_code"]) == ("DependencyNeverSatisfied", None, None)
    assert accounting.history_table([d]).split("\n")[1].split() == [
        "dep", "ann", "default", "FAILED", "DependencyNeverSatisfied", "-", "-", "2023-11-14T22:14:20", "00:00:00",
        "1", "1"]
    assert "started never" in accounting.history_description(d) and "exit code -;" in accounting.history_description(d)
    (line,) = accounting.sacct_lines([never], "synapse", header=False)
    fields = dict(zip(accounting.SACCT_FIELDS, line.split("|"), strict=True))
    assert (fields["State"], fields["Start"], fields["ExitCode"]) == ("CANCELLED", "None", "0:0")
