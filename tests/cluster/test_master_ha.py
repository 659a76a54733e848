"""The highly available master with real processes on 127.0.0.1: redirects, failover, restarts."""

from __future__ import annotations

import grpc
import pytest

from synapse.client.master_client import ClientError, ClusterUnavailable, MasterClient
from synapse.common.auth import client_metadata
from synapse.proto import api_pb2
from tests.support.cluster import proto_spec, register, wait_status
from tests.support.helpers import wait_for

pytestmark = pytest.mark.slow


def test_follower_names_the_leader_and_client_follows(make_cluster):
    cluster = make_cluster()
    leader = cluster.wait_leader()
    follower = next(m for m in cluster.state["masters"] if m["id"] != leader)
    stub = cluster.client.stub(follower["api_address"])
    with pytest.raises(grpc.RpcError) as err:
        stub.SubmitJob(api_pb2.SubmitJobRequest(request_id="x", spec=proto_spec()), timeout=5,
                       metadata=client_metadata(cluster.token))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert dict(err.value.trailing_metadata())["synapse-leader"] == cluster.master(leader)["api_address"]
    # Through a client that only knows the follower, the submission still lands.
    only_follower = cluster.new_client([follower["api_address"]])
    job_id = only_follower.submit(proto_spec(), request_id="via-follower")
    assert only_follower.get_job(job_id).status == "PENDING"
    assert only_follower.leader == cluster.master(leader)["api_address"]


def test_kill_leader_then_submit_succeeds_and_request_id_is_idempotent(make_cluster):
    cluster = make_cluster()
    first = cluster.client.submit(proto_spec(), request_id="req-1")
    old_leader = cluster.wait_leader()
    cluster.kill_master(old_leader)
    # The same request id after a failover: still exactly one job.
    assert cluster.client.submit(proto_spec(), request_id="req-1") == first
    second = cluster.client.submit(proto_spec(), request_id="req-2")
    new_leader = cluster.wait_leader(exclude=old_leader)
    assert new_leader != old_leader
    assert sorted(j.id for j in cluster.client.list_jobs()) == sorted([first, second])


def test_full_restart_keeps_every_acknowledged_job(make_cluster):
    cluster = make_cluster()
    register(cluster, "n1")
    acked = [cluster.client.submit(proto_spec(tasks=1, gpu=8), request_id=f"r{i}") for i in range(20)]
    before = {j.id: j.status for j in cluster.client.list_jobs()}
    assert set(before) == set(acked) and list(before.values()).count("SCHEDULED") == 1
    # Listings come in pages, oldest first, without events.
    first = cluster.client.call("ListJobs", api_pb2.ListJobsRequest(limit=7))
    assert [j.id for j in first.jobs] == acked[:7] and first.next == acked[6] and not first.jobs[0].events
    assert [j.id for j in cluster.client.list_jobs(page=7)] == acked
    assert len(cluster.client.get_job(acked[0]).events) >= 1
    for m in cluster.state["masters"]:
        cluster.kill_master(m["id"])
    for m in cluster.state["masters"]:
        cluster.restart_master(m["id"])
    after = {j.id: j.status for j in cluster.client.list_jobs()}
    assert after == before
    assert [j.id for j in cluster.client.list_jobs(page=6)] == acked  # order survives the restart
    cluster.converged_digest()


def test_node_without_heartbeats_goes_down_and_gang_is_requeued(make_cluster):
    cluster = make_cluster()
    credentials = {n: register(cluster, n, rack=r).node_credential for n, r in (("n1", "r1"), ("n2", "r2"))}
    job_id = cluster.client.submit(proto_spec(tasks=1, gpu=8, max_restarts=1))
    job = wait_status(cluster.client, job_id, {"SCHEDULED"})
    # Only n2 keeps heartbeating: the node holding the task goes DOWN after the 3 s timeout.
    lost_node = job.tasks[0].node_id
    alive = "n2" if lost_node == "n1" else "n1"
    worker = cluster.node_client(alive)
    worker.metadata = worker.metadata + (("synapse-node-credential", credentials[alive]),)
    import time
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        worker.call("Heartbeat", api_pb2.HeartbeatRequest(node_id=alive))
        nodes = {n.id: n.status for n in cluster.client.list_nodes()}
        if nodes[lost_node] == "DOWN":
            break
        time.sleep(0.3)
    assert nodes == {lost_node: "DOWN", alive: "READY"}
    job = wait_status(cluster.client, job_id, {"SCHEDULED"}, attempt=2)
    assert job.tasks[0].node_id == alive


def test_grow_three_to_five_then_survive_two_losses_and_replace(make_cluster):
    import yaml
    from click.testing import CliRunner

    from synapse.client.cli.main import main as synctl
    from synapse.local.cluster import free_base_port

    cluster = make_cluster()
    env = dict(cluster.env)
    config_path = cluster.data_dir / "cluster.yaml"
    before = cluster.client.submit(proto_spec(), request_id="before-growth")
    for replica_id in ("m4", "m5"):
        base = free_base_port(1)
        raft, api = f"127.0.0.1:{base + 100}", f"127.0.0.1:{base}"
        out = CliRunner().invoke(synctl, ["cluster", "add-master", "--id", replica_id, "--raft", raft,
                                          "--api", api], env=env)
        assert out.exit_code == 0 and "added" in out.output, out.output
        doc = yaml.safe_load(config_path.read_text())
        doc["replicas"].append({"id": replica_id, "raft": raft, "api": api})
        config_path.write_text(yaml.safe_dump(doc))
        cluster.state["masters"].append({"id": replica_id, "api_address": api, "raft_address": raft, "pid": 0,
                                         "data_dir": str(cluster.data_dir / "masters" / replica_id)})
        cluster.restart_master(replica_id)
        cluster.converged_digest(timeout=20)
    # converged_digest compares the replicas that answer: m5 may still be catching up (or starting).
    def caught_up():
        try:
            s = cluster.client.replica_status(cluster.master("m5")["api_address"])
        except (ClientError, ClusterUnavailable):
            return None
        return s if s.commands_applied > 0 else None
    status = wait_for(caught_up, 30, "m5 to apply the log")
    assert len(status.partners) == 4
    # Five replicas tolerate two failures: kill two (never the last leader alone), keep writing.
    leader = cluster.wait_leader()
    victims = [m for m in ("m1", "m2", "m3") if m != leader][:2]
    for victim in victims:
        cluster.kill_master(victim)
    survivors = [m["api_address"] for m in cluster.state["masters"] if m["id"] not in victims]
    client = cluster.new_client(survivors, deadline=20)
    after = client.submit(proto_spec(), request_id="after-two-losses")
    assert {j.id for j in client.list_jobs()} == {before, after}
    # Replace a dead replica: remove it from the membership.
    out = CliRunner().invoke(synctl, ["cluster", "remove-master", "--id", victims[0]],
                             env={**env, "SYNAPSE_MASTERS": ",".join(survivors)})
    assert out.exit_code == 0 and "removed" in out.output, out.output
    leader_api = client.leader
    assert len(client.replica_status(leader_api).partners) == 3
    # Both are idempotent: a retry whose first answer was lost (a timeout, a failover) succeeds and
    # changes nothing.
    out = CliRunner().invoke(synctl, ["cluster", "remove-master", "--id", victims[0]],
                             env={**env, "SYNAPSE_MASTERS": ",".join(survivors)})
    assert out.exit_code == 0 and "removed" in out.output, out.output
    m5 = cluster.master("m5")
    out = CliRunner().invoke(synctl, ["cluster", "add-master", "--id", "m5", "--raft", m5["raft_address"],
                                      "--api", m5["api_address"]], env={**env, "SYNAPSE_MASTERS": ",".join(survivors)})
    assert out.exit_code == 0 and "added" in out.output, out.output
    assert len(client.replica_status(client.leader).partners) == 3


def test_finished_jobs_are_forgotten_after_the_retention(tmp_path):
    from synapse.local import cluster as local
    from synapse.local.cluster import free_base_port

    data_dir = tmp_path / "retention"
    state = local.up(data_dir, 3, 0, 1, 8, free_base_port(3), heartbeat=0.5, job_retention="1s")
    try:
        client = MasterClient([m["api_address"] for m in state["masters"]], state["token"], tls=local.client_tls(state))
        done = client.submit(proto_spec(), request_id="short-lived")
        client.cancel(done)
        waiting = client.submit(proto_spec(), request_id="still-pending")
        import time
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(client.list_jobs()) > 1:
            time.sleep(0.2)
        assert [j.id for j in client.list_jobs()] == [waiting]  # the pending job stays
        client.close()
    finally:
        local.down(data_dir)
