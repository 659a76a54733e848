"""Where an image's manifests and blobs come from: a registry, an OCI layout directory (`oci:`) or an
OCI layout in a tar file (`oci-archive:`). Each gives the same two things, a document by digest (or
its top-level one) and a blob's bytes into a verifying writer, so the store treats them alike.
"""

from __future__ import annotations

import contextlib
import os
import tarfile
import threading
from pathlib import Path
from typing import IO

from synapse.core.jobs.imageref import ImageRef
from synapse.images.blobs import VerifyingWriter
from synapse.images.manifest import MAX_MANIFEST_BYTES, OCI_INDEX, Descriptor, descriptor, load_json
from synapse.images.model import PullError
from synapse.images.registry import RegistryClient

CHUNK = 1 << 20
#: The annotation an OCI layout's index uses to name an image (skopeo's `oci:DIR:NAME`).
REF_NAME = "org.opencontainers.image.ref.name"


class RegistrySource:
    """An image in a registry, by tag or digest."""

    def __init__(self, ref: ImageRef, client: RegistryClient) -> None:
        self.ref = ref
        self.client = client

    def top(self, deadline: float | None) -> tuple[bytes, str, str]:
        """(bytes, media type from the server, digest the bytes must have or "")."""
        reference = self.ref.digest or self.ref.tag
        data, content_type, header_digest = self.client.manifest(self.ref.repository, reference, deadline)
        return data, content_type, self.ref.digest or header_digest

    def document(self, desc: Descriptor, deadline: float | None) -> tuple[bytes, str]:
        data, content_type, _ = self.client.manifest(self.ref.repository, desc.digest, deadline)
        return data, content_type

    def copy_blob(self, desc: Descriptor, writer: VerifyingWriter, deadline: float | None) -> None:
        self.client.copy_blob(self.ref.repository, desc, writer, deadline)


class LayoutSource:
    """An OCI image layout, as a directory or as a tar of one. Its index.json is the top document;
    the image is the entry whose ref name annotation is the reference's (or its only entry)."""

    def __init__(self, ref: ImageRef) -> None:
        self.ref = ref
        #: Guards the tar file's one file object, read by several blob threads (a directory's files
        #: are separate objects and need no lock).
        self._lock: threading.Lock | contextlib.nullcontext[None] = \
            threading.Lock() if ref.transport == "oci-archive" else contextlib.nullcontext()
        self._tar: tarfile.TarFile | None = None
        self._members: dict[str, tarfile.TarInfo] = {}
        path = Path(ref.path)
        if ref.transport == "oci-archive":
            try:
                self._tar = tarfile.open(path, "r:")
                self._members = {m.name.removeprefix("./"): m for m in self._tar.getmembers() if m.isfile()}
            except FileNotFoundError:
                raise PullError("NOT_FOUND", f"{ref}: no such archive") from None
            except (OSError, tarfile.TarError) as exc:
                raise PullError("BAD_IMAGE", f"{ref}: not a readable tar archive ({exc})") from None
        elif not path.is_dir():
            raise PullError("NOT_FOUND", f"{ref}: no such OCI layout directory")

    def close(self) -> None:
        if self._tar is not None:
            self._tar.close()

    def _open(self, name: str, limit: int | None = None) -> tuple[IO[bytes], int]:
        """A readable file object for a file of the layout, and its size."""
        if self._tar is not None:
            member = self._members.get(name)
            if member is None:
                raise PullError("NOT_FOUND", f"{self.ref}: the archive has no {name}")
            with self._lock:
                f = self._tar.extractfile(member)
            if f is None:  # not reached: _members holds regular files only
                raise PullError("BAD_IMAGE", f"{self.ref}: the archive's {name} is not a file")
            return f, member.size
        try:
            # A layout is plain files: never follow a symlink planted in it.
            fd = os.open(Path(self.ref.path) / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise PullError("NOT_FOUND", f"{self.ref}: the layout has no {name}") from None
        except OSError as exc:
            raise PullError("BAD_IMAGE", f"{self.ref}: cannot read {name}: {exc}") from None
        opened = os.fdopen(fd, "rb")
        return opened, os.fstat(fd).st_size

    def _read_small(self, name: str) -> bytes:
        f, size = self._open(name)
        with f:
            if size > MAX_MANIFEST_BYTES:
                raise PullError("TOO_LARGE", f"{self.ref}: {name} is {size} bytes, above {MAX_MANIFEST_BYTES}")
            with self._lock:
                return f.read(MAX_MANIFEST_BYTES + 1)

    def top(self, deadline: float | None) -> tuple[bytes, str, str]:
        """The descriptor chosen from index.json, as a one-entry index the store resolves further."""
        index = load_json(self._read_small("index.json"), f"{self.ref} index.json")
        entries = index.get("manifests")
        if not isinstance(entries, list):
            raise PullError("BAD_IMAGE", f"{self.ref}: index.json has no manifests list")
        if self.ref.tag:
            chosen = [e for e in entries if isinstance(e, dict) and (e.get("annotations") or {}).get(REF_NAME)
                      == self.ref.tag]
            if not chosen:
                raise PullError("NOT_FOUND", f"{self.ref}: the layout has no image named {self.ref.tag!r}")
        else:
            chosen = entries
            if len(chosen) != 1:
                raise PullError("BAD_REFERENCE", f"{self.ref}: the layout holds {len(entries)} images; name one "
                                                 f"as {self.ref}:NAME")
        desc = descriptor(chosen[0], f"{self.ref} index.json entry")
        data, _ = self.document(desc, deadline)
        return data, desc.media_type, desc.digest

    def document(self, desc: Descriptor, deadline: float | None) -> tuple[bytes, str]:
        if desc.size > MAX_MANIFEST_BYTES:
            raise PullError("TOO_LARGE", f"{self.ref}: {desc.digest} is {desc.size} bytes, above {MAX_MANIFEST_BYTES}")
        return self._read_small(_blob_name(desc)), desc.media_type or OCI_INDEX

    def copy_blob(self, desc: Descriptor, writer: VerifyingWriter, deadline: float | None) -> None:
        writer.reset()
        f, size = self._open(_blob_name(desc))
        with f:
            if size > desc.size:
                raise PullError("TOO_LARGE", f"{self.ref}: blob {desc.digest} is {size} bytes, longer than the "
                                             f"{desc.size} its descriptor gives; refused")
            while True:
                with self._lock:
                    chunk = f.read(CHUNK)
                if not chunk:
                    break
                writer.write(chunk)


def _blob_name(desc: Descriptor) -> str:
    return "blobs/sha256/" + desc.digest.removeprefix("sha256:")
