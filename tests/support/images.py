"""Test support for the image store: OCI images built offline in pure Python, OCI layouts and
archives of them, and a real registry (Debian's `docker-registry`) on a free loopback port, with
optional htpasswd (Basic) or token (Bearer) authentication, that they are pushed into.

The images: `busybox_image()` (the static busybox with a few applets as symlinks), `layered_image()`
(three layers exercising whiteouts, an opaque directory, hard links and symlinks), and
`multiarch_index()` (linux/amd64 and linux/arm64, each with a file naming its platform).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import ctypes.util
import datetime
import gzip
import hashlib
import io
import json
import os
import secrets
import shutil
import socket
import subprocess
import tarfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from synapse.core.jobs import jobspec
from synapse.core.model import Assignment
from synapse.worker import container
from tests.support.helpers import wait_for

BUSYBOX = Path("/bin/busybox")
REGISTRY_BIN = Path("/usr/bin/docker-registry")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class E:
    """One layer entry: kind is file, dir, symlink, hardlink, char, fifo (target for links)."""

    name: str
    kind: str = "file"
    data: bytes = b""
    target: str = ""
    mode: int = 0o644


def layer_tar(entries: list[E]) -> bytes:
    """The uncompressed tar of entries, in order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.mode = e.mode
            info.mtime = 1_700_000_000
            if e.kind == "file":
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
                         "char": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE}[e.kind]
            if e.kind == "dir" and e.mode == 0o644:
                info.mode = 0o755
            info.linkname = e.target
            if e.kind == "char":
                info.devmajor, info.devminor = 1, 3
            tar.addfile(info)
    return buf.getvalue()


@dataclass
class Layer:
    blob: bytes
    diff_id: str
    media_type: str = LAYER_GZIP


def make_layer(entries: list[E], compress: bool = True) -> Layer:
    raw = layer_tar(entries)
    return Layer(gzip.compress(raw, compresslevel=1, mtime=0) if compress else raw, sha(raw),
                 LAYER_GZIP if compress else LAYER_TAR)


@dataclass
class Img:
    """A single-platform image: its manifest and every blob it names."""

    manifest: bytes
    blobs: dict[str, bytes] = field(default_factory=dict)
    media_type: str = OCI_MANIFEST

    @property
    def digest(self) -> str:
        return sha(self.manifest)


def make_image(layers: list[Layer], *, arch: str = "amd64", env: tuple[str, ...] = ("PATH=/bin",),
               cmd: tuple[str, ...] = ("/bin/sh",), diff_ids: list[str] | None = None, docker: bool = False) -> Img:
    """An image of the layers; `docker` gives it Docker's v2 schema 2 media types instead of OCI's."""
    config = json.dumps({"architecture": arch, "os": "linux",
                         "config": {"Env": list(env), "Cmd": list(cmd), "WorkingDir": "/", "User": ""},
                         "rootfs": {"type": "layers", "diff_ids": diff_ids or [layer.diff_id for layer in layers]}},
                        sort_keys=True).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST if docker else OCI_MANIFEST,
                           "config": {"mediaType": DOCKER_CONFIG if docker else OCI_CONFIG, "digest": sha(config),
                                      "size": len(config)},
                           "layers": [{"mediaType": DOCKER_LAYER if docker else layer.media_type,
                                       "digest": sha(layer.blob), "size": len(layer.blob)}
                                      for layer in layers]}).encode()
    return Img(manifest, {sha(config): config, **{sha(layer.blob): layer.blob for layer in layers}},
               DOCKER_MANIFEST if docker else OCI_MANIFEST)


def make_index(images: list[tuple[Img, str]], docker: bool = False) -> Img:
    """An image index (a Docker manifest list with `docker`) over (image, architecture) pairs; its
    blobs include the child manifests."""
    index = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_LIST if docker else OCI_INDEX,
                        "manifests": [{"mediaType": img.media_type, "digest": img.digest, "size": len(img.manifest),
                                       "platform": {"os": "linux", "architecture": arch}}
                                      for img, arch in images]}).encode()
    blobs: dict[str, bytes] = {}
    for img, _ in images:
        blobs.update(img.blobs)
        blobs[img.digest] = img.manifest
    return Img(index, blobs, DOCKER_LIST if docker else OCI_INDEX)


def busybox_image(extra: list[E] | None = None) -> Img:
    """The static busybox as /bin/busybox with sh, echo, cat, ls as symlinks to it."""
    entries = [E("bin", "dir"), E("bin/busybox", data=BUSYBOX.read_bytes(), mode=0o755)]
    entries += [E(f"bin/{applet}", "symlink", target="busybox") for applet in ("sh", "echo", "cat", "ls")]
    entries += [E("etc", "dir"), E("etc/hostname", data=b"image\n")]
    return make_image([make_layer(entries + (extra or []))], env=("PATH=/bin", "IMAGE=busybox"))


def layered_image() -> Img:
    """Three layers: whiteouts of a file and a directory, an opaque directory that keeps its own
    layer's entries, hard links (within a layer and to a lower layer), symlinks, a replaced type."""
    base = make_layer([
        E("etc", "dir"), E("etc/keep", data=b"keep\n"), E("etc/gone", data=b"gone\n"),
        E("data", "dir"), E("data/sub", "dir"), E("data/sub/deep", data=b"deep\n"), E("data/old", data=b"old\n"),
        E("opq", "dir"), E("opq/lower1", data=b"l1\n"), E("opq/lowerdir", "dir"), E("opq/lowerdir/x", data=b"x\n"),
        E("lib", "dir"), E("lib/real.so", data=b"ELF-ish\n", mode=0o755),
        E("lib/link.so", "symlink", target="real.so"), E("abs", "symlink", target="/etc/keep"),
        E("becomes-dir", data=b"was a file\n"), E("becomes-file", "dir"), E("becomes-file/inner", data=b"i\n"),
    ])
    middle = make_layer([
        E("etc/.wh.gone", data=b""), E("data/.wh.sub", data=b""),
        E("opq", "dir"), E("opq/.wh..wh..opq", data=b""), E("opq/upper", data=b"upper\n"),
        E("hard", "dir"), E("hard/a", data=b"shared inode\n"), E("hard/b", "hardlink", target="hard/a"),
        E("hard/lower", "hardlink", target="etc/keep"),
        E("becomes-dir", "dir"), E("becomes-dir/now", data=b"dir now\n"),
        E("becomes-file", data=b"file now\n"),
    ], compress=False)
    top = make_layer([
        E("data/old", data=b"new\n"), E("data/sub", "dir"), E("data/sub/fresh", data=b"fresh\n"),
        E("lib/.wh.link.so", data=b""), E("lib/link.so", "symlink", target="/lib/real.so"),
    ])
    return make_image([base, middle, top])


def multiarch_index() -> tuple[Img, Img, Img]:
    """(index, amd64 image, arm64 image): the images differ by /platform."""
    amd = busybox_image([E("platform", data=b"amd64\n")])
    arm = make_image([make_layer([E("platform", data=b"arm64\n")])], arch="arm64")
    return make_index([(arm, "arm64"), (amd, "amd64")]), amd, arm


def write_layout(path: Path, named: dict[str, Img]) -> Path:
    """An OCI image layout at path holding each image under its ref name."""
    blobs = path / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, img in named.items():
        for digest, data in {**img.blobs, img.digest: img.manifest}.items():
            (blobs / digest.removeprefix("sha256:")).write_bytes(data)
        entries.append({"mediaType": img.media_type, "digest": img.digest, "size": len(img.manifest),
                        "annotations": {"org.opencontainers.image.ref.name": name}})
    (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": entries}))
    return path


def write_archive(path: Path, layout: Path) -> Path:
    """The layout as an uncompressed tar (skopeo's oci-archive)."""
    with tarfile.open(path, "w") as tar:
        for item in sorted(layout.rglob("*")):
            tar.add(item, arcname=str(item.relative_to(layout)), recursive=False)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bcrypt_hash(password: str) -> str:
    """A bcrypt hash (what the registry's htpasswd file needs) from the C library's crypt(3):
    libxcrypt, in every Debian, does bcrypt, so no Python package or apache2-utils is needed."""
    lib = ctypes.CDLL(ctypes.util.find_library("crypt") or "libcrypt.so.1")
    lib.crypt_gensalt.restype = ctypes.c_char_p
    lib.crypt_gensalt.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int]
    lib.crypt.restype = ctypes.c_char_p
    lib.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    salt = lib.crypt_gensalt(b"$2b$", 5, None, 0)
    return lib.crypt(password.encode(), salt).decode()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenIssuer:
    """The registry's token service for tests: checks Basic credentials and signs RS256 JWTs that the
    real registry verifies against the certificate in its `rootcertbundle`."""

    ISSUER = "synapse-test-issuer"
    SERVICE = "synapse-test-registry"

    def __init__(self, workdir: Path, users: dict[str, str]) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID
        self.users = users
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "synapse test token signer")])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(self.key.public_key())
                     .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
                     .not_valid_after(now + datetime.timedelta(days=1)).sign(self.key, hashes.SHA256()))
        self.cert_path = workdir / "token-cert.pem"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self._der = self.cert.public_bytes(serialization.Encoding.DER)
        self.requests: list[str] = []
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                auth = self.headers.get("Authorization", "")
                user = ""
                if auth.startswith("Basic "):
                    u, _, p = base64.b64decode(auth[6:]).decode().partition(":")
                    if issuer.users.get(u) != p:
                        self.send_response(401)
                        self.end_headers()
                        return
                    user = u
                issuer.requests.append(self.path)
                access = []
                for scope in query.get("scope", []):
                    kind, name, actions = scope.split(":")
                    # Anonymous callers get nothing; known users get what they asked for.
                    access.append({"type": kind, "name": name, "actions": actions.split(",") if user else []})
                body = json.dumps({"token": issuer.token(user, access)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def token(self, user: str, access: list[dict]) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(self._der).decode()]}
        claims = {"iss": self.ISSUER, "sub": user, "aud": self.SERVICE, "exp": now + 600, "nbf": now - 60,
                  "iat": now, "jti": secrets.token_hex(8), "access": access}
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64url(signature)}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Registry:
    """Debian's docker-registry on a free 127.0.0.1 port with storage in `workdir`; `auth` is None,
    ("htpasswd", {user: password}) or ("token", {user: password}). Its log is JSON, one request a line."""

    def __init__(self, workdir: Path, auth: tuple[str, dict[str, str]] | None = None) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.auth = auth
        self.issuer: TokenIssuer | None = None
        self.log_path = workdir / "registry.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Registry:
        auth_conf = ""
        if self.auth and self.auth[0] == "htpasswd":
            (self.workdir / "htpasswd").write_text("".join(f"{u}:{bcrypt_hash(p)}\n" for u, p in self.auth[1].items()))
            auth_conf = f"auth:\n  htpasswd:\n    realm: synapse-test\n    path: {self.workdir / 'htpasswd'}\n"
        elif self.auth and self.auth[0] == "token":
            self.issuer = TokenIssuer(self.workdir, self.auth[1])
            auth_conf = (f"auth:\n  token:\n    realm: {self.issuer.realm}\n    service: {TokenIssuer.SERVICE}\n"
                         f"    issuer: {TokenIssuer.ISSUER}\n    rootcertbundle: {self.issuer.cert_path}\n")
        config = self.workdir / "config.yml"
        config.write_text(f"version: 0.1\nlog:\n  level: info\n  formatter: json\n  accesslog:\n    disabled: true\n"
                          f"storage:\n  filesystem:\n    rootdirectory: {self.workdir / 'data'}\n"
                          f"http:\n  addr: {self.host}\n  secret: {secrets.token_hex(8)}\n{auth_conf}")
        self.proc = subprocess.Popen([str(REGISTRY_BIN), "serve", str(config)], stdout=subprocess.DEVNULL,
                                     stderr=open(self.log_path, "wb"))  # noqa: SIM115
        wait_for(self._up, 30, "the registry to listen")
        return self

    def _up(self) -> bool:
        assert self.proc and self.proc.poll() is None, self.log_path.read_text()[-2000:]
        with contextlib.suppress(OSError):
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        return False

    def __exit__(self, *exc) -> None:
        if self.proc:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.issuer:
            self.issuer.close()

    def _auth_header(self, repository: str) -> dict[str, str]:
        if not self.auth:
            return {}
        user, password = next(iter(self.auth[1].items()))
        if self.auth[0] == "htpasswd":
            return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
        assert self.issuer
        access = [{"type": "repository", "name": repository, "actions": ["pull", "push"]}]
        return {"Authorization": "Bearer " + self.issuer.token(user, access)}

    def _call(self, method: str, url: str, repository: str, data: bytes = b"", headers: dict | None = None):
        req = urllib.request.Request(url if url.startswith("http") else f"http://{self.host}{url}", data=data or None,
                                     method=method, headers={**self._auth_header(repository), **(headers or {})})
        return urllib.request.urlopen(req, timeout=60)

    def push(self, repository: str, tag: str, img: Img) -> str:
        """Upload the image's blobs and manifests (children by digest, then the top one by tag)."""
        for digest, data in img.blobs.items():
            if data.lstrip().startswith(b"{") and b'"schemaVersion"' in data[:200]:
                continue  # a child manifest: pushed below
            resp = self._call("POST", f"/v2/{repository}/blobs/uploads/", repository)
            location = urllib.parse.urljoin(f"http://{self.host}/", resp.headers["Location"])
            sep = "&" if "?" in location else "?"
            self._call("PUT", f"{location}{sep}digest={digest}", repository, data,
                       {"Content-Type": "application/octet-stream"})
        for digest, data in img.blobs.items():
            if data.lstrip().startswith(b"{") and b'"schemaVersion"' in data[:200]:
                self._call("PUT", f"/v2/{repository}/manifests/{digest}", repository, data,
                           {"Content-Type": json.loads(data)["mediaType"]})
        self._call("PUT", f"/v2/{repository}/manifests/{tag}", repository, img.manifest,
                   {"Content-Type": img.media_type})
        return img.digest

    def requests(self, method: str = "GET", contains: str = "") -> list[str]:
        """The URIs of the requests the registry completed, from its JSON log."""
        found = []
        for line in self.log_path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("msg") == "response completed" and rec.get("http.request.method") == method and \
                    contains in rec.get("http.request.uri", ""):
                found.append(rec["http.request.uri"])
        return found


def registry_available() -> str:
    """Why registry tests cannot run here, or ""."""
    if not REGISTRY_BIN.exists():
        return "Debian's docker-registry is not installed (scripts/install-test-packages.sh)"
    if not BUSYBOX.exists():
        return "busybox-static is not installed (scripts/install-test-packages.sh)"
    return ""


def tree(root: Path) -> dict[str, tuple]:
    """A comparable listing of a root: path -> (kind, content or link target[, mode]), plus the key
    "(hard links)" -> the groups of paths sharing an inode."""
    out: dict[str, tuple] = {}
    inodes: dict[int, list[str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = Path(dirpath) / name
            rel = str(full.relative_to(root))
            st = full.lstat()
            if full.is_symlink():
                out[rel] = ("symlink", os.readlink(full))
            elif full.is_dir():
                out[rel] = ("dir",)
            else:
                inodes.setdefault(st.st_ino, []).append(rel)
                out[rel] = ("file", full.read_bytes(), oct(st.st_mode & 0o777), int(st.st_mtime))
    out["(hard links)"] = tuple(sorted(tuple(sorted(g)) for g in inodes.values() if len(g) > 1))
    return out


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, symlinks=True)


class FakeRegistry:
    """A tiny, deliberately broken registry: `routes` maps a request path to a function given the
    handler, which writes whatever response the test wants. `hits` counts requests per path."""

    def __init__(self) -> None:
        self.routes: dict[str, object] = {}
        self.hits: dict[str, int] = {}
        self.release = threading.Event()  #: set on close: a stalled response may end
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                path = urllib.parse.urlsplit(self.path).path
                fake.hits[path] = fake.hits.get(path, 0) + 1
                route = fake.routes.get(path)
                try:
                    if route is None:
                        self.send_response(404)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                    else:
                        route(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def serve(self, path: str, body: bytes, content_type: str = "application/octet-stream", **headers: str) -> None:
        def route(h: BaseHTTPRequestHandler) -> None:
            h.send_response(200)
            h.send_header("Content-Type", content_type)
            h.send_header("Content-Length", str(len(body)))
            for k, v in headers.items():
                h.send_header(k.replace("_", "-"), v)
            h.end_headers()
            h.wfile.write(body)
        self.routes[path] = route

    def serve_image(self, repository: str, tag: str, img: Img) -> None:
        """Every document and blob of img at its usual path (tampering is the test's business)."""
        self.serve(f"/v2/{repository}/manifests/{tag}", img.manifest, img.media_type)
        self.serve(f"/v2/{repository}/manifests/{img.digest}", img.manifest, img.media_type)
        for digest, data in img.blobs.items():
            self.serve(f"/v2/{repository}/blobs/{digest}", data)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


BUSYBOX_ON_PATH = shutil.which("busybox")  #: the busybox a root file system of the tests copies


APPLETS = ("sh", "cat", "ls", "echo", "env", "pwd", "sleep", "touch", "grep", "id", "test", "stat")


needs_root_fs = pytest.mark.skipif(not BUSYBOX_ON_PATH or os.geteuid() != 0
                                   and not os.path.exists("/proc/self/ns/user"), reason="needs busybox and namespaces")


def busybox_root(path: Path, release: str = "imgrun-test 1") -> Path:
    """A root file system with a static busybox and an os-release the tests look for."""
    (path / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX_ON_PATH, path / "bin" / "busybox")
    for name in APPLETS:
        (path / "bin" / name).symlink_to("busybox")
    (path / "etc").mkdir()
    (path / "etc" / "os-release").write_text(f"NAME={release}\n")
    return path


def finished(cluster, job_id: str, timeout: float = 60.0):
    return wait_for(lambda: (lambda j: j if j.status in ("SUCCEEDED", "FAILED", "CANCELLED") else None)(
        cluster.client.get_job(job_id)), timeout, f"job {job_id} to end")


def task_logs(cluster, job_id: str, attempt: int = 1) -> list[str]:
    info = cluster.client.get_job(job_id)
    nodes = {a.attempt: list(a.nodes) for a in info.attempts}[attempt]
    return [(cluster.worker_dir(node) / "logs" / job_id / f"attempt-{attempt}" / f"task-{i}.log").read_text()
            for i, node in enumerate(nodes)]


def parse(text: str):
    return jobspec.parse_job(yaml.safe_load(text))


def submit(cluster, text: str) -> str:
    from synapse.core import codec
    return cluster.client.submit(codec.job_spec_to_proto(parse(text)))


def assignment(**kw) -> Assignment:
    fields = dict(job_id="j1", attempt=1, index=0, rank=0, world_size=1, local_rank=0, local_world_size=1,
                  node_rank=0, master_addr="127.0.0.1", master_port=0, gpus=(), command=(), env=(),
                  image="dir:/images/x")
    fields.update(kw)
    return Assignment(**fields)


def image(root: Path, env=(), working_dir="", entrypoint=(), cmd=(), user="") -> SimpleNamespace:
    """What the store's `ensure` returns, as far as the runtime reads it."""
    return SimpleNamespace(root=root, config=SimpleNamespace(env=env, working_dir=working_dir, entrypoint=entrypoint,
                                                             cmd=cmd, user=user))


def plan(tmp_path: Path, **kw) -> container.ContainerSpec:
    args = dict(task_dir=tmp_path / "task", image_root="/images/x", image_env=(), working_dir="", entrypoint=(),
                cmd=(), command=("true",), task_env={}, gpus=(), mounts=(), allowed_mounts=(), cdi_specs=())
    args.update(kw)
    return container.plan(**args)


def leftovers(store_root: Path) -> list[str]:
    """What a failed pull left in the store: partial unpacks, temporary blobs, images."""
    return sorted(str(p.relative_to(store_root)) for d in ("tmp", "images") for p in (store_root / d).iterdir())
