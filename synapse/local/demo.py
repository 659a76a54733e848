"""The narrated tour `synapse-local demo` gives: a cluster, a rack-packed gang, a leader killed mid-run."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import click
import yaml

from synapse.client.master_client import MasterClient
from synapse.core import codec
from synapse.core.jobs.jobspec import parse_job
from synapse.local.cluster import client_tls, down, up
from synapse.proto import api_pb2

DEMO_JOB = """\
name: demo-train
tasks: 2
resources: {cpu: 1, memory: 1Gi, gpu: 8}
topology: {pack: rack, mode: required}
max_restarts: 1
command:
  - sh
  - -c
  - >-
    echo rank $RANK of $WORLD_SIZE task $SYNAPSE_TASK_ID master $MASTER_ADDR:$MASTER_PORT
    gpus $CUDA_VISIBLE_DEVICES; sleep 6; echo rank $RANK done
"""


def demo(data_dir: Path, base_port: int, say: Callable[[str], None] = click.echo) -> bool:
    """The narrated tour: cluster up, a rack-packed gang, the leader killed mid-run, SUCCEEDED."""
    data_dir = data_dir.resolve()
    say(f"1. Starting a local cluster: 3 masters (Raft), 4 workers on 2 racks, 8 fake GPUs each, TLS on "
        f"(files in {data_dir}) ...")
    started = time.monotonic()
    state = up(data_dir, 3, 4, 2, 8, base_port, heartbeat=1.0, fresh=True)  # a tour starts anew
    ok = False
    try:
        addresses = [m["api_address"] for m in state["masters"]]
        client = MasterClient(addresses, state["token"], deadline=30, tls=client_tls(state))
        client.list_nodes()  # finds the leader
        leader_id = client.replica_status(client.leader or addresses[0]).id
        say(f"   ready in {time.monotonic() - started:.1f}s; leader is {leader_id}; workers: "
            + ", ".join(f"{w['id']}@{w['rack']}" for w in state["workers"]))
        (data_dir / "demo-job.yaml").write_text(DEMO_JOB)
        spec = parse_job(yaml.safe_load(DEMO_JOB))
        say("2. Submitting a 2-task gang, 8 GPUs per task, that must sit in one rack (demo-job.yaml) ...")
        job_id = client.submit(codec.job_spec_to_proto(spec))
        info = _wait_job(client, job_id, {"RUNNING"})
        racks = {w["id"]: w["rack"] for w in state["workers"]}
        say(f"   {job_id} is RUNNING; placement:")
        for t in info.tasks:
            say(f"     rank {t.rank} -> {t.node_id} ({racks.get(t.node_id)}), GPUs {','.join(map(str, t.gpus))}")
        time.sleep(0.5)
        for t in info.tasks:
            log = data_dir / "workers" / t.node_id / "logs" / job_id / "attempt-1" / f"task-{t.index}.log"
            say(f"     task {t.index} says: {log.read_text().splitlines()[0] if log.exists() else '(no output yet)'}")
        old = client.leader
        victim = next(m for m in state["masters"] if m["api_address"] == old)
        say(f"3. Killing the leader {victim['id']} (kill -9, pid {victim['pid']}) while the gang runs ...")
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        info = client.get_job(job_id)  # follows the cluster to the new leader
        new = client.replica_status(client.leader or "")
        say(f"   new leader {new.id} (term {new.term}) answered after {time.monotonic() - killed_at:.2f}s; "
            f"the job is still {info.status}, attempt {info.attempt}")
        info = _wait_job(client, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=60)
        say(f"4. {job_id} ended {info.status} (attempt {info.attempt}); its events:")
        for e in info.events:
            say(f"     {e.kind:<10} {e.message}")
        ok = info.status == "SUCCEEDED" and info.attempt == 1
        client.close()
    finally:
        say("5. Stopping everything the demo started ...")
        pids = down(data_dir)
        say(f"   stopped {len(pids)} process(es). {'Demo passed.' if ok else 'Demo FAILED.'}")
    return ok


def _wait_job(client: MasterClient, job_id: str, statuses: set[str], timeout: float = 30.0) -> api_pb2.JobInfo:
    deadline = time.monotonic() + timeout
    while True:
        info = client.get_job(job_id)
        if info.status in statuses or time.monotonic() > deadline:
            return info
        time.sleep(0.1)

