"""Faults (nemeses): small, bounded actions on the processes of a local cluster, by pid.

Each `inject(target, rng, history)` acts, waits out its own duration, heals what it broke (a
killed process is restarted, a paused one resumed), and records a `fault` line. Every nemesis has
a test showing it really acts (tests/test_nemesis.py).
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.history import History
from synapse.client.master_client import MasterClient
from synapse.local import cluster as local
from synapse.local.netns import MasterNet
from synapse.local.netns import unavailable as netns_unavailable


@dataclass
class Target:
    """The cluster under test: its data dir, cluster.json state and a client."""

    data_dir: Path
    state: dict[str, Any]
    client: MasterClient
    downtime: float = 1.5  #: how long a killed process stays down
    pause: float = 2.0  #: how long a paused leader stays stopped (above the election timeout)
    partition: float = 3.0  #: how long an isolated leader stays cut off
    #: the master lane and the machine lane restart processes concurrently; cluster.json is shared
    restart_lock: threading.Lock = field(default_factory=threading.Lock)

    # -- processes --

    def master_alive(self, m: dict) -> bool:
        return local.is_ours(m["pid"], self.data_dir) and local.is_alive(m["pid"])

    def leader(self) -> dict | None:
        for m in self.state["masters"]:
            if not self.master_alive(m):
                continue
            try:
                if self.client.replica_status(m["api_address"], timeout=1).state == "leader":
                    return m
            except Exception:  # noqa: BLE001 - a replica in trouble: not the leader
                continue
        return None

    def wait_leader(self, timeout: float = 15.0) -> dict | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None:
                return leader
            time.sleep(0.05)
        return None

    def kill(self, proc: dict, sig: int = signal.SIGKILL) -> None:
        local.stop_process(self.data_dir, proc["pid"], sig)

    def restart_master(self, m: dict) -> None:
        with self.restart_lock:
            local.restart(self.data_dir, self.state, m)

    def restart_worker(self, w: dict, gpus: int) -> None:
        with self.restart_lock:
            local.restart(self.data_dir, self.state, w, gpus=gpus)

    def worker_tasks(self, w: dict) -> list[tuple[list, int]]:
        """(task key, shim pid) of the tasks a worker's state file lists as started."""
        path = self.data_dir / "workers" / w["id"] / "worker-state.json"
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            return []
        out = []
        for t in state["tasks"]:
            if t["handle"]:
                a = t["assignment"]
                out.append(([a["job_id"], a["attempt"], a["index"]], t["handle"]["pid"]))
        return out



Nemesis = Callable[[Target, random.Random, History], dict]


def _record(history: History, kind: str, targets: list[str], start: float, **detail: Any) -> dict:
    fault = {"kind": kind, "targets": targets, "start": start, "end": time.time(), "detail": detail}
    history.write("fault", **fault)
    return fault


def kill_leader(t: Target, rng: random.Random, history: History) -> dict:
    leader = t.wait_leader()
    start = time.time()
    if leader is None:
        return _record(history, "kill-leader", [], start, skipped="no leader")
    t.kill(leader)
    time.sleep(t.downtime)
    t.restart_master(leader)
    return _record(history, "kill-leader", [leader["id"]], start)


def kill_follower(t: Target, rng: random.Random, history: History) -> dict:
    leader = t.wait_leader()
    followers = [m for m in t.state["masters"] if m is not leader and t.master_alive(m)]
    start = time.time()
    if not followers:
        return _record(history, "kill-follower", [], start, skipped="no follower")
    victim = rng.choice(followers)
    t.kill(victim)
    time.sleep(t.downtime)
    t.restart_master(victim)
    return _record(history, "kill-follower", [victim["id"]], start)


def kill_minority(t: Target, rng: random.Random, history: History) -> dict:
    masters = [m for m in t.state["masters"] if t.master_alive(m)]
    victims = rng.sample(masters, k=min(len(masters), (len(t.state["masters"]) - 1) // 2))
    start = time.time()
    for m in victims:
        t.kill(m)
    time.sleep(t.downtime)
    for m in victims:
        t.restart_master(m)
    return _record(history, "kill-minority", [m["id"] for m in victims], start)


def pause_leader(t: Target, rng: random.Random, history: History) -> dict:
    leader = t.wait_leader()
    start = time.time()
    if leader is None:
        return _record(history, "pause-leader", [], start, skipped="no leader")
    os.kill(leader["pid"], signal.SIGSTOP)
    try:
        time.sleep(t.pause)
    finally:
        os.kill(leader["pid"], signal.SIGCONT)
    return _record(history, "pause-leader", [leader["id"]], start, seconds=t.pause)


def partition_leader(t: Target, rng: random.Random, history: History) -> dict:
    """Cut the leader off from the other masters (clients and workers still reach it), then heal.
    Needs a cluster started with masters in network namespaces (`local.up(netns=True)`)."""
    net = MasterNet.from_dict(t.state["netns"])
    leader = t.wait_leader()
    start = time.time()
    if leader is None:
        return _record(history, "partition-leader", [], start, skipped="no leader")
    net.isolate(leader["id"])
    try:
        time.sleep(t.partition)
    finally:
        net.heal(leader["id"])
    return _record(history, "partition-leader", [leader["id"]], start, seconds=t.partition)


def restart_masters(t: Target, rng: random.Random, history: History) -> dict:
    start = time.time()
    for m in t.state["masters"]:
        t.kill(m, signal.SIGTERM)
    for m in t.state["masters"]:
        t.restart_master(m)
    return _record(history, "restart-masters", [m["id"] for m in t.state["masters"]], start)


def kill_worker(t: Target, rng: random.Random, history: History, gpus: int = 8) -> dict:
    """A machine dies: kill -9 the worker and its tasks; it comes back after the downtime."""
    w = rng.choice(t.state["workers"])
    tasks = t.worker_tasks(w)
    start = time.time()
    t.kill(w)
    for _key, pid in tasks:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for key, _ in tasks:
        history.write("task", node=w["id"], job=key[0], attempt=key[1], index=key[2], event="lost", time=start,
                      code=None)
    time.sleep(t.downtime)
    t.restart_worker(w, gpus)
    return _record(history, "kill-worker", [w["id"]], start, tasks=len(tasks))


def restart_worker(t: Target, rng: random.Random, history: History, gpus: int = 8) -> dict:
    """The agent alone crashes (kill -9) and restarts; its tasks keep running."""
    w = rng.choice(t.state["workers"])
    start = time.time()
    t.kill(w)
    time.sleep(t.downtime / 2)
    t.restart_worker(w, gpus)
    return _record(history, "restart-worker", [w["id"]], start)


NEMESES: dict[str, Nemesis] = {
    "kill-leader": kill_leader, "kill-follower": kill_follower, "kill-minority": kill_minority,
    "pause-leader": pause_leader, "partition-leader": partition_leader, "restart-masters": restart_masters,
    "kill-worker": kill_worker, "restart-worker": restart_worker,
}
#: Machine faults act on workers only, so they run in their own lane, concurrently with the master
#: faults (machines and masters fail independently); every other kind is a master fault.
MACHINE_FAULTS = frozenset({"kill-worker", "restart-worker"})
#: Faults that need the masters in network namespaces (see synapse.netns).
NEEDS_NETNS = frozenset({"partition-leader"})


def unavailable(kind: str) -> str:
    """'' if this machine can inject `kind`, else why not (a runner skips it with this message)."""
    return netns_unavailable() if kind in NEEDS_NETNS else ""
