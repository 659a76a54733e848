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
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from synapse.common.tls import TLSFiles, generate, http_base
from synapse.core import codec
from synapse.core.model import JobSpec, Resources, Role
from synapse.core.schedule.scheduler import PENDING_REASONS
from synapse.master.access import token_hash, token_key
from synapse.master.dashboard import gang_classes
from synapse.master.dashboard_sessions import Sessions
from synapse.master.http import HTTPService
from tests.support.cluster import wait_status
from tests.support.dashboard import Clock, Page
from tests.support.http import fetch

# ---- sign-in sessions: the store alone, then an in-process server ---------------------------------


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
    # Start: the leader's estimate (the running job has no time limit: when it ends is unknown)
    assert jobs_page.row_of(big)["cells"][8] == "unknown: no predicted end on its nodes", jobs_page.row_of(big)
    assert running[8] == "-"

    # A follower knows the reasons the leader recorded in the log, not the reservations.
    followed = poll(follower, "/jobs", lambda p: reason(p, big) in PENDING_REASONS)
    assert reason(followed, big) in PENDING_REASONS
    assert followed.row_of(big)["cells"][8].startswith("unknown: the leader's")
    follower_nodes = get(follower, "/nodes", cluster.token)[2]
    assert "only preemption holds are marked here" in follower_nodes and not reserved_rows(Page(follower_nodes))
    for j in (big, small, job):
        cluster.client.cancel(j)
