"""A master replica's HTTP side: /metrics for Prometheus and health for load balancers and systemd.

    GET /metrics          Prometheus text (synapse.master.metrics)
    GET /livez            200 while the process serves (not stopping for corrupt data or a full disk)
    GET /readyz           200 when every check passes, else 503; ?verbose lists each check
    GET /readyz/leader    200 only on the leader, with its loops ready and a majority in contact
    GET / … (dashboard)   synapse.master.dashboard, for a token (Authorization: Bearer, or the
                          HttpOnly cookie POST /login sets); 401 with a sign-in form otherwise

It runs on its own threads (the standard library's ThreadingHTTPServer): a scrape reads the state
under the same lock as gRPC reads, and never waits on the asyncio loop, so it still answers while
the loop is busy. GET only (and POST /login); anything else is 405. Pages carry a strict
Content-Security-Policy: no script, styles from this server only.
"""

from __future__ import annotations

import threading
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from synapse.master.access import identify, token_key
from synapse.master.dashboard import STYLE, Dashboard, login_page

#: The dashboard's pages run no script and load nothing from elsewhere.
CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
       "base-uri 'none'")
#: The cookie the sign-in form sets (HttpOnly: no script could read it, and the pages have none).
COOKIE = "synapse_token"

if TYPE_CHECKING:
    from synapse.master.metrics import Metrics
    from synapse.master.replica import Master


def readiness(master: Master) -> list[tuple[str, str]]:
    """Each readiness check as (name, '' if it passes else why not)."""
    raft = master.raft
    leader = raft.is_leader() or raft.leader_if_connected()
    status = raft.status()
    behind = status.get("commit_idx", 0) - status.get("last_applied", 0)
    storage = master.fatal or raft.corruption() or ("" if master.disk_has_room() else "the disk is nearly full")
    return [("raft-leader-known", "" if leader else "no leader known"),
            ("applied-caught-up", "" if behind <= 1000 else f"{behind} committed entries not applied yet"),
            ("storage", storage)]


def history_detail(master: Master) -> str:
    """A readyz line on the history store: informational, never failing readiness (a store that lags
    must not take a serving master out of a load balancer)."""
    history = master.history
    if history is None:
        return ""
    with master.lock:
        unarchived = len(master.state.unarchived)
    why = history.lag_reason(unarchived)
    return f"[+]history ok{f' (lagging: {why})' if why else ''}\n"


def leader_ready(master: Master) -> str:
    """'' on a leader with its loops ready and a majority of the replicas connected; else why not."""
    if not master.ready_leader_term():
        return "not the ready leader"
    partners = master.raft.partners()
    status = master.raft.status()
    connected = sum(1 for p in partners if status.get(f"partner_node_status_server_{p}") == 2)
    if (connected + 1) * 2 <= len(partners) + 1:
        return f"in contact with {connected} of {len(partners)} other replicas: no majority"
    return ""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        pass  # scrapes every few seconds would flood the log

    def _send(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _html(self, code: int, html: str, extra: tuple[tuple[str, str], ...] = ()) -> None:
        body = html.encode()
        self.send_response(code)
        for name, value in (("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(body))),
                            ("Cache-Control", "no-store"), ("Content-Security-Policy", CSP),
                            ("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer"), *extra):
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _token(self) -> str:
        header = self.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            return header[7:].strip()
        cookie = SimpleCookie(self.headers.get("Cookie", ""))
        return cookie[COOKIE].value if COOKIE in cookie else ""

    def _dashboard(self, url) -> None:
        if url.path == "/static/style.css":
            self._send(200, STYLE.encode(), "text/css; charset=utf-8")
            return
        if url.path == "/favicon.ico":  # browsers ask for it; there is none
            self.send_response(HTTPStatus.NO_CONTENT)
            self.end_headers()
            return
        if url.path == "/login":
            self._html(200, login_page())
            return
        caller = identify(self.server.master, self.server.token_key, self._token())
        if caller is None or caller.confined:  # a worker's credentials see nothing of the cluster
            self._html(401, login_page("A token is needed to see this cluster."),
                       (("WWW-Authenticate", 'Bearer realm="synapse"'),))
            return
        code, html = self.server.dashboard.render(url.path, url.query)
        self._html(code, html)

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        master, url = self.server.master, urlsplit(self.path)
        if url.path == "/metrics":
            self._send(200, generate_latest(self.server.metrics.registry), CONTENT_TYPE_LATEST)
        elif url.path == "/livez":
            self._send(503, f"stopping: {master.fatal}\n".encode()) if master.fatal else self._send(200, b"ok\n")
        elif url.path == "/readyz":
            checks = readiness(master)
            ok = all(not why for _, why in checks)
            body = "".join(f"[+]{name} ok\n" if not why else f"[-]{name} failed: {why}\n" for name, why in checks)
            body += history_detail(master)
            body += "readyz check passed\n" if ok else "readyz check failed\n"
            self._send(200 if ok else 503, (body if "verbose" in url.query or not ok else "ok\n").encode())
        elif url.path == "/readyz/leader":
            why = leader_ready(master)
            self._send(503, f"{why}\n".encode()) if why else self._send(200, b"ok\n")
        else:
            self._dashboard(url)

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802 - the base class's name
        """Only the sign-in form posts: it turns a token into an HttpOnly, SameSite cookie."""
        if urlsplit(self.path).path != "/login":
            self._refuse()
            return
        length = min(int(self.headers.get("Content-Length") or 0), 4096)
        token = parse_qs(self.rfile.read(length).decode(errors="replace")).get("token", [""])[-1].strip()
        if identify(self.server.master, self.server.token_key, token) is None or not token:
            self._html(401, login_page("That token is not valid here."))
            return
        self.send_response(HTTPStatus.SEE_OTHER)
        self.send_header("Location", "/")
        self.send_header("Set-Cookie", f"{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _refuse(self) -> None:
        self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], master: Master, metrics: Metrics) -> None:
        super().__init__(address, _Handler)
        self.master, self.metrics = master, metrics
        self.dashboard = Dashboard(master)
        self.token_key = token_key(master.config.raft_password)


#: How often the HTTP thread checks for a stop.
STOP_POLL_S = 0.05


class HTTPService:
    """The HTTP server of one replica, on its own thread."""

    def __init__(self, address: str, master: Master, metrics: Metrics) -> None:
        host, _, port = address.rpartition(":")
        self.server = _Server((host, int(port)), master, metrics)
        #: stop() waits up to one poll interval (the default 0.5 s was half of a master's stop)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(STOP_POLL_S,), name="http",
                                       daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
