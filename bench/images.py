"""Image pulls: a cold pull + unpack by the node's image store against Debian's skopeo + umoci doing
the same, and concurrent `ensure` calls of one uncached image.

    python bench/images.py            # a ~1 GiB image (several layers, many small files, a few large)
    python bench/images.py --quick    # ~20 MB, for CI
    python bench/images.py --size-mb 200
    python bench/images.py --json     # {"image_bytes", "blob_bytes", "store_s", "store_mb_s",
                                      #  "skopeo_umoci_s", "skopeo_umoci_mb_s", "ratio", "concurrent_callers",
                                      #  "concurrent_blob_gets_max"}

(a) The image is generated on disk (half-random file contents, so gzip halves it as it does real
images), pushed to Debian's docker-registry on a loopback port, and pulled cold: `ImageStore.ensure`
(download in parallel, verify, unpack) against `skopeo copy docker://… oci:…` followed by
`umoci unpack --rootless` of the same image, in the same run. MB/s counts the unpacked image's bytes.
(b) 8 threads call `ensure` on one uncached image at once; the registry's own log counts the GETs of
each blob: 1 means one pull served every caller.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse.images.store import ImageStore  # noqa: E402
from tests.images_support import (  # noqa: E402
    LAYER_GZIP,
    OCI_CONFIG,
    OCI_MANIFEST,
    E,
    Registry,
    make_image,
    make_layer,
    registry_available,
)

MB = 1 << 20


class _Hashing:
    """A file wrapper that hashes what is written through it (the layer's diff id)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.hash = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        return self.inner.write(data)

    def flush(self) -> None:
        self.inner.flush()


def write_layer(path: Path, files: list[tuple[str, int]], seed: int) -> tuple[str, int]:
    """A gzip layer of the given (name, size) files at path; returns (diff id, unpacked bytes)."""
    pool = os.urandom(8 * MB)
    total = 0
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) as gz:
        hashing = _Hashing(gz)
        with tarfile.open(fileobj=hashing, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            dirs = sorted({str(Path(name).parent) for name, _ in files} - {"."})
            for d in dirs:
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            for i, (name, size) in enumerate(files):
                info = tarfile.TarInfo(name)
                info.size, info.mode = size, 0o644
                tar.addfile(info, _Content(pool, size, seed * 1_000_003 + i))
                total += size
    return "sha256:" + hashing.hash.hexdigest(), total


class _Content:
    """`size` bytes, half drawn from a random pool, half zeros: gzip about halves it."""

    def __init__(self, pool: bytes, size: int, seed: int) -> None:
        self.pool, self.left, self.offset = pool, size, (seed * 7919) % (len(pool) - 65536)

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        out = bytearray()
        while len(out) < n:
            k = min(n - len(out), 65536)
            half = k // 2
            out += self.pool[self.offset:self.offset + half] + b"\0" * (k - half)
            self.offset = (self.offset + half + 4099) % (len(self.pool) - 65536)
        self.left -= n
        return bytes(out)


def generate(workdir: Path, total: int) -> tuple[list[tuple[Path, str]], int]:
    """Layers of ~total bytes: three of many small files (4-64 KiB) and one with a few large files."""
    small_share = total // 2
    layers = []
    unpacked = 0
    for n in range(3):
        files, size, i = [], 0, 0
        while size < small_share // 3:
            s = 4096 * (1 + (i * 37 + n) % 16)
            files.append((f"usr/lib/pkg{n}/d{i // 200}/f{i}.py", s))
            size += s
            i += 1
        diff_id, got = write_layer(workdir / f"layer{n}.tar.gz", files, n)
        layers.append((workdir / f"layer{n}.tar.gz", diff_id))
        unpacked += got
    big = total - unpacked
    files = [(f"opt/model/shard{k}.bin", big // 4) for k in range(4)]
    diff_id, got = write_layer(workdir / "layer3.tar.gz", files, 9)
    layers.append((workdir / "layer3.tar.gz", diff_id))
    return layers, unpacked + got


def push_files(registry: Registry, repository: str, tag: str, layers: list[tuple[Path, str]]) -> None:
    """Push layers from files (streamed, never whole in memory), a config and a manifest."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/usr/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": [d for _, d in layers]}}).encode()
    descriptors = []
    for path, _ in layers:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(MB), b""):
                h.update(chunk)
        digest = "sha256:" + h.hexdigest()
        resp = registry._call("POST", f"/v2/{repository}/blobs/uploads/", repository)
        location = urllib.request.urljoin(f"http://{registry.host}/", resp.headers["Location"])
        with open(path, "rb") as f:
            req = urllib.request.Request(f"{location}&digest={digest}", data=f, method="PUT",
                                         headers={"Content-Type": "application/octet-stream",
                                                  "Content-Length": str(path.stat().st_size)})
            urllib.request.urlopen(req, timeout=600)
        descriptors.append({"mediaType": LAYER_GZIP, "digest": digest, "size": path.stat().st_size})
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    resp = registry._call("POST", f"/v2/{repository}/blobs/uploads/", repository)
    location = urllib.request.urljoin(f"http://{registry.host}/", resp.headers["Location"])
    registry._call("PUT", f"{location}&digest={config_digest}", repository, config,
                   {"Content-Type": "application/octet-stream"})
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": len(config)},
                           "layers": descriptors}).encode()
    registry._call("PUT", f"/v2/{repository}/manifests/{tag}", repository, manifest, {"Content-Type": OCI_MANIFEST})


def run(total: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp_name:
        tmp = Path(tmp_name)
        gen = tmp / "gen"
        gen.mkdir()
        layers, unpacked = generate(gen, total)
        blob_bytes = sum(p.stat().st_size for p, _ in layers)
        with Registry(tmp / "registry") as registry:
            push_files(registry, "bench/big", "1", layers)
            shutil.rmtree(gen)
            ref = f"{registry.host}/bench/big:1"

            started = time.monotonic()
            image = ImageStore(tmp / "store").ensure(ref)
            store_s = time.monotonic() - started
            assert (image.root / "opt" / "model" / "shard0.bin").is_file()
            shutil.rmtree(tmp / "store")

            started = time.monotonic()
            subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{ref}",
                            f"oci:{tmp}/skopeo:1"], check=True)
            subprocess.run(["umoci", "unpack", "--rootless", "--image", f"{tmp}/skopeo:1", str(tmp / "bundle")],
                           check=True, capture_output=True)
            tools_s = time.monotonic() - started
            shutil.rmtree(tmp / "skopeo")
            shutil.rmtree(tmp / "bundle")

            small = make_image([make_layer([E(f"f{i}", data=os.urandom(256 << 10))]) for i in range(4)])
            registry.push("bench/once", "1", small)
            store = ImageStore(tmp / "concurrent")
            barrier = threading.Barrier(8)
            errors: list[Exception] = []

            def ensure() -> None:
                barrier.wait()
                try:
                    store.ensure(f"{registry.host}/bench/once:1")
                except Exception as exc:  # noqa: BLE001 (reported)
                    errors.append(exc)

            threads = [threading.Thread(target=ensure) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                raise errors[0]
            gets = registry.requests("GET", "/v2/bench/once/blobs/")
            per_blob = {d: gets.count(f"/v2/bench/once/blobs/{d}") for d in small.blobs}
    return {"image_bytes": unpacked, "blob_bytes": blob_bytes, "store_s": round(store_s, 2),
            "store_mb_s": round(unpacked / MB / store_s, 1), "skopeo_umoci_s": round(tools_s, 2),
            "skopeo_umoci_mb_s": round(unpacked / MB / tools_s, 1), "ratio": round(tools_s / store_s, 2),
            "concurrent_callers": 8, "concurrent_blob_gets_max": max(per_blob.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a ~20 MB image (CI)")
    parser.add_argument("--size-mb", type=int, default=1024, help="the image's unpacked size (default 1024)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    missing = registry_available() or ("" if shutil.which("skopeo") and shutil.which("umoci")
                                       else "skopeo or umoci is not installed")
    if missing:
        print(f"bench/images: skipped: {missing} (scripts/install-test-packages.sh)")
        return
    result = run(20 * MB if args.quick else args.size_mb * MB)
    if args.json:
        print(json.dumps(result))
        return
    print(f"image: {result['image_bytes'] / MB:.0f} MB unpacked, {result['blob_bytes'] / MB:.0f} MB of gzip layers")
    print(f"cold pull + unpack, image store:  {result['store_s']:7.2f} s  {result['store_mb_s']:7.1f} MB/s")
    print(f"skopeo copy + umoci unpack:       {result['skopeo_umoci_s']:7.2f} s  "
          f"{result['skopeo_umoci_mb_s']:7.1f} MB/s")
    print(f"ratio (skopeo+umoci time / store time): {result['ratio']:.2f}")
    print(f"{result['concurrent_callers']} concurrent ensure of one uncached image: each blob fetched "
          f"{result['concurrent_blob_gets_max']} time(s) at most")


if __name__ == "__main__":
    main()
