"""One master replica: the Raft node, the gRPC API, and the leader-only loops when it leads.

    synapse-master --config cluster.yaml --id m1

Threads: pysyncobj's tick thread applies commands; everything else runs on one asyncio loop (the
gRPC server, the leader loops, the assignment watchers). The tick thread only ever hands work to
the loop with `call_soon_threadsafe`, so it is never blocked by us, and no synchronous replicated
call is ever made from it.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import logging
import signal
import sys
import time
import uuid
from pathlib import Path

import grpc

from synapse import commands as c
from synapse.auth import TokenInterceptor
from synapse.config import ClusterConfig, ConfigError, load_cluster_config
from synapse.durability import check_journal, free_bytes
from synapse.heartbeat import HeartbeatTracker
from synapse.logs import configure
from synapse.raft import RaftNode, RaftTimeouts, raft_config
from synapse.tls import generate, server_credentials

log = logging.getLogger(__name__)

#: How long a replica with no known leader holds a request before answering UNAVAILABLE: a little
#: over the longest election timeout. An election normally ends within it; a replica still without
#: a leader may be cut off from its peers, and the client does better trying the others.
LEADER_WAIT_S = 1.2
#: gRPC message size limit, both ways: a job spec or a node's assignments fit well inside it.
MAX_MESSAGE_BYTES = 4 << 20
#: How often leadership is checked (pysyncobj has no reliable cross-thread notification).
LEADERSHIP_POLL_S = 0.02
#: How often the replica checks its stored data and its disk.
WATCHDOG_S = 0.5
#: Exit status of a replica that stopped because its data is corrupt or its disk is full.
EXIT_STORAGE = 3


class Master:
    """The state of one replica process that is not replicated: leadership, watchers, loops."""

    def __init__(self, config: ClusterConfig, replica_id: str, raft: RaftNode) -> None:
        self.config = config
        self.replica = config.replica(replica_id)
        self.raft = raft
        self.heartbeats = HeartbeatTracker(config.heartbeat_timeout)  #: leader only; reset on election
        self.loop: asyncio.AbstractEventLoop | None = None
        self.leader_loops = None  #: LeaderLoops while this replica leads, else None
        self._node_events: dict[str, asyncio.Event] = {}  #: node id -> set when its assignments may change
        self._leadership_lost = asyncio.Event()  #: set whenever this replica stops leading
        self.deposed_at = float("-inf")  #: monotonic time this replica last stopped leading
        self.scheduler_dirty = asyncio.Event()  #: something changed that may let a gang start
        self.data_dir = config.data_dir_of(replica_id)
        self.fatal = ""  #: why the replica stopped itself (corruption, full disk), if it did

    # ---- proposing and reading -----------------------------------------------------------------

    @property
    def state(self):
        return self.raft.replicated.state

    @property
    def lock(self):
        return self.raft.replicated.lock

    async def propose(self, cmd: c.Command, timeout: float = 5.0) -> c.Result:
        return await self.raft.propose_async(cmd, timeout)

    def now(self) -> float:
        return time.time()

    def node_credential(self, node_id: str) -> str:
        """The credential a worker presents to act for `node_id`: an HMAC only masters can make
        (keyed by the Raft password, which clients and workers never see)."""
        key = hashlib.sha256(b"synapse-node-credential\0" + self.config.raft_password.encode()).digest()
        return hmac.new(key, node_id.encode(), hashlib.sha256).hexdigest()

    def new_job_id(self, name: str) -> str:
        return f"{name[:40]}-{uuid.uuid4().hex[:8]}"

    def leader_api_address(self) -> str:
        """The API address of the leader this replica follows and is connected to, or ''.

        pysyncobj keeps naming a dead leader until the next election; a hint to it would only send
        clients in circles, so a replica names its leader only while its link to it is up.
        """
        leader = self.raft.leader_if_connected()
        return self.api_of_raft(leader) if leader else ""

    def api_of_raft(self, raft_address: str) -> str:
        """API address of a replica from the cluster file, or from the replicated directory."""
        known = self.config.api_of_raft(raft_address)
        if known:
            return known
        with self.lock:
            return next((api for raft, api in self.state.replicas.values() if raft == raft_address), "")

    def ready_leader_term(self) -> int:
        """The term this replica leads in with its loops ready, or 0."""
        loops = self.leader_loops
        if loops is not None and loops.ready.is_set() and self.raft.is_leader() and self.raft.term() == loops.term:
            return loops.term
        return 0

    # ---- change notification (tick thread -> loop) ---------------------------------------------

    def on_applied(self, applied: list[tuple[c.Command | None, c.Result]]) -> None:
        """Listener for every applied log entry; runs on pysyncobj's tick thread, so it only hands off."""
        changes = [cmd for cmd, result in applied if result.ok and cmd is not None and not isinstance(cmd, c.Barrier)]
        inbox = self.raft.inbox
        if inbox is not None and changes:
            inbox.post(self._changed_all, changes)

    def _changed_all(self, cmds: list[c.Command]) -> None:
        self.scheduler_dirty.set()
        for cmd in cmds:
            self._changed(cmd)

    def _changed(self, cmd: c.Command) -> None:
        node_ids: set[str] = set()
        if isinstance(cmd, c.NodeDown):
            node_ids = set(self._node_events)  # its gangs stop everywhere
        elif hasattr(cmd, "job_id"):
            with self.lock:
                job = self.state.jobs.get(cmd.job_id)  # type: ignore[attr-defined]
                node_ids = {t.node_id for t in job.tasks} if job else set()
        if hasattr(cmd, "node_id"):
            node_ids.add(cmd.node_id)  # type: ignore[attr-defined]
        if isinstance(cmd, c.CommitPlan):
            node_ids.update(p.node_id for p in cmd.placements)
        for node_id in node_ids:
            self.notify_node(node_id)

    def notify_node(self, node_id: str) -> None:
        event = self._node_events.pop(node_id, None)
        if event is not None:
            event.set()

    def node_event(self, node_id: str) -> asyncio.Event:
        """An event set the next time this node's assignments may have changed."""
        event = self._node_events.get(node_id)
        if event is None:
            event = self._node_events[node_id] = asyncio.Event()
        return event

    def disk_has_room(self) -> bool:
        """False once the data dir's file system has less than min_free_disk left."""
        return free_bytes(self.data_dir) >= self.config.min_free_disk

    async def watchdog(self, stop: asyncio.Event) -> None:
        """Stop the replica on corrupt data, or before a full disk makes the journal's mmap fail."""
        while not stop.is_set():
            problem = self.raft.corruption()
            if not problem and free_bytes(self.data_dir) < self.config.min_free_disk // 4:
                problem = (f"less than {self.config.min_free_disk // 4} bytes free under {self.data_dir}; "
                           "stopping before the journal cannot grow")
            if problem:
                log.critical("replica %s stops: %s. Rebuild it with: synapse-master rebuild --config FILE --id %s",
                             self.replica.id, problem, self.replica.id)
                self.fatal = problem
                stop.set()
                return
            await asyncio.sleep(WATCHDOG_S)

    def leadership_lost(self) -> asyncio.Event:
        return self._leadership_lost

    # ---- leadership ----------------------------------------------------------------------------

    async def watch_leadership(self) -> None:
        from synapse.leader import LeaderLoops  # the loops import the endpoints' helpers

        while True:
            leading = self.raft.is_leader()
            term = self.raft.term()
            loops = self.leader_loops
            if loops is not None and (not leading or term != loops.term):
                abandoned = self.raft.abandon()
                self.deposed_at = time.monotonic()
                log.info("leadership lost term=%d replica=%s abandoned_proposals=%d", loops.term, self.replica.id,
                         abandoned)
                loops.stop()
                self.leader_loops = None
                self._leadership_lost.set()
                self._leadership_lost = asyncio.Event()
                for event in self._node_events.values():
                    event.set()
                self._node_events.clear()
            if leading and self.leader_loops is None:
                log.info("leadership gained term=%d replica=%s", term, self.replica.id)
                self.leader_loops = LeaderLoops(self, term)
                self.leader_loops.start()
            await asyncio.sleep(LEADERSHIP_POLL_S)


async def serve(config: ClusterConfig, replica_id: str, stop: asyncio.Event | None = None) -> None:
    """Run one replica until SIGTERM / SIGINT (or `stop` is set)."""
    from synapse.endpoints import MasterServicer, add_to_server

    replica = config.replica(replica_id)
    timeouts = RaftTimeouts(election_min=config.election_min, election_max=config.election_max,
                            leader_fallback=min(0.35, config.election_min * 0.85))
    conf = raft_config(bind_address=replica.raft, data_dir=config.data_dir_of(replica_id),
                       password=config.raft_password, timeouts=timeouts)
    partners = [r.raft for r in config.replicas if r.id != replica_id]
    problem = check_journal(Path(config.data_dir_of(replica_id)) / "raft.journal")
    if problem:
        raise StorageError(f"journal corrupt: {problem}. Rebuild this replica from its peers with: "
                           f"synapse-master rebuild --config FILE --id {replica_id}")
    raft = RaftNode(replica.raft, partners, conf, config.topology_levels, durable=config.durability == "fsync")
    master = Master(config, replica_id, raft)
    master.loop = asyncio.get_running_loop()
    raft.bind_loop(master.loop)
    raft.replicated.listener = master.on_applied

    interceptors = [TokenInterceptor(config.token)] if config.token else []
    server = grpc.aio.server(interceptors=interceptors, options=[
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0)])
    add_to_server(MasterServicer(master), server)
    if config.tls.enabled:
        server.add_secure_port(replica.api, server_credentials(config.tls_of(replica_id),
                                                                config.require_worker_certs))
    else:
        server.add_insecure_port(replica.api)
    await server.start()
    log.info("master serving replica=%s api=%s raft=%s partners=%s", replica_id, replica.api, replica.raft,
             ",".join(partners))
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(master.watch_leadership())
    guard = asyncio.create_task(master.watchdog(stop))
    await stop.wait()
    guard.cancel()
    log.info("master stopping replica=%s", replica_id)
    watcher.cancel()
    if master.leader_loops is not None:
        master.leader_loops.stop()
    await server.stop(grace=1.0)
    raft.replicated.listener = None
    raft.destroy()
    if master.fatal:
        raise StorageError(master.fatal)


class StorageError(RuntimeError):
    """The replica's stored data is corrupt, or its disk is full: it must not serve."""


def rebuild(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="synapse-master rebuild", description=(
        "Set aside a replica's data dir (corrupt journal or snapshot) so that, started again, it "
        "rejoins empty and copies the state from the leader. Run it with the replica stopped, "
        "while the other replicas hold a majority."))
    parser.add_argument("--config", required=True)
    parser.add_argument("--id", required=True)
    args = parser.parse_args(argv)
    config = load_cluster_config(args.config, need_secrets=False)
    data_dir = Path(config.data_dir_of(config.replica(args.id).id))
    if not data_dir.exists():
        print(f"{data_dir} does not exist: nothing to set aside")
        return
    aside = data_dir.with_name(f"{data_dir.name}.broken-{time.strftime('%Y%m%dT%H%M%S')}")
    data_dir.rename(aside)
    print(f"moved {data_dir} to {aside}; start the replica again and it will catch up from the leader")


def gen_certs(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="synapse-master gen-certs",
                                     description="Write a development CA and certificates (see synapse/tls.py).")
    parser.add_argument("--out", required=True, help="directory to write the PEM files to")
    parser.add_argument("--hosts", default="127.0.0.1,localhost", help="names and IPs the masters answer on")
    parser.add_argument("--workers", default="", help="worker node ids to make client certificates for")
    parser.add_argument("--days", type=int, default=365)
    args = parser.parse_args(argv)
    written = generate(Path(args.out), [h for h in args.hosts.split(",") if h],
                       [w for w in args.workers.split(",") if w], args.days)
    for path in written:
        print(path)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["gen-certs"]:
        gen_certs(argv[1:])
        return
    if argv[:1] == ["rebuild"]:
        rebuild(argv[1:])
        return
    parser = argparse.ArgumentParser(prog="synapse-master", description="Run one Synapse master replica "
                                     "(or: synapse-master gen-certs --help).")
    parser.add_argument("--config", required=True, help="cluster file (YAML)")
    parser.add_argument("--id", required=True, help="this replica's id in the cluster file")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    configure("synapse-master", args.id, args.log_level)
    try:
        config = load_cluster_config(args.config)
        config.replica(args.id)
    except ConfigError as exc:
        print(f"synapse-master: {exc}", file=sys.stderr)
        sys.exit(2)
    try:
        asyncio.run(serve(config, args.id))
    except StorageError as exc:
        print(f"synapse-master: {exc}", file=sys.stderr)
        sys.exit(EXIT_STORAGE)


if __name__ == "__main__":
    main()
