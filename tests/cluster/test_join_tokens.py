"""Join tokens on a real cluster: what a worker keeps on disk opens only that node's calls, and a worker
joins with a one-use token and restarts on its own credential (the rules are in
tests/unit/test_join_tokens.py)."""

from __future__ import annotations

import json
import os
import stat
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from synapse.client.cli.main import main as synctl
from synapse.common.auth import client_metadata, node_metadata
from synapse.common.tls import http_base
from synapse.core import codec
from synapse.local import cluster as local
from synapse.proto import api_pb2, api_pb2_grpc, types_pb2
from synapse.worker.lease import CREDENTIAL_FILE
from tests.support.helpers import spec, wait_for


def attempt(stub, method: str, request, metadata) -> grpc.StatusCode:
    """The status a call ends with (OK, or the first message of a stream)."""
    try:
        reply = getattr(stub, method)(request, metadata=metadata, timeout=5)
        if method in ("WatchAssignments", "ReadLog"):
            next(iter(reply))
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()


def worker_secrets(cluster, worker_id: str) -> tuple[str, str]:
    """What a thief finds on a worker machine: its join token file and its node credential."""
    join = (cluster.data_dir / "secrets" / local.JOIN_TOKEN_FILE).read_text().strip()
    saved = cluster.saved_credential(worker_id)
    assert saved["node_id"] == worker_id
    return join, saved["credential"]


@pytest.mark.slow
def test_a_workers_files_give_a_caller_nothing_but_that_nodes_calls(make_cluster):
    """Done when: with everything a worker keeps on disk, a caller gets PERMISSION_DENIED for user
    management, cancel, drain, membership, join tokens and another node's calls; only its own
    node's calls pass."""
    cluster = make_cluster(workers=2)
    job_id = cluster.client.submit(codec.job_spec_to_proto(spec(tasks=1, gpu=1, name="victim")))
    join, credential = worker_secrets(cluster, "w1")
    # The worker has no cluster token: not in its files, its command line or its environment.
    pid = cluster.worker("w1")["pid"]
    seen = [p.read_bytes() for p in cluster.worker_dir("w1").rglob("*") if p.is_file()]
    seen += [Path(f"/proc/{pid}/cmdline").read_bytes(), Path(f"/proc/{pid}/environ").read_bytes()]
    assert not any(cluster.token.encode() in blob for blob in seen)
    mode = stat.S_IMODE(os.stat(cluster.worker_dir("w1") / CREDENTIAL_FILE).st_mode)
    assert mode == 0o600

    # On a TLS cluster the thief also holds the worker's certificate.
    stub = api_pb2_grpc.MasterStub(cluster.channel(cluster.client.leader, as_node="w1"))
    cap = types_pb2.Resources(cpu_millis=1000, memory_bytes=1 << 30, gpu=1)
    as_w1 = node_metadata("w1", credential)
    forbidden = [
        ("AddUser", api_pb2.AddUserRequest(name="mallory", role="admin")),
        ("ListUsers", api_pb2.ListUsersRequest()),
        ("RemoveUser", api_pb2.RemoveUserRequest(name="alice")),
        ("CancelJob", api_pb2.CancelJobRequest(job_id=job_id)),
        ("DrainNode", api_pb2.DrainNodeRequest(node_id="w2")),
        ("SetSchedulable", api_pb2.SetSchedulableRequest(node_id="w2", schedulable=False)),
        ("AddReplica", api_pb2.MembershipRequest(id="m9", raft_address="127.0.0.1:1", api_address="127.0.0.1:2")),
        ("RemoveReplica", api_pb2.MembershipRequest(id="m2")),
        ("CreateJoinToken", api_pb2.CreateJoinTokenRequest(uses=1)),
        ("SubmitJob", api_pb2.SubmitJobRequest(spec=codec.job_spec_to_proto(spec()))),
        ("LogAccess", api_pb2.LogAccessRequest(job_id=job_id)),
        ("Heartbeat", api_pb2.HeartbeatRequest(node_id="w2")),
        ("WatchAssignments", api_pb2.WatchAssignmentsRequest(node_id="w2")),
        ("ReportTaskEvents", api_pb2.ReportTaskEventsRequest(node_id="w2", events=[api_pb2.TaskEvent(
            job_id=job_id, attempt=1, index=0, started=False, exit_code=1)])),
        ("RegisterNode", api_pb2.RegisterNodeRequest(node_id="w2", address="127.0.0.1:1", topology=["r"],
                                                     capacity=cap)),
    ]
    for who, metadata in (("w1's credential", as_w1), ("the join token", client_metadata(join)),
                          ("both", client_metadata(join) + as_w1)):
        for method, request in forbidden:
            assert attempt(stub, method, request, metadata) == grpc.StatusCode.PERMISSION_DENIED, (who, method)
    # Another node's credential, or w1's under w2's name, is no identity at all.
    assert attempt(stub, "Heartbeat", api_pb2.HeartbeatRequest(node_id="w2"),
                   node_metadata("w2", credential)) == grpc.StatusCode.UNAUTHENTICATED
    # What w1's credential is for: w1's own calls.
    assert attempt(stub, "Heartbeat", api_pb2.HeartbeatRequest(node_id="w1"), as_w1) == grpc.StatusCode.OK
    assert attempt(stub, "WatchAssignments", api_pb2.WatchAssignmentsRequest(node_id="w1"), as_w1) == grpc.StatusCode.OK
    assert cluster.client.get_job(job_id).status in ("PENDING", "SCHEDULED", "RUNNING", "SUCCEEDED")
    assert {n.id for n in cluster.client.list_nodes()} == {"w1", "w2"}
    users = cluster.client.call("ListUsers", api_pb2.ListUsersRequest()).users
    assert "mallory" not in {u.name for u in users}
    # Nor do they open the dashboard, or another job's task logs on the worker itself.
    base, context = http_base(cluster.master(cluster.wait_leader())["http_address"], cluster.state["ca"])
    for secret in (join, credential):
        request = urllib.request.Request(f"{base}/", headers={"Authorization": f"Bearer {secret}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5, context=context)
        assert refused.value.code == 401
    (w1,) = [n for n in cluster.client.list_nodes() if n.id == "w1"]
    logs = api_pb2_grpc.WorkerStub(cluster.channel(w1.address, node_id="w1", as_node="w1"))
    for metadata in ((), client_metadata(join), as_w1):
        assert attempt(logs, "ReadLog", api_pb2.ReadLogRequest(job_id=job_id, attempt=1, index=0),
                       metadata) == grpc.StatusCode.UNAUTHENTICATED


def cli(cluster, *args: str) -> str:
    result = CliRunner().invoke(synctl, list(args), env=cluster.env)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.slow
def test_a_worker_joins_with_a_one_use_token_and_restarts_on_its_own_credential(make_cluster, tmp_path):
    cluster = make_cluster(workers=0)
    out = cli(cluster, "node", "token", "create", "--ttl", "1h", "--uses", "1", "-o", "json")
    made = json.loads(out)
    assert made["token"].startswith("synjoin_") and made["max_uses"] == 1 and made["uses"] == 0
    assert 3500 < made["expires_at"] - time.time() <= 3600
    token_file = tmp_path / "join-token"
    token_file.write_text(made["token"] + "\n")

    cluster.node_tls("wj")  # its certificate, on a TLS cluster, where worker_argv finds it

    def start() -> int:
        pid = local._spawn(local.worker_argv(cluster.data_dir, ",".join(cluster.addresses), token_file, "wj",
                                             "rack0", 8, 0.5), cluster.data_dir / "logs" / "wj.log")
        cluster.state["workers"].append({"id": "wj", "pid": pid, "rack": "rack0"})
        (cluster.data_dir / "cluster.json").write_text(json.dumps(cluster.state))
        return pid

    start()
    wait_for(lambda: any(n.id == "wj" and n.status == "READY" for n in cluster.client.list_nodes()), what="wj")
    tokens = json.loads(cli(cluster, "node", "token", "list", "-o", "json"))
    assert len(tokens) == 2  # and synapse-local's own, for the workers it starts
    (listed,) = [t for t in tokens if t["id"] == made["id"]]
    assert (listed["id"], listed["uses"], listed["max_uses"], listed["nodes"]) == (made["id"], 1, 1, ["wj"])
    assert "token" not in listed and made["id"] in cli(cluster, "node", "token", "list")
    # The token is spent: it registers nothing more, not even a node that does not exist yet.
    # (With a certificate issued to that node: what is refused is the spent token.)
    cap = types_pb2.Resources(cpu_millis=1000, memory_bytes=1 << 30, gpu=1)

    def intrude() -> grpc.StatusCode | None:
        """The leader's answer; None for UNAVAILABLE (a loaded machine's leader change says nothing)."""
        stub = api_pb2_grpc.MasterStub(cluster.channel(cluster.master(cluster.wait_leader())["api_address"],
                                                       as_node="intruder"))
        code = attempt(stub, "RegisterNode", api_pb2.RegisterNodeRequest(
            node_id="intruder", address="127.0.0.1:1", topology=["r"], capacity=cap), client_metadata(made["token"]))
        return None if code == grpc.StatusCode.UNAVAILABLE else code

    assert wait_for(intrude, 30, "an answer from the leader") == grpc.StatusCode.PERMISSION_DENIED

    # Restarted without its join token, the worker comes back on the credential in its data dir.
    cluster.kill_worker("wj", with_tasks=True)
    cluster.state["workers"].pop()
    token_file.unlink()
    token_file.write_text("")  # present but empty: it must not be needed
    start()
    # Restarts allowed: on a loaded machine the new process may start after the 3 s heartbeat
    # timeout, and the node goes DOWN (failing a first attempt placed there) before it is heard again.
    job_id = cluster.client.submit(codec.job_spec_to_proto(spec(tasks=1, gpu=1, max_restarts=5)))
    wait_for(lambda: cluster.client.get_job(job_id).status == "SUCCEEDED", what="a job on wj")
    log = (cluster.data_dir / "logs" / "wj.log").read_text()
    assert "with=join-token" in log and "with=credential" in log

    # A revoked token is no credential at all; an expired one registers nothing.
    other = json.loads(cli(cluster, "node", "token", "create", "-o", "json"))
    assert other["max_uses"] is None and 86300 < other["expires_at"] - time.time() <= 86400
    assert cli(cluster, "node", "token", "revoke", other["id"]).strip() == f"join token {other['id']} revoked"
    stub = api_pb2_grpc.MasterStub(cluster.channel(cluster.client.leader, as_node="late"))
    assert attempt(stub, "RegisterNode", api_pb2.RegisterNodeRequest(
        node_id="late", address="127.0.0.1:1", topology=["r"], capacity=cap),
        client_metadata(other["token"])) == grpc.StatusCode.UNAUTHENTICATED
    brief = json.loads(cli(cluster, "node", "token", "create", "--ttl", "1s", "-o", "json"))
    time.sleep(1.2)
    assert attempt(stub, "RegisterNode", api_pb2.RegisterNodeRequest(
        node_id="late", address="127.0.0.1:1", topology=["r"], capacity=cap),
        client_metadata(brief["token"])) == grpc.StatusCode.PERMISSION_DENIED
    listed_ids = {t["id"] for t in json.loads(cli(cluster, "node", "token", "list", "-o", "json"))}
    assert {made["id"], brief["id"]} <= listed_ids and other["id"] not in listed_ids and len(listed_ids) == 3
    # Join tokens are the admin's: a user may not even list them.
    alice = cluster.client.call("AddUser", api_pb2.AddUserRequest(name="alice")).token
    denied = CliRunner().invoke(synctl, ["node", "token", "list"], env={**cluster.env, "SYNAPSE_TOKEN": alice})
    assert denied.exit_code == 5 and "join tokens need the admin role" in denied.output
