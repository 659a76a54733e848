"""Applying image layers to a root file system, exactly per the OCI image-spec's layer rules, and
never writing outside the root.

The rules, and the choices this applier makes where the spec leaves one:
- Layers apply in order. `.wh.NAME` deletes NAME from the layers below; `.wh..wh..opq` empties its
  directory of what the layers below put there; entries of the same layer are kept. Whiteout files
  themselves are never created.
- Every path is taken relative to the root (a leading `/` or `./` is dropped, as Docker does) and one
  with a `..` component is refused (BAD_IMAGE): no entry may name anything outside the root.
- Each parent directory is opened one component at a time with O_NOFOLLOW from the root's fd, so a
  symlink inside the rootfs is never followed when writing: an entry whose parent is a symlink is
  refused (BAD_IMAGE) rather than resolved. Symlinks themselves are created as given; their targets
  are only text until a task's runtime resolves them inside its own root.
- Hard links name a path of the same root (relative or root-absolute), which must already exist and
  not be a directory; the link is made without following a symlink.
- Device nodes (character and block) are skipped: an unprivileged applier cannot make them and a task's
  runtime provides /dev itself. FIFOs are made.
- Files and symlinks keep their modification times (a `.pyc` is used only while its source's
  mtime matches); directories get the time of the unpack.
- Setuid and setgid bits are stripped from every file and directory, and extended attributes (file
  capabilities among them) are not applied: the store is shared by all
  tasks on the node and a task never needs to gain privileges from its image. Directories get at
  least u+rwx so later layers can write into them. Owners are not changed: files belong to the
  worker's user (rootless, as `umoci unpack --rootless`).
- A layer is gzip or uncompressed tar, told by its first bytes; zstd is refused (BAD_IMAGE). The
  uncompressed stream is hashed and must equal the config's diff id (DIGEST_MISMATCH otherwise).
- A full disk is DISK_FULL; the caller removes the partial root.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import logging
import os
import shutil
import stat
import tarfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from synapse.images.blobs import FULL_ERRNOS, disk_error
from synapse.images.model import PullError

log = logging.getLogger(__name__)

CHUNK = 1 << 20
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: The deepest path an entry may have (Linux's PATH_MAX of 4096 allows about 2000; images need far fewer).
MAX_DEPTH = 256
#: How many directory fds the applier keeps open between entries.
_CACHE_FDS = 64


class _Reader(Protocol):
    """What the layer readers read from: a blob file, a gzip stream, or another reader."""

    def read(self, n: int, /) -> bytes: ...


class _Hashing:
    """A reader that hashes what passes through it and reports how many compressed bytes were used."""

    def __init__(self, inner: _Reader) -> None:
        self.inner = inner
        self.hash = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.inner.read(n)
        self.hash.update(data)
        return data


class _Missing(PullError):
    """A path an entry needs does not exist."""


class _Applier:
    """One layer onto one root; every write goes through a directory fd reached without symlinks."""

    def __init__(self, root_fd: int, what: str) -> None:
        self.root_fd = root_fd
        self.what = what
        self.added: set[tuple[str, ...]] = set()  #: paths this layer created (an opaque whiteout keeps them)
        self._fds: dict[tuple[str, ...], int] = {}  #: parent path -> open fd; cleared when a directory goes
        self.skipped_devices = 0

    def close(self) -> None:
        self._forget()

    def _forget(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _refuse(self, name: str, why: str) -> PullError:
        return PullError("BAD_IMAGE", f"{self.what}: entry {name!r} {why}; refused")

    def parts(self, name: str) -> tuple[str, ...]:
        parts = tuple(p for p in name.split("/") if p not in ("", "."))
        if ".." in parts:
            raise self._refuse(name, "escapes the root ('..')")
        if len(parts) > MAX_DEPTH:
            raise self._refuse(name[:200], f"is more than {MAX_DEPTH} directories deep")
        if any("\0" in p for p in parts):
            raise self._refuse(name, "has a NUL byte")
        return parts

    def directory(self, parts: tuple[str, ...], name: str, create: bool = True) -> int:
        """An fd of the directory at `parts`, walked from the root (or the nearest cached ancestor)
        one component at a time without following any symlink."""
        if not parts:
            return self.root_fd
        depth = len(parts)
        while depth and parts[:depth] not in self._fds:
            depth -= 1
        fd = self._fds[parts[:depth]] if depth else self.root_fd
        for i in range(depth, len(parts)):
            fd = self._child(fd, parts[:i + 1], name, create)
            self._fds[parts[:i + 1]] = fd
        return fd

    def _child(self, parent: int, parts: tuple[str, ...], name: str, create: bool) -> int:
        component = parts[-1]
        try:
            return os.open(component, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise _Missing("BAD_IMAGE", f"{self.what}: entry {name!r} refers to {'/'.join(parts)}, which does "
                                            "not exist; refused") from None
            os.mkdir(component, 0o755, dir_fd=parent)
            return os.open(component, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                kind = "a symlink" if stat.S_ISLNK(os.stat(component, dir_fd=parent, follow_symlinks=False).st_mode) \
                    else "not a directory"
                raise self._refuse(name, f"would be written through {'/'.join(parts)}, which is {kind}") from None
            raise

    def exists(self, parts: tuple[str, ...], name: str) -> bool:
        """Whether the directory at `parts` exists (a whiteout under a missing one has nothing to do);
        a path through a symlink is still refused."""
        try:
            self.directory(parts, name, create=False)
        except _Missing:
            return False
        return True

    def remove(self, dfd: int, base: str) -> None:
        """Remove whatever is at base in dfd (a directory with all it holds), never following a symlink."""
        try:
            st = os.stat(base, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(base, dir_fd=dfd)
            self._forget()  # a cached fd may have been inside it (dfd too is closed now)
        else:
            os.unlink(base, dir_fd=dfd)

    def cleared(self, parts: tuple[str, ...], name: str) -> int:
        """The parent's fd after removing whatever is at `parts` (fetched again: removing a directory
        forgets every cached fd)."""
        self.remove(self.directory(parts[:-1], name), parts[-1])
        return self.directory(parts[:-1], name)

    def entry(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        if len(self._fds) >= _CACHE_FDS:
            self._forget()
        parts = self.parts(member.name)
        if not parts:
            return  # the root itself
        base = parts[-1]
        if base == OPAQUE:
            self.opaque(parts[:-1], member.name)
            return
        if base.startswith(WHITEOUT):
            target = parts[:-1] + (base[len(WHITEOUT):],)
            if target[-1] in ("", ".", ".."):
                raise self._refuse(member.name, "is a whiteout of nothing")
            if target not in self.added and self.exists(parts[:-1], member.name):
                self.remove(self.directory(parts[:-1], member.name), target[-1])
            return
        if member.ischr() or member.isblk():
            self.skipped_devices += 1
            return
        dfd = self.directory(parts[:-1], member.name)
        mode = (member.mode & 0o7777 & ~(stat.S_ISUID | stat.S_ISGID))
        if member.isdir():
            try:
                st = os.stat(base, dir_fd=dfd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    dfd = self.cleared(parts, member.name)
                    raise FileNotFoundError
            except FileNotFoundError:
                os.mkdir(base, 0o700, dir_fd=dfd)
            fd = os.open(base, _DIR_FLAGS, dir_fd=dfd)
            try:
                os.fchmod(fd, mode | 0o700)
            finally:
                os.close(fd)
        elif member.isreg():
            dfd = self.cleared(parts, member.name)
            self.write_file(tar, member, dfd, base, mode)
        elif member.issym():
            if not member.linkname:
                raise self._refuse(member.name, "is a symlink to nothing")
            dfd = self.cleared(parts, member.name)
            os.symlink(member.linkname, base, dir_fd=dfd)
            os.utime(base, (member.mtime, member.mtime), dir_fd=dfd, follow_symlinks=False)
        elif member.islnk():
            target = self.parts(member.linkname)
            if not target:
                raise self._refuse(member.name, "is a hard link to the root")
            if target == parts:
                raise self._refuse(member.name, "is a hard link to itself")
            tfd = self.directory(target[:-1], member.name, create=False)
            try:
                tst = os.stat(target[-1], dir_fd=tfd, follow_symlinks=False)
            except FileNotFoundError:
                raise self._refuse(member.name, f"is a hard link to {member.linkname!r}, which does not exist") \
                    from None
            if stat.S_ISDIR(tst.st_mode):
                raise self._refuse(member.name, "is a hard link to a directory")
            self.cleared(parts, member.name)
            tfd = self.directory(target[:-1], member.name, create=False)
            dfd = self.directory(parts[:-1], member.name)
            os.link(target[-1], base, src_dir_fd=tfd, dst_dir_fd=dfd, follow_symlinks=False)
        elif member.isfifo():
            dfd = self.cleared(parts, member.name)
            os.mkfifo(base, mode, dir_fd=dfd)
        else:
            raise self._refuse(member.name, f"has tar type {member.type!r}, which an image layer may not hold")
        self.added.add(parts)

    def write_file(self, tar: tarfile.TarFile, member: tarfile.TarInfo, dfd: int, base: str, mode: int) -> None:
        fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            source = tar.extractfile(member)
            left = member.size
            while left > 0:
                chunk = source.read(min(CHUNK, left)) if source else b""
                if not chunk:
                    raise PullError("BAD_IMAGE", f"{self.what}: entry {member.name!r} is cut short")
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
                left -= len(chunk)
            os.fchmod(fd, mode)
            # Kept as in the image: Python's .pyc files, for one, are valid only for their source's mtime.
            os.utime(fd, (member.mtime, member.mtime))
        finally:
            os.close(fd)

    def opaque(self, parts: tuple[str, ...], name: str) -> None:
        dfd = self.directory(parts, name)
        for child in os.listdir(dfd):
            if parts + (child,) not in self.added:
                self.remove(self.directory(parts, name), child)


def apply_layer(root: Path, blob: Path, diff_id: str, what: str,
                on_bytes: Callable[[int], None] | None = None) -> None:
    """Apply the layer in `blob` to the directory `root` (see the module's rules); `on_bytes` hears
    how many bytes of the blob were read."""
    try:
        raw = open(blob, "rb")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise PullError("BAD_IMAGE", f"{what}: cannot read its blob: {exc}") from None
    applier = None
    root_fd = os.open(root, _DIR_FLAGS)
    try:
        magic = raw.read(4)
        raw.seek(0)
        if magic[:2] == b"\x1f\x8b":
            # typeshed asks the fileobj for seek too; gzip seeks it only to rewind, which no read here asks.
            stream: _Reader = gzip.GzipFile(fileobj=_Counting(raw, on_bytes), mode="rb")  # type: ignore[call-overload]
        elif magic == b"\x28\xb5\x2f\xfd":
            raise PullError("BAD_IMAGE", f"{what} is zstd-compressed, which this node cannot unpack (no zstd "
                                         "library); push the image with gzip layers")
        else:
            stream = _Counting(raw, on_bytes)
        hashing = _Hashing(stream)
        applier = _Applier(root_fd, what)
        try:
            # A stream ("r|") is only read; typeshed's fileobj protocol also asks write, tell, seek, close.
            with tarfile.open(fileobj=hashing, mode="r|") as tar:  # type: ignore[call-overload]
                for member in tar:
                    applier.entry(tar, member)
            while hashing.read(CHUNK):
                pass  # the end-of-archive padding counts in the diff id
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise PullError("BAD_IMAGE", f"{what} is not a readable tar layer: {exc}") from None
        got = "sha256:" + hashing.hash.hexdigest()
        if got != diff_id:
            raise PullError("DIGEST_MISMATCH", f"{what} unpacks to {got}, not its diff id {diff_id}; refused")
        if applier.skipped_devices:
            log.info("image layer devices skipped layer=%s count=%d", what, applier.skipped_devices)
    except OSError as exc:
        if exc.errno in FULL_ERRNOS:
            raise disk_error(exc, f"unpacking {what}") from None
        raise PullError("BAD_IMAGE", f"{what}: {exc}") from None
    finally:
        if applier is not None:
            applier.close()
        os.close(root_fd)
        raw.close()


class _Counting:
    """A reader that tells `on_bytes` how much it read."""

    def __init__(self, inner: _Reader, on_bytes: Callable[[int], None] | None) -> None:
        self.inner = inner
        self.on_bytes = on_bytes

    def read(self, n: int = -1) -> bytes:
        data = self.inner.read(n)
        if self.on_bytes and data:
            self.on_bytes(len(data))
        return data


def disk_usage(path: Path) -> int:
    """Bytes the tree at path takes on disk (each inode once; symlinks not followed)."""
    seen: set[int] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_blocks * 512
    return total
