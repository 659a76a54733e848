"""Link shards on a real cluster: any replica absorbs a heartbeat and names the node's shard, the
leader learns liveness from the followers' digests alone, followers serve assignments, and killing
the replica a worker is attached to moves it without a NodeDown."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
import time

import grpc
import pytest

from synapse.common.auth import REPLICA_CREDENTIAL_KEY, node_metadata
from synapse.core import codec
from synapse.core.shards import shard_of
from synapse.proto import api_pb2
from tests.support.cluster import proto_spec, register, wait_status
from tests.support.helpers import spec, wait_for
from tests.support.http import scrape, value


def running(tasks: int, *command: str) -> api_pb2.JobSpec:
    return codec.job_spec_to_proto(dataclasses.replace(spec(tasks=tasks, gpu=8), command=command))


def heartbeat(stub, metadata, node_id: str = "n1") -> api_pb2.HeartbeatReply:
    """A heartbeat answered by this replica (one that has not applied the registration yet says
    UNAVAILABLE, and only the leader says UNKNOWN)."""
    deadline = time.monotonic() + 5
    while True:
        try:
            return stub.Heartbeat(api_pb2.HeartbeatRequest(node_id=node_id), metadata=metadata, timeout=5)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def statuses(cluster) -> dict[str, str]:
    return {n.id: n.status for n in cluster.client.list_nodes()}


def metrics_by_api(cluster) -> dict[str, dict]:
    """Every replica's scraped metrics, by its API address."""
    return {m["api_address"]: scrape(m["http_address"], ca=cluster.state["ca"]) for m in cluster.state["masters"]}


def test_any_replica_absorbs_a_heartbeat_and_the_leader_hears_it_through_the_digests(make_cluster):
    cluster = make_cluster()
    leader = cluster.master(cluster.wait_leader())
    credential = register(cluster, "n1").node_credential
    metadata = node_metadata("n1", credential)
    n1 = cluster.node_client("n1")  # on a TLS cluster, n1's calls carry its certificate
    # every replica answers (none refuses), and each names the same shard, never the leader while
    # it has followers (asked again if an election on this busy machine moved the leader meanwhile)
    deadline = time.monotonic() + 10
    while True:
        shard = shard_of("n1", cluster.addresses, leader["api_address"])
        replies = [heartbeat(n1.stub(m["api_address"]), metadata) for m in cluster.state["masters"]]
        if all(r.shard == shard and r.node_status == "READY" and list(r.order)[-1] == leader["api_address"]
               for r in replies) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
        leader = cluster.master(cluster.wait_leader())
    assert [(r.shard, r.node_status) for r in replies] == [(shard, "READY")] * 3
    assert shard != leader["api_address"] and list(replies[0].order)[-1] == leader["api_address"]
    # each replica counts what it absorbed; the ones that are not n1's shard count redirects
    for api, families in metrics_by_api(cluster).items():
        absorbed, redirected = (value(families, f"synapse_shard_{n}") for n in ("heartbeats", "redirects"))
        assert absorbed >= 1 and (redirected < absorbed if api == shard else redirected >= 1), (api, shard)
    # heartbeats to the other follower alone, for twice the 3 s timeout: the node stays READY
    other = next(m["api_address"] for m in cluster.state["masters"]
                 if m["api_address"] not in (shard, leader["api_address"]))
    stub = n1.stub(other)
    end = time.monotonic() + 6
    while time.monotonic() < end:
        assert stub.Heartbeat(api_pb2.HeartbeatRequest(node_id="n1"), metadata=metadata, timeout=5).shard == shard
        assert statuses(cluster)["n1"] == "READY"
        time.sleep(0.5)
    attached = {api: value(f, "synapse_shard_nodes") for api, f in metrics_by_api(cluster).items()}
    assert attached == {api: 1 if api == other else 0 for api in attached}  # heard within the 3 s timeout
    # silent everywhere: DOWN within the timeout, a digest and a monitor tick
    silent = time.monotonic()
    while statuses(cluster)["n1"] != "DOWN":
        assert time.monotonic() - silent < 6, "a silent node was never declared DOWN"
        time.sleep(0.1)
    assert time.monotonic() - silent > 2.5
    # heard again at a follower: back up (the change goes to the leader at once)
    stub.Heartbeat(api_pb2.HeartbeatRequest(node_id="n1"), metadata=metadata, timeout=5)
    deadline = time.monotonic() + 3
    while statuses(cluster)["n1"] != "READY":
        assert time.monotonic() < deadline, "a node heard again at a follower did not come back up"
        stub.Heartbeat(api_pb2.HeartbeatRequest(node_id="n1"), metadata=metadata, timeout=5)
        time.sleep(0.2)


def test_only_a_replica_sends_digests(make_cluster):
    cluster = make_cluster()
    leader = cluster.master(cluster.wait_leader())
    stub = cluster.client.stub(leader["api_address"])
    credential = register(cluster, "n1").node_credential
    digest = api_pb2.LivenessDigest(shard="x:1", node_ids=["n1"], ages_ms=[0])
    with pytest.raises(grpc.RpcError) as err:  # a worker's credential may not (with its certificate)
        cluster.node_client("n1").stub(leader["api_address"]).ReportLiveness(
            digest, metadata=node_metadata("n1", credential), timeout=5)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as err:  # a made-up replica credential is no one
        stub.ReportLiveness(digest, metadata=((REPLICA_CREDENTIAL_KEY, "0" * 64),), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    password = (cluster.data_dir / "secrets" / "raft-password").read_text().strip()
    replica = hashlib.sha256(b"synapse-replica-credential\0" + password.encode()).hexdigest()
    with pytest.raises(grpc.RpcError) as err:  # one age per node
        stub.ReportLiveness(api_pb2.LivenessDigest(shard="x:1", node_ids=["n1"]),
                            metadata=((REPLICA_CREDENTIAL_KEY, replica),), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert stub.ReportLiveness(digest, metadata=((REPLICA_CREDENTIAL_KEY, replica),), timeout=5).term > 0
    user = cluster.client.call("AddUser", api_pb2.AddUserRequest(name="alice", role="user")).token
    with pytest.raises(grpc.RpcError) as err:  # nor a user's token
        stub.ReportLiveness(digest, metadata=(("authorization", f"Bearer {user}"),), timeout=5)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


@contextlib.contextmanager
def beating(stub, metadata, node_id: str = "n1"):
    """Heartbeats for `node_id` to `stub`'s replica every 0.3 s while the block runs (it stays READY)."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.3):
            try:
                stub.Heartbeat(api_pb2.HeartbeatRequest(node_id=node_id), metadata=metadata, timeout=2)
            except grpc.RpcError:
                pass

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_a_follower_serves_assignments_and_refuses_no_worker(make_cluster):
    cluster = make_cluster()
    leader = cluster.master(cluster.wait_leader())
    credential = register(cluster, "n1").node_credential
    metadata = node_metadata("n1", credential)
    follower = next(m for m in cluster.state["masters"] if m["id"] != leader["id"])
    stub = cluster.node_client("n1").stub(follower["api_address"])
    with beating(stub, metadata):
        job_id = cluster.client.submit(proto_spec(tasks=1, gpu=8))
        stream = stub.WatchAssignments(api_pb2.WatchAssignmentsRequest(node_id="n1"), metadata=metadata, timeout=10)
        for message in stream:
            if any(t.job_id == job_id for t in message.tasks):
                assert message.node_status == "READY" and message.version > 0
                break
        stream.cancel()
        # a worker that has seen a newer version than a replica holds waits for it, never goes back
        job = wait_status(cluster.client, job_id, {"SCHEDULED"})
        assert job.tasks[0].node_id == "n1"
        with pytest.raises(grpc.RpcError) as err:
            for _ in stub.WatchAssignments(api_pb2.WatchAssignmentsRequest(node_id="n1", known_version=10 ** 9),
                                           metadata=metadata, timeout=10):
                raise AssertionError("a replica served a version older than the worker's")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_watch_sends_a_list_only_when_it_changed(make_cluster):
    """Commits that touch a node without changing its list (a cordon and its undoing) send it
    nothing; the next change does. (Before, every newer version went out: a gang's n TaskPrepared
    commits sent each of its n workers its unchanged list, n x n messages ahead of its release.)"""
    cluster = make_cluster()
    leader = cluster.master(cluster.wait_leader())
    metadata = node_metadata("n1", register(cluster, "n1").node_credential)
    follower = next(m for m in cluster.state["masters"] if m["id"] != leader["id"])
    stub = cluster.node_client("n1").stub(follower["api_address"])
    stream = stub.WatchAssignments(api_pb2.WatchAssignmentsRequest(node_id="n1"), metadata=metadata, timeout=30)
    with beating(stub, metadata):
        first = next(stream)
        while first.node_status != "READY":  # the follower had not applied the registration yet
            first = next(stream)
        assert not first.tasks
        messages: list = []

        def read() -> None:
            try:
                messages.extend(stream)
            except grpc.RpcError:
                pass  # cancelled

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        for schedulable in (False, True):  # each commit touches n1 (and is applied before the job's)
            cluster.client.call("SetSchedulable", api_pb2.SetSchedulableRequest(node_id="n1",
                                                                                 schedulable=schedulable))
        job_id = cluster.client.submit(proto_spec(tasks=1, gpu=8))
        wait_for(lambda: any(t.job_id == job_id for m in messages for t in m.tasks), 20, "n1's list with the job")
        stream.cancel()
    assert all(any(t.job_id == job_id for t in m.tasks) for m in messages), \
        [(m.version, [t.job_id for t in m.tasks]) for m in messages]


def test_killing_the_replica_a_worker_is_attached_to_moves_it_without_a_node_down(make_cluster):
    cluster = make_cluster(workers=4, racks=1)
    leader = cluster.master(cluster.wait_leader())
    workers = [w["id"] for w in cluster.state["workers"]]
    shards = {w: shard_of(w, cluster.addresses, leader["api_address"]) for w in workers}
    victim_api = max(set(shards.values()), key=lambda a: sum(1 for s in shards.values() if s == a))
    victim = next(m for m in cluster.state["masters"] if m["api_address"] == victim_api)
    job_id = cluster.client.submit(running(4, "sleep", "12"))
    wait_status(cluster.client, job_id, {"RUNNING"}, timeout=30)
    cluster.kill_master(victim["id"])
    # three timeouts with the replica gone: no NodeDown, the gang keeps running
    end = time.monotonic() + 9
    while time.monotonic() < end:
        assert set(statuses(cluster).values()) == {"READY"}, statuses(cluster)
        assert cluster.client.get_job(job_id).status == "RUNNING"
        time.sleep(0.3)
    # the leader counts the dead shard's silence; its workers are attached to the other follower now
    survivor = next(m for m in cluster.state["masters"] if m["id"] not in (leader["id"], victim["id"]))
    silence = scrape(leader["http_address"], ca=cluster.state["ca"])
    assert value(silence, "synapse_leader_shard_silence_seconds", shard=victim_api) > 8
    assert value(silence, "synapse_leader_shard_silence_seconds", shard=survivor["api_address"]) < 3
    assert value(silence, "synapse_nodes_held_silent") == 0
    assert value(scrape(survivor["http_address"], ca=cluster.state["ca"]), "synapse_shard_nodes") == len(workers)
    # the moved workers watch elsewhere: a new job reaches them and ends
    second = cluster.client.submit(running(4, "true"))
    assert wait_status(cluster.client, second, {"SUCCEEDED"}, timeout=30).status == "SUCCEEDED"
    assert wait_status(cluster.client, job_id, {"SUCCEEDED"}, timeout=30).status == "SUCCEEDED"


def test_a_follower_that_names_a_leader_its_digests_do_not_reach_lets_its_workers_go():
    """Chaos `partition-leader` (seed 1, a false NodeDown about 2.5 s after the heal): the cut-off old
    leader's outgoing packets were dropped, but the new leader's appends got in now and then, so it
    named that leader, kept serving and kept its workers while none of its digests got out. A
    link to a leader is not enough: a whole cut-off without a digest delivered ends the serving."""
    from types import SimpleNamespace

    from synapse.master.link_shard import LinkShard

    leader = ""
    master = SimpleNamespace(stopping=False, replica=SimpleNamespace(api="10.0.0.3:1"),
                             config=SimpleNamespace(heartbeat_interval=0.5, heartbeat_timeout=3.0),
                             ready_leader_term=lambda: 0, leader_api_address=lambda: leader)
    shard = LinkShard(master)
    cut_off = shard.timings.cut_off
    now = time.monotonic()
    leader = "10.0.0.1:1"
    shard.delivered_at = now - cut_off / 2
    assert shard.serving()  # a link, and digests through within the cut-off (an election passes unnoticed)
    shard.delivered_at = now - cut_off - 1
    assert not shard.serving()  # the one-way link of the partition: its workers must move
    leader = ""
    shard.delivered_at, shard.leader_contact = now - cut_off / 2, now - cut_off - 1
    assert not shard.serving()  # no link to a leader for the cut-off (as before)
    master.ready_leader_term = lambda: 7
    shard.delivered_at = now - 10 * cut_off
    assert shard.serving()  # the leader always serves
