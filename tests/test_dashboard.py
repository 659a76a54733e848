"""The dashboard on a real cluster: token, methods, CSP, every page parsed, the heatmap, redaction."""

from __future__ import annotations

import urllib.error
import urllib.request
from html.parser import HTMLParser

import pytest

from synapse.core import codec
from synapse.core.model import JobSpec, Resources
from tests.test_master_ha import wait_status

pytestmark = pytest.mark.slow


def fetch(address: str, path: str, token: str = "", method: str = "GET", data: bytes | None = None,
          cookie: str = "") -> tuple[int, dict, str]:
    request = urllib.request.Request(f"http://{address}{path}", method=method, data=data)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if cookie:
        request.add_header("Cookie", cookie)

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


class Page(HTMLParser):
    """Collects what the tests look at: GPU cells, links, and that the document parses."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.gpu_cells: list[dict] = []
        self.links: list[str] = []
        self.scripts = 0
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "td" and "gpu" in (a.get("class") or "").split():
            self.gpu_cells.append(a)
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag == "script":
            self.scripts += 1


def test_the_dashboard(make_cluster):
    cluster = make_cluster(workers=2, racks=2)
    job = cluster.client.submit(codec.job_spec_to_proto(JobSpec(
        name="visible-job", tasks=2, resources=Resources(1000, 1 << 30, 4), command=("sleep", "60"),
        env=(("SECRET", "hunter2"),))))
    wait_status(cluster.client, job, {"RUNNING"})
    address = cluster.state["masters"][0]["http_address"]

    status, headers, _ = fetch(address, "/")
    assert status == 401 and "Bearer" in headers.get("WWW-Authenticate", "")
    assert fetch(address, "/", cluster.token, method="POST", data=b"")[0] == 405
    assert fetch(address, "/", "not-a-token")[0] == 401
    status, headers, body = fetch(address, "/", cluster.token)
    assert status == 200 and "script-src" not in headers["Content-Security-Policy"]
    assert headers["Content-Security-Policy"].startswith("default-src 'none'")
    for node in ("w1", "w2"):
        assert node in body
    assert job in body

    pages = ["/", "/nodes", "/nodes/w1", "/queues", "/jobs", f"/jobs/{job}", "/masters",
             "/jobs?state=RUNNING&sort=gpus"]
    for path in pages:
        status, _, body = fetch(address, path, cluster.token)
        assert status == 200, (path, body[:200])
        page = Page(body)
        assert page.scripts == 0 and "hunter2" not in body, path
    heatmap = Page(fetch(address, "/nodes", cluster.token)[2])
    assert len(heatmap.gpu_cells) == 16  # one cell per GPU: 2 nodes x 8
    assert sum(1 for c in heatmap.gpu_cells if "used" in c["class"]) == 8  # 2 tasks x 4 GPUs
    detail = fetch(address, f"/jobs/{job}", cluster.token)[2]
    assert "SECRET=***" in detail and "Gang" in detail
    assert fetch(address, "/jobs/nope", cluster.token)[0] == 404
    assert fetch(address, "/static/style.css")[0] == 200

    status, headers, _ = fetch(address, "/login", method="POST", data=f"token={cluster.token}".encode())
    assert status == 303
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert fetch(address, "/", cookie=cookie.split(";")[0])[0] == 200
    assert fetch(address, "/login", method="POST", data=b"token=wrong")[0] == 401
    cluster.client.cancel(job)
