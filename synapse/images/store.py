"""The node's image store: `ensure` makes an image ready (pulled, verified, unpacked) and pins it for
a task; `release` unpins; unpinned images are evicted least recently used first when the store is
over its budget.

On disk, under `root` (`images/` in the worker's data directory):
- `blobs/sha256/<hex>`: configs and layers, each verified against its digest and size as it was
  written (blobs.py), shared by the images that use them;
- `images/<hex>/rootfs`: one unpacked root per image manifest digest, shared read-only by every task
  of that image on the node; it appears there by a rename only once complete;
- `state.json`: which references name which digest, each image's config, size, last use and
  holders (pins), written atomically on every change, so a new ImageStore on the same root (a worker
  restart) finds the same images and pins and re-adopted tasks keep their root;
- `tmp/`: downloads and unpacks in progress, emptied when a store opens.

One process owns a root at a time (the worker). Inside it, `ensure` is single-flight per reference
and per image digest: concurrent callers of one image wait for the one pull and share its result.
A cached tag is used as it is, without asking the registry again (Kubernetes' IfNotPresent): a job
that must follow a moving tag names a digest instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypedDict

from synapse.core.jobs import imageref
from synapse.core.jobs.imageref import ImageRef
from synapse.images import manifest as mf
from synapse.images.blobs import BlobStore, disk_error
from synapse.images.model import CachedImage, Image, ImageConfig, PullError, PullProgress
from synapse.images.registry import RegistryClient, load_credentials
from synapse.images.sources import LayoutSource, RegistrySource
from synapse.images.unpack import apply_layer, disk_usage

log = logging.getLogger(__name__)

__all__ = ["CachedImage", "Image", "ImageConfig", "ImageStore", "PullError", "PullProgress"]

STATE_VERSION = 1
#: Layers downloaded at once per pull.
PARALLEL_LAYERS = 4
#: How deep an index may nest before the manifest.
MAX_INDEX_DEPTH = 3
#: Progress is reported at most once per this many bytes (and at each phase change).
PROGRESS_STEP = 1 << 20


class ImageStore:
    """Images on this node under `root`; see the module docstring. Thread-safe. A malformed
    credentials file raises ValueError here, so the worker refuses to start with it."""

    def __init__(self, root: Path, *, budget_bytes: int | None = None, credentials: Path | None = None,
                 insecure_registries: Iterable[str] = (), timeout: float = 60.0, retries: int = 3,
                 ca_file: Path | None = None) -> None:
        self.root = Path(root)
        self.budget_bytes = budget_bytes
        self.timeout = timeout
        self.retries = retries
        self.ca_file = ca_file
        self.insecure = tuple(insecure_registries)
        self.credentials = load_credentials(credentials)
        self.tmp = self.root / "tmp"
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        (self.root / "images").mkdir(exist_ok=True)
        self.blobs = BlobStore(self.root / "blobs", self.tmp)
        self._lock = threading.Lock()  #: guards everything below and state.json
        self._images: dict[str, _Entry] = {}  #: digest -> its record (state.json's "images")
        self._tags: dict[str, str] = {}  #: canonical reference -> digest
        self._flights: dict[str, threading.Lock] = {}  #: reference or digest -> the lock of its one pull
        self._busy_blobs: dict[str, int] = {}  #: blob digest -> pulls using it now (eviction spares them)
        self._clients: dict[str, RegistryClient] = {}  #: registry -> its client (tokens are cached there)
        self._serial = 0
        self._load()
        self._evict()  # a worker restarted with a smaller budget trims at once

    # -- the API --------------------------------------------------------------------------------------

    def ensure(self, reference: str, *, holder: str = "", progress: Callable[[PullProgress], None] | None = None,
               deadline: float | None = None) -> Image:
        """The image, ready on this node; pulls it if it is not here. Blocks; `deadline` is a
        time.monotonic() instant bounding the wait and the pull. Pins it for `holder` when given (an
        image ensured without a holder may be evicted once another pull needs the room). Raises
        PullError. `progress` is called from the pulling threads."""
        ref = _parse(reference)
        if ref.transport == "dir":
            return _dir_image(ref)
        canonical = str(ref)
        flight = self._flight(canonical)
        if not flight.acquire(timeout=-1 if deadline is None else max(0.0, deadline - time.monotonic())):
            raise PullError("TIMEOUT", f"{canonical}: the deadline passed while another pull of it ran")
        try:
            image = self._cached_image(ref, canonical, holder)
            if image is None:
                image = self._pull(ref, canonical, holder, progress, deadline)
        finally:
            flight.release()
        if progress:
            progress(PullProgress(canonical, 0, 0, "done"))
        self._evict(keep=image.digest)
        return image

    def release(self, holder: str) -> None:
        """Unpin every image `holder` pinned; they may then be evicted when the store is over budget."""
        with self._lock:
            changed = False
            for entry in self._images.values():
                if holder in entry["holders"]:
                    entry["holders"].remove(holder)
                    changed = True
            if changed:
                self._save(durable=False)
        self._evict()

    def has(self, reference: str) -> bool:
        """Whether the image is here, unpacked (cheap: no registry is asked)."""
        try:
            ref = imageref.parse(reference)
        except imageref.ImageRefError:
            return False
        if ref.transport == "dir":
            return Path(ref.path).is_dir()
        with self._lock:
            return self._known_digest(ref, str(ref)) is not None

    def cached(self) -> list[CachedImage]:
        """Every image in the store, least recently used first."""
        with self._lock:
            counts: dict[str, int] = {}
            for entry in self._images.values():
                for blob in set(entry["blobs"]):
                    counts[blob] = counts.get(blob, 0) + 1
            out = [CachedImage(tuple(e["references"]), digest,
                               e["rootfs_bytes"] + sum(self.blobs.size(b) for b in set(e["blobs"]) if counts[b] == 1),
                               e["last_used"], tuple(e["holders"]))
                   for digest, e in self._images.items()]
        return sorted(out, key=lambda c: c.last_used)

    def usage_bytes(self) -> int:
        """What the store's images and blobs take on disk now."""
        with self._lock:
            return self._usage_locked()

    # -- finding what is here ---------------------------------------------------------------------------

    def _known_digest(self, ref: ImageRef, canonical: str) -> str | None:
        digest = self._tags.get(canonical)
        if digest is None and ref.digest and ref.digest in self._images:
            digest = ref.digest  # the same content, whichever repository named it
        return digest if digest in self._images else None

    def _cached_image(self, ref: ImageRef, canonical: str, holder: str) -> Image | None:
        with self._lock:
            digest = self._known_digest(ref, canonical)
            if digest is None:
                return None
            return self._adopt_locked(digest, canonical, holder, durable=False)

    def _adopt_locked(self, digest: str, canonical: str, holder: str, durable: bool = True) -> Image:
        entry = self._images[digest]
        entry["last_used"] = time.time()
        if canonical not in entry["references"]:
            entry["references"].append(canonical)
        self._tags[canonical] = digest
        if holder and holder not in entry["holders"]:
            entry["holders"].append(holder)
        self._save(durable)
        return Image(canonical, digest, self._rootfs(digest), ImageConfig(**_config_fields(entry["config"])))

    def _rootfs(self, digest: str) -> Path:
        return self.root / "images" / digest.removeprefix("sha256:") / "rootfs"

    def _flight(self, key: str) -> threading.Lock:
        with self._lock:
            return self._flights.setdefault(key, threading.Lock())

    # -- pulling ----------------------------------------------------------------------------------------

    def _source(self, ref: ImageRef) -> RegistrySource | LayoutSource:
        if ref.transport == "docker":
            with self._lock:
                client = self._clients.get(ref.registry)
                if client is None:
                    client = self._clients[ref.registry] = RegistryClient(
                        ref.registry, credentials=self.credentials, insecure=self.insecure, timeout=self.timeout,
                        retries=self.retries, ca_file=self.ca_file)
            return RegistrySource(ref, client)
        return LayoutSource(ref)

    def _pull(self, ref: ImageRef, canonical: str, holder: str, progress: Callable[[PullProgress], None] | None,
              deadline: float | None) -> Image:
        started = time.monotonic()
        report = _Reporter(canonical, progress)
        report.phase("manifest")
        source = self._source(ref)
        try:
            digest, manifest = _resolve(source, canonical, deadline)
            with self._flight(digest):
                with self._lock:
                    if digest in self._images:
                        return self._adopt_locked(digest, canonical, holder)
                self._evict(need=2 * sum(layer.size for layer in manifest.layers))
                config, layer_blobs = self._fetch_and_unpack(source, canonical, digest, manifest, report, deadline)
                rootfs_bytes = disk_usage(self._rootfs(digest))
                with self._lock:
                    self._images[digest] = {"references": [], "blobs": [manifest.config.digest, *layer_blobs],
                                            "rootfs_bytes": rootfs_bytes, "last_used": 0.0,
                                            "holders": [], "config": asdict(config)}
                    image = self._adopt_locked(digest, canonical, holder)
        finally:
            if isinstance(source, LayoutSource):
                source.close()
        log.info("image pulled reference=%s digest=%s layers=%d bytes=%d seconds=%.2f", canonical, digest,
                 len(manifest.layers), report.total, time.monotonic() - started)
        return image

    def _fetch_and_unpack(self, source: _Source, canonical: str, digest: str, manifest: mf.Manifest, report: _Reporter,
                          deadline: float | None) -> tuple[ImageConfig, list[str]]:
        """Download the config and the layers (in parallel) and apply the layers in order as each
        arrives, into a temporary root renamed into place only when whole."""
        layer_digests = [layer.digest for layer in manifest.layers]
        used = [manifest.config.digest, *layer_digests]
        with self._lock:
            for blob in used:
                self._busy_blobs[blob] = self._busy_blobs.get(blob, 0) + 1
            self._serial += 1
            work = self.tmp / f"unpack-{digest.removeprefix('sha256:')[:16]}-{self._serial}"
        report.total = sum(layer.size for layer in manifest.layers)
        abort = threading.Event()

        def fetch(desc: mf.Descriptor, counted: bool) -> Path:
            def on_bytes(n: int) -> None:
                if abort.is_set():
                    raise _Abandoned  # another layer failed: stop this one, without retrying it
                if counted:
                    report.add("layers", n)
            return self.blobs.put(desc, lambda writer: source.copy_blob(desc, writer, deadline), on_bytes)

        pool = ThreadPoolExecutor(max_workers=PARALLEL_LAYERS, thread_name_prefix="image-pull")
        try:
            config_path = fetch(manifest.config, counted=False)
            config, diff_ids = mf.parse_config(config_path.read_bytes(), len(manifest.layers), f"{canonical} config")
            futures = [pool.submit(fetch, layer, True) for layer in manifest.layers]
            rootfs = work / "rootfs"
            try:
                rootfs.mkdir(parents=True)
            except OSError as exc:
                raise disk_error(exc, "creating the image's root") from None
            for i, future in enumerate(futures):
                blob = future.result()
                apply_layer(rootfs, blob, diff_ids[i], f"{canonical} layer {i} ({layer_digests[i]})",
                            on_bytes=lambda n: report.add("unpack", n))
            final = self._rootfs(digest).parent
            if final.is_dir():
                # Only a complete unpack of this digest is ever renamed there: one kept from an
                # unreadable state file. It is the same tree; keep it (tasks may be using it).
                shutil.rmtree(work, ignore_errors=True)
            else:
                os.replace(work, final)
            return config, layer_digests
        except BaseException:
            abort.set()
            pool.shutdown(wait=True, cancel_futures=True)
            shutil.rmtree(work, ignore_errors=True)
            raise
        finally:
            pool.shutdown(wait=True)
            with self._lock:
                for blob in used:
                    self._busy_blobs[blob] -= 1
                    if not self._busy_blobs[blob]:
                        del self._busy_blobs[blob]

    # -- eviction -----------------------------------------------------------------------------------------

    def _usage_locked(self) -> int:
        """The images' roots and every blob file, orphans of failed pulls included."""
        return sum(e["rootfs_bytes"] for e in self._images.values()) + self.blobs.total_bytes()

    def _unused_blobs_locked(self) -> set[str]:
        """Blobs no image uses and no pull is using (left by failed pulls, or by evicted images)."""
        used = {b for e in self._images.values() for b in e["blobs"]} | set(self._busy_blobs)
        return self.blobs.digests() - used

    def _evict(self, keep: str = "", need: int = 0) -> None:
        """Remove unpinned images, least recently used first, until the store is within its budget
        (less `need`, room for a pull about to start). Pinned images and `keep` stay even over budget."""
        if self.budget_bytes is None:
            return
        doomed: list[Path] = []
        with self._lock:
            usage = self._usage_locked()
            if usage + need > self.budget_bytes:
                for blob in self._unused_blobs_locked():  # first what no image needs
                    self.blobs.remove(blob)
                usage = self._usage_locked()
            for digest in sorted(self._images, key=lambda d: self._images[d]["last_used"]):
                if usage + need <= self.budget_bytes:
                    break
                entry = self._images[digest]
                if entry["holders"] or digest == keep:
                    continue
                del self._images[digest]
                for ref in entry["references"]:
                    if self._tags.get(ref) == digest:
                        del self._tags[ref]
                for blob in self._unused_blobs_locked():
                    self.blobs.remove(blob)
                self._serial += 1
                gone = self.tmp / f"evicted-{self._serial}"
                os.replace(self._rootfs(digest).parent, gone)
                doomed.append(gone)
                usage = self._usage_locked()
                log.info("image evicted digest=%s references=%s", digest, ",".join(entry["references"]))
            if doomed:
                self._save()
        for path in doomed:
            shutil.rmtree(path, ignore_errors=True)

    # -- state.json ---------------------------------------------------------------------------------------

    def _save(self, durable: bool = True) -> None:
        """Write the state atomically (caller holds the lock). `durable=False` skips the fsync: for
        what only pins and use times change (a cached image's start, a release), which a power loss
        may take back at no cost (the tasks died with the machine; the worker unpins what it no
        longer knows), while an fsync on every cached start cost ~8 ms of its start time."""
        doc = {"version": STATE_VERSION, "images": self._images, "tags": self._tags}
        tmp = self.root / "state.json.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, self.root / "state.json")
        except OSError as exc:
            raise disk_error(exc, "saving the image store's state") from None

    def _load(self) -> None:
        """Adopt the images a previous store left (those whose root is there); drop the rest."""
        path = self.root / "state.json"
        trusted = True  #: whether images the state does not list may be removed
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            doc = {}
        except (OSError, ValueError) as exc:
            # Roots it listed may be in use by tasks still running: keep every one (unlisted, so
            # no longer counted) and the file for a person to look at.
            log.warning("image store state unreadable path=%s error=%s; starting empty, keeping images/", path, exc)
            os.replace(path, path.with_suffix(".unreadable"))
            doc, trusted = {}, False
        if doc and doc.get("version") != STATE_VERSION:
            log.warning("image store state version=%s unknown; starting empty", doc.get("version"))
            doc = {}
        images = doc.get("images", {}) if isinstance(doc.get("images"), dict) else {}
        self._images = {d: e for d, e in images.items() if self._rootfs(d).is_dir()}
        self._tags = {r: d for r, d in (doc.get("tags") or {}).items() if d in self._images}
        known = {d.removeprefix("sha256:") for d in self._images}
        for stray in (self.root / "images").iterdir() if trusted else ():
            if stray.name not in known:  # unpacked but never recorded (a crash between rename and save)
                shutil.rmtree(stray, ignore_errors=True)
        with self._lock:
            self._save()


class _Entry(TypedDict):
    """An image's record in state.json."""

    references: list[str]  #: the canonical references that name it
    blobs: list[str]  #: its config's and layers' blob digests
    rootfs_bytes: int  #: its unpacked root's size on disk
    last_used: float  #: wall-clock time of its last use (eviction takes the oldest first)
    holders: list[str]  #: who pins it now (a pinned image is never evicted)
    config: dict[str, Any]  #: its ImageConfig's fields


_Source = RegistrySource | LayoutSource


class _Abandoned(Exception):
    """Stops a layer download whose pull has already failed (never seen by a caller)."""


class _Reporter:
    """Progress for one pull, from the threads that download and the one that unpacks."""

    def __init__(self, reference: str, callback: Callable[[PullProgress], None] | None) -> None:
        self.reference = reference
        self.callback = callback
        self.total = 0  #: the layers' compressed bytes
        self._done: dict[str, int] = {}  #: phase -> bytes so far ("layers": downloaded, "unpack": applied)
        self._last: dict[str, int] = {}
        self._lock = threading.Lock()

    def phase(self, phase: str) -> None:
        if self.callback:
            self.callback(PullProgress(self.reference, 0, self.total, phase))

    def add(self, phase: str, n: int) -> None:
        if not self.callback:
            return
        with self._lock:
            done = self._done[phase] = self._done.get(phase, 0) + n
            if done - self._last.get(phase, -PROGRESS_STEP) < PROGRESS_STEP and done != self.total:
                return
            self._last[phase] = done
            update = PullProgress(self.reference, done, self.total, phase)
        self.callback(update)


def _parse(reference: str) -> ImageRef:
    try:
        return imageref.parse(reference)
    except imageref.ImageRefError as exc:
        raise PullError("BAD_REFERENCE", str(exc)) from None


def _dir_image(ref: ImageRef) -> Image:
    """A dir: image: the directory itself, refused when it is (or resolves to) the node's own root."""
    path = Path(ref.path)
    resolved = Path(os.path.realpath(path))
    if resolved == Path("/"):
        raise PullError("BAD_IMAGE", f"{ref} resolves to /, the node's own root; refused")
    if not path.exists():
        raise PullError("NOT_FOUND", f"{ref}: no such directory")
    if not resolved.is_dir():
        raise PullError("BAD_IMAGE", f"{ref} is not a directory")
    return Image(str(ref), "", resolved, ImageConfig())


def _resolve(source: _Source, canonical: str, deadline: float | None) -> tuple[str, mf.Manifest]:
    """Follow the top document through any index to this platform's manifest; every document's
    bytes are checked against the digest that named it."""
    data, media_type, want = source.top(deadline)
    for _ in range(MAX_INDEX_DEPTH + 1):
        got = "sha256:" + hashlib.sha256(data).hexdigest()
        if want and got != want:
            raise PullError("DIGEST_MISMATCH", f"{canonical}: a manifest named {want} has digest {got}; refused")
        doc = mf.load_json(data, f"{canonical} manifest")
        kind = mf.media_type_of(doc, media_type)
        if kind in mf.MANIFEST_TYPES:
            return got, mf.parse_manifest(doc, f"{canonical} manifest")
        if kind not in mf.INDEX_TYPES:
            raise PullError("BAD_IMAGE", f"{canonical}: media type {kind!r} is neither an image manifest nor an index")
        desc = mf.pick_platform(doc, f"{canonical} index")
        data, media_type = source.document(desc, deadline)
        if len(data) != desc.size:
            raise PullError("DIGEST_MISMATCH", f"{canonical}: manifest {desc.digest} is {len(data)} bytes, not "
                                               f"{desc.size}; refused")
        want = desc.digest
    raise PullError("BAD_IMAGE", f"{canonical}: indexes nest deeper than {MAX_INDEX_DEPTH}")


def _config_fields(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in doc.items()}
