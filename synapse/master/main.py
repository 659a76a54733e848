"""`synapse-master`: assemble one master replica and run it; plus its maintenance commands.

    synapse-master --config cluster.yaml --id m1
    synapse-master rebuild --config cluster.yaml --id m2
    synapse-master gen-certs --out ./pki --hosts h1,h2,h3

This module is the only one that knows every piece of a replica: the Raft node
(`synapse.master.raft`), the process-local state (`synapse.master.replica`), the gRPC endpoints
(`synapse.master.api`) and the leader loops (`synapse.master.leader`). Those receive what they
need from here and never import it, so the master's modules import each other without a circle.
"""

from __future__ import annotations

import asyncio
import faulthandler
import importlib.metadata
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

import click
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from synapse.common import systemd
from synapse.common.cli import CONTEXT_SETTINGS, fail, version_option
from synapse.common.collector import tune_for_large_state
from synapse.common.datadir import make_private, private_umask
from synapse.common.logs import configure
from synapse.common.tls import generate, issue, issue_worker, server_credentials
from synapse.core import codec, versions
from synapse.master.api.base import add_to_server
from synapse.master.api.servicer import MasterServicer
from synapse.master.beats import BeatEndpoint, serve_beats
from synapse.master.config import ClusterConfig, ConfigError, load_cluster_config
from synapse.master.durability import check_journal
from synapse.master.http import HTTPService, leader_ready
from synapse.master.leader import LeaderLoops
from synapse.master.link_shard import LinkShard
from synapse.master.metrics import Metrics
from synapse.master.raft import RaftNode, RaftTimeouts, raft_config
from synapse.master.replica import Master

log = logging.getLogger(__name__)

#: The gRPC health service name that is SERVING only on the ready leader with a majority in contact.
LEADER_SERVICE = "synapse.v1.Master/leader"

#: Exit status of a replica that stopped because its data is corrupt or its disk is full.
EXIT_STORAGE = 3
#: The master's event loop: uvloop (libuv's loop, a dependency on Linux) unless this says `asyncio`.
#: Per submission the leader's loop runs about twenty callbacks of gRPC's and asyncio's own: with
#: uvloop they cost a tenth less CPU (docs/benchmarks.md, "Where a submission's CPU goes").
EVENT_LOOP_ENV = "SYNAPSE_EVENT_LOOP"
#: gRPC message size limit, both ways: a job spec or a node's assignments fit well inside it.
MAX_MESSAGE_BYTES = 4 << 20

#: TEST ONLY (tests/cluster/test_upgrade.py): replicas of a mixed-version cluster, from one code base. Never
#: set in production. With TEST_NEW_KIND_ENV naming a command class (e.g. AddUser), the replica runs
#: the next command set: that kind counts as introduced by COMMAND_VERSION + 1, as a new kind of the
#: next release would. With TEST_COMMAND_VERSION_ENV too, it knows versions only up to that number:
#: an older release, whose codec refuses the newer kind. Restarted without it, it is upgraded.
TEST_NEW_KIND_ENV = "SYNAPSE_TEST_NEW_KIND"
TEST_COMMAND_VERSION_ENV = "SYNAPSE_TEST_COMMAND_VERSION"
#: TEST ONLY (bench/ha.py --profile): set, every Python thread of the replica carries its name as
#: its OS thread name, so /proc/PID/task/*/comm tells the threads apart for per-thread CPU time.
#: Set to a path prefix, each thread also runs under cProfile (timed in thread CPU time) and the
#: profiles are written to PREFIX.<replica>.<thread>.prof when the replica stops. Never set in
#: production: profiling makes every Python call several times dearer.
TEST_PROFILE_ENV = "SYNAPSE_TEST_PROFILE"


#: A replica asked to stop is gone within this long, clean or not: a restart (or a failover) must
#: not wait on a call or a thread that hangs in the shutdown. Nothing is lost by cutting it short:
#: every acknowledged write is in the fsynced journal, as after a kill -9.
SHUTDOWN_DEADLINE_S = 2.0
#: How long a stopping master waits for pysyncobj's thread to close the journal and the links.
DESTROY_WAIT_S = 0.5


def command_set(environ: Mapping[str, str]) -> codec.CommandSet:
    """The command set this replica runs: the code's own, unless a test asks otherwise (see
    TEST_NEW_KIND_ENV)."""
    kind_name = environ.get(TEST_NEW_KIND_ENV, "")
    if not kind_name:
        return codec.CURRENT
    kind = next((k for k in versions.KIND_VERSIONS if k.__name__ == kind_name), None)
    if kind is None:
        raise ConfigError(f"{TEST_NEW_KIND_ENV}: no command kind {kind_name!r}")
    newer = versions.COMMAND_VERSION + 1
    known = int(environ.get(TEST_COMMAND_VERSION_ENV) or newer)
    log.warning("TEST ONLY: command set with %s at version %d; this replica knows 1..%d", kind_name, newer, known)
    return codec.CommandSet({**versions.KIND_VERSIONS, kind: newer}, known)


class _ThreadProfiles:
    """Names every thread of this process started from now on, and with a `prefix`, runs cProfile
    in each (see TEST_PROFILE_ENV)."""

    def __init__(self, prefix: str) -> None:
        import cProfile

        self.prefix = prefix
        self.profiles: dict[str, cProfile.Profile] = {}
        self._lock = threading.Lock()
        threading.setprofile(self._start_in_thread)  # threads started from now on
        self._start_in_thread()  # this (the event loop's) thread

    def _start_in_thread(self, *_: object) -> None:
        import cProfile
        import ctypes

        name = threading.current_thread().name
        name = "loop" if name == "MainThread" else name
        try:
            ctypes.CDLL(None).prctl(15, name[:15].encode(), 0, 0, 0)  # PR_SET_NAME: /proc/PID/task/TID/comm
        except (OSError, AttributeError):
            pass
        if not self.prefix:
            sys.setprofile(None)  # named: nothing more to do in this thread
            return
        profile = cProfile.Profile(time.thread_time)  # CPU time: what a loaded machine does not stretch
        with self._lock:
            self.profiles[f"{name}-{threading.get_native_id()}"] = profile
        profile.enable()  # replaces this hook in this thread

    def dump(self) -> None:
        """Write each thread's profile (call once the threads are idle or gone)."""
        with self._lock:
            profiles = dict(self.profiles)
        for name, profile in profiles.items():
            try:
                profile.dump_stats(f"{self.prefix}.{name.replace('/', '_')}.prof")
            except Exception:  # noqa: BLE001 - a test aid: one bad dump must not stop the others
                log.exception("profile dump failed thread=%s", name)


_profiles: _ThreadProfiles | None = None


def _exit_if_still_running(replica_id: str) -> None:
    log.warning("master did not stop within %.0f s; exiting now replica=%s", SHUTDOWN_DEADLINE_S, replica_id)
    os._exit(0)


async def serve(config: ClusterConfig, replica_id: str, stop: asyncio.Event | None = None,
                hard_stop: bool = False) -> None:
    """Run one replica until SIGTERM / SIGINT (or `stop` is set). With `hard_stop` (the
    synapse-master process), the process exits SHUTDOWN_DEADLINE_S after the stop at the latest."""
    replica = config.replica(replica_id)
    make_private(config.data_dir_of(replica_id))
    timeouts = RaftTimeouts(election_min=config.election_min, election_max=config.election_max,
                            leader_fallback=config.election_min)
    conf = raft_config(bind_address=replica.raft, data_dir=config.data_dir_of(replica_id),
                       password=config.raft_password, timeouts=timeouts)
    partners = [r.raft for r in config.replicas if r.id != replica_id]
    problem = check_journal(Path(config.data_dir_of(replica_id)) / "raft.journal")
    if problem:
        raise StorageError(f"journal corrupt: {problem}. Rebuild this replica from its peers with: "
                           f"synapse-master rebuild --config FILE --id {replica_id}")
    raft = RaftNode(replica.raft, partners, conf, config.topology_levels, durable=config.durability == "fsync",
                    commands=command_set(os.environ), group_commit_delay=config.group_commit_delay)
    master = Master(config, replica_id, raft)
    if config.history is not None:
        from synapse.history.exporter import History  # SQLAlchemy, for masters with a history store

        master.history = History(config.history)  # connects at first use: a store down never stops a start
    link_shard = master.shard = LinkShard(master)
    master.loop = asyncio.get_running_loop()
    raft.bind_loop(master.loop)
    raft.replicated.listener = master.on_applied

    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0)])
    metrics = master.metrics = Metrics(master)
    add_to_server(MasterServicer(master, metrics), server)
    # With tls on, the HTTP port (dashboard, /metrics, health) is HTTPS with the replica's certificate.
    http = (HTTPService(replica.http, master, metrics, config.tls_of(replica_id) if config.tls.enabled else None)
            if replica.http else None)
    if config.tls.enabled:
        server.add_secure_port(replica.api, server_credentials(config.tls_of(replica_id),
                                                                config.require_worker_certs))
    else:
        server.add_insecure_port(replica.api)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    await server.start()
    beats: BeatEndpoint | None = None
    if config.heartbeat_datagrams:
        beats = master.beats = await serve_beats(master, replica.api)
    if http is not None:
        http.start()
    log.info("master serving replica=%s api=%s raft=%s http=%s partners=%s", replica_id, replica.api, replica.raft,
             replica.http or "-", ",".join(partners))
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(master.watch_leadership(LeaderLoops))
    guard = asyncio.create_task(master.watchdog(stop))
    shard = asyncio.create_task(link_shard.run(stop))
    pulse = asyncio.create_task(_report_health(master, health))
    exporter = None
    if master.history is not None:  # a follower writes the history store's rows (synapse.history.exporter)
        from synapse.history.exporter import follower_export_loop

        exporter = asyncio.create_task(follower_export_loop(master, master.history, stop))
    systemd.notify("READY=1")
    await stop.wait()
    systemd.notify("STOPPING=1")
    if hard_stop:
        faulthandler.dump_traceback_later(SHUTDOWN_DEADLINE_S - 0.5)  # where a slow stop hangs, in the log
        timer = threading.Timer(SHUTDOWN_DEADLINE_S, _exit_if_still_running, args=(replica_id,))
        timer.daemon = True
        timer.start()
    pulse.cancel()
    if exporter is not None:
        exporter.cancel()
    shard.cancel()
    if beats is not None and beats.transport is not None:
        beats.transport.close()
    await link_shard.close()
    await health.enter_graceful_shutdown()
    guard.cancel()
    log.info("master stopping replica=%s", replica_id)
    watcher.cancel()
    if master.leader_loops is not None:
        master.leader_loops.stop()
    master.begin_stop()
    await server.stop(grace=0.5)
    if http is not None:
        http.stop()
    raft.replicated.listener = None
    raft.destroy()
    raft.wait_destroyed(DESTROY_WAIT_S)  # the journal closed before the process exits (see main)
    if master.history is not None:
        master.history.store.close()
    if master.fatal:
        raise StorageError(master.fatal)


async def _report_health(master: Master, health: health_aio.HealthServicer) -> None:
    """Keep the gRPC health service current ("" while serving; LEADER_SERVICE only on a ready leader
    with a majority in contact) and ping systemd's watchdog from the event loop, so a loop that
    hangs stops the pings and systemd restarts the replica."""
    interval = systemd.watchdog_interval()
    last_ping, leading = 0.0, None
    while True:
        now = time.monotonic()
        ready = not leader_ready(master)
        if ready != leading:
            leading = ready
            await health.set(LEADER_SERVICE, health_pb2.HealthCheckResponse.SERVING if ready
                             else health_pb2.HealthCheckResponse.NOT_SERVING)
        if interval and now - last_ping >= interval and not master.fatal:
            systemd.notify("WATCHDOG=1")
            last_ping = now
        await asyncio.sleep(0.1)


class StorageError(RuntimeError):
    """The replica's stored data is corrupt, or its disk is full: it must not serve."""


CONFIG = click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
                      help="cluster file (YAML)")
REPLICA = click.option("--id", "replica_id", required=True, help="the replica's id in the cluster file")


@click.group(context_settings=CONTEXT_SETTINGS, invoke_without_command=True)
@version_option("synapse-master")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="cluster file (YAML)")
@click.option("--id", "replica_id", help="this replica's id in the cluster file")
@click.option("--log-level", default="INFO", show_default=True, help="DEBUG, INFO, WARNING or ERROR")
@click.pass_context
def main(ctx: click.Context, config_path: str | None, replica_id: str | None, log_level: str) -> None:
    """Run one Synapse master replica: synapse-master --config FILE --id ID.

    The subcommands below maintain a replica; they do not start one.
    """
    if ctx.invoked_subcommand is not None:
        return
    if not config_path or not replica_id:
        fail("synapse-master", "--config and --id are required to run a replica (see --help)")
    private_umask()  # the journal, its dump, a SQLite history store: the replica's user's alone
    configure("synapse-master", replica_id, log_level)
    tune_for_large_state()
    global _profiles
    if TEST_PROFILE_ENV in os.environ:
        prefix = os.environ[TEST_PROFILE_ENV]
        log.warning("TEST ONLY: threads named%s", f", each profiled to {prefix}.{replica_id}.*.prof" if prefix else "")
        _profiles = _ThreadProfiles(f"{prefix}.{replica_id}" if prefix else "")
    try:
        config = load_cluster_config(config_path)
        config.replica(replica_id)
    except ConfigError as exc:
        fail("synapse-master", str(exc))
    try:
        run_loop(serve(config, replica_id, hard_stop=True), os.environ.get(EVENT_LOOP_ENV, "uvloop"))
    except StorageError as exc:
        fail("synapse-master", str(exc), EXIT_STORAGE)
    _exit_stopped()


def run_loop(main: Coroutine[Any, Any, None], kind: str) -> None:
    """Run the replica's coroutine to its end on an event loop of `kind` (EVENT_LOOP_ENV)."""
    if kind not in ("uvloop", "asyncio"):
        fail("synapse-master", f"{EVENT_LOOP_ENV}={kind}: say uvloop or asyncio")
    if kind == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.warning("uvloop is not installed: running on asyncio's own event loop (it costs more CPU)")
        else:
            log.info("event loop: uvloop %s", importlib.metadata.version("uvloop"))
            uvloop.run(main)
            return
    asyncio.run(main)


def _exit_stopped() -> None:
    """Exit at once once `serve` has stopped: the journal is closed, the history store too. The
    interpreter's own teardown then waited about a second on gRPC's threads, in every stop of
    every master, and a restart of all of them waited for it (chaos `restart-masters`)."""
    if _profiles is not None:
        _profiles.dump()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@main.command("rebuild")
@CONFIG
@REPLICA
def rebuild_cmd(config_path: str, replica_id: str) -> None:
    """Set aside a replica's data dir (corrupt journal or snapshot).

    Started again, the replica rejoins empty and copies the state from the leader. Run it with the
    replica stopped, while the other replicas hold a majority.
    """
    try:
        config = load_cluster_config(config_path, need_secrets=False)
        data_dir = Path(config.data_dir_of(config.replica(replica_id).id))
    except ConfigError as exc:
        fail("synapse-master", str(exc))
    if not data_dir.exists():
        click.echo(f"{data_dir} does not exist: nothing to set aside")
        return
    aside = data_dir.with_name(f"{data_dir.name}.broken-{time.strftime('%Y%m%dT%H%M%S')}")
    data_dir.rename(aside)
    click.echo(f"moved {data_dir} to {aside}; start the replica again and it will catch up from the leader")


@main.command("gen-certs")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="directory to write the PEM files to")
@click.option("--hosts", default="127.0.0.1,localhost", show_default=True,
              help="names and IPs the masters answer on, comma-separated")
@click.option("--workers", default="", help="worker node ids to make client certificates for, comma-separated")
@click.option("--users", default="", help="user names to make client certificates for (tls.user_certs)")
@click.option("--days", type=int, default=365, show_default=True, help="validity of the certificates")
@click.option("--add", is_flag=True,
              help="sign only the --workers and --users certificates with the CA already in --out")
def gen_certs_cmd(out: str, hosts: str, workers: str, users: str, days: int, add: bool) -> None:
    """Write a development CA and certificates (see synapse/common/tls.py)."""
    worker_ids = [w for w in workers.split(",") if w]
    user_names = tuple(u for u in users.split(",") if u)
    if add:
        if not (Path(out) / "ca-key.pem").exists():
            raise click.ClickException(f"--add: no CA in {out} (ca.pem and ca-key.pem)")
        written = [p for w in worker_ids for p in issue_worker(Path(out), w, days)]
        written += [p for u in user_names for p in issue(Path(out), f"user-{u}", u, ("client",), [], days)]
    else:
        written = generate(Path(out), [h for h in hosts.split(",") if h], worker_ids, days, user_names)
    for path in written:
        click.echo(path)


if __name__ == "__main__":
    main()
