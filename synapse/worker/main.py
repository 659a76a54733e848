"""`synapse-worker`: the agent that runs on every machine.

    synapse-worker --masters h1:7000,h2:7000,h3:7000 --join-token-file /etc/synapse/join-token \\
        --topology zone1/block2/rack7 --data-dir /var/lib/synapse-worker

A worker holds no admin credential: a join token (`synctl node token create`) registers the node
the first time, and the node's own credential, which acts for this node only, is then kept in the
data dir (`node-credential.json`) for every later call and restart. The cluster token
(`--token-file`) still works, for workers set up before join tokens.

Capacity is detected (cpu count, memory from /proc/meminfo, GPUs with their model and memory from
NVML or `nvidia-smi`: `--gpus auto`, the default) and any flag overrides it: tests and the local
cluster announce 8 fake GPUs with `--gpus 8`. The node id is kept in the data dir, so a restarted
worker is the same node.

Tasks are confined in cgroups of their own (`--isolation`, see isolation.py); the choice is
logged and registered, so `synctl describe node` shows it. `--health-check CMD` runs CMD every
`--health-interval` seconds; a failing check cordons the node (see health.py). GPUs found by
discovery are watched for errors every `--gpu-check-interval` seconds (see gpu_errors.py).

A task whose job names an image runs inside it (container.py, sandbox.py): the image store in
DATA_DIR/images (`--image-cache-size`, `--registry-credentials`, `--insecure-registry`) gets it
first; a job's mounts must come from under an `--allow-mount` prefix; GPUs follow the node's CDI
spec where it has one (`--cdi-spec-dir`).

SIGTERM or SIGINT stops the agent and leaves its tasks running: a restarted agent re-adopts them,
as slurmd and the Borglet do. With `--stop-tasks-on-exit` it stops every task first (a machine
leaving the cluster, or a local cluster being torn down).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import uuid
from pathlib import Path

import click

from synapse.client.master_client import AuthError, PermissionDenied, parse_addresses
from synapse.common.cli import CONTEXT_SETTINGS, fail, version_option
from synapse.common.datadir import TASK_UMASK_ENV, make_private, private_umask
from synapse.common.logs import configure
from synapse.common.tls import TLSFiles
from synapse.core.jobs.quantity import QuantityError, parse_cpu, parse_memory
from synapse.core.model import Resources
from synapse.core.rendezvous import MASTER_PORTS, format_ports, parse_ports
from synapse.images.store import ImageStore
from synapse.worker import container, gpu_errors, isolation
from synapse.worker import gpus as gpu_discovery
from synapse.worker.agent import WorkerAgent
from synapse.worker.health import HealthCheck, command_problem
from synapse.worker.lease import load_credential
from synapse.worker.runtime import stop_all

log = logging.getLogger(__name__)


#: The image store's default disk budget: a few large training images (NGC PyTorch is ~10 GB unpacked).
DEFAULT_IMAGE_CACHE = "50Gi"


def gpu_capacity(flag: str | None) -> tuple[int, dict[str, str], str]:
    """(GPU count, node labels, how they were found) for `--gpus N|auto` (absent: auto)."""
    if flag not in (None, "auto"):
        try:
            count = int(flag)
        except ValueError:
            raise click.BadParameter(f"must be a whole number or auto, not {flag!r}", param_hint="--gpus") from None
        if count < 0:
            raise click.BadParameter("must not be negative", param_hint="--gpus")
        return count, {}, "--gpus"
    found, source = gpu_discovery.discover()
    return len(found), gpu_discovery.labels_for(found), source


def detect_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def node_id_for(data_dir: Path, given: str) -> str:
    """The node's stable id: given, or kept in the data dir, or made once from the hostname."""
    path = data_dir / "node-id"
    if given:
        path.write_text(given + "\n")
        return given
    if path.exists():
        return path.read_text().strip()
    node_id = f"{socket.gethostname().split('.')[0]}-{uuid.uuid4().hex[:6]}"
    path.write_text(node_id + "\n")
    return node_id


@click.command(context_settings=CONTEXT_SETTINGS)
@version_option("synapse-worker")
@click.option("--masters", envvar="SYNAPSE_MASTERS", default="",
              help="comma-separated master API addresses [env: SYNAPSE_MASTERS]")
@click.option("--token", envvar="SYNAPSE_TOKEN", default="", help="cluster token [env: SYNAPSE_TOKEN]")
@click.option("--token-file", type=click.Path(dir_okay=False), help="read the cluster token from this file")
@click.option("--join-token-file", envvar="SYNAPSE_JOIN_TOKEN_FILE", type=click.Path(dir_okay=False),
              help="a join token (synctl node token create) to register this node the first time; the node's "
                   "own credential is then kept in the data dir [env: SYNAPSE_JOIN_TOKEN_FILE]")
@click.option("--node-id", default="", help="node id (default: kept in the data dir)")
@click.option("--rack", help="rack label (shorthand for --topology default/default/RACK)")
@click.option("--topology", help="topology path, widest first, e.g. zone1/block2/rack7")
@click.option("--cpus", help="cpu cores to offer, e.g. 16 or 500m (default: all)")
@click.option("--memory", help="memory to offer, e.g. 512Gi (default: all)")
@click.option("--gpus", envvar="SYNAPSE_GPUS", default=None,
              help="GPUs to offer: a count, or auto to ask NVML / nvidia-smi for them and their model "
                   "(default: auto) [env: SYNAPSE_GPUS]")
@click.option("--data-dir", default="/var/lib/synapse-worker", show_default=True, type=click.Path(file_okay=False),
              help="node id, state file, task logs")
@click.option("--address", default=socket.gethostname, show_default="this host's name",
              help="host other machines reach this one at")
@click.option("--port", type=int, default=0, show_default=True, help="port of the worker's log service (0: any free)")
@click.option("--heartbeat-interval", type=float, default=5.0, show_default=True, help="seconds between heartbeats")
@click.option("--stop-grace", type=float, default=10.0, show_default=True,
              help="seconds from SIGTERM to SIGKILL for a task")
@click.option("--runtime", envvar="SYNAPSE_RUNTIME", default="",
              help="external runtime template, e.g. 'carapace run {task_id} {image}' [env: SYNAPSE_RUNTIME]")
@click.option("--isolation", "isolation_mode", envvar="SYNAPSE_ISOLATION",
              type=click.Choice(["auto", "cgroup", "none"]), default="auto", show_default=True,
              help="confine each task in a cgroup (memory, cpu quota, pids); auto: when this worker may create "
                   "them [env: SYNAPSE_ISOLATION]")
@click.option("--task-pids-max", type=int, default=isolation.DEFAULT_PIDS_MAX, show_default=True,
              help="processes and threads a task may have (0: no cap)")
@click.option("--health-check", envvar="SYNAPSE_HEALTH_CHECK", default="",
              help="a command that exits 0 while this node is healthy [env: SYNAPSE_HEALTH_CHECK]")
@click.option("--health-interval", envvar="SYNAPSE_HEALTH_INTERVAL", type=float, default=30.0, show_default=True,
              help="seconds between health checks [env: SYNAPSE_HEALTH_INTERVAL]")
@click.option("--health-timeout", envvar="SYNAPSE_HEALTH_TIMEOUT", type=float, default=None,
              help="seconds a check may take before it counts as failed (default: the interval, at most 60) "
                   "[env: SYNAPSE_HEALTH_TIMEOUT]")
@click.option("--health-on-failure", envvar="SYNAPSE_HEALTH_ON_FAILURE", type=click.Choice(["cordon", "drain"]),
              default="cordon", show_default=True,
              help="cordon the failing node, or also stop (and requeue) the gangs running on it "
                   "[env: SYNAPSE_HEALTH_ON_FAILURE]")
@click.option("--gpu-check-interval", envvar="SYNAPSE_GPU_CHECK_INTERVAL", type=float, default=10.0,
              show_default=True, help="seconds between looks at the GPUs for errors (nvidia-smi; only for GPUs "
                                      "found by --gpus auto); 0: never [env: SYNAPSE_GPU_CHECK_INTERVAL]")
@click.option("--ca", envvar="SYNAPSE_CA", default="", help="CA of the masters' TLS certificates [env: SYNAPSE_CA]")
@click.option("--cert", default="", help="this worker's client certificate (mTLS; CN = node id)")
@click.option("--key", default="", help="its private key")
@click.option("--http", envvar="SYNAPSE_WORKER_HTTP", default="",
              help="host:port for /metrics and /livez (port 0: any free one, written to DATA_DIR/http-address)")
@click.option("--image-cache-size", envvar="SYNAPSE_IMAGE_CACHE_SIZE", default=DEFAULT_IMAGE_CACHE, show_default=True,
              help="disk the image store may use under DATA_DIR/images, e.g. 200Gi; images no task uses are "
                   "evicted, least recently used first [env: SYNAPSE_IMAGE_CACHE_SIZE]")
@click.option("--registry-credentials", envvar="SYNAPSE_REGISTRY_CREDENTIALS", default="",
              type=click.Path(dir_okay=False),
              help="a Docker config.json-style file of registry credentials (auths) "
                   "[env: SYNAPSE_REGISTRY_CREDENTIALS]")
@click.option("--insecure-registry", multiple=True, metavar="HOST:PORT",
              help="a registry reached over plain HTTP (repeatable)")
@click.option("--allow-mount", multiple=True, metavar="PREFIX",
              help="a host directory jobs in images may mount from, e.g. /data (repeatable; none by default)")
@click.option("--cdi-spec-dir", multiple=True, metavar="DIR",
              help=f"where this node's CDI specs are (repeatable; default: {', '.join(container.CDI_DIRS)})")
@click.option("--rendezvous-ports", envvar="SYNAPSE_RENDEZVOUS_PORTS", default=format_ports(MASTER_PORTS),
              show_default=True, metavar="LOW-HIGH",
              help="the masters' rendezvous_ports (where MASTER_PORT comes from): the worker warns when this "
                   "node's ephemeral ports reach into them [env: SYNAPSE_RENDEZVOUS_PORTS]")
@click.option("--heartbeat-datagrams/--no-heartbeat-datagrams", default=True, show_default=True,
              help="send each heartbeat by UDP datagram to the shard's API port first, by call only when "
                   "that is not answered (docs/operating/workers.md)")
@click.option("--stop-tasks-on-exit", is_flag=True, help="stop every task when the agent stops")
@click.option("--log-level", default="INFO", show_default=True, help="DEBUG, INFO, WARNING or ERROR")
def main(masters: str, token: str, token_file: str | None, join_token_file: str | None, node_id: str,
         rack: str | None, topology: str | None,
         cpus: str | None, memory: str | None, gpus: str | None, data_dir: str, address: str, port: int,
         heartbeat_interval: float, stop_grace: float, runtime: str, isolation_mode: str, task_pids_max: int,
         health_check: str, health_interval: float, health_timeout: float | None, health_on_failure: str,
         gpu_check_interval: float, ca: str, cert: str, key: str, http: str, image_cache_size: str,
         registry_credentials: str, insecure_registry: tuple[str, ...], allow_mount: tuple[str, ...],
         cdi_spec_dir: tuple[str, ...], rendezvous_ports: str, heartbeat_datagrams: bool, stop_tasks_on_exit: bool,
         log_level: str) -> None:
    """Run the Synapse worker agent on this machine."""
    os.environ[TASK_UMASK_ENV] = f"{private_umask():04o}"  # the worker's files private; its tasks' as before
    if rack and topology:
        fail("synapse-worker", "give --rack or --topology, not both")
    addresses = parse_addresses(masters)
    if not addresses:
        fail("synapse-worker", "--masters (or SYNAPSE_MASTERS) is required")
    health = None
    if health_check:
        problem = command_problem(health_check)
        if problem:
            fail("synapse-worker", problem)
        if health_interval <= 0 or (health_timeout is not None and health_timeout <= 0):
            fail("synapse-worker", "--health-interval and --health-timeout must be above 0 seconds")
        health = HealthCheck(health_check, health_interval,
                             health_timeout if health_timeout is not None else min(health_interval, 60.0))
    if task_pids_max < 0:
        fail("synapse-worker", "--task-pids-max must not be negative")
    gpu_count, labels, gpu_source = gpu_capacity(gpus)
    try:
        capacity = Resources(parse_cpu(cpus) if cpus else (os.cpu_count() or 1) * 1000,
                             parse_memory(memory) if memory else detect_memory(), gpu_count)
        cache_bytes = parse_memory(image_cache_size)
    except QuantityError as exc:
        fail("synapse-worker", str(exc))
    try:
        ports = parse_ports(rendezvous_ports)
    except ValueError as exc:
        fail("synapse-worker", f"--rendezvous-ports {exc}")
    bad = [p for p in allow_mount if not os.path.isabs(p) or ".." in p.split("/")]
    if bad:
        fail("synapse-worker", f"--allow-mount {bad[0]}: must be an absolute path without '..'")
    root = Path(data_dir)
    make_private(root)
    node_id = node_id_for(root, node_id)
    configure("synapse-worker", node_id, log_level)
    try:
        cgroups, isolated = isolation.choose(isolation_mode, isolation.group_name(node_id, root))
    except isolation.IsolationError as exc:
        fail("synapse-worker", f"--isolation cgroup: cannot confine tasks here: {exc}")
    if cgroups is None and isolation_mode == "auto":
        log.warning("tasks will run unconfined node=%s isolation=%s", node_id, isolated)
    log.info("isolation node=%s isolation=%s", node_id, isolated)
    log.info("gpus node=%s count=%d source=%s labels=%s", node_id, gpu_count, gpu_source,
             ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "-")
    if token_file:
        token = Path(token_file).read_text().strip()
    if token and join_token_file:
        # Which credential would it present? A SYNAPSE_TOKEN left in the environment (another
        # cluster's, say) would silently win over the join token: refuse, and name the one to drop.
        given = "--token-file" if token_file else "--token (or SYNAPSE_TOKEN in the environment)"
        fail("synapse-worker", f"both a cluster token ({given}) and --join-token-file are given; a worker "
                               f"registers with one: drop {given}, or the join token file")
    join_token = ""
    if join_token_file and not load_credential(root, node_id):  # once registered, the file is not read again
        try:
            join_token = Path(join_token_file).read_text().strip()
        except OSError as exc:
            fail("synapse-worker", f"--join-token-file: {exc}")
    path = tuple(topology.split("/")) if topology else ((rack,) if rack else ())
    agent = WorkerAgent(node_id=node_id, address=address, topology=path, capacity=capacity,
                        masters=addresses, token=token, join_token=join_token, data_dir=root,
                        heartbeat_interval=heartbeat_interval, stop_grace=stop_grace,
                        runtime_template=runtime, log_port=port, tls=TLSFiles(ca, cert, key), http=http,
                        cgroups=cgroups, isolation=isolated, pids_max=task_pids_max, labels=labels, health=health,
                        drain_on_failure=health_on_failure == "drain",
                        images=ImageStore(root / "images", budget_bytes=cache_bytes,
                                          credentials=Path(registry_credentials) if registry_credentials else None,
                                          insecure_registries=insecure_registry),
                        allow_mounts=allow_mount, cdi_dirs=cdi_spec_dir or container.CDI_DIRS,
                        gpu_watch=gpu_errors.watch_for(node_id, gpu_source, gpu_count, gpu_check_interval),
                        rendezvous_ports=ports, heartbeat_datagrams=heartbeat_datagrams)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
    log.info("worker starting node=%s capacity=%s topology=%s", node_id, capacity, "/".join(path))
    try:
        agent.run()
    except (AuthError, PermissionDenied) as exc:
        fail("synapse-worker", f"registration refused: {exc}", 4)
    if stop_tasks_on_exit:
        stop_all(agent.runtime, [t.handle for t in agent.state.running() if t.handle], stop_grace)
    if cgroups is not None:
        cgroups.close()
    log.info("worker stopped node=%s", node_id)


if __name__ == "__main__":
    main()
