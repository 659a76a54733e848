"""Link shards at scale: many simulated workers against a real 3-replica local cluster.

    python bench/scale.py --nodes 3000          # a table
    python bench/scale.py --nodes 3000 --json   # the figures as one JSON object
    python bench/scale.py --quick               # CI: 60 nodes, 1 s heartbeats, short phases, same code path

Simulated workers are light (asyncio, all in this process, sharing a few channels per replica) but
speak the real protocol: each registers with a join token and keeps the node credential it gets,
heartbeats every 5 s to its link shard (synapse.core.shards: the replica a heartbeat's reply
names; its own rendezvous order over the master list while it has no answer), and holds a
WatchAssignments stream from that replica, moved when the shard changes (or answers again) and
reopened after a random pause of up to two heartbeat intervals when it breaks, as
synapse.worker.agent does. Reported:

(a) steady state: CPU of each replica over a window, minus its idle CPU before any node existed;
    per heartbeat (each replica's CPU over the heartbeats it absorbed) and per node; the leader's
    share. The load generator shares the 2 cores with the cluster: its own CPU is printed too.
    Then a second window of the same length with every watch stream closed (heartbeats alone):
    a replica's CPU per heartbeat without its streams, and the streams' share of its steady CPU
    (their keepalives: one message per node every WATCH_REFRESH_S). The difference of two windows
    on a shared machine: noisy at small sizes.
(b) dead-node detection: a few nodes stop; from each one's last answered heartbeat to DOWN in the
    leader's state (polled every 0.5 s, so +-0.5 s).
(c) kill -9 of a follower, then (after it is restarted and caught up) of the leader: the time until
    every live worker has had a heartbeat answered and a watch message from a live replica after
    the kill, how many moved, and false NodeDowns (a live node DOWN at any point after the kill).
(d) on the pure state, before the cluster starts (no sockets: the leader brain's own round, as
    bench/workflows.py measures it): --state-nodes nodes (20,000 by default), every one busy, and
    1,000 pending 64 x 8 gangs: the scheduling round's p50 / p99, the state's snapshot size, and
    the time to write and to read that snapshot.
Targets (issue 26, at 20,000 nodes, 5 s heartbeats): the leader's liveness work <= 0.10 core, each
follower <= 0.5; DOWN within 20 s p99; all workers re-attached within 30 s of a leader kill, no false
DOWN. The per-node costs measured here say what 20,000 nodes need (printed at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc  # noqa: E402
from support.elections import Elections  # noqa: E402
from support.measure import cpu_seconds, percentile  # noqa: E402
from workflows import fill, job_spec, new_state, round_times  # noqa: E402

from synapse.client.master_client import MasterClient  # noqa: E402
from synapse.common import beats  # noqa: E402
from synapse.common.auth import node_metadata  # noqa: E402
from synapse.core import commands as c  # noqa: E402
from synapse.core.brain.leader_state import LeaderState  # noqa: E402
from synapse.core.brain.stimuli import RoundDue  # noqa: E402
from synapse.core.shards import ranked  # noqa: E402
from synapse.core.state.fsm import ClusterState  # noqa: E402
from synapse.local import cluster as local  # noqa: E402
from synapse.master.beats import beat_socket  # noqa: E402
from synapse.proto import api_pb2, api_pb2_grpc, types_pb2  # noqa: E402

HEARTBEAT_S = 5.0  #: the workers' heartbeat interval (--heartbeat; --quick runs at 1 s)
#: Simulated workers per channel (one HTTP/2 connection carries that many heartbeats and streams).
NODES_PER_CHANNEL = 500
TRY_S = 1.5  #: a heartbeat try's budget, as the worker's client


class SimNode:
    """One simulated worker: its credential, its shard, and when it last heard from the masters."""

    def __init__(self, index: int, addresses: list[str]) -> None:
        self.index = index
        self.id = f"sim-{index:05d}"
        self.addresses = addresses
        self.metadata: tuple[tuple[str, str], ...] = ()
        self.replicas = ranked(self.id, addresses)  #: where heartbeats go, in order (replies correct it)
        self.shard_moved = asyncio.Event()
        self.known = (0, 0)  #: newest (term, version) of assignments seen
        self.beat_ok = 0.0  #: monotonic time of the last answered heartbeat
        self.beat_by = ""  #: the replica that answered it
        self.watch_ok = 0.0  #: monotonic time of the last watch message
        self.watch_by = ""  #: the replica the stream is open on
        self.moves = 0  #: times its shard changed
        self.credential = ""  #: from RegisterNode: keys its heartbeat datagrams
        self.alive = True  #: False once the benchmark stops it (dead-node detection)

    @property
    def shard(self) -> str:
        return self.replicas[0]

    def order(self) -> list[str]:
        return self.replicas + [a for a in self.addresses if a not in self.replicas]


class _Replies(asyncio.DatagramProtocol):
    """The simulated nodes' heartbeat datagrams' answers, each to the heartbeat that waits for it."""

    def __init__(self) -> None:
        self.waiting: dict[int, tuple[bytes, asyncio.Future]] = {}  #: seq -> (key, its answer)

    def expect(self, seq: int, key: bytes) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.waiting[seq] = (key, future)
        return future

    def datagram_received(self, data: bytes, addr: Any) -> None:
        try:
            reply = api_pb2.HeartbeatReply.FromString(beats.body_of(data))
        except Exception:  # noqa: BLE001 - not an answer
            return
        key, future = self.waiting.get(reply.seq, (b"", None))
        if future is not None and not future.done() and beats.authentic(key, beats.REPLY, data):
            future.set_result(reply)


class Sim:
    """Every simulated worker's loops, and what they counted."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses
        self.channels: dict[str, list[grpc.aio.Channel]] = {}
        self.nodes: list[SimNode] = []
        self.absorbed: dict[str, int] = {a: 0 for a in addresses}  #: heartbeats answered, per replica
        self.failed_beats = 0
        self.tasks: dict[str, list[asyncio.Task | None]] = {}  #: node id -> [heartbeats, watch (None: paused)]
        #: heartbeats by datagram first, as workers send them (synapse.worker.beats), or by call only
        self.datagrams = True
        self.by_datagram = 0  #: heartbeats answered by datagram
        self._udp: Any = None  #: (transport, protocol) shared by every simulated node
        self._seq = 0

    def stub(self, address: str, node: SimNode) -> api_pb2_grpc.MasterStub:
        pool = self.channels.setdefault(address, [])
        slot = node.index // NODES_PER_CHANNEL
        while len(pool) <= slot:
            pool.append(grpc.aio.insecure_channel(address, options=[("grpc.enable_retries", 0)]))
        return api_pb2_grpc.MasterStub(pool[slot])

    async def register(self, count: int, join_token: str) -> float:
        """Register `count` nodes with the join token (100 at a time, at the leader); seconds taken."""
        leader = MasterClient(self.addresses, join_token)
        started = time.monotonic()
        cap = types_pb2.Resources(cpu_millis=64000, memory_bytes=512 << 30, gpu=8)
        self.nodes = [SimNode(i, self.addresses) for i in range(count)]

        def one(node: SimNode) -> None:
            reply = leader.call("RegisterNode", api_pb2.RegisterNodeRequest(
                node_id=node.id, address=f"{node.id}.invalid:1", topology=[f"simrack{node.index // 32}"],
                capacity=cap), deadline=60.0)
            node.metadata = node_metadata(node.id, reply.node_credential)
            node.credential = reply.node_credential

        for start in range(0, count, 100):
            await asyncio.gather(*(asyncio.to_thread(one, n) for n in self.nodes[start:start + 100]))
        leader.close()
        return time.monotonic() - started

    def start(self) -> None:
        for node in self.nodes:
            self.tasks[node.id] = [asyncio.create_task(self.heartbeats(node)), asyncio.create_task(self.watch(node))]

    def pause_watches(self) -> None:
        """Close every watch stream (heartbeats go on)."""
        for tasks in self.tasks.values():
            tasks.pop().cancel()
            tasks.append(None)

    def resume_watches(self) -> None:
        for node in self.nodes:
            tasks = self.tasks.get(node.id)
            if tasks is not None and tasks[-1] is None:
                tasks[-1] = asyncio.create_task(self.watch(node))

    def stop_node(self, node: SimNode) -> None:
        node.alive = False
        for task in self.tasks.pop(node.id, []):
            if task is not None:
                task.cancel()

    async def heartbeats(self, node: SimNode) -> None:
        await asyncio.sleep(random.uniform(0, HEARTBEAT_S))
        while True:
            sent = time.monotonic()
            for address in node.order():
                try:
                    reply = await self.beat(node, address)
                except grpc.aio.AioRpcError:
                    self.failed_beats += 1
                    continue
                node.beat_ok, node.beat_by = time.monotonic(), address
                self.absorbed[address] += 1
                if reply.order and list(reply.order) != node.replicas:
                    if reply.order[0] != node.shard:
                        node.moves += 1
                        node.shard_moved.set()
                    node.replicas = list(reply.order)
                if address == node.shard != node.watch_by:
                    node.shard_moved.set()  # the shard answers again (restarted): the stream goes back to it
                break
            await asyncio.sleep(max(0.0, HEARTBEAT_S - (time.monotonic() - sent)))

    async def beat(self, node: SimNode, address: str) -> api_pb2.HeartbeatReply:
        """One heartbeat to `address`: by datagram first to the shard, as synapse.worker.beats sends
        it, then (no good answer within beats.WAIT_S, or `datagrams` off) by call."""
        request = api_pb2.HeartbeatRequest(node_id=node.id)
        if self.datagrams and address == node.shard:
            if self._udp is None:
                # One socket takes every simulated node's answers: it gets a replica's buffer
                self._udp = await asyncio.get_running_loop().create_datagram_endpoint(
                    _Replies, sock=beat_socket("127.0.0.1", 0))
            transport, replies = self._udp
            self._seq = request.seq = max(self._seq + 1, time.time_ns())
            key = beats.key_of(node.credential)
            answer = replies.expect(request.seq, key)
            host, _, port = address.rpartition(":")
            transport.sendto(beats.seal(key, beats.REQUEST, request.SerializeToString()), (host, int(port)))
            try:
                reply = await asyncio.wait_for(answer, beats.WAIT_S)
                if not reply.refused:
                    self.by_datagram += 1
                    return reply
            except TimeoutError:
                pass
            finally:
                replies.waiting.pop(request.seq, None)
        return await self.stub(address, node).Heartbeat(request, metadata=node.metadata, timeout=TRY_S)

    async def watch(self, node: SimNode) -> None:
        delivered = False
        while True:
            for address in node.order():
                if delivered:  # a stream that broke after delivering: reopen after a jittered pause
                    delivered = False
                    await asyncio.sleep(random.uniform(0, 2 * HEARTBEAT_S))
                node.shard_moved.clear()
                call = self.stub(address, node).WatchAssignments(api_pb2.WatchAssignmentsRequest(
                    node_id=node.id, known_term=node.known[0], known_version=node.known[1]), metadata=node.metadata)
                try:
                    async for message in call:
                        node.known = max(node.known, (message.term, message.version))
                        node.watch_ok, node.watch_by = time.monotonic(), address
                        delivered = True
                        if node.shard_moved.is_set():
                            call.cancel()
                            break
                except grpc.aio.AioRpcError:
                    pass
                if node.shard_moved.is_set() and delivered:
                    delivered = False  # moving to the new shard is no failure: no pause
                    break
            else:
                await asyncio.sleep(0.2)  # a whole round failed

    async def close(self) -> None:
        if self._udp is not None:
            self._udp[0].close()
        for tasks in self.tasks.values():
            for task in tasks:
                if task is not None:
                    task.cancel()
        await asyncio.sleep(0.1)
        for pool in self.channels.values():
            for channel in pool:
                await channel.close()


def scheduling_at_size(nodes: int, gangs: int, rounds: int, limits: bool = False) -> dict:
    """(d): rounds over a full cluster of `nodes` with `gangs` pending 64 x 8 gangs; the estimate walk
    after each (what the first read of estimated starts costs the leader); the snapshot. `limits`:
    every running task and gang has a time limit (1-8 h; the gangs 1 h), so the walk has ends to
    plan by (without, every estimate is unknown at once)."""
    state = new_state(racks=max(1, nodes // 32), nodes_per_rack=32)
    fill(state, at=1.0, limits=(3600.0, 7200.0, 14400.0, 28800.0) if limits else ())
    for i in range(gangs):
        spec = dataclasses.replace(job_spec(f"gang{i}", time_limit=3600.0 if limits else 0.0), tasks=64)
        assert state.apply(c.SubmitJob(at=2.0, job_id=f"gang{i}", request_id=f"gang{i}", spec=spec)).ok
    times, cpu = round_times(state, rounds, at=3.0)
    brain, walks = LeaderState(), []
    for i in range(rounds):
        brain.handle(state, RoundDue(at=3.0 + i))
        started = time.thread_time()
        brain.estimates(state, 3.0 + i)
        walks.append(time.thread_time() - started)
    started = time.perf_counter()
    text = json.dumps(state.to_snapshot())
    written = time.perf_counter() - started
    started = time.perf_counter()
    ClusterState.from_snapshot(json.loads(text))
    read = time.perf_counter() - started
    return {"nodes": len(state.nodes), "pending_gangs": gangs, "rounds": rounds,
            "round_p50_s": round(statistics.median(times), 4), "round_p99_s": round(percentile(times, 0.99), 4),
            "round_cpu_p99_s": round(percentile(cpu, 0.99), 4), "round_cpu_p50_s": round(statistics.median(cpu), 4),
            "estimate_walk_cpu_p50_s": round(statistics.median(walks), 4), "limits": limits,
            "snapshot_mb": round(len(text) / 1e6, 2), "snapshot_write_s": round(written, 3),
            "snapshot_read_s": round(read, 3)}


def statuses(client: MasterClient) -> dict[str, str]:
    return {n.id: n.status for n in client.list_nodes()}


async def settle(sim: Sim, seconds: float) -> None:
    """Wait, then until every node's shard and stream agree (the map has settled)."""
    await asyncio.sleep(seconds)
    end = time.monotonic() + 4 * HEARTBEAT_S
    while time.monotonic() < end and any(n.watch_by != n.shard or n.beat_by != n.shard for n in sim.nodes if n.alive):
        await asyncio.sleep(0.5)


async def kill_and_reattach(state: dict, data_dir: Path, sim: Sim, client: MasterClient, victim: dict,
                            limit: float) -> dict:
    """kill -9 one replica; the time until every live node heard a heartbeat answer and got a watch
    message from a live replica, and the live nodes DOWN at any point meanwhile."""
    moves_before = sum(n.moves for n in sim.nodes)
    killed_at = time.monotonic()
    local.stop_process(data_dir, victim["pid"])
    live = [n for n in sim.nodes if n.alive]
    false_down: set[str] = set()
    done_at = None
    while time.monotonic() - killed_at < limit:
        await asyncio.sleep(0.5)
        try:
            seen = await asyncio.to_thread(statuses, client)
            false_down |= {n.id for n in live if seen.get(n.id) == "DOWN"}
        except Exception:  # noqa: BLE001 - no leader for a moment (the leader's kill)
            pass
        gone = victim["api_address"]
        if done_at is None and all(n.beat_ok > killed_at and n.watch_ok > killed_at and n.beat_by != gone
                                   and n.watch_by != gone for n in live):
            done_at = time.monotonic()
        if done_at is not None and time.monotonic() - done_at > HEARTBEAT_S:
            break  # and a heartbeat's worth more, to see no NodeDown follow
    return {"reattached_s": round(done_at - killed_at, 2) if done_at else None,
            "moved": sum(n.moves for n in sim.nodes) - moves_before, "false_node_downs": len(false_down)}


async def run(args: argparse.Namespace, state: dict, data_dir: Path) -> dict:
    addresses = [m["api_address"] for m in state["masters"]]
    client = MasterClient(addresses, state["token"], deadline=30.0)
    await asyncio.to_thread(client.list_nodes)
    elections = Elections(state)
    pids = {m["id"]: m["pid"] for m in state["masters"]}
    t0, idle0 = time.monotonic(), {r: cpu_seconds(p) for r, p in pids.items()}
    await asyncio.sleep(args.idle)
    idle = {r: (cpu_seconds(p) - idle0[r]) / (time.monotonic() - t0) for r, p in pids.items()}

    sim = Sim(addresses)
    sim.datagrams = not args.calls
    join_token = (data_dir / "secrets" / local.JOIN_TOKEN_FILE).read_text().strip()
    registered_s = await sim.register(args.nodes, join_token)
    sim.start()
    await settle(sim, 2 * HEARTBEAT_S)
    leader_api = client.leader or await asyncio.to_thread(lambda: (client.list_nodes(), client.leader)[1])
    role = {m["id"]: "leader" if m["api_address"] == leader_api else "follower" for m in state["masters"]}

    # (a) steady state
    with elections.phase("steady state"):
        before = {r: cpu_seconds(p) for r, p in pids.items()}
        absorbed0, me0, start = dict(sim.absorbed), cpu_seconds_self(), time.monotonic()
        await asyncio.sleep(args.window)
        span = time.monotonic() - start
        cpu = {r: (cpu_seconds(p) - before[r]) / span for r, p in pids.items()}
        load_gen = (cpu_seconds_self() - me0) / span
    api = {m["id"]: m["api_address"] for m in state["masters"]}
    beats = {r: sim.absorbed[api[r]] - absorbed0[api[r]] for r in pids}
    held = {r: sum(1 for n in sim.nodes if n.shard == api[r]) for r in pids}
    replicas = {r: {"role": role[r], "cpu_cores": round(cpu[r], 3), "idle_cores": round(idle[r], 3),
                    "nodes": held[r], "heartbeats_per_s": round(beats[r] / span, 1),
                    "us_per_heartbeat": round(1e6 * (cpu[r] - idle[r]) * span / beats[r], 1) if beats[r] else None,
                    "ms_per_s_per_1000_nodes":
                        round(1e6 * (cpu[r] - idle[r]) / max(1, held[r]), 2) if held[r] else None}
                for r in pids}
    leader_id = next(r for r in pids if role[r] == "leader")
    followers = [r for r in pids if role[r] == "follower"]
    leader_marginal = max(0.0, cpu[leader_id] - idle[leader_id])
    follower_per_node = statistics.mean(max(0.0, cpu[r] - idle[r]) / max(1, held[r]) for r in followers)

    # (a) again, heartbeats alone: what the watch streams' keepalives cost
    sim.pause_watches()
    await asyncio.sleep(1.0)  # the streams' ends are handled
    with elections.phase("heartbeats alone"):
        span_alone, alone, beats_alone = await _window(sim, pids, api, args.window)
    # ... and once more with every heartbeat by call (as workers sent them before datagrams): the
    # baseline, measured in the same run
    sim.datagrams = False
    await asyncio.sleep(HEARTBEAT_S)  # every node has sent one by call
    with elections.phase("heartbeats alone, by call"):
        span_calls, by_call, beats_by_call = await _window(sim, pids, api, args.window)
    sim.datagrams = not args.calls
    sim.resume_watches()
    for r, x in replicas.items():
        above, above_alone = cpu[r] - idle[r], alone[r] - idle[r]
        x["us_per_heartbeat_alone"] = round(1e6 * above_alone * span_alone / beats_alone[r], 1) \
            if beats_alone[r] else None
        x["us_per_heartbeat_by_call_alone"] = round(1e6 * (by_call[r] - idle[r]) * span_calls / beats_by_call[r], 1) \
            if beats_by_call[r] else None
        # not clamped: a negative share is the noise of two windows on a shared machine, shown as such
        x["watch_share"] = round(1 - above_alone / above, 3) if above > 0 and beats[r] else None
    await settle(sim, 2 * HEARTBEAT_S)

    # (b) dead-node detection
    victims = random.sample([n for n in sim.nodes], k=min(args.dead, len(sim.nodes)))
    last_beat = {n.id: n.beat_ok for n in victims}
    for n in victims:
        sim.stop_node(n)
        last_beat[n.id] = n.beat_ok
    detected: dict[str, float] = {}
    limit = time.monotonic() + 60
    while len(detected) < len(victims) and time.monotonic() < limit:
        await asyncio.sleep(0.5)
        seen = await asyncio.to_thread(statuses, client)
        now = time.monotonic()
        for n in victims:
            if n.id not in detected and seen.get(n.id) == "DOWN":
                detected[n.id] = now - last_beat[n.id]
    live_down = sum(1 for n in sim.nodes if n.alive and seen.get(n.id) == "DOWN")

    # (c) kill -9 of a follower, restart it, then kill -9 of the leader
    follower = next(m for m in state["masters"] if m["id"] == followers[0])
    follower_kill = await kill_and_reattach(state, data_dir, sim, client, follower, args.fault_limit)
    await asyncio.to_thread(local.restart, data_dir, state, follower)
    await settle(sim, 3 * HEARTBEAT_S)
    leader = next(m for m in state["masters"] if m["id"] == leader_id)
    leader_kill = await kill_and_reattach(state, data_dir, sim, client, leader, args.fault_limit)
    await sim.close()
    client.close()
    elections.client.close()
    per_node_follower_us = 1e6 * follower_per_node
    report = {
        "nodes": args.nodes, "heartbeat_s": HEARTBEAT_S, "register_s": round(registered_s, 2),
        "window_s": round(span, 1), "replicas": replicas, "load_generator_cores": round(load_gen, 3),
        "leader_marginal_cores": round(leader_marginal, 3),
        "leader_share_of_cluster_marginal": round(leader_marginal / max(1e-9, sum(
            max(0.0, cpu[r] - idle[r]) for r in pids)), 3),
        "follower_us_per_node_per_s": round(per_node_follower_us, 2),
        # issue 47's figure: a follower's CPU per heartbeat in steady state (watch streams and digests
        # included), the median over followers; then heartbeats alone by datagram, and by call (the
        # baseline, same run), and the share of heartbeats the datagrams carried
        "follower_us_per_heartbeat": _median_of(replicas, followers, "us_per_heartbeat"),
        "follower_us_per_heartbeat_alone": _median_of(replicas, followers, "us_per_heartbeat_alone"),
        "follower_us_per_heartbeat_by_call_alone": _median_of(replicas, followers, "us_per_heartbeat_by_call_alone"),
        "datagram_share": round(sim.by_datagram / max(1, sum(sim.absorbed.values())), 3),
        "dead_node_detect_s": {"count": len(detected), "of": len(victims),
                               "p50": round(statistics.median(detected.values()), 2) if detected else None,
                               "max": round(max(detected.values()), 2) if detected else None,
                               "p99": round(percentile(list(detected.values()), 0.99), 2) if detected else None},
        "live_nodes_down_after_detection": live_down,
        "kill_follower": follower_kill, "kill_leader": leader_kill,
        "at_20000_nodes": {
            "leader_cores_if_linear": round(leader_marginal * 20000 / args.nodes, 3),
            "per_follower_cores_3_replicas": round(per_node_follower_us * 1e-6 * 10000, 3),
            "per_follower_cores_5_replicas": round(per_node_follower_us * 1e-6 * 5000, 3)},
        "fault_free_elections": elections.fault_free(),
    }
    return report


async def _window(sim: Sim, pids: dict[str, int], api: dict[str, str],
                  seconds: float) -> tuple[float, dict[str, float], dict[str, int]]:
    """(its length, each replica's cores over it, the heartbeats each absorbed in it)"""
    before = {r: cpu_seconds(p) for r, p in pids.items()}
    absorbed0, start = dict(sim.absorbed), time.monotonic()
    await asyncio.sleep(seconds)
    span = time.monotonic() - start
    return (span, {r: (cpu_seconds(p) - before[r]) / span for r, p in pids.items()},
            {r: sim.absorbed[api[r]] - absorbed0[api[r]] for r in pids})


def _median_of(replicas: dict, which: list[str], key: str) -> float | None:
    values = [replicas[r][key] for r in which if replicas[r][key] is not None]
    return round(statistics.median(values), 1) if values else None


def cpu_seconds_self() -> float:
    import os

    return cpu_seconds(os.getpid())


def main() -> None:
    global HEARTBEAT_S
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--window", type=float, default=30.0, help="steady-state window, seconds")
    parser.add_argument("--idle", type=float, default=5.0, help="idle window before any node, seconds")
    parser.add_argument("--dead", type=int, default=5, help="nodes stopped for dead-node detection")
    parser.add_argument("--fault-limit", type=float, default=60.0, help="longest wait after a kill -9")
    parser.add_argument("--heartbeat", type=float, default=HEARTBEAT_S, help="heartbeat interval, seconds")
    parser.add_argument("--state-nodes", type=int, default=20000, help="(d): nodes of the pure state")
    parser.add_argument("--rounds", type=int, default=20, help="(d): scheduling rounds timed")
    parser.add_argument("--state-limits", action="store_true",
                        help="(d): running tasks and gangs with time limits (the estimate walk plans by them)")
    parser.add_argument("--keep", default="", help="run the cluster in this directory and keep its logs")
    parser.add_argument("--calls", action="store_true",
                        help="every heartbeat by call, none by datagram (as workers sent them before datagrams)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="60 nodes, short windows: the code path, not figures")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.window, args.idle, args.dead, args.fault_limit, args.heartbeat = 60, 3.0, 1.0, 2, 30.0, 1.0
        args.state_nodes, args.rounds = 640, 3
    HEARTBEAT_S = args.heartbeat
    scheduling = scheduling_at_size(args.state_nodes, 1000 if not args.quick else 50, args.rounds, args.state_limits)
    with tempfile.TemporaryDirectory(prefix="synapse-bench-scale-") as tmp:
        data_dir = Path(args.keep or tmp) / "cluster"
        # 5 s heartbeats (timeout 15 s), as the issue's targets; history off: liveness only. Plaintext
        # (the one bench that is): its thousands of simulated nodes share a few connections, and with
        # TLS each node's calls must come over a connection with a certificate issued to that node.
        # What TLS costs is measured in bench/ha.py, both modes in one run.
        state = local.up(data_dir, 3, 0, 1, 8, local.free_base_port(3), heartbeat=args.heartbeat, history="none",
                         tls=False)
        try:
            report = asyncio.run(run(args, state, data_dir))
        finally:
            local.down(data_dir)
    report["scheduling"] = scheduling
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)
    if report["fault_free_elections"]:
        print("FAIL: the leader changed in the steady-state window with no fault injected", file=sys.stderr)
        sys.exit(1)
    bad = report["kill_leader"]["false_node_downs"] + report["kill_follower"]["false_node_downs"] + \
        report["live_nodes_down_after_detection"]
    if bad or None in (report["kill_leader"]["reattached_s"], report["kill_follower"]["reattached_s"]):
        print("FAIL: false NodeDowns, or workers that never re-attached", file=sys.stderr)
        sys.exit(1)


def print_table(r: dict) -> None:
    print(f"{r['nodes']} simulated nodes, {r['heartbeat_s']:.0f} s heartbeats, 3 replicas (registered in "
          f"{r['register_s']} s with a join token); steady window {r['window_s']} s")
    print(f"{'replica':8} {'role':9} {'cores':>6} {'idle':>6} {'nodes':>6} {'hb/s':>7} {'us/hb':>7} "
          f"{'ms/s per 1k nodes':>18} {'us/hb, no watches':>18} {'watch share':>11}")
    for rid, x in sorted(r["replicas"].items()):
        share = f"{100 * x['watch_share']:.0f} %" if x["watch_share"] is not None else "-"
        print(f"{rid:8} {x['role']:9} {x['cpu_cores']:6.3f} {x['idle_cores']:6.3f} {x['nodes']:6d} "
              f"{x['heartbeats_per_s']:7.1f} {x['us_per_heartbeat'] or 0:7.1f} "
              f"{x['ms_per_s_per_1000_nodes'] or 0:18.2f} {x['us_per_heartbeat_alone'] or 0:18.1f} {share:>11}")
    print(f"a follower's CPU per heartbeat (median over followers): {r['follower_us_per_heartbeat']} us in steady "
          f"state; heartbeats alone {r['follower_us_per_heartbeat_alone']} us by datagram, "
          f"{r['follower_us_per_heartbeat_by_call_alone']} us by call (the baseline, same run); "
          f"{100 * r['datagram_share']:.0f} % of all heartbeats answered by datagram")
    print(f"load generator (this process): {r['load_generator_cores']} cores; leader's marginal "
          f"{r['leader_marginal_cores']} cores = {100 * r['leader_share_of_cluster_marginal']:.0f} % of the cluster's")
    d = r["dead_node_detect_s"]
    print(f"dead node -> DOWN: {d['count']}/{d['of']} detected, p50 {d['p50']} s, p99 {d['p99']} s, max {d['max']} s; "
          f"live nodes DOWN: {r['live_nodes_down_after_detection']}")
    for name in ("kill_follower", "kill_leader"):
        k = r[name]
        print(f"kill -9 {name[5:]}: every live worker answered and watching again after {k['reattached_s']} s, "
              f"{k['moved']} shard moves, {k['false_node_downs']} false NodeDowns")
    d = r["scheduling"]
    print(f"pure state, {d['nodes']} busy nodes, {d['pending_gangs']} pending 64 x 8 gangs: round p50 "
          f"{d['round_p50_s']} s, p99 {d['round_p99_s']} s ({d['rounds']} rounds), estimate walk after it "
          f"{d['estimate_walk_cpu_p50_s']} s CPU; snapshot {d['snapshot_mb']} MB, "
          f"written in {d['snapshot_write_s']} s, read in {d['snapshot_read_s']} s")
    z = r["at_20000_nodes"]
    print(f"at 20,000 nodes (linear in the per-node costs above): leader {z['leader_cores_if_linear']} cores; "
          f"each follower {z['per_follower_cores_3_replicas']} cores with 3 replicas, "
          f"{z['per_follower_cores_5_replicas']} with 5")


if __name__ == "__main__":
    main()
