"""Image references: parsing and validating the text a job gives as its `image`, with reasons.

Pure (no I/O): `synctl submit` and the master check a job's image with it before the job is
accepted, and a worker parses the same text before pulling, so a malformed reference is refused at
submit and never reaches a node.

The accepted forms (the transports are skopeo's names, so a reference copies between the tools):

- `registry.example:5000/team/train:1.4`, `…/train@sha256:<64 hex>`, `…/train:1.4@sha256:…`, with
  an optional `docker://` prefix: an image in a registry (OCI distribution API). The first path
  component is the registry host when it contains a `.` or a `:` or is `localhost`; otherwise the
  host is `docker.io`, as Docker does (`team/train` is `docker.io/team/train`, a bare `train` is
  `docker.io/library/train`). With neither tag nor digest the tag is `latest`, as Docker does.
- `oci:/abs/layout[:ref]`: an OCI image layout directory on the node, and optionally the image's
  `org.opencontainers.image.ref.name` in its index (without one the index must hold one image).
- `oci-archive:/abs/train.tar[:ref]`: the same layout in a tar file.
- `dir:/abs/rootfs`: an unpacked root file system used as it is.

Paths must be absolute, without `.` or `..` components or empty parts, and may use only letters,
digits and `/._+-@`: a job names a file on every node the same way, and shell-odd characters in a
path are a mistake more often than a need. A path may not hold `:` (the separator before the ref,
as in skopeo).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The transports a reference may name.
TRANSPORTS = ("docker", "oci", "oci-archive", "dir")
#: Docker's default registry, used for a name with no registry host.
DEFAULT_REGISTRY = "docker.io"
#: The longest reference accepted (jobspec.MAX_IMAGE_CHARS bounds the job field as well).
MAX_REFERENCE = 1024
#: The longest repository name a registry accepts (distribution's reference grammar).
MAX_REPOSITORY = 255

_HOST_LABEL = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_HOST_RE = re.compile(rf"^{_HOST_LABEL}(?:\.{_HOST_LABEL})*(?::[0-9]{{1,5}})?$|^\[[0-9A-Fa-f:.]+\](?::[0-9]{{1,5}})?$")
_COMPONENT_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_OCI_REF_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._+@/-]{0,254})$")
_PATH_CHARS_RE = re.compile(r"^[A-Za-z0-9/._+@-]+$")


class ImageRefError(ValueError):
    """A reference that cannot be used; the message says which part is wrong and why."""


@dataclass(frozen=True, slots=True)
class ImageRef:
    """A parsed, validated image reference; `str()` gives its canonical text."""

    transport: str  #: "docker" | "oci" | "oci-archive" | "dir"
    registry: str = ""  #: host[:port], for docker
    repository: str = ""  #: e.g. team/train, for docker
    tag: str = ""  #: the tag (docker) or ref name (oci, oci-archive); "" when only a digest is given
    digest: str = ""  #: "sha256:<64 hex>" or ""
    path: str = ""  #: absolute path, for oci / oci-archive / dir

    def __str__(self) -> str:
        if self.transport == "docker":
            return f"{self.registry}/{self.repository}" + (f":{self.tag}" if self.tag else "") + \
                (f"@{self.digest}" if self.digest else "")
        return f"{self.transport}:{self.path}" + (f":{self.tag}" if self.tag else "")


def parse(text: str) -> ImageRef:
    """The reference `text` names, or ImageRefError naming the problem."""
    if not isinstance(text, str) or not text:
        raise ImageRefError("the image reference is empty")
    if len(text) > MAX_REFERENCE:
        raise ImageRefError(f"the image reference is longer than {MAX_REFERENCE} characters")
    if text != text.strip() or any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in text):
        raise ImageRefError(f"{text!r}: spaces and control characters are not allowed")
    for transport in ("oci-archive", "oci", "dir"):
        if text.startswith(transport + ":"):
            return _parse_local(transport, text[len(transport) + 1:])
    if text.startswith("docker://"):
        return _parse_docker(text[len("docker://"):])
    head = text.split(":", 1)[0]
    if "/" not in head and head in ("docker-archive", "docker-daemon", "containers-storage", "sif", "docker",
                                    "file", "http", "https"):
        raise ImageRefError(f"{text!r}: unknown transport {head!r} (known: docker://, oci:, oci-archive:, dir:)")
    return _parse_docker(text)


def _parse_local(transport: str, rest: str) -> ImageRef:
    path, _, ref = rest.partition(":")
    _check_path(path, transport)
    if path.rstrip("/") == "":
        raise ImageRefError(f"{transport}:/ : the path may not be / (the node's own root)")
    if transport == "dir":
        if ref:
            raise ImageRefError(f"dir:{rest}: a dir: path may not contain ':' (dir: takes no ref name)")
        return ImageRef(transport, path=path.rstrip("/"))
    if ref and not _OCI_REF_RE.match(ref):
        raise ImageRefError(f"{transport}:{rest}: ref name {ref!r} must be letters, digits and ._+@/- "
                            "starting with a letter or digit, up to 255 characters")
    return ImageRef(transport, tag=ref, path=path.rstrip("/"))


def _check_path(path: str, transport: str) -> None:
    if not path:
        raise ImageRefError(f"{transport}: needs a path (e.g. {transport}:/shared/images/train)")
    if not path.startswith("/"):
        raise ImageRefError(f"{transport}:{path}: the path must be absolute (start with /)")
    if not _PATH_CHARS_RE.match(path):
        raise ImageRefError(f"{transport}:{path}: the path may use only letters, digits and /._+@-")
    parts = path.strip("/").split("/") if path != "/" else []
    if "//" in path:
        raise ImageRefError(f"{transport}:{path}: the path has an empty component")
    if any(p in (".", "..") for p in parts):
        raise ImageRefError(f"{transport}:{path}: the path may not contain '.' or '..' components")


def _parse_docker(text: str) -> ImageRef:
    original = text
    digest = ""
    if "@" in text:
        text, _, digest = text.partition("@")
        if not _DIGEST_RE.match(digest):
            raise ImageRefError(f"{original!r}: digest {digest!r} must be sha256: and 64 lowercase hex digits")
    tag = ""
    slash = text.rfind("/")
    colon = text.rfind(":")
    if colon > slash:
        text, tag = text[:colon], text[colon + 1:]
        if not _TAG_RE.match(tag):
            raise ImageRefError(f"{original!r}: tag {tag!r} must be letters, digits, '_', '.' or '-' (not first), "
                                "up to 128 characters")
    if not text:
        raise ImageRefError(f"{original!r}: the repository name is empty")
    parts = text.split("/")
    registry = DEFAULT_REGISTRY
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        registry = parts.pop(0)
        if not _HOST_RE.match(registry):
            raise ImageRefError(f"{original!r}: registry host {registry!r} is not a host name or host:port")
        port = registry.rpartition(":")[2] if ":" in registry and not registry.endswith("]") else ""
        if port and not 0 < int(port) < 65536:
            raise ImageRefError(f"{original!r}: registry port {port} is out of range")
    if registry == DEFAULT_REGISTRY and len(parts) == 1:
        parts = ["library", *parts]
    for part in parts:
        if not part:
            raise ImageRefError(f"{original!r}: the repository name has an empty component")
        if not _COMPONENT_RE.match(part):
            raise ImageRefError(f"{original!r}: repository component {part!r} must be lowercase letters and "
                                "digits, separated by '.', '_', '__' or '-'")
    repository = "/".join(parts)
    if len(repository) > MAX_REPOSITORY:
        raise ImageRefError(f"{original!r}: the repository name is longer than {MAX_REPOSITORY} characters")
    if not tag and not digest:
        tag = "latest"
    return ImageRef("docker", registry=registry, repository=repository, tag=tag, digest=digest)
