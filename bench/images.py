"""Images: a cold pull + unpack by the node's image store against Debian's skopeo + umoci doing
the same; concurrent `ensure` calls of one uncached image; a task's start in a cached image against
a plain process; and the start spread of a gang in an image from a cold cache.

    python bench/images.py                  # all four; a ~1 GiB image, 20 + 20 starts, 16-task gang x 5
    python bench/images.py --quick          # ~20 MB, 3 + 3 starts, a 4-task gang x 2 (for CI)
    python bench/images.py --size-mb 200
    python bench/images.py --only start,gang --trials 40 --gang-tasks 16 --gang-trials 10
    python bench/images.py --json           # {"image_bytes", "blob_bytes", "store_s", "store_mb_s",
                                            #  "skopeo_umoci_s", "skopeo_umoci_mb_s", "ratio", "concurrent_callers",
                                            #  "concurrent_blob_gets_max", "start": {...}, "gang": {...}}

(a) The image is generated on disk (half-random file contents, so gzip halves it as it does real
images), pushed to Debian's docker-registry on a loopback port, and pulled cold: `ImageStore.ensure`
(download in parallel, verify, unpack) against `skopeo copy docker://… oci:…` followed by
`umoci unpack --rootless` of the same image, in the same run. MB/s counts the unpacked image's bytes.
(b) 8 threads call `ensure` on one uncached image at once; the registry's own log counts the GETs of
each blob: 1 means one pull served every caller.

(c) and (d) run on a real local cluster: 3 masters (TLS, fsync'd Raft log, as `synapse-local up`)
and G workers (the gang's size), each offering 1 fake GPU (a plain file as /dev/nvidia0, as the
tests do: the sandbox binds it) and pulling from the loopback registry. The built-in sandbox runs
every task in an image (namespaces, overlay, minimal /dev, pivot). The command of every task, plain
or in the image, is the same static busybox, `busybox adjtimex`, which reads the clock with its
first system call and prints it (microseconds) to the task's log: that is the moment the command
runs. Every clock read is this machine's.

(c) Task start with the image cached, against a plain process in the same run: 1-task jobs
(cpu 1, gpu 1), one at a time, alternately a plain job (`/bin/busybox adjtimex` on the host) and
the same command in a busybox image from the registry, which a warm-up gang put in every worker's
store first (so no trial pulls). Start = from the leader's CommitPlan (the `at` it stamped on the
job's Scheduled event) to the command's first instruction. That spans what both kinds share
(commit, the listing to the worker, the worker's start, the shim) and what only the image has:
the store's look-up (on a pull thread), the container's plan and the sandbox. (A job of one task
is not held for TaskPrepared: synapse.master.dispatch.held.) Printed: p50 and p90 of each, and
the difference of the p50s; then where each kind's time goes (p50s): CommitPlan -> the worker
starting the shim (its task journal), and shim -> command. Target (issue 34): at most 50 ms more
than plain at p50.

(d) A G-task gang (default 16, 1 GPU each, so one task on each worker) in an image no worker holds
(each trial pushes a new one: a file with a nonce makes its digest new): each worker pulls, reports
TaskPrepared, and the leader's ImageReady event (the last node's TaskPrepared committed) releases
the gang. Spread = the last task's first instruction minus the first one's; all of them come after
ImageReady (checked). Printed: spread p50 and max over the trials, ImageReady -> first and last
start, and the spread of the workers' starts (their task journals: for a gang, each gate's
opening, the sandboxes being set up before the release) beside it, which tells the dispatch's
share. Target (issue 34): spread at most 100 ms.

On one machine G workers and their sandboxes share its cores, so (d) measures contention a
cluster of G machines does not have: read it as an upper bound.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from support.measure import percentile  # noqa: E402

from synapse.client.master_client import MasterClient  # noqa: E402
from synapse.common.tls import issue_worker  # noqa: E402
from synapse.core import codec  # noqa: E402
from synapse.core.model import JobSpec, Resources  # noqa: E402
from synapse.images.store import ImageStore  # noqa: E402
from synapse.local import cluster as local  # noqa: E402
from synapse.worker import container  # noqa: E402
from synapse.worker.fence import TASK_JOURNAL  # noqa: E402
from tests.support.helpers import wait_for  # noqa: E402
from tests.support.images import (  # noqa: E402
    BUSYBOX,
    LAYER_GZIP,
    OCI_CONFIG,
    OCI_MANIFEST,
    E,
    Registry,
    busybox_image,
    make_image,
    make_layer,
    registry_available,
)

MB = 1 << 20
#: Every task's command, plain or in the image: the static busybox reads the clock with its first
#: system call and prints it ("time.tv_sec: S" and "time.tv_usec: U" lines) to the task's log.
PROBE = (str(BUSYBOX), "adjtimex")
#: What every task asks for: one of its worker's one (fake) GPU, so a gang of G runs on G workers.
TASK_RESOURCES = Resources(1000, 1 << 30, 1)
#: The start targets of issue 34 (seconds).
START_TARGET_S = 0.050
SPREAD_TARGET_S = 0.100


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


def run_pulls(total: int) -> dict:
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


class BenchCluster:
    """3 masters and `workers` workers (1 fake GPU each, the registry allowed in plain HTTP) on
    this machine, in `data_dir`; a context manager that stops all of them."""

    def __init__(self, data_dir: Path, workers: int, registry: str) -> None:
        self.data_dir, self.workers, self.registry = data_dir, workers, registry
        self.client: MasterClient | None = None
        self.state: dict | None = None
        self.dev_root: str | None = None  #: the caller's DEV_ROOT_HOOK, put back on exit

    def __enter__(self) -> BenchCluster:
        fake_dev = self.data_dir.parent / "fake-dev"
        fake_dev.mkdir(parents=True, exist_ok=True)
        for name in ("nvidia0", "nvidiactl", "nvidia-uvm"):
            (fake_dev / name).write_text("")
        self.dev_root = os.environ.get(container.DEV_ROOT_HOOK)
        os.environ[container.DEV_ROOT_HOOK] = str(fake_dev)  # the workers inherit it
        try:
            self.state = local.up(self.data_dir, 3, 0, 1, 1, local.free_base_port(3), heartbeat=0.5)
            addresses = [m["api_address"] for m in self.state["masters"]]
            self.client = MasterClient(addresses, self.state["token"], deadline=30, tls=local.client_tls(self.state))
            join = self.data_dir / "secrets" / local.JOIN_TOKEN_FILE
            ids = [f"w{i + 1}" for i in range(self.workers)]
            for worker_id in ids:
                issue_worker(self.data_dir / "tls", worker_id)
                argv = local.worker_argv(self.data_dir, ",".join(addresses), join, worker_id, "rack0", 1, 0.5)
                pid = local._spawn(argv + ["--insecure-registry", self.registry],
                                   self.data_dir / "logs" / f"{worker_id}.log")
                self.state["workers"].append({"id": worker_id, "pid": pid, "rack": "rack0"})
            (self.data_dir / "cluster.json").write_text(json.dumps(self.state))  # so `down` stops them
            wait_for(lambda: {n.id for n in self.client.list_nodes() if n.status == "READY"} >= set(ids), 120,
                     "the workers to register", every=0.1)
            # The gang gate holds tasks once every replica's applied state is at version 4.
            wait_for(lambda: min(self.client.replica_status(a).applied_version for a in addresses) >= 4, 60,
                     "command-set version 4 on every replica")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.client is not None:
            self.client.close()
        if self.state is not None:  # (a cluster that did not come up was stopped by `up`)
            local.down(self.data_dir)
        if self.dev_root is None:
            os.environ.pop(container.DEV_ROOT_HOOK, None)
        else:
            os.environ[container.DEV_ROOT_HOOK] = self.dev_root

    def run(self, name: str, tasks: int, image: str = "", timeout: float = 120.0):
        """Submit a job of `tasks` PROBE tasks (in `image` if given) and wait for it to succeed."""
        assert self.client is not None
        spec = JobSpec(name=name, tasks=tasks, resources=TASK_RESOURCES, command=PROBE, image=image)
        job_id = self.client.submit(codec.job_spec_to_proto(spec))
        info = wait_for(lambda: (j := self.client.get_job(job_id)).status in ("SUCCEEDED", "FAILED", "CANCELLED")
                        and j, timeout, f"job {name} to end", every=0.02)
        if info.status != "SUCCEEDED" or info.attempt != 1:
            raise SystemExit(f"bench/images: job {name} ended {info.status} at attempt {info.attempt}: "
                             f"{info.failure} {[e.message for e in info.events]}")
        return info

    def command_at(self, info, index: int) -> float:
        """When task `index`'s command ran: the clock it read first, from its log."""
        node = next(t.node_id for t in info.tasks if t.index == index)
        log = (self.data_dir / "workers" / node / "logs" / info.id / f"attempt-{info.attempt}"
               / f"task-{index}.log").read_text()
        found = re.search(r"time\.tv_sec:\s+(\d+)\s+time\.tv_usec:\s+(\d+)", log)
        if found is None:
            raise SystemExit(f"bench/images: no clock in the log of task {index} of {info.id}: {log[-500:]!r}")
        return int(found.group(1)) + int(found.group(2)) / 1e6

    def shim_at(self, info, index: int) -> float:
        """When the worker started task `index`'s shim: its task journal's start record."""
        node = next(t.node_id for t in info.tasks if t.index == index)
        for line in (self.data_dir / "workers" / node / TASK_JOURNAL).read_text().splitlines():
            record = json.loads(line)
            if (record["event"], record["job"], record["attempt"], record["index"]) == \
                    ("start", info.id, info.attempt, index):
                return float(record["at"])
        raise SystemExit(f"bench/images: no start of task {index} of {info.id} in {node}'s journal")


def event_at(info, kind: str) -> float:
    """When the job's (last) event of `kind` was stamped; 0.0 if it has none."""
    return max((e.at for e in info.events if e.kind == kind), default=0.0)


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def summary(samples: list[float]) -> dict:
    """p50, p90 and max of samples in seconds, as milliseconds."""
    return {"p50_ms": ms(statistics.median(samples)), "p90_ms": ms(percentile(samples, 0.9)),
            "max_ms": ms(max(samples)), "all_ms": [ms(x) for x in samples]}


def measure_starts(cluster: BenchCluster, image: str, trials: int) -> dict:
    """(c): `trials` plain and `trials` image starts, interleaved (which goes first alternates)."""
    cluster.run("warm-up", cluster.workers, image)  # every worker's store holds the image now
    plain: list[float] = []
    contained: list[float] = []
    stages: dict[str, list[float]] = {"plain_to_shim": [], "plain_shim_to_command": [], "image_to_shim": [],
                                      "image_shim_to_command": []}
    for n in range(trials):
        for kind in (("plain", "image") if n % 2 == 0 else ("image", "plain")):
            info = cluster.run(f"{kind}{n}", 1, image if kind == "image" else "")
            scheduled = event_at(info, "Scheduled")
            shim, command = cluster.shim_at(info, 0), cluster.command_at(info, 0)
            (contained if kind == "image" else plain).append(command - scheduled)
            stages[f"{kind}_to_shim"].append(shim - scheduled)
            stages[f"{kind}_shim_to_command"].append(command - shim)
    result = {"trials": trials, "plain": summary(plain), "image": summary(contained)}
    result["p50_difference_ms"] = round(result["image"]["p50_ms"] - result["plain"]["p50_ms"], 1)
    result["stages_p50_ms"] = {k: ms(statistics.median(v)) for k, v in stages.items()}
    return result


def measure_gang(cluster: BenchCluster, registry: Registry, trials: int) -> dict:
    """(d): a gang of every worker in a new (uncached) image per trial."""
    spreads, first, last, shim_spreads = [], [], [], []
    for n in range(trials):
        nonce = os.urandom(16).hex().encode()
        registry.push("bench/gang", str(n), busybox_image([E("etc/trial", data=nonce)]))
        info = cluster.run(f"gang{n}", cluster.workers, f"{registry.host}/bench/gang:{n}")
        ready = event_at(info, "ImageReady")
        if not ready:
            raise SystemExit(f"bench/images: gang {info.id} has no ImageReady event: it was not gated")
        starts = [cluster.command_at(info, t.index) for t in info.tasks]
        shims = [cluster.shim_at(info, t.index) for t in info.tasks]
        if min(shims) < ready:
            raise SystemExit(f"bench/images: a task of {info.id} started {ms(ready - min(shims))} ms before ImageReady")
        spreads.append(max(starts) - min(starts))
        first.append(min(starts) - ready)
        last.append(max(starts) - ready)
        shim_spreads.append(max(shims) - min(shims))
    return {"tasks": cluster.workers, "trials": trials, "spread": summary(spreads),
            "ready_to_first_p50_ms": ms(statistics.median(first)), "ready_to_last_p50_ms": ms(statistics.median(last)),
            "shim_spread_p50_ms": ms(statistics.median(shim_spreads))}


def run_cluster(start_trials: int, gang_tasks: int, gang_trials: int, only: set[str]) -> dict:
    """(c) and (d) on one local cluster of `gang_tasks` workers."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-images-run-") as tmp_name:
        tmp = Path(tmp_name)
        with Registry(tmp / "registry") as registry:
            registry.push("bench/start", "1", busybox_image())
            with BenchCluster(tmp / "cluster", gang_tasks, registry.host) as cluster:
                if "start" in only:
                    out["start"] = measure_starts(cluster, f"{registry.host}/bench/start:1", start_trials)
                if "gang" in only:
                    out["gang"] = measure_gang(cluster, registry, gang_trials)
    return out


def print_pulls(result: dict) -> None:
    print(f"image: {result['image_bytes'] / MB:.0f} MB unpacked, {result['blob_bytes'] / MB:.0f} MB of gzip layers")
    print(f"cold pull + unpack, image store:  {result['store_s']:7.2f} s  {result['store_mb_s']:7.1f} MB/s")
    print(f"skopeo copy + umoci unpack:       {result['skopeo_umoci_s']:7.2f} s  "
          f"{result['skopeo_umoci_mb_s']:7.1f} MB/s")
    print(f"ratio (skopeo+umoci time / store time): {result['ratio']:.2f}")
    print(f"{result['concurrent_callers']} concurrent ensure of one uncached image: each blob fetched "
          f"{result['concurrent_blob_gets_max']} time(s) at most")


def print_starts(result: dict, judge: bool) -> None:
    plain, image, stages = result["plain"], result["image"], result["stages_p50_ms"]
    print(f"task start, CommitPlan -> the command's first instruction ({result['trials']} + {result['trials']} "
          "1-task jobs, interleaved):")
    print(f"  plain process:       p50 {plain['p50_ms']:7.1f} ms  p90 {plain['p90_ms']:7.1f} ms")
    print(f"  in the cached image: p50 {image['p50_ms']:7.1f} ms  p90 {image['p90_ms']:7.1f} ms")
    print(f"  difference of the p50s: {result['p50_difference_ms']:+.1f} ms")
    print(f"  p50 stages: plain: shim started {stages['plain_to_shim']:.1f}, command "
          f"{stages['plain_shim_to_command']:.1f} later; image: shim started {stages['image_to_shim']:.1f}, "
          f"command {stages['image_shim_to_command']:.1f} later (ms)")
    if judge:
        verdict(f"image p50 at most {ms(START_TARGET_S):.0f} ms more than plain",
                result["p50_difference_ms"] <= ms(START_TARGET_S))


def print_gang(result: dict, judge: bool) -> None:
    spread = result["spread"]
    print(f"{result['tasks']}-task gang in an uncached image, {result['trials']} trial(s): spread of the tasks' "
          f"first instructions, all after ImageReady (the last node's image committed ready):")
    print(f"  spread: p50 {spread['p50_ms']:.1f} ms, max {spread['max_ms']:.1f} ms; all: {spread['all_ms']}")
    print(f"  ImageReady -> first task {result['ready_to_first_p50_ms']:.1f} ms, -> last task "
          f"{result['ready_to_last_p50_ms']:.1f} ms (p50); the workers' gate openings spread "
          f"{result['shim_spread_p50_ms']:.1f} ms (p50)")
    if judge:
        verdict(f"spread p50 at most {ms(SPREAD_TARGET_S):.0f} ms", spread["p50_ms"] <= ms(SPREAD_TARGET_S))


def verdict(target: str, met: bool) -> None:
    print(f"  target ({target}):", "met" if met else "NOT met")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a ~20 MB image, 3 + 3 starts, a 4-task gang twice (CI)")
    parser.add_argument("--size-mb", type=int, default=1024, help="the pulled image's unpacked size (default 1024)")
    parser.add_argument("--only", default="pull,start,gang",
                        help="which measurements, comma-separated: pull (a and b), start (c), gang (d)")
    parser.add_argument("--trials", type=int, default=20, help="starts of each kind in (c) (default 20)")
    parser.add_argument("--gang-tasks", type=int, default=16, help="the gang's size in (d), one worker each")
    parser.add_argument("--gang-trials", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    only = {w.strip() for w in args.only.split(",") if w.strip()}
    if only - {"pull", "start", "gang"}:
        parser.error(f"--only: unknown {sorted(only - {'pull', 'start', 'gang'})}")
    if args.quick:
        args.size_mb, args.trials, args.gang_tasks, args.gang_trials = 20, 3, 4, 2
    missing = registry_available() or ("" if "pull" not in only or shutil.which("skopeo") and shutil.which("umoci")
                                       else "skopeo or umoci is not installed")
    if missing:
        print(f"bench/images: skipped: {missing} (scripts/install-test-packages.sh)")
        return
    result = run_pulls(args.size_mb * MB) if "pull" in only else {}
    if only & {"start", "gang"}:
        why = sandbox_unavailable()
        if why:
            print(f"bench/images: start and gang skipped: {why}")
        else:
            result.update(run_cluster(args.trials, args.gang_tasks, args.gang_trials, only))
    if args.json:
        print(json.dumps(result))
        return
    if "pull" in only:
        print_pulls(result)
    if "start" in result:
        print_starts(result["start"], not args.quick)
    if "gang" in result:
        print_gang(result["gang"], not args.quick)
    if args.quick:
        print("(--quick: sizes too small to judge the targets)")


def sandbox_unavailable() -> str:
    """Why tasks cannot run in images here ("" if they can): the sandbox needs namespaces."""
    if os.geteuid() != 0 and not os.path.exists("/proc/self/ns/user"):
        return "no user namespaces and not root: the sandbox cannot run here"
    return ""


if __name__ == "__main__":
    main()
