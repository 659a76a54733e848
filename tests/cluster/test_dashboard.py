"""The dashboard: sign-in sessions (on an in-process server, its clock injected) and, on a real TLS
cluster, HTTPS, token, methods, CSP, every page parsed, the heatmap (gang colours, nodes reserved for
a waiting gang), the jobs page's wait and reason, redaction."""

from __future__ import annotations

import functools
import re
import ssl
import threading
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from synapse.common.tls import TLSFiles, generate, http_base
from synapse.core import codec
from synapse.core.model import JobSpec, Resources, Role
from synapse.core.schedule.scheduler import PENDING_REASONS
from synapse.master.access import token_hash, token_key
from synapse.master.dashboard import PALETTE, NodeMark, gang_classes, heatmap
from synapse.master.dashboard_sessions import Sessions
from synapse.master.http import HTTPService
from tests.support.cluster import wait_status
from tests.support.http import fetch


class Page(HTMLParser):
    """Collects what the tests look at: GPU cells, links, table rows (their class, head's title and
    cells' text), and that the document parses."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.gpu_cells: list[dict] = []
        self.links: list[str] = []
        self.scripts = 0
        self.rows: list[dict] = []  #: {"class", "title" (of its th), "cells": [text of each th/td]}
        self.in_cell = False
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
        if tag == "tr":
            self.rows.append({"class": a.get("class") or "", "title": "", "cells": []})
        if tag in ("td", "th") and self.rows:
            self.rows[-1]["cells"].append("")
            self.in_cell = True
            if tag == "th" and a.get("title"):
                self.rows[-1]["title"] = a["title"]

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.in_cell = False

    def handle_data(self, data):
        if self.in_cell:
            self.rows[-1]["cells"][-1] += data

    def row_of(self, text: str) -> dict | None:
        """The first row whose first cell contains `text`."""
        return next((r for r in self.rows if r["cells"] and text in r["cells"][0]), None)


# ---- sign-in sessions: the store alone, then an in-process server ---------------------------------

class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_holds_its_token_until_it_expires_or_is_closed():
    clock = Clock()
    sessions = Sessions(ttl_s=60, clock=clock)
    first, second = sessions.open("tok-a"), sessions.open("tok-b")
    assert first != second and len(first) >= 43 and "tok" not in first
    assert sessions.token(first) == "tok-a" and sessions.token(second) == "tok-b"
    assert sessions.token("") == sessions.token("made-up") == ""
    clock.now += 59.9
    assert sessions.token(first) == "tok-a"
    sessions.close(second)
    assert sessions.token(second) == ""
    clock.now += 0.1  # exactly its expiry: refused, and forgotten
    assert sessions.token(first) == "" and len(sessions) == 0


def test_sessions_past_the_limit_drop_the_expired_then_the_oldest():
    clock = Clock()
    sessions = Sessions(ttl_s=10, clock=clock, limit=3)
    old = sessions.open("old")
    clock.now += 10
    a, b, c = (sessions.open(t) for t in "abc")  # `old` expired: dropped first
    assert len(sessions) == 3 and sessions.token(old) == ""
    d = sessions.open("d")
    assert [sessions.token(x) for x in (a, b, c, d)] == ["", "b", "c", "d"]


ADMIN_TOKEN, ALICE_TOKEN, JOIN_TOKEN = "the-cluster-token", "syn_alice-token", "synjoin_a-join-token"


class StubMaster:
    """What the HTTP side reads of a master for sign-in (its config, replica, lock and users) and /livez."""

    def __init__(self) -> None:
        self.fatal = ""
        self.config = SimpleNamespace(token=ADMIN_TOKEN, raft_password="raft-password", user_certs=False)
        self.replica = SimpleNamespace(id="m1")
        self.lock = threading.Lock()
        alice = SimpleNamespace(name="alice", role=Role.USER, groups=())
        key = token_key("raft-password")
        self.state = SimpleNamespace(users={"alice": alice}, join_token_by_hash={token_hash(key, JOIN_TOKEN): "j1"},
                                     user_by_token={token_hash(key, ALICE_TOKEN): "alice"})


@pytest.fixture(params=["http", "https"])
def served(request, tmp_path):
    """An in-process HTTP service (plain, or HTTPS with a development CA) whose sessions' clock the
    test moves, and whose dashboard renders one line naming the page."""
    ca, tls = "", None
    if request.param == "https":
        generate(tmp_path, ["127.0.0.1", "localhost"], [])
        ca, tls = str(tmp_path / "ca.pem"), TLSFiles(str(tmp_path / "ca.pem"), str(tmp_path / "server.pem"),
                                                     str(tmp_path / "server-key.pem"))
    clock, master = Clock(), StubMaster()
    service = HTTPService("127.0.0.1:0", master, SimpleNamespace(registry=CollectorRegistry()), tls,
                          Sessions(ttl_s=3600, clock=clock))
    service.server.dashboard = SimpleNamespace(render=lambda path, query: (200, f"<p>page {path}</p>"))
    service.start()
    address = f"127.0.0.1:{service.server.server_address[1]}"
    yield SimpleNamespace(address=address, ca=ca, clock=clock, master=master, https=request.param == "https",
                          get=functools.partial(fetch, address, ca=ca))
    service.stop()


def sign_in(served, token: str) -> tuple[str, str]:
    """POST /login; (the whole Set-Cookie header, the name=value to send back)."""
    status, headers, _ = served.get("/login", method="POST", data=f"token={token}".encode())
    assert status == 303 and headers["Location"] == "/", (status, headers)
    return headers["Set-Cookie"], headers["Set-Cookie"].split(";")[0]


def test_sign_in_sets_a_session_cookie_that_holds_no_token(served):
    set_cookie, cookie = sign_in(served, ADMIN_TOKEN)
    name, _, session_id = cookie.partition("=")
    assert name == "synapse_session_m1" and len(session_id) >= 43
    assert ADMIN_TOKEN not in set_cookie
    flags = [f.strip() for f in set_cookie.split(";")[1:]]
    assert {"HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=3600"} <= set(flags)
    assert ("Secure" in flags) is served.https
    assert served.get("/jobs", cookie=cookie)[:3:2] == (200, "<p>page /jobs</p>")
    assert served.get("/jobs")[0] == 401  # the cookie, not the connection, carries the sign-in
    assert served.get("/jobs", cookie=f"{name}=made-up")[0] == 401
    assert served.get("/jobs", cookie=f"{name}={ADMIN_TOKEN}")[0] == 401  # a token in the cookie is no session
    assert served.get("/jobs", ADMIN_TOKEN)[0] == 200  # scripts keep the bearer header


def test_a_bad_or_worker_token_opens_no_session(served):
    for data in (b"token=wrong", b"token=", b"", f"token={JOIN_TOKEN}".encode()):
        status, headers, _ = served.get("/login", method="POST", data=data)
        assert status == 401 and "Set-Cookie" not in headers, data


def test_an_expired_session_is_refused(served):
    _, cookie = sign_in(served, ADMIN_TOKEN)
    served.clock.now += 3599
    assert served.get("/", cookie=cookie)[0] == 200
    served.clock.now += 1
    status, headers, body = served.get("/", cookie=cookie)
    assert status == 401 and "Sign in" in body and "Bearer" in headers["WWW-Authenticate"]


def test_sign_out_revokes_the_session_here_and_clears_the_cookie(served):
    _, cookie = sign_in(served, ADMIN_TOKEN)
    _, other = sign_in(served, ADMIN_TOKEN)  # another browser's
    status, headers, _ = served.get("/logout", method="POST", data=b"", cookie=cookie)
    assert status == 303 and headers["Location"] == "/login"
    cleared = [f.strip() for f in headers["Set-Cookie"].split(";")]
    assert cleared[0] == "synapse_session_m1=" and "Max-Age=0" in cleared
    assert served.get("/", cookie=cookie)[0] == 401  # a copy of the cookie kept elsewhere is dead too
    assert served.get("/", cookie=other)[0] == 200


def test_a_form_posted_from_another_site_signs_nobody_in_or_out(served):
    _, cookie = sign_in(served, ADMIN_TOKEN)
    for path, data in (("/login", f"token={ADMIN_TOKEN}".encode()), ("/logout", b"")):
        request = urllib.request.Request(f"{http_base(served.address, served.ca)[0]}{path}", data=data,
                                         headers={"Sec-Fetch-Site": "cross-site", "Cookie": cookie})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5, context=http_base(served.address, served.ca)[1])
        assert refused.value.code == 403 and "Set-Cookie" not in refused.value.headers
    assert served.get("/", cookie=cookie)[0] == 200


def test_a_session_is_judged_like_its_token_on_every_request(served):
    """Removing a user ends their sessions at once, as it ends their token; the role is the token's."""
    _, cookie = sign_in(served, ALICE_TOKEN)
    assert served.get("/queues", cookie=cookie)[0] == 200
    with served.master.lock:
        served.master.state.users.pop("alice")
    assert served.get("/queues", cookie=cookie)[0] == 401


@pytest.mark.parametrize("served", ["https"], indirect=True)
def test_the_https_port_refuses_plain_http(served):
    assert served.get("/livez")[:3:2] == (200, "ok\n")
    status, _, body = fetch(served.address, "/", ADMIN_TOKEN)  # http://, the token in the clear
    assert status == 400 and f"https://{served.address}/" in body and "page" not in body
    with pytest.raises(urllib.error.URLError) as failed:  # a client without the CA does not trust it
        urllib.request.urlopen(f"https://{served.address}/livez", timeout=5,
                               context=ssl.create_default_context())
    assert isinstance(failed.value.reason, ssl.SSLCertVerificationError)


# ---- the pages ------------------------------------------------------------------------------------

def test_the_heatmap_colours_gangs_marks_kept_nodes_and_escapes_ids():
    """Job ids cannot hold '<' through the API (names are checked), but the page must not trust that."""
    evil, waiting = "<script>alert(1)</script>-1", 'big"><img src=x onerror=alert(1)>'
    nodes = [{"id": "w1", "rack": "r0", "status": "READY", "schedulable": True, "gpus": 4, "used": 3,
              "owner": {0: (evil, 0), 1: (evil, 1), 2: ("other-2", 0)}, "address": ""},
             {"id": "w2", "rack": "r1", "status": "READY", "schedulable": True, "gpus": 2, "used": 0, "owner": {},
              "address": ""}]
    colours = gang_classes([evil, "other-2"])
    html = heatmap(nodes, colours, {"w2": [NodeMark(waiting, "reserved by the scheduler")]}, "a follower's note")
    assert "<script>" not in html and "<img" not in html
    page = Page(html)
    assert page.scripts == 0
    by_gpu = {(c["data-node"], c["data-gpu"]): c for c in page.gpu_cells}
    assert by_gpu["w1", "0"]["title"] == f"w1 GPU 0: job {evil} task 0"  # unescaped by the parser: exact
    assert by_gpu["w1", "1"]["class"].split() == ["gpu", "used", colours[evil]]
    assert by_gpu["w1", "2"]["class"].split() == ["gpu", "used", colours["other-2"]] != ["gpu", "used", colours[evil]]
    assert by_gpu["w1", "3"]["class"].split() == ["gpu", "free"]
    assert by_gpu["w2", "0"]["class"].split() == ["gpu", "free", "reserved"]
    assert by_gpu["w2", "0"]["title"] == f"w2 GPU 0: free; kept for job {waiting}: reserved by the scheduler"
    kept = [r for r in page.rows if "reserved" in r["class"].split()]
    assert [r["cells"][0] for r in kept] == ["w2"] and kept[0]["cells"][-1] == f"for {waiting}"
    assert "a follower&#x27;s note" in html
    assert f'<span class="swatch {colours[evil]}"' in html  # the legend


def test_gang_colours_are_stable_and_distinct_while_the_palette_lasts():
    ids = [f"job-{i}" for i in range(3 * len(PALETTE))]
    own = {j: gang_classes([j])[j] for j in ids}  # a gang alone: its hash slot, on every replica and load
    assert own == {j: gang_classes([j])[j] for j in ids} and set(own.values()) == {f"g{i}" for i in range(len(PALETTE))}
    assert len(set(gang_classes(ids[:len(PALETTE)]).values())) == len(PALETTE)  # no two alike
    assert set(gang_classes(ids).values()) == set(own.values())  # past the palette, colours repeat
    older, younger = next((a, b) for a in ids for b in ids if a != b and own[a] == own[b])
    both = gang_classes([older, younger])
    assert both[older] == own[older] and both[younger] != own[younger]  # the younger gives way


@pytest.mark.slow
def test_the_dashboard(make_cluster):
    cluster = make_cluster(workers=2, racks=2, tls=True)
    get = functools.partial(fetch, ca=cluster.state["ca"])  # HTTPS, verified by the cluster's CA
    job = cluster.client.submit(codec.job_spec_to_proto(JobSpec(
        name="visible-job", tasks=2, resources=Resources(1000, 1 << 30, 4), command=("sleep", "60"),
        env=(("SECRET", "hunter2"),))))
    wait_status(cluster.client, job, {"RUNNING"})
    address = cluster.state["masters"][0]["http_address"]

    status, headers, _ = get(address, "/")
    assert status == 401 and "Bearer" in headers.get("WWW-Authenticate", "")
    assert get(address, "/", cluster.token, method="POST", data=b"")[0] == 405
    assert get(address, "/", "not-a-token")[0] == 401
    status, headers, body = get(address, "/", cluster.token)
    assert status == 200 and "script-src" not in headers["Content-Security-Policy"]
    assert headers["Content-Security-Policy"].startswith("default-src 'none'")
    for node in ("w1", "w2"):
        assert node in body
    assert job in body

    pages = ["/", "/nodes", "/nodes/w1", "/queues", "/jobs", f"/jobs/{job}", "/masters",
             "/jobs?state=RUNNING&sort=gpus"]
    for path in pages:
        status, _, body = get(address, path, cluster.token)
        assert status == 200, (path, body[:200])
        page = Page(body)
        assert page.scripts == 0 and "hunter2" not in body, path
    nodes_page = Page(get(address, "/nodes", cluster.token)[2])
    assert len(nodes_page.gpu_cells) == 16  # one cell per GPU: 2 nodes x 8
    used = [c for c in nodes_page.gpu_cells if "used" in c["class"]]
    assert len(used) == 8  # 2 tasks x 4 GPUs
    assert {c["class"].split()[-1] for c in used} == {gang_classes([job])[job]}  # the gang's colour
    assert {re.sub(r" \d+$", "", c["title"].split(": ", 1)[1]) for c in used} == {f"job {job} task"}
    detail = get(address, f"/jobs/{job}", cluster.token)[2]
    assert "SECRET=***" in detail and "Gang" in detail
    assert get(address, "/jobs/nope", cluster.token)[0] == 404
    assert get(address, "/static/style.css")[0] == 200

    status, headers, _ = get(address, "/login", method="POST", data=f"token={cluster.token}".encode())
    assert status == 303
    cookie = headers["Set-Cookie"]
    assert cluster.token not in cookie and {"HttpOnly", "SameSite=Strict", "Secure"} <= {
        f.strip() for f in cookie.split(";")}
    assert get(address, "/", cookie=cookie.split(";")[0])[0] == 200
    other = next(m["http_address"] for m in cluster.state["masters"] if m["http_address"] != address)
    assert get(other, "/", cookie=cookie.split(";")[0])[0] == 401  # a sign-in is per replica
    assert get(address, "/login", method="POST", data=b"token=wrong")[0] == 401
    status, _, body = fetch(address, "/", cluster.token)  # plain HTTP on the HTTPS port
    assert status == 400 and "HTTPS only" in body

    # A reservation for real: a gang of two whole nodes cannot start while visible-job runs, so the
    # leader reserves both nodes for it; a one-GPU job behind it may not backfill onto them.
    def submit(name: str, tasks: int, gpu: int) -> str:
        return cluster.client.submit(codec.job_spec_to_proto(JobSpec(
            name=name, tasks=tasks, resources=Resources(1000, 1 << 30, gpu), command=("sleep", "60"))))

    big, small = submit("big-gang", 2, 8), submit("small", 1, 1)
    leader = cluster.master(cluster.wait_leader())["http_address"]
    follower = next(m["http_address"] for m in cluster.state["masters"] if m["http_address"] != leader)

    def poll(address: str, path: str, done) -> Page:
        deadline = time.monotonic() + 15
        while True:
            page = Page(get(address, path, cluster.token)[2])
            if done(page) or time.monotonic() > deadline:
                return page
            time.sleep(0.2)

    def reserved_rows(page: Page) -> list[dict]:
        return [r for r in page.rows if "reserved" in r["class"].split()]

    nodes_page = poll(leader, "/nodes", reserved_rows)
    kept = reserved_rows(nodes_page)
    assert sorted(r["cells"][0] for r in kept) == ["w1", "w2"], nodes_page.rows
    assert all(f"kept for job {big}: reserved by the scheduler" in r["title"] and r["cells"][-1] == f"for {big}"
               for r in kept), [(r["title"], r["cells"][-1]) for r in kept]
    hatched = [c for c in nodes_page.gpu_cells if c["class"].split() == ["gpu", "free", "reserved"]]
    assert len(hatched) == 8 and all(f"kept for job {big}" in c["title"] for c in hatched)
    assert {c["class"].split()[-1] for c in nodes_page.gpu_cells if "used" in c["class"]} == {gang_classes([job])[job]}

    def reason(page: Page, job_id: str) -> str:
        row = page.row_of(job_id)
        return row["cells"][7].split()[0] if row and row["cells"][7].strip() else ""

    jobs_page = poll(leader, "/jobs", lambda p: {reason(p, big), reason(p, small)} <= set(PENDING_REASONS))
    for pending in (big, small):
        cells = jobs_page.row_of(pending)["cells"]
        assert cells[1] == "PENDING" and re.fullmatch(r"\d+[smhd](\d\d[mh])?", cells[6]), cells
        assert cells[7].split()[0] in PENDING_REASONS, cells
    assert "nodes kept for it" in jobs_page.row_of(big)["cells"][7]
    running = jobs_page.row_of(job)["cells"]
    assert running[1] == "RUNNING" and re.fullmatch(r"\d+s", running[6]) and running[7] == "", running

    # A follower knows the reasons the leader recorded in the log, not the reservations.
    followed = poll(follower, "/jobs", lambda p: reason(p, big) in PENDING_REASONS)
    assert reason(followed, big) in PENDING_REASONS
    follower_nodes = get(follower, "/nodes", cluster.token)[2]
    assert "only preemption holds are marked here" in follower_nodes and not reserved_rows(Page(follower_nodes))
    for j in (big, small, job):
        cluster.client.cancel(j)
