"""Users, roles and ownership, over a real 3-master cluster with 2 workers running real tasks."""

from __future__ import annotations

import json
import time

import grpc
import pytest
from click.testing import CliRunner

from synapse.client.cli.exits import EXIT_DENIED
from synapse.client.cli.main import main
from synapse.client.master_client import MasterClient
from synapse.common.auth import client_metadata
from synapse.common.tls import TLSFiles
from synapse.proto import api_pb2, api_pb2_grpc
from tests.support.cluster import add_user, synctl_as, wait_status

pytestmark = pytest.mark.slow

SLEEPER = ["--name", "sleeper", "--tasks", "1", "--cpu", "1", "--mem", "1Gi", "--gpu", "1", "--",
           "sh", "-c", "echo hello from $SYNAPSE_TASK_INDEX; sleep 30"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from tests.support.cluster import LocalCluster

    c = LocalCluster(tmp_path_factory.mktemp("identity"), 3, 2, 1, 8)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def users(cluster):
    return {"alice": add_user(cluster, "alice", "--group", "team-a")["token"],
            "bob": add_user(cluster, "bob", "--group", "team-b")["token"]}


def submit(cluster, token):
    out = synctl_as(cluster, token, "submit", "-o", "json", *SLEEPER)
    assert out.exit_code == 0, out.output
    job_id = json.loads(out.output)["id"]
    wait_status(cluster.client, job_id, {"RUNNING"})
    return job_id


def test_user_add_prints_a_token_once_and_the_user_owns_what_it_submits(cluster, users):
    listed = json.loads(synctl_as(cluster, cluster.token, "user", "list", "-o", "json").output)
    alice = next(u for u in listed if u["name"] == "alice")
    assert alice["groups"] == ["team-a"] and alice["role"] == "user" and alice["created_by"] == "admin"
    assert "token" not in alice and "token_hash" not in alice

    me = json.loads(synctl_as(cluster, users["alice"], "whoami", "-o", "json").output)
    assert me["name"] == "alice" and me["role"] == "user"

    job_id = submit(cluster, users["alice"])
    jobs = json.loads(synctl_as(cluster, users["alice"], "get", "jobs", "-o", "json").output)
    assert next(j for j in jobs if j["id"] == job_id)["user"] == "alice"
    bobs = json.loads(synctl_as(cluster, users["bob"], "get", "jobs", "--user", "bob", "-o", "json").output)
    assert job_id not in {j["id"] for j in bobs}  # everyone reads everything; --user filters
    described = synctl_as(cluster, users["bob"], "describe", "job", job_id)
    assert "User:       alice" in described.output
    assert synctl_as(cluster, users["alice"], "cancel", job_id).exit_code == 0


def test_another_user_cannot_cancel_nor_cordon_and_nothing_changes(cluster, users):
    job_id = submit(cluster, users["alice"])
    users_before = synctl_as(cluster, cluster.token, "user", "list", "-o", "json").output

    out = synctl_as(cluster, users["bob"], "cancel", job_id)
    assert out.exit_code == EXIT_DENIED
    assert "permission denied" in out.output and "belongs to alice" in out.output
    node = cluster.client.list_nodes()[0].id
    out = synctl_as(cluster, users["bob"], "cordon", node)
    assert out.exit_code == EXIT_DENIED and "admin role" in out.output
    out = synctl_as(cluster, users["alice"], "user", "add", "mallory")
    assert out.exit_code == EXIT_DENIED and "user management" in out.output
    out = synctl_as(cluster, users["alice"], "cluster", "add-master", "--id", "m9", "--raft", "127.0.0.1:1",
                 "--api", "127.0.0.1:2")
    assert out.exit_code == EXIT_DENIED and "membership" in out.output

    # Refused calls changed nothing (reads commit barriers, so the state digest itself moves on).
    job = cluster.client.get_job(job_id)
    assert job.status == "RUNNING" and not job.cancelled_by
    assert all(n.schedulable for n in cluster.client.list_nodes())
    assert synctl_as(cluster, cluster.token, "user", "list", "-o", "json").output == users_before
    leader = cluster.client.replica_status(cluster.client.leader)
    assert "127.0.0.1:1" not in leader.partners

    out = synctl_as(cluster, cluster.token, "cancel", job_id)  # the admin may
    assert out.exit_code == 0, out.output
    job = wait_status(cluster.client, job_id, {"CANCELLED"})
    assert job.cancelled_by == "admin"
    described = synctl_as(cluster, users["alice"], "describe", "job", job_id).output
    assert "cancelled by admin" in described and "Submitted  by alice" in described


def test_logs_are_for_the_owner_and_admins_and_tickets_open_one_task_only(cluster, users):
    job_id = submit(cluster, users["alice"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        out = synctl_as(cluster, users["alice"], "logs", job_id)
        if "hello from 0" in out.output:
            break
        time.sleep(0.2)
    assert out.exit_code == 0 and "hello from 0" in out.output, out.output
    assert "hello from 0" in synctl_as(cluster, cluster.token, "logs", job_id).output
    out = synctl_as(cluster, users["bob"], "logs", job_id)
    assert out.exit_code == EXIT_DENIED and "logs of job" in out.output

    access = cluster.client.call("LogAccess", api_pb2.LogAccessRequest(job_id=job_id))
    ticket = access.tickets[0]
    with cluster.channel(ticket.address, node_id=ticket.node_id) as channel:
        stub = api_pb2_grpc.WorkerStub(channel)

        def read(**fields):
            request = api_pb2.ReadLogRequest(job_id=job_id, attempt=access.attempt, index=0, **fields)
            return b"".join(c.data for c in stub.ReadLog(request, timeout=5, metadata=fields.pop("md", ())))

        with pytest.raises(grpc.RpcError) as err:  # a user's token is no key to the worker
            b"".join(c.data for c in stub.ReadLog(api_pb2.ReadLogRequest(
                job_id=job_id, attempt=access.attempt, index=0), timeout=5, metadata=client_metadata(users["alice"])))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:  # the ticket names another task
            b"".join(c.data for c in stub.ReadLog(api_pb2.ReadLogRequest(
                job_id=job_id, attempt=access.attempt, index=1, ticket=ticket.ticket), timeout=5))
        assert err.value.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND)
        with pytest.raises(grpc.RpcError) as err:  # a forged ticket
            forged = ticket.ticket.split(".")[0] + "." + "0" * 64
            b"".join(c.data for c in stub.ReadLog(api_pb2.ReadLogRequest(
                job_id=job_id, attempt=access.attempt, index=0, ticket=forged), timeout=5))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert b"hello from 0" in read(ticket=ticket.ticket)
    cluster.client.cancel(job_id)


def test_rotation_and_removal_take_effect_on_every_master(cluster, users):
    carol = add_user(cluster, "carol")["token"]
    assert synctl_as(cluster, carol, "get", "jobs").exit_code == 0
    out = synctl_as(cluster, carol, "user", "rotate", "bob")  # only one's own
    assert out.exit_code == EXIT_DENIED
    rotated = json.loads(synctl_as(cluster, carol, "user", "rotate", "-o", "json").output)
    assert rotated["name"] == "carol" and rotated["token"] != carol
    assert synctl_as(cluster, carol, "get", "jobs").exit_code == 4
    carol = rotated["token"]
    assert synctl_as(cluster, carol, "get", "jobs").exit_code == 0

    out = synctl_as(cluster, cluster.token, "user", "remove", "carol")
    assert out.exit_code == 0, out.output
    for address in cluster.addresses:
        out = synctl_as(cluster, carol, "get", "jobs", masters=address)
        assert out.exit_code == 4, (address, out.output)
    assert synctl_as(cluster, "syn_not-a-token", "get", "nodes").exit_code == 4
    assert synctl_as(cluster, "", "get", "nodes").exit_code == 4


def test_a_new_user_is_known_at_once_on_any_master_even_after_a_failover(cluster, users):
    dave = add_user(cluster, "dave")["token"]
    for address in cluster.addresses:  # followers redirect what they have not yet applied
        out = synctl_as(cluster, dave, "whoami", masters=address)
        assert out.exit_code == 0 and out.output.startswith("dave"), (address, out.output)
    old = cluster.wait_leader()
    cluster.kill_master(old)
    try:
        new = cluster.wait_leader(exclude=old)
        follower = next(m["api_address"] for m in cluster.state["masters"] if m["id"] not in (old, new))
        out = synctl_as(cluster, dave, "submit", *SLEEPER, masters=follower)
        assert out.exit_code == 0, out.output
        job_id = out.output.strip()
        assert cluster.client.get_job(job_id).user == "dave"
        assert synctl_as(cluster, users["bob"], "cancel", job_id, masters=follower).exit_code == EXIT_DENIED
        assert synctl_as(cluster, dave, "cancel", job_id, masters=follower).exit_code == 0
    finally:
        cluster.restart_master(old)
        cluster.wait_leader()


def test_on_a_tls_cluster_a_certificate_names_its_user_and_logs_travel_encrypted(make_cluster):
    cluster = make_cluster(workers=1, racks=1, tls=True, user_certs=("erin",))
    tls = cluster.data_dir.resolve() / "tls"
    admin = {"SYNAPSE_MASTERS": ",".join(cluster.addresses), "SYNAPSE_TOKEN": cluster.token,
             "SYNAPSE_CA": str(tls / "ca.pem"), "SYNAPSE_CERT": str(tls / "client.pem"),
             "SYNAPSE_KEY": str(tls / "client-key.pem")}
    erin = {**admin, "SYNAPSE_TOKEN": "", "SYNAPSE_CERT": str(tls / "user-erin.pem"),
            "SYNAPSE_KEY": str(tls / "user-erin-key.pem")}
    cluster.client.close()
    cluster.client = MasterClient(cluster.addresses, cluster.token, deadline=30, tls=TLSFiles(
        admin["SYNAPSE_CA"], admin["SYNAPSE_CERT"], admin["SYNAPSE_KEY"]))

    def run(env, *args):
        return CliRunner().invoke(main, ["--timeout", "15", *args], env=env, catch_exceptions=False)

    # synapse-local's --user-cert made erin a user too: the certificate works at once
    assert run(erin, "whoami").output.startswith("erin (role user")
    assert run(admin, "user", "remove", "erin").exit_code == 0
    assert run(erin, "whoami").exit_code == 4  # a certificate alone is no one: tls.user_certs names a user
    assert run(admin, "user", "add", "erin").exit_code == 0
    assert run(erin, "whoami").output.startswith("erin (role user")
    out = run(erin, "submit", "-o", "json", *SLEEPER)
    assert out.exit_code == 0, out.output
    job_id = json.loads(out.output)["id"]
    wait_status(cluster.client, job_id, {"RUNNING"})
    assert cluster.client.get_job(job_id).user == "erin"
    deadline = time.monotonic() + 10
    while "hello from 0" not in (out := run(erin, "logs", job_id)).output and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "hello from 0" in out.output, out.output

    access = cluster.client.call("LogAccess", api_pb2.LogAccessRequest(job_id=job_id))
    with grpc.insecure_channel(access.tickets[0].address) as channel:  # plain text gets nothing
        with pytest.raises(grpc.RpcError):
            b"".join(c.data for c in api_pb2_grpc.WorkerStub(channel).ReadLog(api_pb2.ReadLogRequest(
                job_id=job_id, attempt=access.attempt, index=0, ticket=access.tickets[0].ticket), timeout=3))
    assert run(admin, "cancel", job_id).exit_code == 0
