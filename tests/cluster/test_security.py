"""Security: what reaches the Raft port cannot run code; strangers are refused."""

from __future__ import annotations

import os
import pickle
import random
import socket
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from synapse.core import codec
from synapse.local.cluster import free_base_port
from tests.support.helpers import spec
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow


class Exploit:
    """Unpickling this creates a marker file: proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def frame(payload: bytes) -> bytes:
    return struct.pack("i", len(payload)) + payload


def attack(address: str, marker: Path, rounds: int = 3) -> None:
    """Send pysyncobj-framed pickles (compressed as it expects) and random bytes to a Raft port."""
    host, port = address.rsplit(":", 1)
    evil = frame(zlib.compress(pickle.dumps(Exploit(str(marker)))))
    rng = random.Random(1)
    for _ in range(rounds):
        for blob in (evil, frame(rng.randbytes(200)), rng.randbytes(500), frame(b"")):
            try:
                with socket.create_connection((host, int(port)), timeout=2) as s:
                    s.sendall(blob)
                    time.sleep(0.1)
            except OSError:
                pass


def wait_file(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.05)
    return path.exists()


def test_control_an_unprotected_pysyncobj_runs_the_payload(tmp_path):
    """Without this, the next test could pass by never delivering the payload at all."""
    address = f"127.0.0.1:{free_base_port(1)}"
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.raft_bare", address], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        marker = tmp_path / "pwned"
        attack(address, marker, rounds=1)
        assert wait_file(marker, 5), "the payload did not run on an unprotected pysyncobj node"
    finally:
        proc.kill()
        proc.wait()


def test_raft_port_with_password_runs_nothing_and_keeps_serving(make_cluster, tmp_path):
    cluster = make_cluster()
    marker = tmp_path / "pwned"
    for m in cluster.state["masters"]:
        attack(m["raft_address"], marker)
    assert not wait_file(marker, 2), "code ran on a master's Raft port"
    job_id = cluster.client.submit(codec.job_spec_to_proto(spec()))
    assert cluster.client.get_job(job_id).status == "PENDING"
    cluster.converged_digest()
    statuses = [cluster.client.replica_status(a) for a in cluster.addresses]
    assert sorted(s.state for s in statuses) == ["follower", "follower", "leader"]


def test_raft_binds_only_the_configured_address(make_cluster):
    cluster = make_cluster()
    m = cluster.state["masters"][0]
    port = int(m["raft_address"].rsplit(":", 1)[1])
    listening = Path("/proc/net/tcp").read_text().splitlines()[1:]
    local_addresses = {line.split()[1] for line in listening if line.split()[3] == "0A"}  # LISTEN
    assert f"0100007F:{port:04X}" in local_addresses  # 127.0.0.1
    assert f"00000000:{port:04X}" not in local_addresses  # not 0.0.0.0


def test_a_worker_may_act_only_for_its_own_node(make_cluster):
    """RegisterNode hands out a credential for that node; another node's calls are refused."""
    import grpc

    from synapse.client.master_client import ClientError
    from synapse.common.auth import client_metadata
    from synapse.proto import api_pb2, types_pb2

    # The node credentials alone, beneath mTLS (which test_tls_cluster_with_mtls_workers covers,
    # and which would refuse these calls earlier, for the certificate): plain mode.
    cluster = make_cluster(tls=False)
    cap = types_pb2.Resources(cpu_millis=1000, memory_bytes=1 << 30, gpu=1)
    creds = {n: cluster.client.call("RegisterNode", api_pb2.RegisterNodeRequest(
        node_id=n, address="127.0.0.1:1", topology=["r1"], capacity=cap)).node_credential for n in ("a", "b")}
    assert creds["a"] != creds["b"] and len(creds["a"]) == 64
    stub = cluster.client.stub(cluster.client.leader)

    def beat(node_id, credential):
        md = client_metadata(cluster.token) + ((("synapse-node-credential", credential),) if credential else ())
        return stub.Heartbeat(api_pb2.HeartbeatRequest(node_id=node_id), metadata=md, timeout=5)

    assert beat("a", creds["a"]).node_status == "READY"
    for node_id, credential in (("b", creds["a"]), ("b", ""), ("a", "0" * 64)):
        with pytest.raises(grpc.RpcError) as err:
            beat(node_id, credential)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, (node_id, credential)
    # A report for node b's tasks sent with node a's credential is refused before it is proposed.
    with pytest.raises(grpc.RpcError) as err:
        stub.ReportTaskEvents(api_pb2.ReportTaskEventsRequest(node_id="b", events=[api_pb2.TaskEvent(
            job_id="j", attempt=1, index=0, started=False, exit_code=0)]),
            metadata=client_metadata(cluster.token) + (("synapse-node-credential", creds["a"]),), timeout=5)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # Absurd registrations are refused and name the field.
    with pytest.raises(ClientError, match="capacity"):
        cluster.client.call("RegisterNode", api_pb2.RegisterNodeRequest(
            node_id="c", address="127.0.0.1:1", capacity=types_pb2.Resources(gpu=-1)))
    with pytest.raises(ClientError, match="topology"):
        cluster.client.call("RegisterNode", api_pb2.RegisterNodeRequest(
            node_id="c", address="127.0.0.1:1", topology=["x" * 100], capacity=cap))


def test_tls_cluster_with_mtls_workers(tmp_path):
    """TLS on the API, mTLS for workers: the right CA works; a stranger's CA fails fast (no spinning);
    a worker's certificate is good for its own node only."""
    import grpc

    from synapse.client.master_client import MasterClient, TLSError
    from synapse.common.tls import TLSFiles, channel_credentials, generate
    from synapse.local import cluster as local
    from synapse.proto import api_pb2, types_pb2

    data_dir = tmp_path / "tls-cluster"
    state = local.up(data_dir, 3, 2, 1, 8, free_base_port(3), heartbeat=0.5, tls=True)
    try:
        addresses = [m["api_address"] for m in state["masters"]]
        good = MasterClient(addresses, state["token"], tls=local.client_tls(state))
        assert sorted((n.id, n.status) for n in good.list_nodes()) == [("w1", "READY"), ("w2", "READY")]
        job_id = good.submit(codec.job_spec_to_proto(spec(tasks=2, gpu=8)))
        deadline = time.monotonic() + 20
        while good.get_job(job_id).status != "SUCCEEDED" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert good.get_job(job_id).status == "SUCCEEDED"  # workers ran it over mTLS

        generate(tmp_path / "stranger", ["127.0.0.1"], [])
        started = time.monotonic()
        with pytest.raises(TLSError):
            stranger = tmp_path / "stranger"
            MasterClient(addresses, state["token"], deadline=20, tls=TLSFiles(
                str(stranger / "ca.pem"), str(stranger / "client.pem"), str(stranger / "client-key.pem"))).list_nodes()
        assert time.monotonic() - started < 5

        # w1's certificate cannot register (or act) as w2.
        tls_dir = data_dir / "tls"
        creds = channel_credentials(TLSFiles(str(tls_dir / "ca.pem"), str(tls_dir / "worker-w1.pem"),
                                             str(tls_dir / "worker-w1-key.pem")))
        stub = good.stub(good.leader).__class__(grpc.secure_channel(good.leader, creds))
        with pytest.raises(grpc.RpcError) as err:
            stub.RegisterNode(api_pb2.RegisterNodeRequest(
                node_id="w2", address="127.0.0.1:1", topology=["r"],
                capacity=types_pb2.Resources(cpu_millis=1000, memory_bytes=1, gpu=1)),
                metadata=good.metadata, timeout=5)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        good.close()
    finally:
        local.down(data_dir)
