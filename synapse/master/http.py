"""A master replica's HTTP side: /metrics for Prometheus and health for load balancers and systemd.

    GET /metrics          Prometheus text (synapse.master.metrics)
    GET /livez            200 while the process serves (not stopping for corrupt data or a full disk)
    GET /readyz           200 when every check passes, else 503; ?verbose lists each check
    GET /readyz/leader    200 only on the leader, with its loops ready and a majority in contact
    GET / … (dashboard)   synapse.master.dashboard, for a token (Authorization: Bearer) or a signed-in
                          session's cookie; 401 with a sign-in form otherwise
    POST /login           a token for a session (synapse.master.dashboard_sessions): the cookie holds
                          a random session id, never the token; HttpOnly, SameSite=Strict, Secure on HTTPS
    POST /logout          ends the session here and clears the cookie

With `tls` in the cluster file the port speaks HTTPS only, with the master's certificate (no client
certificate asked), so neither a bearer token nor a session id crosses the network in the clear;
a plain-HTTP request gets a 400 that says so and is never read as a request. Without `tls` it is
plain HTTP, as the API is.

It runs on its own threads (the standard library's ThreadingHTTPServer): a scrape reads the state
under the same lock as gRPC reads, and never waits on the asyncio loop, so it still answers while
the loop is busy. The TLS handshake happens on the connection's own thread, so a slow or silent
client never holds up the others. GET only (and the two POSTs); anything else is 405. Pages carry a
strict Content-Security-Policy: no script, styles from this server only.
"""

from __future__ import annotations

import logging
import re
import socket
import ssl
import sys
import threading
import time
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import SplitResult, parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from synapse.common.tls import TLSFiles, http_server_context
from synapse.master.access import identify, token_key
from synapse.master.dashboard import STYLE, Dashboard, login_page
from synapse.master.dashboard_sessions import Sessions

log = logging.getLogger(__name__)

#: The dashboard's pages run no script and load nothing from elsewhere.
CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
       "base-uri 'none'")
#: How long a connection may take, TLS handshake and request included, before it is dropped.
CONNECTION_TIMEOUT_S = 30.0
#: The first byte of every TLS connection (a handshake record); a plain-HTTP request starts with a letter.
TLS_HANDSHAKE = 0x16


def cookie_name(replica_id: str) -> str:
    """The session cookie's name on this replica. Named per replica because browsers share cookies
    between the ports of one host, and a sign-in is per replica (replicas on one machine, as
    `synapse-local` runs them, would otherwise sign each other out)."""
    return "synapse_session_" + re.sub(r"[^A-Za-z0-9_-]", "_", replica_id)


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
            ("storage", storage), ("link-shards", link_shards_problem(master)), ("nodes", nodes_problem(master))]


def link_shards_problem(master: Master) -> str:
    """'' while the link shards' digests reach the leader; else which do not. A follower checks its
    own digests; the leader, that each replica it is connected to over Raft sends its digests (one
    that is cut off is Raft's matter, not this). A failing digest leaves the nodes attached to that
    replica unheard, to go DOWN: the cluster is not ready although every process answers."""
    shard = master.shard
    if shard is None:
        return ""
    now = time.monotonic()
    allowed = 2 * shard.timings.silence + shard.timings.digest
    view = master.leader_view()
    if view is None:
        if master.raft.is_leader() or not master.leader_api_address():
            return ""  # becoming the leader, or no leader at all (raft-leader-known says so)
        age = now - shard.delivered_at
        # Failing now, and for a while: not merely no digest yet since an election
        return "" if age <= allowed or not shard.failures else (
            f"this replica's liveness digests have not reached the leader for {age:.0f}s ({shard.failed} failed)")
    if not master.ready_leader_term():
        return ""  # a new leader counts the shards' silence only once its loops have started
    try:
        status = master.raft.status()  # pysyncobj's, read off its thread: it may change under us
    except RuntimeError:
        return ""
    connected = {master.api_of_raft(p) for p in master.raft.partners()
                 if status.get(f"partner_node_status_server_{p}") == 2}
    silent = {api: s for api, s in view.shard_silences(sorted(connected - {""}), now).items() if s > allowed}
    return "; ".join(f"no liveness digest from replica {api} for {s:.0f}s" for api, s in sorted(silent.items()))


def nodes_problem(master: Master) -> str:
    """On the leader, '' unless most registered nodes are DOWN (then the cluster runs little or
    nothing, however healthy its masters are)."""
    if master.leader_view() is None:
        return ""
    with master.lock:
        statuses = [n.status.value for n in master.state.nodes.values()]
    down = statuses.count("DOWN")
    return f"{down} of {len(statuses)} nodes are DOWN" if statuses and down * 2 > len(statuses) else ""


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
    connected, partners = master.raft.partners_connected()  # every 0.1 s (master.main._report_health)
    if (connected + 1) * 2 <= partners + 1:
        return f"in contact with {connected} of {partners} other replicas: no majority"
    return ""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
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

    def _session_id(self) -> str:
        cookie = SimpleCookie(self.headers.get("Cookie", ""))
        name = self.server.cookie_name
        return cookie[name].value if name in cookie else ""

    def _token(self) -> str:
        """The bearer token, else the token of the session the cookie names (judged alike by identify)."""
        header = self.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            return header[7:].strip()
        return self.server.sessions.token(self._session_id())

    def _set_cookie(self, value: str, max_age: int) -> None:
        secure = "; Secure" if self.server.https else ""
        self.send_header("Set-Cookie", f"{self.server.cookie_name}={value}; Max-Age={max_age}; Path=/; HttpOnly; "
                                       f"SameSite=Strict{secure}")

    def _dashboard(self, url: SplitResult) -> None:
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
        """The sign-in form (a token for a session) and the sign-out button; nothing else posts. A
        form another site makes the browser post is refused (Sec-Fetch-Site: browsers set it, scripts
        need not; Origin cannot serve, as the pages' no-referrer policy makes it "null")."""
        path = urlsplit(self.path).path
        if self.headers.get("Sec-Fetch-Site", "") == "cross-site":
            self._discard_body()  # unread, it would reset the connection before the client reads the answer
            self._send(403, b"a form from another site may not sign in or out here\n")
        elif path == "/login":
            self._login()
        elif path == "/logout":
            self.server.sessions.close(self._session_id())
            self._redirect("/login", cookie=("", 0))
        else:
            self._refuse()

    def _login(self) -> None:
        try:
            length = max(0, min(int(self.headers.get("Content-Length") or 0), 4096))
        except ValueError:
            length = 0
        token = parse_qs(self.rfile.read(length).decode(errors="replace")).get("token", [""])[-1].strip()
        caller = identify(self.server.master, self.server.token_key, token) if token else None
        if caller is None or caller.confined:  # a worker's credentials sign nobody in
            self._html(401, login_page("That token is not valid here."))
            return
        sessions = self.server.sessions
        sessions.close(self._session_id())  # a browser signing in again leaves no session behind
        self._redirect("/", cookie=(sessions.open(token), int(sessions.ttl_s)))

    def _redirect(self, location: str, cookie: tuple[str, int]) -> None:
        self.send_response(HTTPStatus.SEE_OTHER)
        self.send_header("Location", location)
        self._set_cookie(*cookie)
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _discard_body(self) -> None:
        """Read a request body this server will not use (at most a form's size)."""
        self.rfile.read(max(0, min(int(self.headers.get("Content-Length") or 0), 4096)))

    def _refuse(self) -> None:
        self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], master: Master, metrics: Metrics,
                 tls: ssl.SSLContext | None = None, sessions: Sessions | None = None) -> None:
        super().__init__(address, _Handler)
        self.master, self.metrics = master, metrics
        self.dashboard = Dashboard(master)
        self.token_key = token_key(master.config.raft_password)
        self.tls = tls  #: HTTPS only when set
        self.sessions = sessions if sessions is not None else Sessions()
        self.cookie_name = cookie_name(master.replica.id)

    @property
    def https(self) -> bool:
        return self.tls is not None

    # A TCP server's requests are sockets: typeshed's base also allows a datagram server's (data, socket).
    def finish_request(self, request: socket.socket,  # type: ignore[override]
                       client_address: tuple[str, int]) -> None:
        """Serve one connection, on its own thread: over TLS when the port has it."""
        request.settimeout(CONNECTION_TIMEOUT_S)
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        try:
            first = request.recv(1, socket.MSG_PEEK)
            if not first:
                return
            if first[0] != TLS_HANDSHAKE:
                self._refuse_plain(request)
                return
            secure = self.tls.wrap_socket(request, server_side=True)  # closes the socket if it fails
        except OSError:  # ssl.SSLError among them
            return  # a failed handshake or a client gone: nothing to answer
        try:
            super().finish_request(secure, client_address)
        finally:
            secure.close()

    def _refuse_plain(self, request: socket.socket) -> None:
        """Answer a plain-HTTP request on the HTTPS port without reading it as one."""
        host, port = self.server_address[:2]
        if isinstance(host, bytes | bytearray):
            host = host.decode()
        body = f"This port serves HTTPS only: https://{host}:{port}/\n".encode()
        request.recv(65536)  # what the client sent, so that closing does not reset the connection first
        request.sendall(b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                        b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)

    def handle_error(self, request: socket.socket,  # type: ignore[override]  # as finish_request
                     client_address: tuple[str, int]) -> None:
        """A client that hung up or stalled is no error of ours; anything else is logged."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError, ssl.SSLError)):
            return
        log.exception("http request failed client=%s", client_address[0] if client_address else "-")


#: How often the HTTP thread checks for a stop.
STOP_POLL_S = 0.05


class HTTPService:
    """The HTTP server of one replica, on its own thread: HTTPS with `tls` (the replica's own files)."""

    def __init__(self, address: str, master: Master, metrics: Metrics, tls: TLSFiles | None = None,
                 sessions: Sessions | None = None) -> None:
        host, _, port = address.rpartition(":")
        context = http_server_context(tls) if tls is not None and tls.enabled else None
        self.server = _Server((host, int(port)), master, metrics, context, sessions)
        #: stop() waits up to one poll interval (the default 0.5 s was half of a master's stop)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(STOP_POLL_S,), name="http",
                                       daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
