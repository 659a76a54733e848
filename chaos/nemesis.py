"""Faults (nemeses): small, bounded actions on the processes of a local cluster, by pid.

Each `inject(target, rng, history)` acts, waits out its own duration, heals what it broke (a
killed process is restarted, a paused one resumed), and records a `fault` line. Every nemesis has
a test showing it really acts (tests/cluster/test_nemesis.py).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from chaos.history import History
from synapse.client.master_client import ClientError, ClusterUnavailable, MasterClient
from synapse.local import cluster as local
from synapse.local.netns import MasterNet
from synapse.local.netns import unavailable as netns_unavailable
from synapse.proto import api_pb2
from synapse.worker import fence

#: kill-worker-under-gang and kill-agent-under-gang: the gang's tasks (each a whole node), and how
#: long they wait for the gang to run, for its node's loss to stop it, and for it to run again.
GANG_TASKS = 2
GANG_START_S = 20.0
#: (30 s, not 10: when other faults restart every master meanwhile, the new leader declares the
#: node DOWN only a heartbeat timeout after it leads; repaired before that, the node was never
#: lost to the scheduler, and the gang could rightly restart on it, against what this fault checks)
GANG_DOWN_S = 30.0
GANG_RESTART_S = 25.0
#: How long a repair waits for the node it brought back to be READY.
REPAIR_WAIT_S = 15.0


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
    #: set once the runner stops the cluster: a fault failing after that is no finding. (A fault
    #: that fails after the run's time is up, on a live cluster, is one: a grow-shrink that failed
    #: then used to leave a fourth member behind, silently.)
    tearing_down: threading.Event = field(default_factory=threading.Event)
    #: the masters the run started with (heal restores this membership); empty: not tracked
    initial_masters: list[dict] = field(default_factory=list)
    #: the history store's PostgreSQL server (synapse.local.postgres), when the run has one
    database: Any = None
    db_downtime: float = 4.0  #: how long a stopped database stays down
    gang_queue: str = ""  #: the queue the gang faults submit their gangs to ("": the default)
    #: kill-agent-under-gang: how long it watches, once the next attempt runs, that the earlier
    #: attempt's processes stay gone
    fence_watch: float = 2.0

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

    def attempt_processes(self, job: Any) -> dict[str, tuple[int, int]]:
        """The live shims of a running attempt's tasks on their nodes, as the nodes' fences read
        them: "JOB.ATTEMPT.INDEX on NODE (pid PID)" -> (pid, start ticks)."""
        return {f"{shim.task} on {node} (pid {shim.pid})": (shim.pid, shim.start_ticks)
                for node in sorted({task.node_id for task in job.tasks})
                for shim in fence.live_shims(self.data_dir / "workers" / node)
                if shim.key()[:2] == (job.id, job.attempt)}

    def _started(self, w: dict) -> list[dict]:
        """The tasks a worker's state file lists as started (with a handle)."""
        path = self.data_dir / "workers" / w["id"] / "worker-state.json"
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            return []
        return [t for t in state["tasks"] if t["handle"]]

    def worker_tasks(self, w: dict) -> list[tuple[list, int]]:
        """(task key, shim pid) of the tasks a worker's state file lists as started."""
        return [([t["assignment"]["job_id"], t["assignment"]["attempt"], t["assignment"]["index"]],
                 t["handle"]["pid"]) for t in self._started(w)]

    def worker_shims(self, w: dict) -> list[tuple[int, int]]:
        """(pid, start ticks) of the shims of the tasks a worker's state file lists as started."""
        return [(t["handle"]["pid"], t["handle"]["start_ticks"]) for t in self._started(w)]

    def wait_quorum(self, timeout: float) -> bool:
        """Wait until the leader is linked to every other member and each has caught up with its
        commit index; False if that did not happen within `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None:
                try:
                    s = self.client.replica_status(leader["api_address"], timeout=1)
                    if set(s.partners) <= set(s.connected) and all(
                            s.match_index.get(p, 0) >= s.commit_index - CAUGHT_UP_SLACK for p in s.partners):
                        return True
                except Exception:  # noqa: BLE001 - a leader in trouble: not yet
                    pass
            time.sleep(0.1)
        return False

    def wait_steady_leader(self, steady: float, timeout: float) -> bool:
        """Wait until one replica has led, in one term, for `steady` seconds as far as polling
        shows; False if that did not happen within `timeout`."""
        deadline = time.monotonic() + timeout
        seen, since = None, time.monotonic()
        while time.monotonic() < deadline:
            leader = self.leader()
            now = (leader["id"], self.term(leader)) if leader is not None else None
            if now != seen or now is None or now[1] < 0:
                seen, since = now, time.monotonic()
            elif time.monotonic() - since >= steady:
                return True
            time.sleep(0.1)
        return False

    def master_by_id(self, replica_id: str) -> dict:
        return next(m for m in self.state["masters"] if m["id"] == replica_id)

    def term(self, m: dict) -> int:
        try:
            return self.client.replica_status(m["api_address"], timeout=1).term
        except Exception:  # noqa: BLE001 - unreachable: no term to compare
            return -1

    # -- membership --

    def spare_ids(self) -> list[str]:
        """Ids of the masters the cluster may grow by (a namespace waits for each with netns)."""
        current = {m["id"] for m in self.state["masters"]}
        if self.state.get("netns"):
            return [r for r in MasterNet.from_dict(self.state["netns"]).replicas if r not in current]
        return [f"m{i}" for i in range(len(current) + 1, 6)]

    def members(self) -> list[str]:
        """The members as the leader knows them (itself and its partners), by Raft address."""
        leader = self.wait_leader()
        if leader is None:
            return []
        status = self.client.replica_status(leader["api_address"], timeout=2)
        return sorted([status.raft_address, *status.partners])

    def restore_members(self, expected: list[dict]) -> None:
        """Bring the membership back to `expected` (the masters the run started with) after a
        membership fault failed half-way: add back any that is missing (started empty), remove
        any other. Raises if it cannot (the run then fails on `members_ok`)."""
        ids = {m["id"] for m in expected}
        for m in expected:
            if m["id"] not in {p["id"] for p in self.state["masters"]}:
                self.add_master(m["id"], raft=m["raft_address"], api=m["api_address"],
                                http=m.get("http_address", ""))
        for m in [p for p in self.state["masters"] if p["id"] not in ids]:
            self.remove_master(m["id"])

    def _membership(self, method: str, request: Any, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.client.call(method, request)
                return
            except (ClientError, ClusterUnavailable) as exc:  # another change under way, or a failover
                if time.monotonic() > deadline or "cannot remove itself" in str(exc):
                    raise RuntimeError(f"{method} failed for {timeout:.0f} s: {exc}") from exc
                time.sleep(0.2)

    def _edit_config(self, edit: Callable[[list[dict]], list[dict]]) -> None:
        path = self.data_dir / "cluster.yaml"
        doc = yaml.safe_load(path.read_text())
        doc["replicas"] = edit(doc["replicas"])
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def add_master(self, replica_id: str, raft: str = "", api: str = "", http: str = "") -> None:
        """Add a replica to the membership, list it in the cluster file, start it, and wait until it
        has caught up with the leader (bounded)."""
        if not raft:
            slot = int(replica_id[1:]) - 1
            base = int(self.state["masters"][0]["api_address"].rsplit(":", 1)[1])
            host = (MasterNet.from_dict(self.state["netns"]).address(replica_id) if self.state.get("netns")
                    else "127.0.0.1")
            raft, api, http = f"{host}:{base + 100 + slot}", f"{host}:{base + slot}", f"{host}:{base + 200 + slot}"
        self._membership("AddReplica", api_pb2.MembershipRequest(id=replica_id, raft_address=raft, api_address=api))
        with self.restart_lock:
            self._edit_config(lambda rs: [*rs, {"id": replica_id, "raft": raft, "api": api, "http": http}])
            proc = {"id": replica_id, "api_address": api, "raft_address": raft, "http_address": http, "pid": 0,
                    "data_dir": str(self.data_dir / "masters" / replica_id)}
            self.state["masters"].append(proc)
            local.restart(self.data_dir, self.state, proc)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            leader = self.leader()
            try:
                mine = self.client.replica_status(api, timeout=1)
                if leader is not None and mine.applied_index >= self.client.replica_status(
                        leader["api_address"], timeout=1).commit_index - CAUGHT_UP_SLACK:
                    return
            except Exception:  # noqa: BLE001 - still starting
                pass
            time.sleep(0.2)
        raise RuntimeError(f"master {replica_id} did not catch up within 60 s: {self._catch_up_view(raft, api)}")

    def _catch_up_view(self, raft: str, api: str) -> str:
        """What the leader and the new replica say about its catch-up (for the fault's record)."""
        parts = []
        leader = self.leader()
        try:
            if leader is not None:
                s = self.client.replica_status(leader["api_address"], timeout=1)
                parts.append(f"leader {leader['id']} term {s.term} commit {s.commit_index} log_start {s.log_start} "
                             f"connected {raft in s.connected} match {s.match_index.get(raft)} "
                             f"next {s.next_index.get(raft)}")
            mine = self.client.replica_status(api, timeout=1)
            parts.append(f"new replica {mine.state} term {mine.term} commit {mine.commit_index} "
                         f"applied {mine.applied_index} log_start {mine.log_start} connected {list(mine.connected)}")
        except Exception as exc:  # noqa: BLE001 - a replica in trouble: say so
            parts.append(f"status unavailable: {exc}")
        return "; ".join(parts) or "no leader"

    def remove_master(self, replica_id: str, wipe: bool = False) -> None:
        """Remove a replica from the membership, stop it, take it out of the cluster file (and
        with `wipe`, delete its data, as a replaced machine would come back empty)."""
        proc = self.master_by_id(replica_id)
        request = api_pb2.MembershipRequest(id=replica_id, raft_address=proc["raft_address"])
        deadline = time.monotonic() + 60
        while True:
            leader = self.wait_leader()
            if leader is not None and leader["id"] == replica_id:  # a leader cannot remove itself:
                with self.restart_lock:  # stop it, so another leads (it is leaving anyway)
                    self.kill(proc, signal.SIGTERM)
                self.wait_leader(15)
            try:
                self._membership("RemoveReplica", request, timeout=max(1.0, deadline - time.monotonic()))
                break
            except RuntimeError as exc:  # the replica that answered as leader is the one to remove
                if "cannot remove itself" not in str(exc) or time.monotonic() > deadline:
                    raise
                with self.restart_lock:  # (another replica may still think it leads): stop it
                    self.kill(proc, signal.SIGTERM)
                self.wait_leader(15)
        with self.restart_lock:
            self.kill(proc, signal.SIGTERM)
            self.state["masters"].remove(proc)
            self._edit_config(lambda rs: [r for r in rs if r["id"] != replica_id])
            (self.data_dir / "cluster.json").write_text(json.dumps(self.state, indent=2))
        if wipe:
            shutil.rmtree(proc["data_dir"], ignore_errors=True)



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


def _leader_and_follower(t: Target, rng: random.Random) -> tuple[dict | None, dict | None, float]:
    """The leader, a live follower chosen by `rng` (None if there is no leader or no follower),
    and the fault's start time."""
    leader = t.wait_leader()
    followers = [m for m in t.state["masters"] if m is not leader and t.master_alive(m)]
    start = time.time()
    if leader is None or not followers:
        return leader, None, start
    return leader, rng.choice(followers), start


def partition_follower(t: Target, rng: random.Random, history: History) -> dict:
    """Cut a follower off from the other masters, heal it, and watch the leader for a while: with
    PreVote the follower's term stayed put, so its return must change no leader. See `judge_heal`.

    It first waits (bounded) until the leader is linked to every member, so that the cut leaves a
    majority: right after a master fault, a member still starting made the cut take the leader's
    majority away, and the leadership changed during the partition (17 of 101 in a long run),
    which is Raft doing its job, not the return of the follower. It also waits (bounded) for a
    leader that has held for a while: a cut 0.1 s into a leadership, just after a restart of every
    master, was followed by that leader's loss after the heal, though it held through the cut."""
    t.wait_steady_leader(STEADY_LEADER_S, WHOLE_QUORUM_WAIT_S)
    t.wait_quorum(WHOLE_QUORUM_WAIT_S)
    net = MasterNet.from_dict(t.state["netns"])
    leader, victim, start = _leader_and_follower(t, rng)
    if victim is None:
        return _record(history, "partition-follower", [], start, skipped="no leader or no follower")
    at_cut = (leader["id"], t.term(leader))
    net.isolate(victim["id"])
    try:
        time.sleep(t.partition)
        # Its API stays reachable (only master-to-master traffic is cut). Read before the rest's,
        # so an election among the rest that the follower hears of cannot look like one of its own.
        victim_term = t.term(victim)
        before = t.leader()  # the leadership the heal must leave alone
        at_heal = None if before is None else (before["id"], t.term(before))
    finally:
        net.heal(victim["id"])
    time.sleep(HEAL_WATCH_S)
    after = t.wait_leader(5)
    at_end = None if after is None else (after["id"], t.term(after))
    return _record(history, "partition-follower", [victim["id"]], start, seconds=t.partition,
                   **judge_heal(at_cut, at_heal, at_end, victim_term))


def judge_heal(at_cut: tuple[str, int], at_heal: tuple[str, int] | None, at_end: tuple[str, int] | None,
               victim_term: int) -> dict[str, bool]:
    """What a follower partition showed, from the leadership (replica id, term; -1 for a term that
    could not be read) when the follower was cut off, when it was healed and after the watch, and
    the follower's own term at the heal.

    * `victim_term_rose`: cut off, the follower's term went past the rest's: it ran elections of
      its own, which PreVote forbids (a pre-vote needs a majority it cannot reach). Judged on every
      cut.
    * `changed_during_cut` / `no_leader_at_heal`: the rest could not keep the leader of the cut
      through it (a member still slow from the fault before): the heal finds an election under
      way, not a steady leader to leave alone, and is not judged.
    * `leader_changed`: the leader that held through the whole cut lost its place after the heal."""
    heal_term = at_heal[1] if at_heal is not None else -1
    detail = {"victim_term_rose": victim_term > max(at_cut[1], heal_term) >= 0,
              "changed_during_cut": False, "no_leader_at_heal": False, "leader_changed": False}
    if at_heal is None:
        detail["no_leader_at_heal"] = True
    elif not _same_leadership(at_cut, at_heal):
        detail["changed_during_cut"] = True
    else:
        detail["leader_changed"] = at_end is None or not _same_leadership(at_heal, at_end)
    return detail


def _same_leadership(a: tuple[str, int], b: tuple[str, int]) -> bool:
    """Same replica, and the same term where both could be read."""
    return a[0] == b[0] and (a[1] < 0 or b[1] < 0 or a[1] == b[1])


def grow_and_shrink(t: Target, rng: random.Random, history: History) -> dict:
    """Grow the masters by two, one at a time (each new one started, then caught up), while the
    clients write, then remove the two again: the members at the end are the ones at the start."""
    start = time.time()
    spares = t.spare_ids()
    if len(t.state["masters"]) + len(spares) < 5 or len(t.state["masters"]) != 3:
        return _record(history, "grow-shrink", [], start, skipped="needs 3 masters and 2 spare slots")
    for replica_id in spares:
        t.add_master(replica_id)
    grown = len(t.members())
    time.sleep(t.downtime)
    for replica_id in reversed(spares):
        t.remove_master(replica_id)
    return _record(history, "grow-shrink", spares, start, grown_to=grown, members=t.members())


def replace_follower(t: Target, rng: random.Random, history: History) -> dict:
    """Replace a follower as an operator replaces a failed disk: remove it from the membership,
    stop it, wipe its data, add it back (same id and addresses) and start it empty."""
    _, victim, start = _leader_and_follower(t, rng)
    if victim is None:
        return _record(history, "replace-follower", [], start, skipped="no leader or no follower")
    t.remove_master(victim["id"], wipe=True)
    t.add_master(victim["id"], raft=victim["raft_address"], api=victim["api_address"],
                 http=victim.get("http_address", ""))
    return _record(history, "replace-follower", [victim["id"]], start, members=t.members())


def restart_masters(t: Target, rng: random.Random, history: History) -> dict:
    start = time.time()
    for m in t.state["masters"]:  # all at once, as a power cut or a rolling-restart mistake would
        if t.master_alive(m):
            os.kill(m["pid"], signal.SIGTERM)
    for m in t.state["masters"]:
        t.kill(m, signal.SIGTERM)  # waits (bounded) until it is gone
    for m in t.state["masters"]:
        t.restart_master(m)
    return _record(history, "restart-masters", [m["id"] for m in t.state["masters"]], start)


def _kill_machine(t: Target, w: dict, history: History) -> tuple[float, int]:
    """kill -9 a worker and its tasks, as a machine dying; each task is recorded lost. Returns the
    fault's start and how many tasks it took down."""
    tasks = t.worker_tasks(w)
    shims = t.worker_shims(w)
    start = time.time()
    t.kill(w)
    for pid, ticks in shims:  # only a shim that still runs: pids wrap, an ended task's may be another's
        fence.kill(fence.Shim("", pid, ticks), [])
    for key, _ in tasks:
        history.write("task", node=w["id"], job=key[0], attempt=key[1], index=key[2], event="lost", time=start,
                      code=None)
    return start, len(tasks)


def repair(t: Target, node_id: str, timeout: float = REPAIR_WAIT_S) -> bool:
    """A node this nemesis brought back is repaired: once READY, an uncordon lifts whatever cordon
    its loss left (a suspect's: gangs of two jobs lost there), as an operator does after replacing a
    machine, so a long run keeps its capacity. (Chaos runs drain nothing and run no health check:
    the only cordon a node gets during a run is a suspect's.) False if it was not READY in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            node = next((n for n in t.client.list_nodes() if n.id == node_id), None)
            if node is not None and node.status == "READY":
                if not node.schedulable:
                    t.client.call("SetSchedulable", api_pb2.SetSchedulableRequest(
                        node_id=node_id, schedulable=True, reason="chaos: machine repaired"))
                return True
        except (ClientError, ClusterUnavailable):
            pass
        time.sleep(0.2)
    return False


def kill_worker(t: Target, rng: random.Random, history: History, gpus: int = 8) -> dict:
    """A machine dies: kill -9 the worker and its tasks; it comes back after the downtime, repaired."""
    w = rng.choice(t.state["workers"])
    start, tasks = _kill_machine(t, w, history)
    time.sleep(t.downtime)
    t.restart_worker(w, gpus)
    return _record(history, "kill-worker", [w["id"]], start, tasks=tasks, repaired=repair(t, w["id"]))


def _gang_spec(gpus: int, queue: str) -> Any:
    from synapse.core.model import JobSpec, Resources

    # Whole nodes, above every workload priority: it starts (preempting if need be) and restarts at
    # the head of its queue.
    return JobSpec(name="gang-under-fault", tasks=GANG_TASKS, resources=Resources(500, 64 << 20, gpus),
                   command=("sleep", "120"), priority=10, max_restarts=5, queue=queue, grace=1.0)


def _job(t: Target, job_id: str) -> Any:
    try:
        return t.client.get_job(job_id)
    except (ClientError, ClusterUnavailable):
        return None


def _wait_job(t: Target, job_id: str, ready: Callable[[Any], bool], timeout: float) -> Any:
    """The job once `ready` holds for it (bounded), else None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = _job(t, job_id)
        if info is not None and ready(info):
            return info
        time.sleep(0.2)
    return None


def _under_gang(t: Target, rng: random.Random, history: History, kind: str, gpus: int,
                act: Callable[[Any, dict, dict[str, Any]], dict]) -> dict:
    """Submit a gang of whole nodes, wait until it runs, pick one of its nodes and return what
    `act(the running job, that node's worker, detail)` records; the gang is cancelled after. A
    gang that could not be submitted or did not start is recorded skipped."""
    from synapse.core import codec

    start = time.time()
    try:
        job_id = t.client.submit(codec.job_spec_to_proto(_gang_spec(gpus, t.gang_queue)))
    except (ClientError, ClusterUnavailable) as exc:
        return _record(history, kind, [], start, skipped=f"submit failed: {exc}")
    detail: dict[str, Any] = {"job": job_id, "tasks": GANG_TASKS}
    try:
        running = _wait_job(t, job_id, lambda j: j.status == "RUNNING", GANG_START_S)
        if running is None:
            return _record(history, kind, [], start, skipped="the gang did not start", **detail)
        node = rng.choice(sorted({task.node_id for task in running.tasks}))
        detail.update(attempt=running.attempt, node=node)
        return act(running, next(w for w in t.state["workers"] if w["id"] == node), detail)
    finally:
        try:
            t.client.cancel(job_id, reason="chaos: the fault is over")
        except (ClientError, ClusterUnavailable):
            pass  # a job left running ends when the run cancels nothing more: settle waits for it


def _wait_next_attempt(t: Target, running: Any, timeout: float, detail: dict[str, Any]) -> None:
    """Wait (bounded) until the gang runs again at a later attempt; say in `detail` whether it did,
    and at which attempt and on which nodes."""
    again = _wait_job(t, running.id, lambda j: j.attempt > running.attempt and j.status == "RUNNING", timeout)
    detail["restarted"] = again is not None
    if again is not None:
        detail.update(restarted_attempt=again.attempt, restarted_nodes=[task.node_id for task in again.tasks])


def kill_worker_under_gang(t: Target, rng: random.Random, history: History, gpus: int = 8) -> dict:
    """A machine dies under a running gang: submit a gang of whole nodes, wait until it runs,
    kill -9 the worker of one of its tasks (and its tasks), and, one time in two, kill -9 the leader
    once the node is declared DOWN (a failover during the restart). The node comes back (repaired)
    after it was declared DOWN; the gang must restart whole, never on the failed node. Records the
    attempts and nodes for the checker (checkers.gangs_under_fault); the gang is cancelled after."""

    def act(running: Any, w: dict, detail: dict[str, Any]) -> dict:
        start, detail["killed_tasks"] = _kill_machine(t, w, history)
        down = _wait_job(t, running.id, lambda j: j.attempt > running.attempt or j.status in ("PENDING", "STOPPING"),
                         GANG_DOWN_S)
        if down is not None and rng.random() < 0.5:
            leader = t.wait_leader(5)
            if leader is not None:
                t.kill(leader)
                detail["failover"] = leader["id"]
                time.sleep(t.downtime)
                t.restart_master(leader)
        t.restart_worker(w, gpus)
        detail["repaired"] = repair(t, w["id"])
        _wait_next_attempt(t, running, GANG_RESTART_S, detail)
        return _record(history, "kill-worker-under-gang", [w["id"]], start, **detail)

    return _under_gang(t, rng, history, "kill-worker-under-gang", gpus, act)


def kill_agent_under_gang(t: Target, rng: random.Random, history: History, gpus: int = 8) -> dict:
    """The agent of a node under a running gang dies alone (kill -9; its tasks keep their
    processes, as when the agent crashes or hangs) and stays down until the gang's next attempt
    runs on other nodes (bounded). Then, for `t.fence_watch` seconds, no process of the earlier
    attempt may be alive on any of its nodes: the lost node's fence must have killed its tasks
    before the leader started their ranks again. Records what it saw alive (`old_alive`, read by
    checkers.old_attempts_alive), brings the agent back, repaired; the gang is cancelled after."""

    def act(running: Any, w: dict, detail: dict[str, Any]) -> dict:
        old = t.attempt_processes(running)
        start = time.time()
        t.kill(w)  # the agent alone, by its pid: its tasks' process groups are left as they are
        detail["old_tasks"] = len(old)
        _wait_next_attempt(t, running, GANG_DOWN_S + GANG_RESTART_S, detail)
        detail["old_alive"] = alive_during(old, t.fence_watch)
        t.restart_worker(w, gpus)
        detail["repaired"] = repair(t, w["id"])
        return _record(history, "kill-agent-under-gang", [w["id"]], start, **detail)

    return _under_gang(t, rng, history, "kill-agent-under-gang", gpus, act)


def task_alive(pid: int, ticks: int) -> bool:
    """True while the task whose shim is (`pid`, start `ticks`) has a process: the shim itself, or
    any process of its process group (the shim's pid), as the node's fence sees them."""
    return fence.running(pid, ticks) or fence.group_alive(pid)


def alive_during(processes: dict[str, tuple[int, int]], seconds: float, every: float = 0.1) -> list[str]:
    """The tasks of `processes` (name -> shim pid and start ticks) seen alive at any of the samples
    taken every `every` seconds for `seconds`."""
    seen: set[str] = set()
    deadline = time.monotonic() + seconds
    while True:
        seen.update(name for name, (pid, ticks) in processes.items() if name not in seen and task_alive(pid, ticks))
        if time.monotonic() >= deadline:
            return sorted(seen)
        time.sleep(every)


def restart_worker(t: Target, rng: random.Random, history: History, gpus: int = 8) -> dict:
    """The agent alone crashes (kill -9) and restarts; its tasks keep running."""
    w = rng.choice(t.state["workers"])
    start = time.time()
    t.kill(w)
    time.sleep(t.downtime / 2)
    t.restart_worker(w, gpus)
    return _record(history, "restart-worker", [w["id"]], start)


def restart_database(t: Target, rng: random.Random, history: History) -> dict:
    """The history store's PostgreSQL stops (fast shutdown: connections cut) and starts again after
    a while; meanwhile finished jobs wait in the replicated state, and nothing may be lost or doubled."""
    start = time.time()
    if t.database is None:
        return _record(history, "restart-database", [], start, skipped="no PostgreSQL store in this run")
    t.database.stop()
    time.sleep(t.db_downtime * rng.uniform(0.5, 1.5))
    t.database.start()
    return _record(history, "restart-database", ["postgresql"], start)


NEMESES: dict[str, Nemesis] = {
    "kill-leader": kill_leader, "kill-follower": kill_follower, "kill-minority": kill_minority,
    "pause-leader": pause_leader, "partition-leader": partition_leader, "restart-masters": restart_masters,
    "kill-worker": kill_worker, "restart-worker": restart_worker, "kill-worker-under-gang": kill_worker_under_gang,
    "kill-agent-under-gang": kill_agent_under_gang,
    "partition-follower": partition_follower, "grow-shrink": grow_and_shrink, "replace-follower": replace_follower,
    "restart-database": restart_database,
}
#: Faults of the history store: a lane of their own (a database fails apart from masters and machines).
DATABASE_FAULTS = frozenset({"restart-database"})
#: Machine faults act on workers only, so they run in their own lane, concurrently with the master
#: faults (machines and masters fail independently); every other kind is a master fault.
MACHINE_FAULTS = frozenset({"kill-worker", "restart-worker", "kill-worker-under-gang", "kill-agent-under-gang"})
#: Machine faults under a gang of their own (GANG_TASKS whole nodes, in Target.gang_queue).
GANG_FAULTS = frozenset({"kill-worker-under-gang", "kill-agent-under-gang"})
#: Faults that need the masters in network namespaces (see synapse.netns).
NEEDS_NETNS = frozenset({"partition-leader", "partition-follower"})
#: Faults that change the membership: the runner leaves room (spare namespaces) for two more masters.
MEMBERSHIP_FAULTS = frozenset({"grow-shrink", "replace-follower"})
#: How long after healing a partitioned follower the leader is watched for a change.
HEAL_WATCH_S = 2.0
#: A replica this few log entries behind the leader's commit index counts as caught up (the
#: clients keep writing while it is checked).
CAUGHT_UP_SLACK = 50
#: How long a follower partition waits for the leader to be linked to every member first.
WHOLE_QUORUM_WAIT_S = 10.0
#: How long one replica must have led, in one term, before a follower partition cuts a follower
#: off (a few maximum election timeouts: the leader is no longer fresh from an election).
STEADY_LEADER_S = 3.0


def unavailable(kind: str) -> str:
    """'' if this machine can inject `kind`, else why not (a runner skips it with this message)."""
    if kind in DATABASE_FAULTS:
        from synapse.local.postgres import unavailable as postgres_unavailable

        return postgres_unavailable()
    return netns_unavailable() if kind in NEEDS_NETNS else ""
