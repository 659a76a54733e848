"""The operator's Prometheus kit (cluster-configs/prometheus, cluster-configs/grafana), its files: the
example scrape configs (plain, and HTTPS for a TLS cluster) name the jobs the rules expect, every
alert has a unit test that fires and one that does not, and the dashboard covers what it should.
promtool, a real Prometheus and a real cluster: tests/cluster/test_prometheus.py."""

from __future__ import annotations

import json
import re

import yaml

from tests.support.paths import ROOT
from tests.support.prometheus import DASHBOARD, KIT, RULES, SCRAPE, SCRAPE_TLS, dashboard_queries

# ---- the files alone -------------------------------------------------------------------------------

def test_the_scrape_config_names_every_job_the_rules_match():
    jobs = {c["job_name"] for c in SCRAPE["scrape_configs"]}
    matched = {job for r in RULES for job in re.findall(r'job="([^"]+)"', r["expr"])}
    assert matched and matched <= jobs, matched - jobs
    assert jobs == {"synapse-master", "synapse-worker"} and SCRAPE["rule_files"] == ["alerts.yaml"]


def test_the_tls_scrape_config_differs_only_in_the_masters_scheme_and_ca():
    tls = json.loads(json.dumps(SCRAPE_TLS))
    (masters,) = [c for c in tls["scrape_configs"] if c["job_name"] == "synapse-master"]
    assert masters.pop("scheme") == "https" and set(masters.pop("tls_config")) == {"ca_file"}
    assert tls == SCRAPE


def test_the_example_scrapes_the_http_address_of_every_master_of_the_example_cluster():
    cluster = yaml.safe_load((ROOT / "cluster-configs" / "three.yaml").read_text())
    (masters,) = [c for c in SCRAPE["scrape_configs"] if c["job_name"] == "synapse-master"]
    assert masters["static_configs"][0]["targets"] == [r["http"] for r in cluster["replicas"]]


def test_every_alert_has_a_unit_test_that_fires_and_one_that_does_not():
    cases = [case for test in yaml.safe_load((KIT / "alerts_test.yaml").read_text())["tests"]
             for case in test["alert_rule_test"]]
    for rule in RULES:
        mine = [case for case in cases if case["alertname"] == rule["alert"]]
        assert any(case["exp_alerts"] for case in mine), f"{rule['alert']}: no case where it fires"
        assert any(not case["exp_alerts"] for case in mine), f"{rule['alert']}: no case where it stays quiet"


def test_the_no_leader_alert_also_fires_when_no_master_answers():
    (rule,) = [r for r in RULES if r["alert"] == "SynapseNoLeader"]
    assert "absent(synapse_raft_is_leader)" in rule["expr"]
    assert any(r["expr"] == 'absent(up{job="synapse-master"} == 1)' for r in RULES)


# ---- a real Prometheus against a real cluster -------------------------------------------------------


# ---- the Grafana dashboard ------------------------------------------------------------------------


def test_the_dashboard_covers_gpus_pending_reasons_latency_and_raft():
    queries = " ".join(dashboard_queries())
    for metric in ("synapse_gpus", "synapse_rack_gpus", "synapse_jobs_pending_reason", "synapse_queue_wait_seconds",
                   "synapse_gang_start_seconds", "synapse_raft_is_leader", "synapse_raft_leader_changes_seen_total",
                   "synapse_raft_commit_index"):
        assert re.search(rf"\b{metric}(_bucket)?\b", queries), metric
    assert all(t["datasource"]["uid"] == "${datasource}" for p in DASHBOARD["panels"] for t in p.get("targets", []))


