"""Every dashboard page in a real headless Chromium (Debian's, installed by
scripts/install-test-packages.sh), over HTTPS on a TLS cluster: sign-in through the form gives a
session cookie (HttpOnly, Secure, SameSite=Strict, no token in it), every page loads on that cookie
alone with no console error, no CSP violation, and a screenshot of each; on the heatmap each gang's
GPUs show in its colour with its id as the title and the nodes reserved for a waiting gang are
outlined and hatched, the jobs page shows each pending job's wait and why, and Sign out ends it.

Chromium is driven through the DevTools protocol (websocket-client). It trusts the masters'
certificate by its public key only (`--ignore-certificate-errors-spki-list`, the master's key pinned:
any other certificate still fails), not by ignoring certificate errors: Chromium on Linux reads
trusted CAs from an NSS database, and filling one needs certutil, which the test machines lack.
Screenshots go to $SYNAPSE_SCREENSHOTS if set, else to the test's temporary directory.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from synapse.core import codec
from synapse.core.model import JobSpec, Resources
from synapse.core.schedule.scheduler import PENDING_REASONS
from synapse.master.dashboard import PALETTE, gang_classes
from tests.support.cluster import wait_status
from tests.support.http import fetch

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class DevTools:
    """A minimal Chrome DevTools Protocol client over one page target."""

    def __init__(self, url: str) -> None:
        import websocket  # websocket-client, a dev dependency

        self.ws = websocket.create_connection(url, timeout=20, suppress_origin=True)
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    def call(self, method: str, **params) -> dict:
        call_id = next(self.ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str, timeout: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.events.append(json.loads(self.ws.recv()))
        raise AssertionError(f"no {method} within {timeout}s")

    def close(self) -> None:
        self.ws.close()


def problems(events: list[dict]) -> list[str]:
    """Console errors, uncaught exceptions and browser log errors (CSP violations among them)."""
    out = []
    for e in events:
        params = e.get("params", {})
        if e.get("method") == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        elif e.get("method") == "Runtime.exceptionThrown":
            out.append(params.get("exceptionDetails", {}).get("text", "exception"))
        elif e.get("method") == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            out.append(params["entry"].get("text", ""))
    return out


def spki_pin(cert: Path) -> str:
    """A certificate's public key as Chromium's --ignore-certificate-errors-spki-list takes it:
    base64 of the SHA-256 of its SubjectPublicKeyInfo."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    key = x509.load_pem_x509_certificate(cert.read_bytes()).public_key()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


@pytest.fixture
def chromium(tmp_path):
    """Starts headless Chromium with extra flags (once per test) and returns its DevTools client."""
    if CHROMIUM is None:
        pytest.skip("no chromium: scripts/install-test-packages.sh installs Debian's package (needs root and apt)")
    started: list[tuple[subprocess.Popen, DevTools | None]] = []

    def start(*flags: str) -> DevTools:
        profile = tmp_path / "profile"
        proc = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                 "--remote-debugging-port=0", f"--user-data-dir={profile}", *flags, "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append((proc, None))
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        # Chromium writes the file after creating it: wait for its first line, not only the file.
        while not (port_file.exists() and port_file.read_text().split()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert port_file.exists() and port_file.read_text().split(), "chromium did not open its DevTools port"
        port = int(port_file.read_text().split()[0])
        request = urllib.request.Request(f"http://127.0.0.1:{port}/json/new?about:blank", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as reply:
            target = json.loads(reply.read())
        tools = DevTools(target["webSocketDebuggerUrl"])
        started[-1] = (proc, tools)
        return tools

    yield start
    for proc, tools in started:
        if tools is not None:
            tools.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def rgb(colour: str) -> str:
    """'#0969da' as getComputedStyle gives it: 'rgb(9, 105, 218)'."""
    return "rgb({}, {}, {})".format(*(int(colour[i:i + 2], 16) for i in (1, 3, 5)))


def test_every_page_renders_in_chromium_without_errors(make_cluster, chromium, tmp_path):
    cluster = make_cluster(workers=4, racks=2, tls=True)
    ca = cluster.state["ca"]

    def submit(name: str, tasks: int, gpu: int) -> str:
        return cluster.client.submit(codec.job_spec_to_proto(JobSpec(
            name=name, tasks=tasks, resources=Resources(1000, 1 << 30, gpu), command=("sleep", "60"))))

    job, evaluation = submit("train", 2, 8), submit("eval", 1, 4)
    wait_status(cluster.client, job, {"RUNNING"})
    wait_status(cluster.client, evaluation, {"RUNNING"})
    # a gang of every node cannot start while those run: the leader reserves the nodes for it, and a
    # small job may not backfill onto them
    big, small = submit("big-gang", 4, 8), submit("small", 1, 2)
    address = cluster.master(cluster.wait_leader())["http_address"]  # the leader knows the reservations
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (
            fetch(address, "/nodes", cluster.token, ca=ca)[2].count('<tr class="reserved">') < 4
            or '<b class="reason">BehindReservation</b>' not in fetch(address, "/jobs", cluster.token, ca=ca)[2]):
        time.sleep(0.2)
    shots = Path(os.environ.get("SYNAPSE_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)

    browser = chromium(f"--ignore-certificate-errors-spki-list={spki_pin(cluster.data_dir / 'tls' / 'server.pem')}")
    for domain in ("Page", "Runtime", "Log", "Network"):
        browser.call(f"{domain}.enable")
    browser.call("Emulation.setDeviceMetricsOverride", width=1280, height=800, deviceScaleFactor=1, mobile=False)

    def run(expression: str):
        return browser.call("Runtime.evaluate", expression=expression)["result"].get("value")

    def load(url: str = "", click: str = "") -> None:
        """Navigate to `url`, or click the `click` element, and wait for the page it leads to."""
        browser.events.clear()
        if url:
            browser.call("Page.navigate", url=url)
        else:
            run(f"document.querySelector({json.dumps(click)}).click()")
        browser.wait_for("Page.loadEventFired")

    # sign in as a person would: type the token into the form, once
    load(f"https://{address}/login")
    assert problems(browser.events) == [] and run("document.title").startswith("Sign in")
    run("document.querySelector('input[name=token]').focus()")
    browser.call("Input.insertText", text=cluster.token)
    load(click="form[action='/login'] button")
    assert run("document.location.pathname") == "/" and run("document.title").startswith("Overview")
    (cookie,) = browser.call("Network.getCookies", urls=[f"https://{address}/"])["cookies"]
    assert cookie["name"].startswith("synapse_session_") and cluster.token not in json.dumps(cookie)
    assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/"
    assert 7.9 * 3600 < cookie["expires"] - time.time() <= 8 * 3600
    assert run("document.cookie") == ""  # HttpOnly: no script could read it
    pages = {"overview": "/", "nodes": "/nodes", "node": "/nodes/w1", "queues": "/queues", "jobs": "/jobs",
             "job": f"/jobs/{job}", "masters": "/masters"}
    seen: dict[str, object] = {}
    for name, path in pages.items():  # on the session cookie alone
        load(f"https://{address}{path}")
        time.sleep(0.2)  # late console messages
        title = run("document.title")
        assert "Synapse" in title and "Sign in" not in title, (path, title)
        shot = browser.call("Page.captureScreenshot", format="png")
        (shots / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))
        assert problems(browser.events) == [], (path, problems(browser.events))
        if name in ("nodes", "jobs"):
            seen[name] = json.loads(run(LOOKS[name]))
    assert run("document.location.pathname") == "/masters"  # still alive

    # Sign out: the session ends on the master, and the cookie is gone
    load(click="form.signout button")
    assert run("document.location.pathname") == "/login"
    assert browser.call("Network.getCookies", urls=[f"https://{address}/"])["cookies"] == []
    assert fetch(address, "/", cookie=f"{cookie['name']}={cookie['value']}", ca=ca)[0] == 401  # revoked, not forgotten
    load(f"https://{address}/")
    assert run("document.title").startswith("Sign in")

    # the heatmap as the browser draws it: gang colours from the stylesheet (the CSP allows no
    # inline style), titles, the reserved nodes outlined and their free GPUs hatched
    gpus, reserved_rows = seen["nodes"]["cells"], seen["nodes"]["reserved"]
    assert len(gpus) == 32 and sorted(reserved_rows) == ["w1", "w2", "w3", "w4"], seen["nodes"]
    holders, colours = {job: 16, evaluation: 4}, gang_classes([job, evaluation])  # train is the older
    assert len({c["background"] for c in gpus if c["job"]}) == 2  # one colour per gang
    for gang, count in holders.items():
        mine = [c for c in gpus if c["job"] == gang]
        assert len(mine) == count, (gang, gpus)
        colour = rgb(PALETTE[int(colours[gang][1:])])
        assert all(c["background"] == colour and re.search(f"job {gang} task \\d", c["title"]) for c in mine), mine
    free = [c for c in gpus if not c["job"]]
    assert len(free) == 12 and all("repeating-linear-gradient" in c["image"] for c in free), free
    assert all(c["outline"] == "solid" and f"kept for job {big}" in c["title"] for c in gpus), gpus
    assert big in seen["nodes"]["legend"] and job in seen["nodes"]["legend"]

    # the jobs page: each pending job's wait so far and its typed reason
    rows = {r[0].split()[0]: r for r in seen["jobs"]}
    for pending in (big, small):
        assert rows[pending][1] == "PENDING" and re.fullmatch(r"\d+[smhd].*", rows[pending][6]), rows[pending]
        assert rows[pending][7].split()[0] in PENDING_REASONS, rows[pending]
    assert rows[small][7].startswith("BehindReservation"), rows[small]
    for j in (job, evaluation, big, small):
        cluster.client.cancel(j)


#: What the test reads from a page, as JSON, through the DevTools protocol.
LOOKS = {
    "nodes": """JSON.stringify({
        cells: [...document.querySelectorAll('td.gpu')].map(c => {
            const s = getComputedStyle(c);
            return {job: c.dataset.job || "", title: c.title, background: s.backgroundColor,
                    image: s.backgroundImage, outline: s.outlineStyle};
        }),
        reserved: [...document.querySelectorAll('tr.reserved th')].map(h => h.textContent),
        legend: [...document.querySelectorAll('p.gangs a, ul.kept a')].map(a => a.textContent).join(' ')})""",
    "jobs": """JSON.stringify([...document.querySelectorAll('tbody tr')].map(
        r => [...r.cells].map(c => c.textContent)))""",
}
