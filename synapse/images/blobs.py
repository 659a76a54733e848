"""Content-addressed blobs under the store root, each verified against its descriptor as it is written.

A blob reaches `blobs/sha256/<hex>` only after its bytes hashed to its digest and counted to its
size; a writer refuses the first byte past the size at once, so a lying server cannot fill the disk.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from synapse.images.manifest import Descriptor
from synapse.images.model import PullError

#: The errors that mean the store's file system is full (or the quota is).
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class VerifyingWriter:
    """Takes a blob's bytes into a temporary file, hashing and counting them; `finish` checks both."""

    def __init__(self, desc: Descriptor, path: Path, on_bytes: Callable[[int], None] | None = None) -> None:
        self.desc = desc
        self.path = path
        self.on_bytes = on_bytes
        self._file = open(path, "wb")  # noqa: SIM115 (closed by finish/close)
        self._hash = hashlib.sha256()
        self.written = 0

    def reset(self) -> None:
        """Start again from the first byte (a retried download)."""
        if self.on_bytes and self.written:
            self.on_bytes(-self.written)
        self._file.seek(0)
        self._file.truncate()
        self._hash = hashlib.sha256()
        self.written = 0

    def write(self, chunk: bytes) -> None:
        if self.written + len(chunk) > self.desc.size:
            raise PullError("TOO_LARGE", f"blob {self.desc.digest} is longer than the {self.desc.size} bytes its "
                                         "descriptor gives; refused")
        self._hash.update(chunk)
        try:
            self._file.write(chunk)
        except OSError as exc:
            raise disk_error(exc, f"writing blob {self.desc.digest}") from None
        self.written += len(chunk)
        if self.on_bytes:
            self.on_bytes(len(chunk))

    def finish(self) -> None:
        """Verify size and digest, then flush the file to disk; raises DIGEST_MISMATCH on either."""
        if self.written != self.desc.size:
            raise PullError("DIGEST_MISMATCH", f"blob {self.desc.digest} ended after {self.written} of its "
                                               f"{self.desc.size} bytes")
        got = "sha256:" + self._hash.hexdigest()
        if got != self.desc.digest:
            raise PullError("DIGEST_MISMATCH", f"blob {self.desc.digest} has digest {got}; refused")
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:
            raise disk_error(exc, f"writing blob {self.desc.digest}") from None
        finally:
            self._file.close()

    def close(self) -> None:
        self._file.close()


def disk_error(exc: OSError, doing: str) -> PullError:
    """A PullError for an OSError met while writing the store: DISK_FULL when it is one."""
    if exc.errno in FULL_ERRNOS:
        return PullError("DISK_FULL", f"the image store's file system is full ({doing})")
    return PullError("BAD_IMAGE", f"{doing}: {exc}")


class BlobStore:
    """`root/sha256/<hex>` files, each written only through a VerifyingWriter."""

    def __init__(self, root: Path, tmp: Path) -> None:
        self.root = root / "sha256"
        self.tmp = tmp
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        return self.root / digest.removeprefix("sha256:")

    def has(self, desc: Descriptor) -> bool:
        """Whether the verified blob is here (a size check guards against a file cut short by a crash
        between rename and its data reaching disk, which fsync before rename already makes unlikely)."""
        try:
            return self.path(desc.digest).stat().st_size == desc.size
        except FileNotFoundError:
            return False

    def put(self, desc: Descriptor, fill: Callable[[VerifyingWriter], None],
            on_bytes: Callable[[int], None] | None = None) -> Path:
        """Make the blob present: `fill` writes its bytes into the writer (and may `reset` it to retry)."""
        final = self.path(desc.digest)
        if self.has(desc):
            if on_bytes:
                on_bytes(desc.size)
            return final
        tmp = self.tmp / f"blob-{desc.digest.removeprefix('sha256:')}-{os.getpid()}-{id(fill)}"
        try:
            writer = VerifyingWriter(desc, tmp, on_bytes)
        except OSError as exc:
            raise disk_error(exc, f"creating blob {desc.digest}") from None
        try:
            fill(writer)
            writer.finish()
            os.replace(tmp, final)
        except BaseException:
            writer.close()
            tmp.unlink(missing_ok=True)
            raise
        return final

    def remove(self, digest: str) -> None:
        self.path(digest).unlink(missing_ok=True)

    def digests(self) -> set[str]:
        """Every blob present."""
        return {"sha256:" + p.name for p in self.root.iterdir()}

    def total_bytes(self) -> int:
        """What all blobs take (their sizes)."""
        total = 0
        for p in self.root.iterdir():
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                pass
        return total

    def size(self, digest: str) -> int:
        try:
            return self.path(digest).stat().st_size
        except FileNotFoundError:
            return 0
