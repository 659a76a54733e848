"""`synapse-worker`: the agent that runs on every machine.

    synapse-worker --masters h1:7000,h2:7000,h3:7000 --token-file /etc/synapse/token \\
        --topology zone1/block2/rack7 --data-dir /var/lib/synapse-worker

Capacity is detected (cpu count, memory from /proc/meminfo, GPUs from NVML or `nvidia-smi -L`)
and any flag overrides it: tests and the local cluster announce 8 fake GPUs with `--gpus 8`.
The node id is kept in the data dir, so a restarted worker is the same node.

SIGTERM or SIGINT stops the agent and leaves its tasks running: a restarted agent re-adopts them,
as slurmd and the Borglet do. With `--stop-tasks-on-exit` it stops every task first (a machine
leaving the cluster, or a local cluster being torn down).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

from synapse.agent import WorkerAgent
from synapse.client import AuthError, parse_addresses
from synapse.logs import configure
from synapse.model import Resources
from synapse.quantity import QuantityError, parse_cpu, parse_memory
from synapse.runtime import stop_all
from synapse.tls import TLSFiles

log = logging.getLogger(__name__)


def detect_gpus() -> int:
    try:
        import pynvml  # nvidia-ml-py, optional

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - not installed, or no driver
        pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
            return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            pass
    return 0


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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="synapse-worker", description="Run the Synapse worker agent on this machine.")
    p.add_argument("--masters", default=os.environ.get("SYNAPSE_MASTERS", ""), help="master API addresses")
    p.add_argument("--token", default=os.environ.get("SYNAPSE_TOKEN", ""), help="cluster token")
    p.add_argument("--token-file", help="read the cluster token from this file")
    p.add_argument("--node-id", default="", help="node id (default: kept in the data dir)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--rack", help="rack label (shorthand for --topology default/default/RACK)")
    group.add_argument("--topology", help="topology path, widest first, e.g. zone1/block2/rack7")
    p.add_argument("--cpus", help="cpu cores to offer (default: all)")
    p.add_argument("--memory", help="memory to offer, e.g. 512Gi (default: all)")
    p.add_argument("--gpus", type=int, help="GPUs to offer (default: detected)")
    p.add_argument("--data-dir", default="/var/lib/synapse-worker", help="node id, state file, task logs")
    p.add_argument("--address", default=socket.gethostname(), help="host other machines reach this one at")
    p.add_argument("--port", type=int, default=0, help="port of the worker's log service (0: any free one)")
    p.add_argument("--heartbeat-interval", type=float, default=5.0)
    p.add_argument("--stop-grace", type=float, default=10.0, help="seconds from SIGTERM to SIGKILL for a task")
    p.add_argument("--runtime", default="", help="external runtime template, e.g. 'carapace run {task_id} {image}'")
    p.add_argument("--ca", default=os.environ.get("SYNAPSE_CA", ""), help="CA of the masters' TLS certificates")
    p.add_argument("--cert", default="", help="this worker's client certificate (mTLS; CN = node id)")
    p.add_argument("--key", default="", help="its private key")
    p.add_argument("--stop-tasks-on-exit", action="store_true", help="stop every task when the agent stops")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)

    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    node_id = node_id_for(data_dir, args.node_id)
    configure("synapse-worker", node_id, args.log_level)
    token = Path(args.token_file).read_text().strip() if args.token_file else args.token
    masters = parse_addresses(args.masters)
    if not masters:
        p.error("--masters (or SYNAPSE_MASTERS) is required")
    try:
        capacity = Resources(parse_cpu(args.cpus) if args.cpus else (os.cpu_count() or 1) * 1000,
                             parse_memory(args.memory) if args.memory else detect_memory(),
                             args.gpus if args.gpus is not None else detect_gpus())
    except QuantityError as exc:
        p.error(str(exc))
    topology = tuple(args.topology.split("/")) if args.topology else ((args.rack,) if args.rack else ())
    agent = WorkerAgent(node_id=node_id, address=args.address, topology=topology, capacity=capacity,
                        masters=masters, token=token, data_dir=data_dir,
                        heartbeat_interval=args.heartbeat_interval, stop_grace=args.stop_grace,
                        runtime_template=args.runtime, log_port=args.port,
                        tls=TLSFiles(args.ca, args.cert, args.key))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
    log.info("worker starting node=%s capacity=%s topology=%s", node_id, capacity, "/".join(topology))
    try:
        agent.run()
    except AuthError as exc:
        print(f"synapse-worker: {exc}", file=sys.stderr)
        sys.exit(4)
    if args.stop_tasks_on_exit:
        stop_all(agent.runtime, [t.handle for t in agent.state.running() if t.handle], args.stop_grace)
    log.info("worker stopped node=%s", node_id)


if __name__ == "__main__":
    main()
