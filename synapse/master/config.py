"""The cluster file: one YAML document describing the master replicas and their settings.

    cluster: prod
    topology_levels: [zone, block, rack]
    data_dir: /var/lib/synapse/{id}          # {id} becomes the replica id
    raft_password: {file: /etc/synapse/raft-password}   # or {env: NAME}; required
    token: {env: SYNAPSE_TOKEN}              # or {file: PATH}; empty = no client authentication
    heartbeat_interval: 5s
    heartbeat_timeout: 10s
    election_timeout: {min: 500ms, max: 1s}
    job_retention: 1h                         # finished jobs are forgotten this long after they end
                                              # (with history: after the store holds them); 0 = keep forever
    max_array_size: 10000                     # the most elements a job array may have
    fair_share_half_life: 7d                  # fair share remembers GPU time used, halved every 7d; 0: current only
    spares: {per: rack, nodes: 1}             # optional: spare nodes per rack for restarts (docs: Operating, Spares)
    rendezvous_ports: 20000-29999             # where MASTER_PORT comes from; the same on every master
                                              # (synapse.core.rendezvous; docs: Operating, Workers)
    history:                                  # optional: job history and accounting (docs: Operating, History store)
      url: {env: SYNAPSE_HISTORY_URL}         # sqlite:////var/lib/synapse/history.sqlite or
                                              # postgresql+psycopg://USER:PASSWORD@HOST/DB
      retention: 0                            # rows older than this are purged; 0 = keep forever
      max_unarchived: 50000                   # finished jobs kept in the state while the store lags
    durability: fsync                         # fsync (default) | none; see synapse/master/durability.py
    group_commit_delay: 3ms                   # under load, a log entry waits this long for more writes; 0: never
    heartbeat_datagrams: true                 # workers' heartbeats by UDP datagram on the API port (default)
    min_free_disk: 256Mi                      # refuse writes below this much free space
    tls:                                      # optional: TLS for the API, mTLS for workers
      ca: /etc/synapse/ca.pem
      cert: /etc/synapse/server.pem           # {id} allowed
      key: /etc/synapse/server-key.pem
      require_worker_certs: true              # every caller needs a cert; a worker's CN is its node id
      user_certs: true                        # a client cert's CN names the user when no token is given
    replicas:
      - {id: m1, raft: 10.0.0.1:7100, api: 10.0.0.1:7000, http: 10.0.0.1:7200}   # http: metrics, health
      - {id: m2, raft: 10.0.0.2:7100, api: 10.0.0.2:7000}
      - {id: m3, raft: 10.0.0.3:7100, api: 10.0.0.3:7000}

Secrets are never written in the file itself by the examples: `{env: NAME}` reads an environment
variable (systemd's EnvironmentFile), `{file: PATH}` a file's first line. A plain string is accepted
for local experiments.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from synapse.common.tls import TLSFiles
from synapse.core.jobs.arrays import DEFAULT_MAX_ARRAY_SIZE, MAX_ARRAY_SIZE
from synapse.core.jobs.quantity import QuantityError, parse_duration, parse_memory
from synapse.core.model import DEFAULT_LEVELS
from synapse.core.rendezvous import MASTER_PORTS, parse_ports
from synapse.core.schedule.fairshare import DEFAULT_HALF_LIFE_S
from synapse.core.schedule.spares import SparePolicy
from synapse.history.settings import HistorySettings

#: Raft's heartbeat (AppendEntries period), fixed; election timeouts are sized against it.
RAFT_HEARTBEAT_S = 0.05
#: How long a loaded leader's next log entry waits for more proposals (`group_commit_delay`; see
#: synapse.master.raft, GROUP_COMMIT_FULL), by default, and at most.
GROUP_COMMIT_DELAY_S = 0.003
MAX_GROUP_COMMIT_DELAY_S = 0.05


class ConfigError(ValueError):
    """A cluster file that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class Replica:
    id: str
    raft: str  #: host:port of the Raft port
    api: str  #: host:port of the gRPC API
    http: str = ""  #: host:port of /metrics, /livez, /readyz; "" serves none


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    cluster: str
    replicas: tuple[Replica, ...]
    data_dir: str  #: may contain {id}
    raft_password: str
    token: str = ""
    topology_levels: tuple[str, ...] = DEFAULT_LEVELS
    heartbeat_interval: float = 5.0
    heartbeat_timeout: float = 10.0
    election_min: float = 0.5
    election_max: float = 1.0
    job_retention: float = 3600.0  #: seconds a finished job stays in the state; 0 = forever
    max_array_size: int = DEFAULT_MAX_ARRAY_SIZE  #: the most elements a job array may have
    durability: str = "fsync"  #: fsync | none
    min_free_disk: int = 256 << 20  #: bytes
    group_commit_delay: float = GROUP_COMMIT_DELAY_S  #: seconds (synapse.master.raft); 0: none
    tls: TLSFiles = TLSFiles()  #: cert and key may contain {id}
    require_worker_certs: bool = False
    #: take workers' heartbeats by UDP datagram on the API address (synapse.master.beats)
    heartbeat_datagrams: bool = True
    #: a verified client certificate's common name identifies a user when the call carries no token
    user_certs: bool = False
    history: HistorySettings | None = None  #: None: no history store
    fair_share_half_life: float = DEFAULT_HALF_LIFE_S  #: seconds; the decayed usage admission weighs; 0: current only
    spares: SparePolicy | None = None  #: spare nodes the leader keeps (synapse.core.schedule.spares); None: none
    #: where a gang's MASTER_PORT is drawn from; every replica that dispatches must have the same
    rendezvous_ports: range = MASTER_PORTS
    extra: dict[str, Any] = field(default_factory=dict)

    def replica(self, replica_id: str) -> Replica:
        for r in self.replicas:
            if r.id == replica_id:
                return r
        raise ConfigError(f"replicas: no replica with id {replica_id!r} "
                          f"(known: {', '.join(r.id for r in self.replicas)})")

    def tls_of(self, replica_id: str) -> TLSFiles:
        cert, key = (path.replace("{id}", replica_id) for path in (self.tls.cert, self.tls.key))
        return TLSFiles(self.tls.ca, cert, key)

    def data_dir_of(self, replica_id: str) -> str:
        return self.data_dir.replace("{id}", replica_id)

    def api_of_raft(self, raft_address: str) -> str:
        """The API address of the replica whose Raft address this is, or ''."""
        return next((r.api for r in self.replicas if r.raft == raft_address), "")


def read_secret(value: Any, field_name: str) -> str:
    """A secret from `{env: NAME}`, `{file: PATH}` or a plain string."""
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and set(value) == {"env"}:
        secret = os.environ.get(str(value["env"]), "")
        if not secret:
            raise ConfigError(f"{field_name}: environment variable {value['env']} is not set")
        return secret
    if isinstance(value, dict) and set(value) == {"file"}:
        try:
            return Path(str(value["file"])).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{field_name}: cannot read {value['file']}: {exc.strerror}") from None
    raise ConfigError(f"{field_name}: must be {{env: NAME}}, {{file: PATH}} or a string")


def _duration(doc: dict[str, Any], name: str, default: float) -> float:
    try:
        return parse_duration(doc[name]) if name in doc else default
    except QuantityError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def _flag(doc: dict[str, Any], name: str, default: bool) -> bool:
    value = doc.get(name, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{name}: true or false, not {value!r}")
    return value


def parse_cluster_config(doc: Any, *, need_secrets: bool = True) -> ClusterConfig:
    if not isinstance(doc, dict):
        raise ConfigError("a cluster file must be a YAML mapping")
    known = {"cluster", "topology_levels", "data_dir", "raft_password", "token", "heartbeat_interval",
             "heartbeat_timeout", "election_timeout", "replicas", "tls", "durability", "min_free_disk",
             "job_retention", "max_array_size", "history", "fair_share_half_life", "spares", "group_commit_delay",
             "rendezvous_ports", "heartbeat_datagrams"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown field (known: {', '.join(sorted(known))})")
    replicas_doc = doc.get("replicas")
    if not isinstance(replicas_doc, list) or not replicas_doc:
        raise ConfigError("replicas: a list of {id, raft, api} is required")
    replicas = []
    for i, r in enumerate(replicas_doc):
        if not isinstance(r, dict) or not all(isinstance(r.get(k), str) and r.get(k) for k in ("id", "raft", "api")):
            raise ConfigError(f"replicas[{i}]: needs id, raft (host:port) and api (host:port)")
        if set(r) - {"id", "raft", "api", "http"}:
            raise ConfigError(f"replicas[{i}]: unknown field {sorted(set(r) - {'id', 'raft', 'api', 'http'})[0]}")
        for k in ("raft", "api", "http"):
            if k == "http" and not r.get(k):
                continue
            host, _, port = str(r[k]).rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(f"replicas[{i}].{k}: must be host:port, not {r[k]!r}")
        replicas.append(Replica(r["id"], r["raft"], r["api"], str(r.get("http") or "")))
    for attr in ("id", "raft", "api"):
        values = [getattr(r, attr) for r in replicas]
        if len(set(values)) != len(values):
            raise ConfigError(f"replicas: duplicate {attr}")
    # An even count is allowed: it is the middle of growing 3 -> 5 one replica at a time (it
    # tolerates no more failures than one replica fewer would).
    levels = doc.get("topology_levels", list(DEFAULT_LEVELS))
    if not isinstance(levels, list) or not levels or not all(isinstance(x, str) and x for x in levels):
        raise ConfigError("topology_levels: must be a list of level names, widest first")
    election = doc.get("election_timeout", {}) or {}
    if not isinstance(election, dict):
        raise ConfigError("election_timeout: must be {min: 500ms, max: 1s}")
    election_min = _duration(election, "min", 0.5)
    election_max = _duration(election, "max", 1.0)
    if not 0 < election_min < election_max:
        raise ConfigError("election_timeout: need 0 < min < max")
    if election_min < 10 * RAFT_HEARTBEAT_S:
        raise ConfigError(f"election_timeout: min must be at least 10 Raft heartbeats "
                          f"({10 * RAFT_HEARTBEAT_S * 1000:.0f}ms), or a late heartbeat starts an election")
    durability = str(doc.get("durability", "fsync"))
    if durability not in ("fsync", "none"):
        raise ConfigError(f"durability: must be fsync or none, not {durability!r}")
    try:
        min_free_disk = parse_memory(doc.get("min_free_disk", "256Mi"))
    except QuantityError as exc:
        raise ConfigError(f"min_free_disk: {exc}") from None
    tls_doc = doc.get("tls") or {}
    if not isinstance(tls_doc, dict) or set(tls_doc) - {"ca", "cert", "key", "require_worker_certs", "user_certs"}:
        raise ConfigError("tls: must be {ca, cert, key, require_worker_certs, user_certs}")
    tls = TLSFiles(str(tls_doc.get("ca", "")), str(tls_doc.get("cert", "")), str(tls_doc.get("key", "")))
    if tls.enabled and not (tls.cert and tls.key):
        raise ConfigError("tls: ca, cert and key are all required")
    password = read_secret(doc.get("raft_password"), "raft_password") if need_secrets else ""
    if need_secrets and not password:
        raise ConfigError("raft_password: required (pysyncobj's Raft port runs what it receives "
                          "from anyone who knows no password)")
    group_commit_delay = _duration(doc, "group_commit_delay", GROUP_COMMIT_DELAY_S)
    if not 0 <= group_commit_delay <= MAX_GROUP_COMMIT_DELAY_S:
        raise ConfigError(f"group_commit_delay: from 0 to {MAX_GROUP_COMMIT_DELAY_S * 1000:.0f}ms "
                          "(every write under load waits for it)")
    max_array_size = doc.get("max_array_size", DEFAULT_MAX_ARRAY_SIZE)
    if isinstance(max_array_size, bool) or not isinstance(max_array_size, int) \
            or not 1 <= max_array_size <= MAX_ARRAY_SIZE:
        raise ConfigError(f"max_array_size: a whole number from 1 to {MAX_ARRAY_SIZE}, not {max_array_size!r}")
    try:
        rendezvous_ports = parse_ports(doc["rendezvous_ports"]) if "rendezvous_ports" in doc else MASTER_PORTS
    except ValueError as exc:
        raise ConfigError(f"rendezvous_ports: {exc}") from None
    config = ClusterConfig(
        cluster=str(doc.get("cluster", "synapse")), replicas=tuple(replicas),
        data_dir=str(doc.get("data_dir", "/var/lib/synapse/{id}")), raft_password=password,
        token=read_secret(doc.get("token"), "token") if need_secrets else "",
        topology_levels=tuple(levels),
        heartbeat_interval=_duration(doc, "heartbeat_interval", 5.0),
        heartbeat_timeout=_duration(doc, "heartbeat_timeout", 10.0),
        election_min=election_min, election_max=election_max, tls=tls, durability=durability,
        min_free_disk=min_free_disk, group_commit_delay=group_commit_delay,
        job_retention=_duration(doc, "job_retention", 3600.0),
        require_worker_certs=bool(tls_doc.get("require_worker_certs", False)),
        heartbeat_datagrams=_flag(doc, "heartbeat_datagrams", True),
        user_certs=bool(tls_doc.get("user_certs", False)), max_array_size=max_array_size,
        history=_history(doc.get("history"), need_secrets),
        fair_share_half_life=_duration(doc, "fair_share_half_life", DEFAULT_HALF_LIFE_S),
        spares=_spares(doc.get("spares"), tuple(levels)), rendezvous_ports=rendezvous_ports)
    if config.require_worker_certs and not tls.enabled:
        raise ConfigError("tls.require_worker_certs: needs tls.ca, tls.cert and tls.key")
    if config.user_certs and not config.require_worker_certs:
        raise ConfigError("tls.user_certs: needs tls.require_worker_certs (gRPC asks every caller for a "
                          "certificate or none)")
    if config.heartbeat_timeout <= config.heartbeat_interval:
        raise ConfigError("heartbeat_timeout: must be longer than heartbeat_interval")
    return config


def _spares(doc: Any, levels: tuple[str, ...]) -> SparePolicy | None:
    """The `spares:` section: `{per: LEVEL, nodes: N}` (N spares in each domain of that level)."""
    if doc is None:
        return None
    if not isinstance(doc, dict) or set(doc) - {"per", "nodes"} or "nodes" not in doc:
        raise ConfigError("spares: must be {per: rack, nodes: N}")
    policy = SparePolicy(per=str(doc.get("per", levels[-1])), nodes=doc["nodes"])
    problem = policy.problem(levels)
    if problem:
        raise ConfigError(problem)
    return policy if policy.nodes else None


def _history(doc: Any, need_secrets: bool) -> HistorySettings | None:
    """The `history:` section, its URL checked (not connected to: an unreachable store never stops a start)."""
    if doc is None:
        return None
    if not isinstance(doc, dict) or set(doc) - {"url", "retention", "max_unarchived"}:
        raise ConfigError("history: must be {url, retention, max_unarchived}")
    url = read_secret(doc.get("url"), "history.url") if need_secrets else "sqlite:///unread"
    if not url:
        raise ConfigError("history.url: required (sqlite:////PATH or postgresql+psycopg://USER@HOST/DB)")
    from synapse.history.store import check_url  # SQLAlchemy: only a master with history loads it

    try:
        url = check_url(url)
    except ValueError as exc:
        raise ConfigError(f"history.url: {exc}") from None
    max_unarchived = doc.get("max_unarchived", 50_000)
    if not isinstance(max_unarchived, int) or isinstance(max_unarchived, bool) or max_unarchived < 1:
        raise ConfigError(f"history.max_unarchived: must be a whole number of jobs, at least 1, not {max_unarchived!r}")
    try:
        retention = _duration(doc, "retention", 0.0)
    except ConfigError as exc:
        raise ConfigError(f"history.{exc}") from None
    return HistorySettings(url=url, retention=retention, max_unarchived=max_unarchived)


def load_cluster_config(path: str | Path, *, need_secrets: bool = True) -> ClusterConfig:
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    return parse_cluster_config(doc, need_secrets=need_secrets)
