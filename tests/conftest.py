"""Fixtures that start real clusters (masters, workers) on 127.0.0.1 and always stop them.

"Always" includes an interrupted run: SIGTERM and SIGHUP (a closed terminal) become a
KeyboardInterrupt like Ctrl-C, so pytest runs every fixture's finalizer, and a second signal does
not cut those short (synapse.local.interrupts). After each test that had a tmp_path, whatever a
cluster under it may have left is swept (synapse.local.reaper, the netns ledgers)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import grpc
import pytest
from hypothesis import settings

from synapse.client.master_client import MasterClient
from synapse.common.tls import TLSFiles, channel_credentials, issue_worker
from synapse.local import cluster as local
from synapse.local import interrupts, reaper
from synapse.local.netns import MasterNet
from synapse.master.raft import CHECK_OWN_ENTRIES_ENV
from synapse.worker import fence

# Every replica the tests start (in this process or as a master process, which inherits it) decodes
# the entries it proposed, and stops if they differ from the commands it encoded: a leader applies
# its own entries without decoding them (synapse.master.raft.ReplicatedState.proposing).
os.environ[CHECK_OWN_ENTRIES_ENV] = "1"

# Each pytest-xdist worker takes its clusters' ports from its own slice of 8000-20000 (its
# subprocesses too): two workers checking at once could pick overlapping ranges. Below the
# rendezvous ports (20000-29999), which the gangs' rank 0 bind.
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    _worker = int(os.environ["PYTEST_XDIST_WORKER"][2:])
    _slice = 12_000 // max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    os.environ[local.PORTS_ENV] = f"{8_000 + _worker * _slice}-{8_000 + (_worker + 1) * _slice}"

# Property tests draw the same examples on every run, so a run's verdict is about the code and not
# the draw (a random CI run once drew a failing example nobody had seen, and another drew no
# command of one kind). To explore new examples: `pytest --hypothesis-profile explore`, with
# `--hypothesis-seed N` to repeat a draw.
settings.register_profile("synapse", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile("synapse")


def pytest_configure(config):
    config._synapse_restore_signals = interrupts.install("stopping the clusters the tests started")


def pytest_unconfigure(config):
    restore = getattr(config, "_synapse_restore_signals", None)
    if restore is not None:
        restore()


@pytest.fixture(autouse=True)
def _sweep_clusters(request):
    """The last resort after each test: stop any process marked with a data dir under its tmp_path
    and remove the networks of the ledgers there (a normal or interrupted stop leaves none)."""
    # Asked for here, before the test, so tmp_path is torn down after this fixture, not before.
    root = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if root is None:
        return
    with interrupts.deferred():
        reaper.sweep(root, under=True)
        for ledger in root.rglob(local.NETNS_LEDGER):
            MasterNet.sweep(ledger)


class LocalCluster:
    """A running `synapse-local` cluster and helpers to hurt it."""

    def __init__(self, data_dir: Path, masters: int, workers: int, racks: int, gpus: int, **settings) -> None:
        self.data_dir = data_dir
        self.base_port = local.free_base_port(masters)
        settings.setdefault("heartbeat", 0.5)  # DOWN after max(3 s, 3 heartbeats) of silence
        self.state = local.up(data_dir, masters, workers, racks, gpus, self.base_port, **settings)
        self.token = self.state["token"]
        self.addresses = [m["api_address"] for m in self.state["masters"]]
        self.tls = local.client_tls(self.state)  #: the client's TLS files (TLS is on unless tls=False)
        #: what a synctl of this cluster needs in its environment (masters, token, and the TLS files)
        self.env = local.client_env(self.state)
        self.client = self.new_client(deadline=30)

    def new_client(self, addresses: list[str] | None = None, **kw) -> MasterClient:
        """A client of this cluster (of `addresses`, by default all masters), with its TLS files."""
        return MasterClient(addresses or self.addresses, self.token, tls=self.tls, **kw)

    def node_tls(self, node_id: str) -> TLSFiles:
        """On a TLS cluster, the files of a certificate issued to `node_id` (signed by the cluster's
        CA on first use), as a worker started by hand presents; none on a plain cluster."""
        if not self.tls.enabled:
            return TLSFiles()
        tls_dir = Path(self.tls.ca).parent
        if not (tls_dir / f"worker-{node_id}.pem").exists():
            issue_worker(tls_dir, node_id)
        cert = tls_dir / f"worker-{node_id}"
        return TLSFiles(self.tls.ca, f"{cert}.pem", f"{cert}-key.pem")

    def worker_tls_argv(self, node_id: str) -> list[str]:
        """The TLS options of `synapse-worker` for a worker started by hand as `node_id`."""
        files = self.node_tls(node_id)
        return ["--ca", files.ca, "--cert", files.cert, "--key", files.key] if files.enabled else []

    def node_client(self, node_id: str, **kw) -> MasterClient:
        """A client with the admin token presenting `node_id`'s certificate (on a TLS cluster):
        what registering a node by hand, or acting as one, needs."""
        files = self.node_tls(node_id)
        return MasterClient(self.addresses, self.token, tls=files if files.enabled else self.tls, **kw)

    def channel(self, address: str, node_id: str = "", as_node: str = "") -> grpc.Channel:
        """A gRPC channel to a master (or to worker `node_id`'s log service, whose certificate names
        the node) with this cluster's client TLS files, or `as_node`'s certificate."""
        if not self.tls.enabled:
            return grpc.insecure_channel(address)
        files = self.node_tls(as_node) if as_node else self.tls
        options = [("grpc.ssl_target_name_override", node_id)] if node_id else []
        return grpc.secure_channel(address, channel_credentials(files), options=options)

    def master(self, replica_id: str) -> dict:
        return next(m for m in self.state["masters"] if m["id"] == replica_id)

    def leader_id(self) -> str:
        for m in self.state["masters"]:
            if local.is_ours(m["pid"], self.data_dir) and local.is_alive(m["pid"]):
                try:
                    status = self.client.replica_status(m["api_address"])
                except Exception:  # noqa: BLE001 - a replica going down mid-check
                    continue
                if status.state == "leader":
                    return status.id
        raise AssertionError("no leader")

    def wait_leader(self, timeout: float = 15.0, exclude: str = "") -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                leader = self.leader_id()
                if leader != exclude:
                    return leader
            except AssertionError:
                pass
            time.sleep(0.05)
        raise AssertionError("no leader elected in time")

    def converged_digest(self, timeout: float = 10.0) -> str:
        """The state digest once every live replica has applied the same number of commands."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            statuses = []
            for m in self.state["masters"]:
                if local.is_ours(m["pid"], self.data_dir) and local.is_alive(m["pid"]):
                    try:
                        statuses.append(self.client.replica_status(m["api_address"], digest=True))
                    except Exception:  # noqa: BLE001 - not answering yet
                        pass
            applied = {s.commands_applied for s in statuses}
            if statuses and len(applied) == 1:
                digests = {s.digest for s in statuses}
                assert len(digests) == 1, f"replicas applied the same commands yet differ: {digests}"
                return digests.pop()
            time.sleep(0.05)
        raise AssertionError("replicas did not converge in time")

    def kill_master(self, replica_id: str, sig: int = signal.SIGKILL) -> None:
        pid = self.master(replica_id)["pid"]
        os.kill(pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            deadline = time.monotonic() + 10
            while local.is_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            local._reap(pid)

    def restart_master(self, replica_id: str) -> None:
        local.restart(self.data_dir, self.state, self.master(replica_id))

    def worker(self, worker_id: str) -> dict:
        return next(w for w in self.state["workers"] if w["id"] == worker_id)

    def worker_dir(self, worker_id: str) -> Path:
        return self.data_dir / "workers" / worker_id

    def task_handles(self, worker_id: str) -> list[tuple[int, int]]:
        """(pid, start ticks) of the shims of the tasks a worker's state file lists as started."""
        path = self.worker_dir(worker_id) / "worker-state.json"
        if not path.exists():
            return []
        state = json.loads(path.read_text())
        return [(t["handle"]["pid"], t["handle"]["start_ticks"]) for t in state["tasks"] if t["handle"]]

    def task_pids(self, worker_id: str) -> list[int]:
        """Process groups of the tasks a worker's state file lists as started."""
        return [pid for pid, _ in self.task_handles(worker_id)]

    def kill_worker(self, worker_id: str, with_tasks: bool) -> list[int]:
        """kill -9 a worker agent (and, like a machine dying, its tasks); returns the task pids. A
        task is killed only while its shim is the process the state file names: pids wrap around
        (32768 here) and a finished task's pid may be another test's process by now."""
        handles = self.task_handles(worker_id)
        pid = self.worker(worker_id)["pid"]
        os.kill(pid, signal.SIGKILL)
        if with_tasks:
            for task_pid, ticks in handles:
                fence.kill(fence.Shim("", task_pid, ticks), [])
        pids = [p for p, _ in handles]
        deadline = time.monotonic() + 10
        while local.is_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        local._reap(pid)
        return pids

    def restart_worker(self, worker_id: str) -> None:
        local.restart(self.data_dir, self.state, self.worker(worker_id))

    def stop(self) -> None:
        self.client.close()
        local.down(self.data_dir)


@pytest.fixture
def make_cluster(tmp_path):
    started: list[LocalCluster] = []

    def make(masters: int = 3, workers: int = 0, racks: int = 2, gpus: int = 8, **settings) -> LocalCluster:
        cluster = LocalCluster(tmp_path / f"cluster{len(started)}", masters, workers, racks, gpus, **settings)
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        cluster.stop()


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server of the tests' own (synapse/local/postgres.py), or a skip saying why there is none."""
    from synapse.local.postgres import PostgresServer, unavailable

    why = unavailable()
    if why:
        pytest.skip(why)
    server = PostgresServer()
    yield server
    server.destroy()
