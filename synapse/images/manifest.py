"""Reading OCI and Docker v2 manifests and indexes: limits, media types, and the platform to pick.

Pure functions over bytes already fetched; the caller verified their digest.
"""

from __future__ import annotations

import json
import platform
import re
from dataclasses import dataclass
from typing import Any

from synapse.images.model import ImageConfig, PullError

#: The largest manifest, index or image config accepted (containerd's limit for manifests is 4 MiB too).
MAX_MANIFEST_BYTES = 4 << 20
#: The most layers one image may have (Docker's limit is 127 for overlayfs; this bounds work only).
MAX_LAYERS = 1000

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
#: What a registry is asked for, best first.
ACCEPT = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))
CONFIG_TYPES = ("application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json")
#: Layer media types and how each is compressed.
LAYER_TYPES = {
    "application/vnd.oci.image.layer.v1.tar": "",
    "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd": "zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar": "",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": "gzip",
    "application/vnd.docker.image.rootfs.diff.tar": "",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip": "gzip",
}
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
#: `uname -m` to the OCI architecture names.
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le",
         "s390x": "s390x", "riscv64": "riscv64", "i686": "386", "i386": "386", "armv7l": "arm"}


def machine_arch() -> str:
    """This machine's architecture as OCI names it (amd64, arm64, ...)."""
    return _ARCH.get(platform.machine().lower(), platform.machine().lower())


@dataclass(frozen=True)
class Descriptor:
    """A content descriptor: what a blob is, its digest and its exact size."""

    media_type: str
    digest: str
    size: int


@dataclass(frozen=True)
class Manifest:
    """An image manifest: its config blob and its layers, bottom first."""

    config: Descriptor
    layers: tuple[Descriptor, ...]


def load_json(data: bytes, what: str) -> dict[str, Any]:
    """`data` as a JSON object, refusing one above MAX_MANIFEST_BYTES or not an object."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise PullError("TOO_LARGE", f"{what} is {len(data)} bytes, above the {MAX_MANIFEST_BYTES} byte limit")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PullError("BAD_IMAGE", f"{what} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise PullError("BAD_IMAGE", f"{what} is not a JSON object")
    return doc


def descriptor(doc: object, what: str) -> Descriptor:
    """A descriptor from its JSON, checked: a sha256 digest and a non-negative integer size."""
    if not isinstance(doc, dict):
        raise PullError("BAD_IMAGE", f"{what} is not a descriptor object")
    digest, size, media_type = doc.get("digest"), doc.get("size"), doc.get("mediaType", "")
    if not isinstance(digest, str) or not _DIGEST_RE.match(digest):
        raise PullError("BAD_IMAGE", f"{what} has digest {digest!r}; only sha256:<64 hex> is supported")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise PullError("BAD_IMAGE", f"{what} has size {size!r}, not a non-negative integer")
    if not isinstance(media_type, str):
        raise PullError("BAD_IMAGE", f"{what} has a media type that is not a string")
    return Descriptor(media_type, digest, size)


def media_type_of(doc: dict[str, Any], header_type: str = "") -> str:
    """The document's media type: its own `mediaType`, else the server's, else guessed from its shape."""
    own = doc.get("mediaType")
    if isinstance(own, str) and own:
        return own
    if header_type and header_type.split(";")[0].strip() in (*INDEX_TYPES, *MANIFEST_TYPES):
        return header_type.split(";")[0].strip()
    return OCI_INDEX if "manifests" in doc else OCI_MANIFEST


def pick_platform(index: dict[str, Any], what: str, arch: str | None = None) -> Descriptor:
    """The index's manifest for linux on this machine's architecture (amd64 on x86_64)."""
    arch = arch or machine_arch()
    entries = index.get("manifests")
    if not isinstance(entries, list):
        raise PullError("BAD_IMAGE", f"{what} has no manifests list")
    seen = []
    for i, entry in enumerate(entries):
        d = descriptor(entry, f"{what} manifests[{i}]")
        plat = entry.get("platform") or {}
        os_name, entry_arch = str(plat.get("os", "")), str(plat.get("architecture", ""))
        seen.append(f"{os_name}/{entry_arch}" if plat else "(no platform)")
        if os_name == "linux" and entry_arch == arch and d.media_type in (*MANIFEST_TYPES, ""):
            return d
    raise PullError("NOT_FOUND", f"{what} has no image for linux/{arch} (it has: {', '.join(seen) or 'nothing'})")


def parse_manifest(doc: dict[str, Any], what: str) -> Manifest:
    """The config and layers of an image manifest, every descriptor and media type checked."""
    if doc.get("schemaVersion") != 2:
        raise PullError("BAD_IMAGE", f"{what} has schemaVersion {doc.get('schemaVersion')!r}; only 2 is supported")
    config = descriptor(doc.get("config"), f"{what} config")
    if config.media_type not in CONFIG_TYPES:
        raise PullError("BAD_IMAGE", f"{what} config has media type {config.media_type!r}, not an image config")
    if config.size > MAX_MANIFEST_BYTES:
        raise PullError("TOO_LARGE", f"{what} config is {config.size} bytes, above {MAX_MANIFEST_BYTES}")
    layers_doc = doc.get("layers")
    if not isinstance(layers_doc, list):
        raise PullError("BAD_IMAGE", f"{what} has no layers list")
    if len(layers_doc) > MAX_LAYERS:
        raise PullError("TOO_LARGE", f"{what} has {len(layers_doc)} layers, above {MAX_LAYERS}")
    layers = tuple(descriptor(layer, f"{what} layers[{i}]") for i, layer in enumerate(layers_doc))
    for i, layer in enumerate(layers):
        compression = LAYER_TYPES.get(layer.media_type)
        if compression is None:
            raise PullError("BAD_IMAGE", f"{what} layers[{i}] has media type {layer.media_type!r}, not a layer")
        if compression == "zstd":
            raise PullError("BAD_IMAGE", f"{what} layers[{i}] is zstd-compressed, which this node cannot unpack "
                                         "(no zstd library); push the image with gzip layers")
    return Manifest(config, layers)


def parse_config(data: bytes, layers: int, what: str) -> tuple[ImageConfig, tuple[str, ...]]:
    """The run settings of an image config and its layers' diff ids (digests of the uncompressed tars)."""
    doc = load_json(data, what)
    rootfs = doc.get("rootfs") or {}
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(diff_ids, list) or len(diff_ids) != layers or \
            not all(isinstance(d, str) and _DIGEST_RE.match(d) for d in diff_ids):
        raise PullError("BAD_IMAGE", f"{what} rootfs.diff_ids must list one sha256 digest per layer ({layers})")
    conf = doc.get("config") or {}
    if not isinstance(conf, dict):
        raise PullError("BAD_IMAGE", f"{what} config is not an object")

    def strings(key: str) -> tuple[str, ...]:
        value = conf.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise PullError("BAD_IMAGE", f"{what} config.{key} is not a list of strings")
        return tuple(value)

    def string(key: str) -> str:
        value = conf.get(key) or ""
        if not isinstance(value, str):
            raise PullError("BAD_IMAGE", f"{what} config.{key} is not a string")
        return value

    return (ImageConfig(env=strings("Env"), working_dir=string("WorkingDir"), entrypoint=strings("Entrypoint"),
                        cmd=strings("Cmd"), user=string("User")), tuple(diff_ids))
