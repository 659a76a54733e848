"""What the image store hands out and the typed reasons a pull fails."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: Why a pull failed. `node_side` causes are about this node or its path to the registry, so another
#: node may well succeed; the others are about the image or the reference, and fail everywhere.
#: - NOT_FOUND: the registry, layout or archive has no such image (or none for this platform).
#: - UNAUTHORIZED: the registry refused the node's credentials, or asked for some it does not have
#:   (the credentials file is the cluster admin's, the same on every node, so not node-side).
#: - DIGEST_MISMATCH: a blob's or manifest's content does not match its digest or size.
#: - TOO_LARGE: a manifest, index or config above its limit, or a blob longer than its descriptor.
#: - DISK_FULL (node-side): the store's file system filled up; the partial work is removed.
#: - UNREACHABLE (node-side): connection refused or reset, DNS, TLS, or the registry answering 5xx.
#: - TIMEOUT (node-side): the registry stalled past the timeout, or the caller's deadline passed.
#: - BAD_IMAGE: the image is malformed or unsafe (unknown media type, zstd, an entry escaping the root,
#:   a write through a symlink, a dir: root that is the node's /).
#: - BAD_REFERENCE: the reference does not parse.
CAUSES = ("NOT_FOUND", "UNAUTHORIZED", "DIGEST_MISMATCH", "TOO_LARGE", "DISK_FULL", "UNREACHABLE", "TIMEOUT",
          "BAD_IMAGE", "BAD_REFERENCE")
NODE_SIDE = frozenset({"DISK_FULL", "UNREACHABLE", "TIMEOUT"})


class PullError(Exception):
    """An image that could not be made ready on this node: `cause` (one of CAUSES) is for code,
    `message` for people; `node_side` says whether another node may succeed."""

    def __init__(self, cause: str, message: str) -> None:
        assert cause in CAUSES, cause
        super().__init__(f"{cause}: {message}")
        self.cause = cause
        self.message = message
        self.node_side = cause in NODE_SIDE


@dataclass(frozen=True)
class ImageConfig:
    """What the image's config says a container of it runs with (OCI image config `config`)."""

    env: tuple[str, ...] = ()  #: "NAME=value" entries
    working_dir: str = ""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    user: str = ""


@dataclass(frozen=True)
class Image:
    """An image ready on this node. `root` is its unpacked root file system, shared read-only by
    every task of that image on the node (for dir: the given directory); `digest` is the manifest's
    digest ("" for dir:)."""

    reference: str
    digest: str
    root: Path
    config: ImageConfig


@dataclass(frozen=True)
class PullProgress:
    """How far a pull is; `phase` is "manifest", "layers", "unpack" or "done"."""

    reference: str
    done_bytes: int
    total_bytes: int
    phase: str


@dataclass(frozen=True)
class CachedImage:
    """One image in the store, as `ImageStore.cached()` lists it."""

    references: tuple[str, ...]
    digest: str
    size_bytes: int  #: its unpacked root plus the blobs only it uses
    last_used: float  #: wall-clock seconds
    holders: tuple[str, ...]  #: who pinned it (the worker's task ids); pinned images are never evicted
