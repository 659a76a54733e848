"""Every dashboard page in a real headless Chromium (Debian's, installed by
scripts/install-test-packages.sh): no console error, no CSP violation, and a screenshot of each;
on the heatmap each gang's GPUs show in its colour with its id as the title and the nodes reserved
for a waiting gang are outlined and hatched, and the jobs page shows each pending job's wait and why.

Chromium is driven through the DevTools protocol (websocket-client): the token goes in an
Authorization header set for every request, as a reverse proxy or a script would send it.
Screenshots go to $SYNAPSE_SCREENSHOTS if set, else to the test's temporary directory.
"""

from __future__ import annotations

import base64
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
from synapse.core.scheduler import PENDING_REASONS
from synapse.master.dashboard import PALETTE, gang_classes
from tests.test_dashboard import fetch
from tests.test_master_ha import wait_status

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


@pytest.fixture
def chromium(tmp_path):
    if CHROMIUM is None:
        pytest.skip("no chromium: scripts/install-test-packages.sh installs Debian's package (needs root and apt)")
    profile = tmp_path / "profile"
    proc = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert port_file.exists(), "chromium did not open its DevTools port"
        port = int(port_file.read_text().split()[0])
        request = urllib.request.Request(f"http://127.0.0.1:{port}/json/new?about:blank", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as reply:
            target = json.loads(reply.read())
        tools = DevTools(target["webSocketDebuggerUrl"])
        yield tools
        tools.close()
    finally:
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
    cluster = make_cluster(workers=4, racks=2)

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
            fetch(address, "/nodes", cluster.token)[2].count('<tr class="reserved">') < 4
            or '<b class="reason">BehindReservation</b>' not in fetch(address, "/jobs", cluster.token)[2]):
        time.sleep(0.2)
    shots = Path(os.environ.get("SYNAPSE_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)

    for domain in ("Page", "Runtime", "Log", "Network"):
        chromium.call(f"{domain}.enable")
    chromium.call("Network.setExtraHTTPHeaders", headers={"Authorization": f"Bearer {cluster.token}"})
    chromium.call("Emulation.setDeviceMetricsOverride", width=1280, height=800, deviceScaleFactor=1, mobile=False)
    pages = {"overview": "/", "nodes": "/nodes", "node": "/nodes/w1", "queues": "/queues", "jobs": "/jobs",
             "job": f"/jobs/{job}", "masters": "/masters"}
    seen: dict[str, object] = {}
    for name, path in pages.items():
        chromium.events.clear()
        chromium.call("Page.navigate", url=f"http://{address}{path}")
        chromium.wait_for("Page.loadEventFired")
        time.sleep(0.2)  # late console messages
        title = chromium.call("Runtime.evaluate", expression="document.title")["result"]["value"]
        assert "Synapse" in title, (path, title)
        shot = chromium.call("Page.captureScreenshot", format="png")
        (shots / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))
        assert problems(chromium.events) == [], (path, problems(chromium.events))
        if name in ("nodes", "jobs"):
            seen[name] = json.loads(chromium.call("Runtime.evaluate", expression=LOOKS[name])["result"]["value"])
    cells = chromium.call("Runtime.evaluate", expression="document.location.pathname")  # still alive
    assert cells["result"]["value"] == "/masters"

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
