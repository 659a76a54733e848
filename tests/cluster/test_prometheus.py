"""The Prometheus kit with its programs: the rules pass promtool and their unit tests, a real Prometheus
scraping a real local cluster sees SynapseNoLeader and SynapseMasterDown fire and resolve, scrapes a
TLS cluster's masters over HTTPS with the CA, and the Grafana dashboard queries only what a master
exposes (the files themselves are checked in tests/unit/test_prometheus.py)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from synapse.core import codec
from tests.support.cluster import wait_waiting
from tests.support.helpers import spec, wait_for
from tests.support.http import CONTRACTS, get
from tests.support.prometheus import ALERTS, KIT, RULES, SCRAPE, SCRAPE_TLS, dashboard_queries


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (Debian's prometheus: bash scripts/install-test-packages.sh)")
    return path


def run(*argv: str, cwd: Path = KIT) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_the_rules_and_the_scrape_config_pass_promtool():
    promtool = tool("promtool")
    assert f"SUCCESS: {len(RULES)} rules found" in run(promtool, "check", "rules", "alerts.yaml")
    assert "is valid prometheus config file syntax" in run(promtool, "check", "config", "prometheus.yml")
    assert "is valid prometheus config file syntax" in run(promtool, "check", "config", "prometheus-tls.yml")
    assert "SUCCESS" in run(promtool, "test", "rules", "alerts_test.yaml")


def test_a_broken_unit_test_fails_promtool(tmp_path):
    """The unit tests can fail: the same file expecting another summary does."""
    promtool = tool("promtool")
    shutil.copy(KIT / "alerts.yaml", tmp_path)
    text = (KIT / "alerts_test.yaml").read_text().replace("0 masters claim to lead", "1 masters claim to lead", 1)
    (tmp_path / "alerts_test.yaml").write_text(text)
    done = subprocess.run([promtool, "test", "rules", "alerts_test.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0 and "SynapseNoLeader" in done.stdout + done.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(address: str, path: str) -> dict:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as reply:
        return json.loads(reply.read())["data"]


def local_copy(tmp_path: Path, masters: list[str], workers: list[str], ca: str = "") -> Path:
    """The shipped scrape config and rules, pointed at a local cluster, with 1 s intervals and every
    `for:` cut to 2 s so that firing and resolving take seconds. With the cluster's `ca`: the TLS
    scrape config, with that CA."""
    config = json.loads(json.dumps(SCRAPE_TLS if ca else SCRAPE))
    config["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}
    targets = {"synapse-master": masters, "synapse-worker": workers}
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": targets[job["job_name"]]}]
        if "tls_config" in job:
            job["tls_config"]["ca_file"] = ca
    tmp_path.mkdir(parents=True, exist_ok=True)
    rules = json.loads(json.dumps(ALERTS))
    for rule in (r for g in rules["groups"] for r in g["rules"]):
        if "for" in rule:
            rule["for"] = "2s"
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(rules))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    return tmp_path / "prometheus.yml"


def firing(address: str) -> set[tuple[str, str]]:
    """(alert, instance) of every firing alert ("" for an alert with no instance)."""
    return {(a["labels"]["alertname"], a["labels"].get("instance", ""))
            for a in api(address, "/api/v1/alerts")["alerts"] if a["state"] == "firing"}


def start_prometheus(tmp_path: Path, config: Path) -> tuple[subprocess.Popen, str]:
    """A real Prometheus on `config`; (its process, its address)."""
    address = f"127.0.0.1:{free_port()}"
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen([tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address={address}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()  # the child holds its own copy
    return proc, address


def wait_all_up(address: str, count: int) -> list[dict]:
    """The active targets once Prometheus has scraped all `count` of them successfully."""
    targets: list[dict] = []

    def all_up() -> bool:
        nonlocal targets
        try:
            targets = api(address, "/api/v1/targets")["activeTargets"]
        except OSError:
            return False
        return len(targets) == count and all(t["health"] == "up" for t in targets)

    wait_for(all_up, 30, what="Prometheus to scrape every master and the worker")
    return targets


@pytest.mark.slow
def test_a_real_prometheus_sees_no_leader_and_master_down_fire_and_resolve(make_cluster, tmp_path):
    tool("prometheus")
    cluster = make_cluster(workers=1, racks=1)
    leader = cluster.wait_leader()
    http = {m["id"]: m["http_address"] for m in cluster.state["masters"]}
    worker_http = (cluster.worker_dir("w1") / "http-address").read_text().strip()
    config = local_copy(tmp_path / "prom", list(http.values()), [worker_http], ca=cluster.state["ca"])
    proc, address = start_prometheus(tmp_path, config)
    try:
        wait_all_up(address, 4)
        time.sleep(4)  # two `for:` periods of rule evaluations over a healthy cluster
        assert firing(address) == set()

        follower = next(m for m in http if m != leader)
        cluster.kill_master(follower)
        wait_for(lambda: ("SynapseMasterDown", http[follower]) in firing(address), 30, what="SynapseMasterDown")
        assert not any(name == "SynapseNoLeader" for name, _ in firing(address))  # two of three still agree

        cluster.kill_master(leader)  # a majority gone: the one left leads nothing
        wait_for(lambda: ("SynapseNoLeader", "") in firing(address), 30, what="SynapseNoLeader")
        assert {("SynapseMasterDown", http[follower]), ("SynapseMasterDown", http[leader])} <= firing(address)

        cluster.restart_master(follower)
        cluster.restart_master(leader)
        cluster.wait_leader(timeout=30)
        wait_for(lambda: firing(address) == set(), 30, what="every alert to resolve")

        for m in http:  # no master answers at all: only absent() can tell
            cluster.kill_master(m)
        wait_for(lambda: {("SynapseNoMasterAnswers", ""), ("SynapseNoLeader", "")} <= firing(address), 30,
                 what="SynapseNoMasterAnswers and SynapseNoLeader")
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.slow
def test_a_real_prometheus_scrapes_a_tls_clusters_masters_over_https_with_its_ca(make_cluster, tmp_path):
    tool("prometheus")
    cluster = make_cluster(workers=1, racks=1, tls=True)
    http = [m["http_address"] for m in cluster.state["masters"]]
    worker_http = (cluster.worker_dir("w1") / "http-address").read_text().strip()
    config = local_copy(tmp_path / "prom", http, [worker_http], ca=cluster.state["ca"])
    proc, address = start_prometheus(tmp_path, config)
    try:
        targets = wait_all_up(address, 4)
        assert sorted(t["scrapeUrl"] for t in targets if t["labels"]["job"] == "synapse-master") == [
            f"https://{a}/metrics" for a in sorted(http)]
        assert api(address, "/api/v1/query?query=count(synapse_raft_is_leader)")["result"][0]["value"][1] == "3"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


#: The sample names a family of each type exposes.
SAMPLE_NAMES = {"counter": ("{}_total",), "histogram": ("{}_bucket", "{}_sum", "{}_count")}


def test_every_metric_the_dashboard_queries_is_in_the_exposition(make_cluster):
    """Scraped from the leader (pending reasons are the leader's) with a gang waiting, and a worker."""
    cluster = make_cluster(workers=1, racks=1)
    wait_waiting(cluster.client, cluster.client.submit(codec.job_spec_to_proto(spec(tasks=2, gpu=8, name="too-big"))))
    leader = cluster.master(cluster.wait_leader())["http_address"]
    worker = (cluster.worker_dir("w1") / "http-address").read_text().strip()
    contract = {m["name"]: m for m in CONTRACTS["metrics"] + CONTRACTS["worker_metrics"]}
    labels: dict[str, set[str]] = {"up": set()}  # Prometheus's own; job and instance it adds to all
    for address, ca in ((leader, cluster.state["ca"]), (worker, "")):
        status, text = get(address, "/metrics", ca=ca)
        assert status == 200
        for family in text_string_to_metric_families(text):  # a family with no sample yet counts too
            if family.name not in contract:  # the client library's own, and *_created
                continue
            for name in SAMPLE_NAMES.get(family.type, ("{}",)):
                labels[name.format(family.name)] = set(contract[family.name]["labels"]) | {"le"}
    queries = dashboard_queries()
    assert len(queries) >= 25
    for query in queries:
        names = set(re.findall(r"\b(synapse_[a-z_]+|up)\b(?=\s*[{\[)\s-])", query + " "))
        assert names, query
        missing = names - set(labels)
        assert not missing, (query, missing)
        known = set().union(*(labels[n] for n in names)) | {"job", "instance"}
        for grouping in re.findall(r"\bby \(([^)]*)\)", query):
            assert {g.strip() for g in grouping.split(",")} <= known, (query, grouping)
