"""The Prometheus kit's files (cluster-configs/prometheus, the Grafana dashboard), loaded."""

from __future__ import annotations

import json

import yaml

from tests.support.paths import ROOT

KIT = ROOT / "cluster-configs" / "prometheus"


ALERTS = yaml.safe_load((KIT / "alerts.yaml").read_text())


RULES = [r for g in ALERTS["groups"] for r in g["rules"]]


SCRAPE = yaml.safe_load((KIT / "prometheus.yml").read_text())


SCRAPE_TLS = yaml.safe_load((KIT / "prometheus-tls.yml").read_text())  #: for a cluster with `tls:`


DASHBOARD = json.loads((ROOT / "cluster-configs" / "grafana" / "synapse.json").read_text())


def dashboard_queries() -> list[str]:
    return [t["expr"] for p in DASHBOARD["panels"] for t in p.get("targets", [])]
