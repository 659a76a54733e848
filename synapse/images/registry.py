"""A client of the OCI distribution API: manifests and blobs by GET, with Bearer and Basic auth,
timeouts, retries with backoff, and the plain-HTTP rule.

Plain HTTP is used only for a loopback registry (127.0.0.0/8, ::1, localhost, as Docker does) or one
the worker's admin lists as insecure; every other registry is spoken to over HTTPS, verified with the
system's CAs or the given CA file. A token realm or redirect that would send credentials over plain
HTTP to a host not allowed it is refused.

Credentials come from a file the worker's admin controls, in Docker's `config.json` shape (only
`auths` is read; `credsStore`/`credHelpers` are not run):

    {"auths": {"registry.example:5000": {"auth": "<base64 of user:password>"},
               "other.example": {"username": "u", "password": "p"}}}
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import logging
import random
import re
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from synapse.images.blobs import VerifyingWriter
from synapse.images.manifest import ACCEPT, MAX_MANIFEST_BYTES, Descriptor
from synapse.images.model import PullError

_T = TypeVar("_T")

log = logging.getLogger(__name__)

CHUNK = 1 << 20
MAX_REDIRECTS = 5
#: Docker Hub's API host for the `docker.io` name.
DOCKER_HUB = "registry-1.docker.io"
#: Causes worth another attempt: the registry or the path to it may recover.
RETRIED = frozenset({"UNREACHABLE", "TIMEOUT"})


def load_credentials(path: Path | None) -> dict[str, tuple[str, str]]:
    """registry host -> (user, password) from a Docker-style config.json; {} without a file."""
    if path is None:
        return {}
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"registry credentials {path}: {exc}") from None
    auths = doc.get("auths", {}) if isinstance(doc, dict) else None
    if not isinstance(auths, dict):
        raise ValueError(f"registry credentials {path}: 'auths' must map registry hosts to credentials")
    found = {}
    for host, entry in auths.items():
        if not isinstance(entry, dict):
            raise ValueError(f"registry credentials {path}: auths[{host!r}] is not an object")
        host = re.sub(r"^https?://", "", str(host)).split("/")[0]
        if entry.get("auth"):
            try:
                user, sep, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                sep = ""
            if not sep:
                raise ValueError(f"registry credentials {path}: auths[{host!r}].auth is not base64 of user:password")
        elif entry.get("username") is not None:
            user, password = str(entry["username"]), str(entry.get("password", ""))
        else:
            continue
        found[host] = (user, password)
    return found


def is_loopback(host: str) -> bool:
    """Whether host (without port) is this machine: localhost, 127.0.0.0/8 or ::1."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_host(hostport: str) -> str:
    """The host part of host[:port] (IPv6 in brackets)."""
    if hostport.startswith("["):
        return hostport[1:hostport.index("]")]
    return hostport.rsplit(":", 1)[0] if ":" in hostport else hostport


@dataclass
class _Response:
    status: int
    headers: http.client.HTTPMessage
    body: http.client.HTTPResponse
    conn: http.client.HTTPConnection

    def close(self) -> None:
        self.conn.close()


class RegistryClient:
    """One registry, shared by the threads of a pull; tokens are cached per scope."""

    def __init__(self, registry: str, *, credentials: dict[str, tuple[str, str]] | None = None,
                 insecure: Iterable[str] = (), timeout: float = 60.0, retries: int = 3,
                 ca_file: Path | None = None) -> None:
        self.registry = registry
        self.endpoint = DOCKER_HUB if registry == "docker.io" else registry
        self.insecure = {h.lower() for h in insecure}
        self.plain = self._plain_allowed(self.endpoint)
        self.credentials = (credentials or {}).get(registry) or (credentials or {}).get(self.endpoint)
        self.timeout = timeout
        self.retries = max(0, retries)
        self.ca_file = ca_file
        self._ssl: ssl.SSLContext | None = None  #: made on first HTTPS use (loading the CAs takes a while)
        self._lock = threading.Lock()
        self._auth: dict[str, str] = {}  #: scope -> Authorization header value; guarded by _lock

    def _plain_allowed(self, hostport: str) -> bool:
        return is_loopback(split_host(hostport)) or hostport.lower() in self.insecure or \
            split_host(hostport).lower() in self.insecure

    # -- the two operations -------------------------------------------------------------------------

    def manifest(self, repository: str, reference: str, deadline: float | None = None) -> tuple[bytes, str, str]:
        """(bytes, Content-Type, Docker-Content-Digest) of a manifest or index, by tag or digest;
        TOO_LARGE when it is above MAX_MANIFEST_BYTES, said or read."""
        def attempt() -> tuple[bytes, str, str]:
            resp = self._get(f"/v2/{repository}/manifests/{reference}", repository, deadline, {"Accept": ACCEPT})
            try:
                length = resp.headers.get("Content-Length")
                if length and length.isdigit() and int(length) > MAX_MANIFEST_BYTES:
                    raise PullError("TOO_LARGE", f"manifest {repository}:{reference} is {length} bytes, above the "
                                                 f"{MAX_MANIFEST_BYTES} byte limit")
                data = bytearray()
                while len(data) <= MAX_MANIFEST_BYTES:
                    chunk = self._read(resp, min(CHUNK, MAX_MANIFEST_BYTES + 1 - len(data)), deadline)
                    if not chunk:
                        break
                    data += chunk
                if len(data) > MAX_MANIFEST_BYTES:
                    raise PullError("TOO_LARGE", f"manifest {repository}:{reference} is above the "
                                                 f"{MAX_MANIFEST_BYTES} byte limit")
                return bytes(data), resp.headers.get("Content-Type", ""), resp.headers.get("Docker-Content-Digest", "")
            finally:
                resp.close()
        return self._retrying(attempt, f"manifest {repository}:{reference}", deadline)

    def copy_blob(self, repository: str, desc: Descriptor, writer: VerifyingWriter,
                  deadline: float | None = None) -> None:
        """Stream a blob into `writer`, which verifies it; a transient failure restarts it."""
        def attempt() -> None:
            writer.reset()
            resp = self._get(f"/v2/{repository}/blobs/{desc.digest}", repository, deadline)
            try:
                length = resp.headers.get("Content-Length")
                if length and length.isdigit() and int(length) > desc.size:
                    raise PullError("TOO_LARGE", f"blob {desc.digest} is {length} bytes, longer than the "
                                                 f"{desc.size} its descriptor gives; refused")
                while True:
                    chunk = self._read(resp, CHUNK, deadline)
                    if not chunk:
                        break
                    writer.write(chunk)
            finally:
                resp.close()
        self._retrying(attempt, f"blob {desc.digest}", deadline)

    # -- retries, requests, auth --------------------------------------------------------------------

    def _retrying(self, attempt: Callable[[], _T], what: str, deadline: float | None) -> _T:
        for n in range(self.retries + 1):
            try:
                return attempt()
            except PullError as exc:
                if exc.cause not in RETRIED or n == self.retries:
                    raise
                pause = min(8.0, 0.25 * 2 ** n) * (0.5 + random.random())
                if deadline is not None and time.monotonic() + pause >= deadline:
                    raise
                log.info("image pull retry what=%s attempt=%d cause=%s pause=%.2f", what, n + 1, exc.cause, pause)
                time.sleep(pause)
        raise AssertionError("unreachable")

    def _socket_timeout(self, deadline: float | None) -> float:
        if deadline is None:
            return self.timeout
        left = deadline - time.monotonic()
        if left <= 0:
            raise PullError("TIMEOUT", "the pull's deadline passed")
        return min(self.timeout, left)

    def _read(self, resp: _Response, n: int, deadline: float | None) -> bytes:
        try:
            resp.conn.sock and resp.conn.sock.settimeout(self._socket_timeout(deadline))
            return resp.body.read(n)
        except TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                raise PullError("TIMEOUT", f"the pull's deadline passed while reading from {self.registry}") from None
            raise PullError("TIMEOUT", f"{self.registry} sent nothing for {self.timeout:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise PullError("UNREACHABLE", f"{self.registry}: {exc}") from None

    def _get(self, path: str, repository: str, deadline: float | None,
             headers: dict[str, str] | None = None) -> _Response:
        """A 200 response to GET path, after any auth challenge and redirects; errors as PullError."""
        scope = f"repository:{repository}:pull"
        url = self._url(self.endpoint, self.plain, path)
        challenged = False
        redirects = 0
        while True:
            send = dict(headers or {})
            same_host = urllib.parse.urlsplit(url).netloc == self.endpoint
            with self._lock:
                auth = self._auth.get(scope)
            if auth and same_host:
                send["Authorization"] = auth
            resp = self._request(url, send, deadline)
            if resp.status == 200:
                return resp
            resp_headers = resp.headers
            resp.body.read(64 << 10)  # let the connection finish; the body is an error document
            resp.close()
            if resp.status in (301, 302, 303, 307, 308) and redirects < MAX_REDIRECTS:
                location = resp_headers.get("Location", "")
                url = urllib.parse.urljoin(url, location)
                parts = urllib.parse.urlsplit(url)
                if parts.scheme == "http" and not self._plain_allowed(parts.netloc):
                    raise PullError("UNREACHABLE", f"{self.registry} redirected to plain http at {parts.netloc}, "
                                                   "which is neither loopback nor an insecure registry")
                redirects += 1
                continue
            if resp.status == 401 and not challenged:
                challenged = True
                self._authenticate(resp_headers.get("WWW-Authenticate", ""), scope, deadline)
                continue
            if resp.status in (401, 403):
                who = "with the node's credentials" if self.credentials else "without credentials"
                raise PullError("UNAUTHORIZED", f"{self.registry} refused {path} {who} (HTTP {resp.status})")
            if resp.status == 404:
                raise PullError("NOT_FOUND", f"{self.registry} has no {path.removeprefix('/v2/')} (HTTP 404)")
            if resp.status == 429 or resp.status >= 500:
                raise PullError("UNREACHABLE", f"{self.registry} answered HTTP {resp.status} for {path}")
            raise PullError("NOT_FOUND" if resp.status == 400 else "UNREACHABLE",
                            f"{self.registry} answered HTTP {resp.status} for {path}")

    def _url(self, hostport: str, plain: bool, path: str) -> str:
        return f"{'http' if plain else 'https'}://{hostport}{path}"

    def _request(self, url: str, headers: dict[str, str], deadline: float | None) -> _Response:
        parts = urllib.parse.urlsplit(url)
        timeout = self._socket_timeout(deadline)
        try:
            if parts.scheme == "https":
                with self._lock:
                    if self._ssl is None:
                        self._ssl = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
                conn: http.client.HTTPConnection = http.client.HTTPSConnection(parts.netloc, timeout=timeout,
                                                                               context=self._ssl)
            else:
                conn = http.client.HTTPConnection(parts.netloc, timeout=timeout)
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            conn.request("GET", target, headers={"User-Agent": "synapse-worker", **headers})
            body = conn.getresponse()
        except TimeoutError:
            raise PullError("TIMEOUT", f"{parts.netloc} did not answer within {timeout:g} s") from None
        except ssl.SSLError as exc:
            raise PullError("UNREACHABLE", f"{parts.netloc}: TLS failed: {exc}") from None
        except (OSError, http.client.HTTPException) as exc:
            raise PullError("UNREACHABLE", f"{parts.netloc}: {exc}") from None
        return _Response(body.status, body.headers, body, conn)

    def _authenticate(self, challenge: str, scope: str, deadline: float | None) -> None:
        """Answer a 401's WWW-Authenticate: Basic with the node's credentials, or Bearer by asking the
        realm for a token (with the credentials when the node has some)."""
        scheme, _, params_text = challenge.strip().partition(" ")
        params = dict((k.lower(), v) for k, v in re.findall(r'(\w+)="([^"]*)"', params_text))
        basic = None
        if self.credentials:
            basic = "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()
        if scheme.lower() == "basic":
            if not basic:
                raise PullError("UNAUTHORIZED", f"{self.registry} asks for a user and password and the node has "
                                                "no credentials for it")
            with self._lock:
                self._auth[scope] = basic
            return
        if scheme.lower() != "bearer" or not params.get("realm"):
            raise PullError("UNAUTHORIZED", f"{self.registry} asks for authentication this node does not speak: "
                                            f"{challenge[:100]!r}")
        realm = urllib.parse.urlsplit(params["realm"])
        if realm.scheme not in ("http", "https") or not realm.netloc:
            raise PullError("UNAUTHORIZED", f"{self.registry}'s token realm {params['realm']!r} is not an http(s) URL")
        if realm.scheme == "http" and not self._plain_allowed(realm.netloc):
            raise PullError("UNAUTHORIZED", f"{self.registry}'s token realm {realm.netloc} is plain http and neither "
                                            "loopback nor an insecure registry; refused")
        query = {"scope": params.get("scope") or scope}
        if params.get("service"):
            query["service"] = params["service"]
        url = urllib.parse.urlunsplit((realm.scheme, realm.netloc, realm.path,
                                       "&".join(filter(None, [realm.query, urllib.parse.urlencode(query)])), ""))
        resp = self._request(url, {"Authorization": basic} if basic else {}, deadline)
        try:
            data = self._read(resp, MAX_MANIFEST_BYTES, deadline)
        finally:
            resp.close()
        if resp.status in (401, 403):
            raise PullError("UNAUTHORIZED", f"the token service {realm.netloc} refused the node's credentials "
                                            f"(HTTP {resp.status})")
        if resp.status != 200:
            raise PullError("UNREACHABLE", f"the token service {realm.netloc} answered HTTP {resp.status}")
        try:
            doc = json.loads(data)
            token = doc.get("token") or doc.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise PullError("UNAUTHORIZED", f"the token service {realm.netloc} gave no token")
        with self._lock:
            self._auth[scope] = f"Bearer {token}"
