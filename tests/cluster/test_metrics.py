"""/metrics and health on a real 3-master cluster, held to cluster-configs/prometheus/metrics.yaml."""

from __future__ import annotations

import dataclasses
import re
import time

import pytest
import yaml

from synapse.core import codec
from tests.support.cluster import wait_status
from tests.support.helpers import spec, wait_for
from tests.support.http import CONTRACTS, ROOT, get, scrape, value

CONTRACT, WORKER_CONTRACT = CONTRACTS["metrics"], CONTRACTS["worker_metrics"]
ALERTS = yaml.safe_load((ROOT / "cluster-configs" / "prometheus" / "alerts.yaml").read_text())


def holds_to(contract: list[dict], families: dict, who: str) -> None:
    """Every metric of the contract is there, with its type and exactly its label names."""
    for metric in contract:
        family = families.get(metric["name"])
        assert family is not None, (who, metric["name"])
        assert family.type == metric["type"], (who, metric["name"], family.type)
        for sample in family.samples:
            labels = set(sample.labels) - ({"le"} if metric["type"] == "histogram" else set())
            assert labels == set(metric["labels"]), (who, metric["name"], sample.labels)


def test_alert_rules_use_only_metrics_of_the_contract():
    both = CONTRACT + WORKER_CONTRACT
    names = {m["name"] for m in both} | {f"{m['name']}_total" for m in both if m["type"] == "counter"}
    rules = [r for g in ALERTS["groups"] for r in g["rules"]]
    assert rules
    for rule in rules:
        used = set(re.findall(r"\bsynapse_[a-z_]+", rule["expr"]))
        assert used <= names, (rule["alert"], used - names)
        assert rule["annotations"]["summary"] and rule["labels"]["severity"] in ("critical", "warning", "info")


@pytest.mark.slow
def test_every_master_serves_metrics_and_health(make_cluster):
    cluster = make_cluster(workers=2)
    cluster.wait_leader()
    http = {m["id"]: m["http_address"] for m in cluster.state["masters"]}
    ca = cluster.state["ca"]  # HTTPS on a TLS cluster

    def lists_sent() -> float:
        return sum(value(scrape(address, ca=ca), "synapse_watch_lists", outcome="sent") for address in http.values())

    lists_before = wait_for(lambda: (n := lists_sent()) >= 2 and n, timeout=10,
                            what="both workers' first assignment lists (their watches attached)")
    job = cluster.client.submit(codec.job_spec_to_proto(spec(tasks=1, gpu=2)))
    wait_status(cluster.client, job, {"SUCCEEDED"})  # settled: no replica may see it end between scrapes
    cluster.converged_digest()
    scraped = {rid: scrape(address, ca=ca) for rid, address in http.items()}
    for rid, families in scraped.items():
        holds_to(CONTRACT, families, rid)
    assert sorted(value(f, "synapse_raft_is_leader") for f in scraped.values()) == [0, 0, 1]
    assert all(value(f, "synapse_raft_has_leader") == 1 for f in scraped.values())
    # State gauges come from the replicated state: every caught-up replica says the same.
    for name in ("synapse_gpus", "synapse_jobs", "synapse_nodes"):
        views = [sorted((tuple(sorted(s.labels.items())), s.value) for s in f[name].samples) for f in scraped.values()]
        assert views[0] == views[1] == views[2], name
    assert value(scraped["m1"], "synapse_gpus") == 16
    leader = cluster.wait_leader()
    assert value(scraped[leader], "synapse_api_requests", method="SubmitJob", code="OK") >= 1
    # the job's node was listed its task, then the list without it: two lists more than each
    # worker's first (sent as its watch attached)
    assert sum(value(f, "synapse_watch_lists", outcome="sent") for f in scraped.values()) - lists_before >= 2
    # link shards: the followers absorb the 2 workers' heartbeats (the first comes after a random
    # pause) and reach the leader every second
    followers = [rid for rid in scraped if rid != leader]
    deadline = time.monotonic() + 10
    while True:
        shards = {rid: scrape(address, ca=ca) for rid, address in http.items()}
        if sum(value(shards[rid], "synapse_shard_nodes") for rid in followers) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert sum(value(shards[rid], "synapse_shard_heartbeats") for rid in followers) >= 2
    assert sum(value(shards[rid], "synapse_shard_nodes") for rid in followers) >= 2
    apis = {m["id"]: m["api_address"] for m in cluster.state["masters"]}
    silences = {s.labels["shard"]: s.value for s in shards[leader]["synapse_leader_shard_silence_seconds"].samples}
    assert set(silences) == {apis[rid] for rid in followers} and max(silences.values()) < 3, silences
    assert value(shards[leader], "synapse_nodes_held_silent") == 0
    for rid in followers:
        assert value(shards[rid], "synapse_shard_serving") == 1
        assert value(shards[rid], "synapse_shard_digests", result="delivered") >= 1
        assert value(shards[rid], "synapse_shard_last_digest_age_seconds") < 3
        assert not shards[rid]["synapse_leader_shard_silence_seconds"].samples  # the leader's alone
    for families in scraped.values():  # every replica saw the gang placed and started
        assert {s.name: s.value for s in families["synapse_queue_wait_seconds"].samples}[
            "synapse_queue_wait_seconds_count"] >= 1
        counts = {s.name: s.value for s in families["synapse_gang_start_seconds"].samples}
        assert counts["synapse_gang_start_seconds_count"] >= 1
        assert {s.name: s.value for s in families["synapse_gang_racks_spanned"].samples}[
            "synapse_gang_racks_spanned_count"] >= 1
    leader_families = scraped[leader]
    assert {s.name: s.value for s in leader_families["synapse_raft_commit_seconds"].samples}[
        "synapse_raft_commit_seconds_count"] >= 1
    assert value(leader_families, "synapse_raft_proposals", result="applied") >= 1
    assert {s.name: s.value for s in leader_families["synapse_scheduling_round_seconds"].samples}[
        "synapse_scheduling_round_seconds_count"] >= 1
    assert {s.name: s.value for s in leader_families["synapse_journal_fsync_seconds"].samples}[
        "synapse_journal_fsync_seconds_count"] >= 1

    for rid, address in http.items():
        assert get(address, "/livez", ca=ca) == (200, "ok\n")
        status, body = get(address, "/readyz?verbose", ca=ca)
        assert status == 200 and "[+]raft-leader-known ok" in body and "[+]storage ok" in body
        assert get(address, "/readyz/leader", ca=ca)[0] == (200 if rid == leader else 503)
        assert get(address, "/metrics", method="POST", ca=ca)[0] == 405
        assert get(address, "/nowhere", ca=ca)[0] == 401  # the dashboard wants a token first

    before = scrape(http[leader], ca=ca)
    cluster.client.list_nodes()
    after = scrape(http[leader], ca=ca)
    for name in ("synapse_api_requests",):  # counters only grow
        for sample in before[name].samples:
            assert value(after, name, **sample.labels) >= sample.value

    cluster.kill_master(leader)
    try:
        new = cluster.wait_leader(exclude=leader)
        deadline = time.monotonic() + 10
        while get(http[new], "/readyz/leader", ca=ca)[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        ready = [rid for rid, address in http.items()
                 if rid != leader and get(address, "/readyz/leader", ca=ca)[0] == 200]
        assert ready == [new]
        assert value(scrape(http[new], ca=ca), "synapse_raft_leader_changes_seen") >= 1
    finally:
        cluster.restart_master(leader)


@pytest.mark.slow
def test_grpc_health_names_exactly_one_serving_leader(make_cluster):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from synapse.master.main import LEADER_SERVICE

    cluster = make_cluster()
    leader = cluster.wait_leader()

    def statuses() -> dict[str, int]:
        out = {}
        for m in cluster.state["masters"]:
            with cluster.channel(m["api_address"]) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                assert stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status == 1
                out[m["id"]] = stub.Check(health_pb2.HealthCheckRequest(service=LEADER_SERVICE), timeout=5).status
        return out

    deadline = time.monotonic() + 10
    while statuses() != {m["id"]: 1 if m["id"] == leader else 2 for m in cluster.state["masters"]}:
        assert time.monotonic() < deadline, statuses()
        time.sleep(0.2)


@pytest.mark.slow
def test_a_master_tells_systemd_it_is_ready_and_pings_its_watchdog(tmp_path):
    """A one-replica cluster's master, started as systemd would start it (NOTIFY_SOCKET and
    WATCHDOG_USEC set), sends READY=1 and then WATCHDOG=1 pings; STOPPING=1 on SIGTERM."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    from synapse.local import cluster as local

    state = local.up(tmp_path / "c", 1, 0, 1, 8, local.free_base_port(1))
    local.down(tmp_path / "c")
    sock_path = tmp_path / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(sock_path))
    listener.settimeout(20)
    env = {**os.environ, "NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "1000000"}
    proc = subprocess.Popen([sys.executable, "-m", "synapse.master", "--config", str(tmp_path / "c" / "cluster.yaml"),
                             "--id", state["masters"][0]["id"]], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        got = []
        while got.count("WATCHDOG=1") < 2:
            got.append(listener.recv(256).decode())
        assert got[0] == "READY=1" and got.count("WATCHDOG=1") >= 2
        proc.send_signal(signal.SIGTERM)
        while "STOPPING=1" not in got:
            got.append(listener.recv(256).decode())
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        listener.close()


@pytest.mark.slow
def test_a_worker_serves_its_own_metrics(make_cluster):
    cluster = make_cluster(workers=1, racks=1)
    job = cluster.client.submit(codec.job_spec_to_proto(spec(tasks=1, gpu=1)))
    wait_status(cluster.client, job, {"SUCCEEDED"})
    address = (cluster.worker_dir("w1") / "http-address").read_text().strip()
    deadline = time.monotonic() + 10
    while True:
        families = scrape(address)
        beats = {s.name: s.value for s in families["synapse_worker_heartbeat_seconds"].samples}
        if beats["synapse_worker_heartbeat_seconds_count"] >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert beats["synapse_worker_heartbeat_seconds_count"] >= 1
    holds_to(WORKER_CONTRACT, families, "w1")
    assert value(families, "synapse_worker_master_connected") == 1
    assert value(families, "synapse_worker_task_exits", outcome="succeeded") == 1
    starts = {s.name: s.value for s in families["synapse_worker_task_start_seconds"].samples}
    assert starts["synapse_worker_task_start_seconds_count"] == 1
    assert {s.labels["phase"] for s in families["synapse_worker_tasks"].samples} == {"starting", "running", "stopping"}
    assert get(address, "/livez") == (200, "ok\n")
    assert get(address, "/metrics", method="POST")[0] == 405


@pytest.mark.slow
def test_each_task_start_and_end_reaches_the_master_once(make_cluster):
    """A report thread woken while its call was out (the main loop wakes it at any change while
    reports are owed) sent the reports just acknowledged again, before the main loop had taken the
    acknowledgement in: a second call and a second log entry for a start or an end."""
    cluster = make_cluster(workers=2, racks=1)
    jobs = [cluster.client.submit(codec.job_spec_to_proto(
        dataclasses.replace(spec(tasks=2, gpu=8, name=f"j{k}"), command=("sleep", "0.2")))) for k in range(6)]
    for job in jobs:
        wait_status(cluster.client, job, {"SUCCEEDED"}, timeout=60)
    addresses = [(cluster.worker_dir(w) / "http-address").read_text().strip() for w in ("w1", "w2")]

    def sent() -> float:
        return sum(value(scrape(address), "synapse_worker_task_reports") for address in addresses)

    expected = len(jobs) * 2 * 2  # each task: its start and its end, once
    wait_for(lambda: sent() >= expected, 10, "every start and end acknowledged")
    time.sleep(0.5)  # a second report, if one were owed, goes within a report loop's wake-up
    assert sent() == expected
