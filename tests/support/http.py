"""Requests to a master's or a worker's HTTP port (the dashboard, /metrics) and the metrics contract."""

from __future__ import annotations

import urllib.error
import urllib.request

import yaml
from prometheus_client.parser import text_string_to_metric_families

from synapse.common.tls import http_base
from tests.support.paths import ROOT


def fetch(address: str, path: str, token: str = "", method: str = "GET", data: bytes | None = None,
          cookie: str = "", ca: str = "") -> tuple[int, dict, str]:
    """One request to a master's HTTP port, redirects not followed; over HTTPS verified by `ca` if given."""
    base, context = http_base(address, ca)
    request = urllib.request.Request(base + path, method=method, data=data)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if cookie:
        request.add_header("Cookie", cookie)

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect, urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()



CONTRACTS = yaml.safe_load((ROOT / "cluster-configs" / "prometheus" / "metrics.yaml").read_text())


def get(address: str, path: str, method: str = "GET", ca: str = "") -> tuple[int, str]:
    """A request to a master's or a worker's HTTP port; a master's of a TLS cluster with its `ca`."""
    base, context = http_base(address, ca)
    request = urllib.request.Request(base + path, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(address: str, ca: str = "") -> dict:
    status, text = get(address, "/metrics", ca=ca)
    assert status == 200
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict, name: str, **labels) -> float:
    family = families[name]
    return sum(s.value for s in family.samples
               if s.name in (name, f"{name}_total") and all(s.labels.get(k) == v for k, v in labels.items()))
