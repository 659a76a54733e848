"""A whole cluster on this machine, as separate background processes (`synapse-local`).

`up` generates the Raft password and the cluster token, writes `DIR/cluster.yaml` (the same format
an operator deploys) and `DIR/cluster.json` (what it started, with pids, and the settings it was
made with), creates a join token (`DIR/secrets/join-token`) that the workers register with (they
never see the cluster token), makes each `--user-cert` name a user, and returns once a leader
exists and every worker is registered and READY. `up` in a data dir that holds a stopped cluster
starts that same cluster again (its secrets, journals, certificates and workers, each with the
node credential it keeps), or, asked for other settings, refuses (RestartRefused, exit 2) and says
how to start afresh: `up --fresh`, or `down --purge` (`purge`). `down` stops exactly the processes
listed in `cluster.json`, each only if its command line still names this data dir, and then sweeps
what an interrupted or killed run may have left: processes carrying this data dir's mark in their
environment (synapse.local.reaper: tasks of a killed worker, a process started just before an
interrupt) and the network namespaces, bridge and veths whose tags `DIR/netns-tags` lists. `up`
sweeps the same before it starts, so the next run in a data dir cleans up after the last.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import yaml

from synapse.client.master_client import ClientError, ClusterUnavailable, MasterClient
from synapse.common.datadir import make_private
from synapse.common.tls import TLSFiles, generate
from synapse.local import interrupts, reaper
from synapse.local.netns import MasterNet, Unavailable
from synapse.local.procs import _end_of, _log_tail, _reap, is_alive, is_ours
from synapse.proto import api_pb2

READY_TIMEOUT_S = 60.0
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
#: The tags of every network `up --netns` made in a data dir, written before the network is built.
NETNS_LEDGER = "netns-tags"
#: Present from the start of `down` until the next `up`: `restart` refuses to start anything then.
STOPPING = "stopping"
#: The workers' join token, under the cluster's secrets dir (the cluster token is never given to them).
JOIN_TOKEN_FILE = "join-token"


class ClusterStopping(RuntimeError):
    """`restart` was asked to start a process of a cluster that is being (or has been) stopped."""


#: "LOW-HIGH": the ports `free_base_port` takes its ranges from (all of a range's ports inside),
#: instead of 8000-20000. The tests give each pytest-xdist worker its own (tests/conftest.py).
PORTS_ENV = "SYNAPSE_LOCAL_PORTS"
#: The ports a base port spans: API base+i, Raft base+100+i, HTTP base+200+i (fewer than 100 masters).
_BASE_SPAN = 300


def free_base_port(masters: int, low: int = 8000, high: int = 20000) -> int:
    """A base port whose API (base+i), Raft (base+100+i) and HTTP (base+200+i) ports are all free now.
    Below Linux's default ephemeral range (32768-60999): a port the kernel lends to an outgoing
    connection between this check and the bind looked free here, and gRPC binds with SO_REUSEPORT,
    so a cluster's client could reach another process's server on it (a TLS failure at start, once
    in a CI-like run). Below the default rendezvous range too (20000-29999, synapse.core.rendezvous):
    a gang's rank 0 would otherwise find its MASTER_PORT held by a master (an attempt lost). Two
    processes that check at once can still pick overlapping ranges (one's Raft port another's API
    port: a TLS failure at start, once more): PORTS_ENV keeps them apart."""
    import random

    if os.environ.get(PORTS_ENV):
        low, high = (int(x) for x in os.environ[PORTS_ENV].split("-"))
    for _ in range(500):
        base = random.randrange(low, max(low + 10, high - _BASE_SPAN), 10)
        if all(_port_free(base + off + i) for off in (0, 100, 200) for i in range(masters)):
            return base
    raise RuntimeError("no free port range found")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def process_env(environ: Mapping[str, str], mark: str) -> dict[str, str]:
    """The environment of a process `up` starts: the caller's, less every `SYNAPSE_*` variable
    (a token or CA of another cluster pasted into this shell must not become a worker's credential,
    nor a setting of that shell the cluster's; each process gets its own from the cluster's files),
    plus the data dir's mark. Only the test hooks (`SYNAPSE_TEST_*`) pass."""
    env = {k: v for k, v in environ.items() if not k.startswith("SYNAPSE_") or k.startswith("SYNAPSE_TEST_")}
    env[reaper.MARK] = mark
    return env


def _spawn(argv: list[str], log_path: Path, data_dir: Path | None = None) -> int:
    """Start a process of the cluster in `data_dir` (by default the log's: DIR/logs/ID.log) in its
    own session, marked with the data dir in its environment (see synapse.local.reaper)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    mark = str((data_dir or log_path.parent.parent).resolve())
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=process_env(os.environ, mark))
    return proc.pid


@contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """Exclusive use of the data dir's cluster.json between `restart` and `down` (threads too)."""
    with open(data_dir / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def master_argv(config_path: Path, replica_id: str) -> list[str]:
    return [sys.executable, "-m", "synapse.master", "--config", str(config_path), "--id", replica_id]


def worker_argv(data_dir: Path, masters: str, join_token_file: Path, worker_id: str, rack: str, gpus: int,
                heartbeat: float, allow_mounts: Iterable[str] = ()) -> list[str]:
    """A worker of this cluster: it registers with the join token and never sees the cluster token.
    `allow_mounts`: the host directories jobs in images may mount from."""
    argv = [sys.executable, "-m", "synapse.worker", "--masters", masters, "--join-token-file", str(join_token_file),
            "--node-id", worker_id, "--topology", f"zone0/block0/{rack}", "--gpus", str(gpus),
            "--cpus", "64", "--memory", "512Gi", "--data-dir", str(data_dir / "workers" / worker_id),
            "--address", "127.0.0.1", "--heartbeat-interval", str(heartbeat), "--stop-grace", "3",
            "--http", "127.0.0.1:0", "--stop-tasks-on-exit"]
    for prefix in allow_mounts:
        argv += ["--allow-mount", prefix]
    tls_dir = data_dir / "tls"
    if (tls_dir / "ca.pem").exists():  # a --tls cluster: the worker's own certificate (CN = its id)
        argv += ["--ca", str(tls_dir / "ca.pem"), "--cert", str(tls_dir / f"worker-{worker_id}.pem"),
                 "--key", str(tls_dir / f"worker-{worker_id}-key.pem")]
    return argv


def client_tls(state: dict[str, Any]) -> TLSFiles:
    """The TLS files a client of this local cluster uses (none for a plain cluster)."""
    return TLSFiles(state.get("ca", ""), state.get("cert", ""), state.get("key", ""))


def client_env(state: dict[str, Any]) -> dict[str, str]:
    """The `SYNAPSE_*` variables a client of this local cluster needs (what `up` prints to export)."""
    env = {"SYNAPSE_MASTERS": ",".join(m["api_address"] for m in state["masters"]), "SYNAPSE_TOKEN": state["token"]}
    if state.get("ca"):
        env.update(SYNAPSE_CA=state["ca"], SYNAPSE_CERT=state["cert"], SYNAPSE_KEY=state["key"])
    return env


def _save_state(data_dir: Path, state: dict[str, Any]) -> None:
    """Write cluster.json, readable by its owner only: it holds the admin token."""
    _write_secret(data_dir / "cluster.json", json.dumps(state, indent=2))


def load_state(data_dir: Path) -> dict[str, Any]:
    path = data_dir / "cluster.json"
    if not path.exists():
        raise click.ClickException(f"no local cluster in {data_dir} (no cluster.json)")
    state: dict[str, Any] = json.loads(path.read_text())
    return state


def spares_problem(spares_per_rack: int, workers: int, racks: int) -> str:
    """Why `--spares-per-rack` cannot be used with these workers and racks, or "": every rack must
    keep a node for work besides its spares."""
    if spares_per_rack < 0:
        return "--spares-per-rack must not be negative"
    if not spares_per_rack or not workers:
        return ""
    smallest = workers // max(1, racks)  # workers go round-robin over the racks
    if spares_per_rack >= smallest:
        return (f"--spares-per-rack {spares_per_rack}: the smallest rack has {smallest} worker(s) "
                f"({workers} over {racks} rack(s)); a rack needs more workers than spares")
    return ""


#: The settings `up` made a cluster with, recorded in cluster.json: a second `up` in its data dir
#: restarts that cluster as it was, and refuses one that asks for different settings.
SETTINGS = ("masters", "workers", "racks", "gpus", "base_port", "heartbeat", "tls", "durability", "min_free_disk",
            "job_retention", "netns", "user_certs", "spare_masters", "history", "spares_per_rack", "allow_mounts",
            "heartbeat_timeout")
#: How `synapse-local up` names a setting (the others are not flags of it).
FLAGS = {"masters": "--masters", "workers": "--workers", "racks": "--racks", "gpus": "--gpus-per-worker",
         "base_port": "--base-port", "heartbeat": "--heartbeat", "tls": "--insecure", "netns": "--netns",
         "user_certs": "--user-cert", "history": "--history", "spares_per_rack": "--spares-per-rack",
         "allow_mounts": "--allow-mount"}
#: What a data dir's cluster is made of: `down --purge` and `up --fresh` remove these and nothing else.
CLUSTER_FILES = ("cluster.json", "cluster.yaml", ".lock", STOPPING, NETNS_LEDGER, "secrets", "tls", "masters",
                 "workers", "logs", "history.sqlite", "history.sqlite-journal", "history.sqlite-wal",
                 "history.sqlite-shm")
AFRESH = ("to start afresh instead, which deletes its jobs, history and credentials: `synapse-local up --fresh` "
          "(or `synapse-local down --purge`, then `up`), with the same --data-dir")


class RestartRefused(click.ClickException):
    """The data dir holds a cluster `up` cannot start again as asked; exits 2, saying how to start afresh."""

    exit_code = 2


def up(data_dir: Path, masters: int, workers: int, racks: int, gpus: int, base_port: int,
       heartbeat: float = 1.0, tls: bool = True, durability: str = "fsync",
       min_free_disk: str = "64Mi", job_retention: str = "1h", netns: bool = False,
       user_certs: tuple[str, ...] = (), spare_masters: int = 0, history: str = "",
       spares_per_rack: int = 0, allow_mounts: tuple[str, ...] = (), fresh: bool = False,
       asked: Collection[str] | None = None, heartbeat_timeout: float = 0.0) -> dict[str, Any]:
    """Start a local cluster (TLS on unless `tls` is False); returns what cluster.json records.
    A data dir that holds a cluster already (stopped by `down`) has it started again, with its
    state, secrets and workers, if the settings named in `asked` (default: all of SETTINGS) are
    the ones it was made with; else RestartRefused. `fresh`: delete that cluster first.
    With `netns`, each master runs in its own network namespace with its own address (see
    synapse.netns; needs root). With `user_certs` (and `tls`), client certificates for these user
    names, each a user (role user) of the cluster, and `tls.user_certs` on.
    `spare_masters`: namespaces (with `netns`) for that many more masters, to grow the cluster into.
    `history`: the history store's URL; "" is a SQLite file in the data dir (shared by its masters);
    "none" keeps no history.
    `spares_per_rack`: spare nodes the leader keeps in each rack (`spares:` in the cluster file).
    `allow_mounts`: host directories jobs in images may mount from, on every worker.
    `heartbeat_timeout`: a node silent this long is DOWN (0: three heartbeats, at least 3 s); the
    nodes' lease is that less its margin (synapse.core.brain.heartbeat.Lease).
    Returns only once every worker is registered and READY."""
    data_dir = data_dir.resolve()
    settings = {"masters": masters, "workers": workers, "racks": racks, "gpus": gpus, "base_port": base_port,
                "heartbeat": heartbeat, "tls": tls, "durability": durability, "min_free_disk": min_free_disk,
                "job_retention": job_retention, "netns": netns, "user_certs": list(user_certs),
                "spare_masters": spare_masters, "history": history, "spares_per_rack": spares_per_rack,
                "allow_mounts": list(allow_mounts),
                "heartbeat_timeout": heartbeat_timeout or _heartbeat_timeout(heartbeat)}
    problem = spares_problem(spares_per_rack, workers, racks)
    if problem:
        raise click.ClickException(problem)
    if (data_dir / "cluster.json").exists():
        running = [p for p in _pids(load_state(data_dir)) if is_ours(p, data_dir)]
        if running:
            raise click.ClickException(f"a local cluster is already running in {data_dir}; "
                                       "run `synapse-local down` first")
    if data_dir.is_dir():
        _sweep(data_dir)  # whatever a killed run in this data dir left
        (data_dir / STOPPING).unlink(missing_ok=True)
        if fresh:
            purge(data_dir)
    make_private(data_dir)  # whoever calls: its logs, config and history are the user's alone
    previous = _previous(data_dir)
    if previous is not None:
        _check_same(data_dir, previous["settings"], settings, SETTINGS if asked is None else asked)
        return _restart_cluster(data_dir, previous)
    return _new_cluster(data_dir, settings)


def _previous(data_dir: Path) -> dict[str, Any] | None:
    """What cluster.json says of the cluster in this data dir, or None if there is none; a cluster
    that cannot be started again raises RestartRefused."""
    if not any((data_dir / name).exists() for name in ("cluster.json", "cluster.yaml", "masters")):
        return None
    missing = [name for name in ("cluster.json", "cluster.yaml", "secrets/token") if not (data_dir / name).exists()]
    state = load_state(data_dir) if "cluster.json" not in missing else {}
    why = (f"{', '.join(missing)} missing" if missing
           else "made by an earlier synapse-local, which did not record its settings" if "settings" not in state
           else "its masters ran in network namespaces (--netns), which `down` removed" if state.get("netns")
           else "")
    if why:
        raise RestartRefused(f"{data_dir} holds a local cluster that cannot be started again ({why}); {AFRESH}")
    return state


def _check_same(data_dir: Path, was: dict[str, Any], now: dict[str, Any], asked: Collection[str]) -> None:
    """RestartRefused naming each setting in `asked` that differs from the cluster's."""
    differ = [name for name in asked if name in was and json.loads(json.dumps(now[name])) != was[name]]
    if differ:
        said = "; ".join(f"{FLAGS.get(name, name)}: it has {_shown(name, was[name])}, asked {_shown(name, now[name])}"
                         for name in differ)
        raise RestartRefused(f"{data_dir} holds a local cluster made with other settings ({said}). "
                             f"`up` without them starts it again as it was; {AFRESH}")


def _shown(name: str, value: Any) -> str:
    if name == "tls":
        return "TLS" if value else "no TLS"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value) if value != "" else "the default"


def purge(data_dir: Path) -> list[str]:
    """Delete what a local cluster keeps in this data dir (nothing else; the dir itself if it is then
    empty); returns the names removed. Its processes must be stopped first."""
    removed = []
    for name in CLUSTER_FILES:
        path = data_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    try:
        data_dir.rmdir()
    except OSError:
        pass  # something else is in it (or it is gone)
    return removed


def _new_cluster(data_dir: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """Make a cluster in this data dir: its secrets, cluster file and certificates, then start it."""
    masters, netns, tls, history = settings["masters"], settings["netns"], settings["tls"], settings["history"]
    base_port, heartbeat, user_certs = settings["base_port"], settings["heartbeat"], tuple(settings["user_certs"])
    if masters not in (1, 3, 5):
        raise click.ClickException("--masters must be 1, 3 or 5")
    if user_certs and not tls:
        raise click.ClickException("user certificates need --tls")
    ports = [base_port + off + i for off in (0, 100, 200) for i in range(masters)]
    busy = [] if netns else [p for p in ports if not _port_free(p)]  # namespaces have their own ports
    if busy:
        raise click.ClickException(f"ports {busy} are in use; choose another --base-port")
    secrets_dir = data_dir / "secrets"
    secrets_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(secrets_dir, 0o700)
    token_file, password_file = secrets_dir / "token", secrets_dir / "raft-password"
    for path in (token_file, password_file):
        _write_secret(path, secrets.token_urlsafe(32))
    token = token_file.read_text().strip()
    history_url = ""
    if history != "none":
        from sqlalchemy.engine import make_url

        from synapse.history.store import check_url  # refused here, not after a minute of a master failing

        try:
            history_url = check_url(history or f"sqlite:///{data_dir / 'history.sqlite'}")
        except ValueError as exc:
            raise click.ClickException(f"--history: {exc}") from None
        if netns and make_url(history_url).host in LOOPBACK_HOSTS:
            # Each namespace has a loopback of its own: the masters would never reach the store.
            raise click.ClickException("--history: masters in network namespaces cannot reach a database "
                                       "on loopback; give its Unix socket (postgresql+psycopg://USER@/DB"
                                       "?host=SOCKET_DIR) or an address the bridge routes to")
    ids = [f"m{i + 1}" for i in range(masters)]
    try:
        spares = [f"m{masters + i + 1}" for i in range(settings["spare_masters"])]
        net = MasterNet.create(ids + spares, ledger=data_dir / NETNS_LEDGER) if netns else None
    except Unavailable as exc:
        raise click.ClickException(f"--netns: {exc}") from None
    hosts = [net.address(i) for i in ids] if net else ["127.0.0.1"] * masters
    replicas = [{"id": rid, "raft": f"{host}:{base_port + 100 + i}", "api": f"{host}:{base_port + i}",
                 "http": f"{host}:{base_port + 200 + i}"}
                for i, (rid, host) in enumerate(zip(ids, hosts, strict=True))]
    config_path = data_dir / "cluster.yaml"
    doc: dict[str, Any] = {
        "cluster": "local", "data_dir": str(data_dir / "masters" / "{id}"),
        "raft_password": {"file": str(password_file)}, "token": {"file": str(token_file)},
        "heartbeat_interval": f"{heartbeat}s", "heartbeat_timeout": f"{settings['heartbeat_timeout']}s",
        "durability": settings["durability"], "min_free_disk": settings["min_free_disk"],
        "job_retention": settings["job_retention"], "replicas": replicas}
    if history_url:
        doc["history"] = {"url": history_url}
    if settings["spares_per_rack"]:
        doc["spares"] = {"per": "rack", "nodes": settings["spares_per_rack"]}
    tls_dir = data_dir / "tls"
    if tls_dir.exists():  # an earlier cluster's: workers would take TLS from its files (worker_argv)
        shutil.rmtree(tls_dir)
    workers: list[dict[str, Any]] = [{"id": f"w{i + 1}", "rack": f"rack{i % max(1, settings['racks'])}", "pid": 0}
               for i in range(settings["workers"])]
    if tls:
        spare_hosts = [net.address(i) for i in spares] if net else []  # the masters it may grow into
        generate(tls_dir, sorted({"127.0.0.1", "localhost", *hosts, *spare_hosts}), [w["id"] for w in workers],
                 users=user_certs)
        doc["tls"] = {"ca": str(tls_dir / "ca.pem"), "cert": str(tls_dir / "server.pem"),
                      "key": str(tls_dir / "server-key.pem"), "require_worker_certs": True,
                      "user_certs": bool(user_certs)}
    config_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    state: dict[str, Any] = {"masters": [], "workers": workers, "token": token, "data_dir": str(data_dir),
                             "ca": str(tls_dir / "ca.pem") if tls else "",
                             "cert": str(tls_dir / "client.pem") if tls else "",
                             "key": str(tls_dir / "client-key.pem") if tls else "", "settings": settings}
    if net:
        state["netns"] = net.to_dict()
        _save_state(data_dir, state)  # so `down` removes it
    for r in replicas:
        argv = master_argv(config_path, r["id"])
        pid = _spawn(net.command(r["id"], argv) if net else argv, data_dir / "logs" / f"{r['id']}.log")
        state["masters"].append({"id": r["id"], "api_address": r["api"], "raft_address": r["raft"],
                                 "http_address": r["http"], "pid": pid,
                                 "data_dir": str(data_dir / "masters" / r["id"])})
    _save_state(data_dir, state)
    _start_workers(data_dir, state, restarted=False)
    return state


def _restart_cluster(data_dir: Path, state: dict[str, Any]) -> dict[str, Any]:
    """Start the cluster in this data dir again, as it was: its cluster file, secrets, journals,
    certificates and workers (each with the credential it keeps), on the ports it had."""
    ports = [int(m[key].rpartition(":")[2]) for m in state["masters"]
             for key in ("api_address", "raft_address", "http_address") if m.get(key)]
    busy = [p for p in ports if not _port_free(p)]
    if busy:
        raise click.ClickException(
            f"ports {busy} are in use: the cluster in {data_dir} was made with them and its masters know each "
            f"other by them; free them and run `up` again, or {AFRESH.removeprefix('to ')} and another --base-port")
    for m in state["masters"]:
        m["pid"] = _spawn(master_argv(data_dir / "cluster.yaml", m["id"]), data_dir / "logs" / f"{m['id']}.log")
    for w in state["workers"]:
        w["pid"] = 0
    _save_state(data_dir, state)
    _start_workers(data_dir, state, restarted=True)
    return state


def _heartbeat_timeout(heartbeat: float) -> float:
    """The cluster file's heartbeat_timeout for workers heartbeating every `heartbeat` seconds."""
    return max(3.0, heartbeat * 3)


def _start_workers(data_dir: Path, state: dict[str, Any], restarted: bool) -> None:
    """Once a leader answers: the join token, the users of the certificates, then the workers;
    returns when every worker is READY. On failure, stops everything and raises ClickException."""
    settings = state["settings"]
    addresses = ",".join(m["api_address"] for m in state["masters"])
    client = MasterClient(addresses, state["token"], deadline=READY_TIMEOUT_S, tls=client_tls(state))
    try:
        client.list_nodes()  # answers once a leader is elected and ready
        # Nodes the state knew before this start count as READY until the new leader's grace ends:
        # only after it does READY mean that the worker started now is heard (_wait_for_workers).
        timeout = settings.get("heartbeat_timeout") or _heartbeat_timeout(settings["heartbeat"])
        heard_after = time.monotonic() + timeout + 2 * settings["heartbeat"] \
            if restarted else 0.0
        join_file = data_dir / "secrets" / JOIN_TOKEN_FILE
        if not join_file.exists():
            _write_secret(join_file, _join_token(client))
        _add_users(client, settings["user_certs"])
        for w in state["workers"]:
            w["pid"] = _spawn(worker_argv(data_dir, addresses, join_file, w["id"], w["rack"], settings["gpus"],
                                          settings["heartbeat"], settings["allow_mounts"]),
                              data_dir / "logs" / f"{w['id']}.log")
        _save_state(data_dir, state)
        _wait_for_workers(client, data_dir, state["workers"], heard_after)
    except (ClientError, ClusterUnavailable, click.ClickException) as exc:
        down(data_dir)
        raise click.ClickException(
            f"the local cluster did not come up: {exc}; logs are in {data_dir / 'logs'}"
            + (f"; {AFRESH}" if restarted else "")) from None
    except BaseException:
        down(data_dir)  # whatever went wrong, leave nothing running
        raise
    finally:
        client.close()


def _add_users(client: MasterClient, names: list[str]) -> None:
    """Each user a certificate was made for, with the role user, so the certificate works at once
    (tls.user_certs names a user; it makes none). One that exists already is left as it is."""
    if not names:
        return
    known = {u.name for u in client.call("ListUsers", api_pb2.ListUsersRequest()).users}
    for name in names:
        if name not in known:
            client.call("AddUser", api_pb2.AddUserRequest(name=name, role="user"))


def _join_token(client: MasterClient) -> str:
    """A join token for this cluster's workers (any number of nodes, no expiry: a local cluster).
    A new command kind: proposed once the leader has heard that every replica knows it."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            request = api_pb2.CreateJoinTokenRequest(ttl_s=0, uses=0)
            reply: api_pb2.CreateJoinTokenReply = client.call("CreateJoinToken", request)
            return reply.token
        except ClientError as exc:
            if "CLUSTER_VERSION" not in exc.message or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _write_secret(path: Path, value: str) -> None:
    """Write a file only its owner may read (also when an older copy was readable by others)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")


def _wait_for_workers(client: MasterClient, data_dir: Path, workers: list[dict[str, Any]],
                      heard_after: float = 0.0) -> None:
    """Return once every worker is READY (and, from `heard_after` on, READY is what the leader
    heard after its grace); ClickException naming a worker that exited or is not READY in time."""
    deadline = max(time.monotonic(), heard_after) + READY_TIMEOUT_S
    while workers:
        ready = {n.id for n in client.list_nodes() if n.status == "READY"}
        ends = {w["id"]: end for w in workers if (end := _end_of(w["pid"], data_dir))}
        if ends:
            tails = "; ".join(f"{w}: {end}, its log ends: {_log_tail(data_dir / 'logs' / (w + '.log'))}"
                              for w, end in ends.items())
            raise click.ClickException(f"worker(s) {', '.join(ends)} exited ({tails})")
        if {w["id"] for w in workers} <= ready and time.monotonic() >= heard_after:
            return
        if time.monotonic() > deadline:
            missing = sorted({w["id"] for w in workers} - ready)
            raise click.ClickException(f"worker(s) not registered and READY: {', '.join(missing)}")
        time.sleep(0.1)


def stop_process(data_dir: Path, pid: int, sig: int = signal.SIGKILL, wait: float = 10.0) -> None:
    """Signal one process of this cluster (only if it is ours) and wait, bounded, until it is gone."""
    if is_ours(pid, data_dir):
        os.kill(pid, sig)
    deadline = time.monotonic() + wait
    while is_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    _reap(pid)


def restart(data_dir: Path, state: dict[str, Any], proc: dict[str, Any], gpus: int = 8,
            heartbeat: float = 0.5) -> None:
    """Start a master or worker of this cluster again and record its pid in cluster.json (a worker
    with the cluster's settings; `gpus` and `heartbeat` for a cluster.json that has none). A
    previous incarnation that still runs is stopped first: two on one data dir corrupt it. Once
    `down` has begun, raises ClusterStopping instead (a fault under way must not outlive it)."""
    with _locked(data_dir):
        if (data_dir / STOPPING).exists():
            raise ClusterStopping(f"the local cluster in {data_dir} is being stopped; not restarting {proc['id']}")
        if proc.get("pid") and is_ours(proc["pid"], data_dir) and is_alive(proc["pid"]):
            stop_process(data_dir, proc["pid"])
        if proc in state["masters"]:
            argv = master_argv(data_dir / "cluster.yaml", proc["id"])
            if state.get("netns"):
                argv = MasterNet.from_dict(state["netns"]).command(proc["id"], argv)
        else:
            settings = state.get("settings", {})
            argv = worker_argv(data_dir, ",".join(m["api_address"] for m in state["masters"]),
                               data_dir / "secrets" / JOIN_TOKEN_FILE, proc["id"], proc["rack"],
                               settings.get("gpus", gpus), settings.get("heartbeat", heartbeat),
                               settings.get("allow_mounts", ()))
        proc["pid"] = _spawn(argv, data_dir / "logs" / f"{proc['id']}.log")
        _save_state(data_dir, state)


def _pids(state: dict[str, Any]) -> list[int]:
    return [p["pid"] for p in state.get("workers", []) + state.get("masters", []) if p.get("pid")]


def down(data_dir: Path, grace: float = 10.0) -> list[int]:
    """Stop what `up` started in this data dir, then sweep what cluster.json does not name (see the
    module's docstring); returns the pids cluster.json listed that were running. SIGINT, SIGTERM
    and SIGHUP wait until it is done (synapse.local.interrupts): a half-done `down` leaks."""
    data_dir = data_dir.resolve()
    with interrupts.deferred():
        if data_dir.is_dir():
            with _locked(data_dir):
                (data_dir / STOPPING).touch()
        state = load_state(data_dir) if (data_dir / "cluster.json").exists() else {}
        pids = [p for p in _pids(state) if is_ours(p, data_dir)]
        for pid in pids:
            for sig in (signal.SIGTERM, signal.SIGCONT):  # a process paused by SIGSTOP handles nothing
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(is_ours(p, data_dir) and is_alive(p) for p in pids):
            time.sleep(0.05)
        for pid in pids:
            if is_ours(pid, data_dir) and is_alive(pid):
                os.kill(pid, signal.SIGKILL)
        for pid in pids:
            _reap(pid)
        if state.get("netns"):
            MasterNet.from_dict(state["netns"]).destroy()
        swept = _sweep(data_dir)
    if not state and not swept:
        load_state(data_dir)  # nothing was ever here: say so
    return pids


def _sweep(data_dir: Path) -> list[int | str]:
    """Stop the processes marked with this data dir and remove the networks its ledger names;
    returns what it found."""
    return reaper.sweep(data_dir) + MasterNet.sweep(data_dir / NETNS_LEDGER)
