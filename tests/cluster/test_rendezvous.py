"""MASTER_PORT with real sockets: the worker's probe, and a port taken on rank 0's node requeuing the
attempt with another port on a real cluster (the rule that picks it is in tests/unit/test_rendezvous.py)."""

from __future__ import annotations

import socket

import pytest

from synapse.core.rendezvous import master_port
from synapse.proto import api_pb2
from synapse.worker.runtime import port_in_use
from tests.support.cluster import read_logs, submit, wait_job
from tests.support.helpers import wait_for


def test_the_probe_sees_a_listener_on_any_address_and_not_a_closed_one():
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::1")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.bind((host, 0))
        except OSError:
            continue  # no IPv6 here
        with sock:
            port = sock.getsockname()[1]
            sock.listen()
            assert port_in_use(port), host
        assert not port_in_use(port), host


@pytest.mark.slow
def test_a_master_port_taken_on_rank_0s_node_requeues_the_attempt_with_another_port(make_cluster):
    cluster = make_cluster(masters=1, workers=1, racks=1, gpus=0)
    wait_for(lambda: [n for n in cluster.client.list_nodes() if n.status == "READY"], 30, "the worker")
    cordon = api_pb2.SetSchedulableRequest(node_id="w1", schedulable=False, reason="until the port is taken")
    cluster.client.call("SetSchedulable", cordon)
    job_id = submit(cluster, "port", 2, ["sh", "-c", "echo port=$MASTER_PORT"], gpu=0, max_restarts=0)
    taken = master_port(job_id, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        if not port_in_use(taken):  # else something here holds it already, which does as well
            squatter.bind(("127.0.0.1", taken))
            squatter.listen()
        cluster.client.call("SetSchedulable", api_pb2.SetSchedulableRequest(node_id="w1", schedulable=True))
        info = wait_job(cluster, job_id, {"SUCCEEDED", "FAILED"}, timeout=60)
    events = [e.message for e in info.events]
    assert info.status == "SUCCEEDED" and info.attempt == 2, events  # max_restarts 0: the clash used none
    assert f"attempt 2 after MASTER_PORT {taken} in use on node w1; not charged to max_restarts" in events, events
    assert {log.strip() for log in read_logs(cluster, job_id, attempt=2)} == {f"port={master_port(job_id, 2)}"}
