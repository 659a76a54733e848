"""Helpers on a running local cluster (tests/cluster): the `LocalCluster` the `make_cluster` fixture
starts, and the jobs, waits and synctl calls the cluster tests share."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import grpc
from click.testing import CliRunner

from synapse.client.cli.main import main
from synapse.client.master_client import MasterClient
from synapse.common.tls import TLSFiles, channel_credentials, issue_worker
from synapse.core import codec
from synapse.core.model import JobSpec, PackMode, Resources, TopologySpec
from synapse.local import cluster as local
from synapse.proto import api_pb2, types_pb2
from synapse.worker import fence
from synapse.worker.lease import CREDENTIAL_FILE
from tests.support.helpers import spec, wait_for


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

    def saved_credential(self, worker_id: str) -> dict:
        """The node credential a worker keeps in its data dir. The worker writes it when the
        registration reply reaches it, which may be after the node shows in the listing."""
        path = self.worker_dir(worker_id) / CREDENTIAL_FILE
        return wait_for(lambda: path.exists() and json.loads(path.read_text()), 15, f"{worker_id}'s credential file")

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


def start_worker(cluster, worker_id: str, rack: str, *extra: str) -> None:
    """One more worker of `cluster`, with extra flags (the image store's and the runtime's)."""
    from synapse.local import cluster as local
    cluster.node_tls(worker_id)
    argv = local.worker_argv(cluster.data_dir, ",".join(cluster.addresses),
                             cluster.data_dir / "secrets" / local.JOIN_TOKEN_FILE, worker_id, rack, 8, 0.5)
    pid = local._spawn(argv + list(extra), cluster.data_dir / "logs" / f"{worker_id}.log")
    cluster.state["workers"].append({"id": worker_id, "pid": pid, "rack": rack})
    (cluster.data_dir / "cluster.json").write_text(json.dumps(cluster.state))
    wait_for(lambda: any(n.id == worker_id for n in cluster.client.list_nodes()), what=f"worker {worker_id}")


def proto_spec(**kw):
    return codec.job_spec_to_proto(spec(**kw))


def register(cluster, node_id, rack="r1", gpus=8):
    """Register a node by hand, as the admin presenting a certificate issued to the node (TLS)."""
    with cluster.node_client(node_id) as client:
        return client.call("RegisterNode", api_pb2.RegisterNodeRequest(
            node_id=node_id, address="127.0.0.1:1", topology=[rack],
            capacity=types_pb2.Resources(cpu_millis=64000, memory_bytes=1 << 36, gpu=gpus)))


def wait_status(client, job_id, statuses, attempt=None, timeout=20.0):
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get_job(job_id)
        if job.status in statuses and (attempt is None or job.attempt == attempt):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} is {job.status} at attempt {job.attempt}, wanted {statuses}")


def submit(cluster, name, tasks, command, *, gpu=8, pack="", required=False, max_restarts=0, env=()):
    spec = JobSpec(name=name, tasks=tasks, resources=Resources(1000, 1 << 30, gpu), command=tuple(command),
                   topology=TopologySpec(pack, PackMode.REQUIRED if required else PackMode.PREFERRED),
                   max_restarts=max_restarts, env=tuple(env))
    return cluster.client.submit(codec.job_spec_to_proto(spec))


def job(cluster, job_id):
    return cluster.client.get_job(job_id)


def wait_job(cluster, job_id, statuses, timeout=30.0, attempt=None):
    return wait_for(lambda: (lambda j: j if j.status in statuses and (attempt is None or j.attempt == attempt)
                             else None)(job(cluster, job_id)), timeout, f"job {job_id} in {statuses}")


def read_logs(cluster, job_id, attempt=1):
    info = job(cluster, job_id)
    nodes = {a.attempt: list(a.nodes) for a in info.attempts}[attempt]
    return [(cluster.worker_dir(node) / "logs" / job_id / f"attempt-{attempt}" / f"task-{i}.log").read_text()
            for i, node in enumerate(nodes)]


def synctl(cluster, *args, **kw):
    env = dict(cluster.env) if cluster else {}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False, **kw)


def wait_waiting(client, job_id, timeout=10.0):
    """Until a scheduling round has recorded why the job waits."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get_job(job_id).waiting:
            return
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} has no waiting reason")


def history(cluster, *args: str) -> list[dict]:
    out = synctl(cluster, "history", "--limit", "0", "-o", "json", *args)
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def archived_ids(cluster) -> set[str]:
    """The jobs `synctl history` lists; none while the store is not there yet."""
    out = synctl(cluster, "history", "--limit", "0", "-o", "json")
    return {j["id"] for j in json.loads(out.output)} if out.exit_code == 0 else set()


def synctl_as(cluster, token, *args, masters=None):
    """synctl as the holder of `token` (a user's or the admin's), against `masters` (by default all)."""
    env = {**cluster.env, "SYNAPSE_MASTERS": masters or ",".join(cluster.addresses), "SYNAPSE_TOKEN": token}
    return CliRunner().invoke(main, ["--timeout", "15", *args], env=env, catch_exceptions=False)


def add_user(cluster, name, *args):
    out = synctl_as(cluster, cluster.token, "user", "add", name, *args, "-o", "json")
    assert out.exit_code == 0, out.output
    return json.loads(out.output)




def wait_exit(pid: int, timeout: float = 20.0) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    return None


#: Starts a program with the signals at their defaults, as a program started from a terminal has
#: them: a test run under nohup, or in the background of a script, inherits SIGHUP or SIGINT
#: ignored, and a program rightly keeps ignoring a signal it was started ignoring
#: (synapse.local.interrupts). A fresh interpreter resets them and execs the program, rather than a
#: preexec_fn: that forces a plain fork of this process, whose gRPC channels' fork handlers can
#: crash the child before its exec (grpc/grpc#43055: "epoll_wait error: Bad file descriptor").
AS_FROM_A_TERMINAL = [sys.executable, "-c",
                      "import os, signal, sys\n"
                      "for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP): signal.signal(sig, signal.SIG_DFL)\n"
                      "os.execv(sys.argv[1], sys.argv[1:])"]
