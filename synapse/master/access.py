"""Who is calling, and what they may do: identities, roles, token hashes, and the per-RPC rules.

Identities come from the replicated state, so every replica decides alike and a removed user's
token stops working as soon as its removal applies:

* the cluster token is the bootstrap admin (`admin`): the first operator uses it (and workers
  started before join tokens);
* a join token (`synctl node token create`) may register a new node and nothing else; the
  registration returns that node's credential (an HMAC of its id under a key only masters derive);
* a node's credential with its id (metadata `synapse-node-id`) is that node's identity: it may
  re-register, heartbeat, watch and report for that node, and nothing else;
* a replica's credential (an HMAC under the Raft password) lets a replica send its link shard's
  liveness digest to the leader, and nothing else;
* a user token (`synctl user add`) is looked up by its keyed hash (HMAC-SHA256 under a key derived
  from the Raft password, which clients and workers never see): the state, a snapshot or the log
  hold no usable token, and a stolen copy cannot even be checked against guesses offline;
* with `tls.user_certs`, a verified client certificate's common name names the user when the call
  carries no token (as a worker's certificate names its node);
* a cluster configured without a token lets every caller in as `anonymous`, an admin (a local
  development setting, as before users existed).

Every RPC of the Master service names the role it needs in `ACCESS`; `add_to_server` refuses to
start if one is missing, so a new RPC cannot be served unguarded. Ownership (a user cancels only
its own jobs) is checked by the endpoint, which knows the job.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from synapse.core.identity import ANONYMOUS, BOOTSTRAP_ADMIN
from synapse.core.model import Role

if TYPE_CHECKING:
    from synapse.master.replica import Master

#: What each RPC needs. `USER` lets any authenticated caller in; `ADMIN` only admins.
ACCESS: dict[str, Role] = {
    # reading is open to every user, as squeue and kubectl get are
    "GetJob": Role.USER, "ListJobs": Role.USER, "ListNodes": Role.USER, "ReplicaStatus": Role.USER,
    "WhoAmI": Role.USER, "ListQueues": Role.USER, "PreemptWhatIf": Role.USER,
    "WatchEvents": Role.USER, "ListHistory": Role.USER, "GetUsage": Role.USER,
    # a user's own work (the endpoint checks ownership)
    "SubmitJob": Role.USER, "SubmitJobs": Role.USER, "CancelJob": Role.USER, "LogAccess": Role.USER,
    "RotateUserToken": Role.USER, "UpdateJob": Role.USER, "StartStep": Role.USER, "AttachAccess": Role.USER,
    "SetJobHold": Role.USER, "RequeueJob": Role.USER,
    # operating the cluster
    "SetSchedulable": Role.ADMIN, "DrainNode": Role.ADMIN, "AddReplica": Role.ADMIN, "RemoveReplica": Role.ADMIN,
    "AddUser": Role.ADMIN, "RemoveUser": Role.ADMIN, "ListUsers": Role.ADMIN,
    "ApplyQueues": Role.ADMIN, "DeleteQueue": Role.ADMIN,
    # workers: a node's own credential (NODE_CALLS), or an admin who also presents it; RegisterNode
    # also takes a join token (JOIN_CALLS)
    "RegisterNode": Role.ADMIN, "Heartbeat": Role.ADMIN, "WatchAssignments": Role.ADMIN,
    "ReportTaskEvents": Role.ADMIN, "ReportPullProgress": Role.ADMIN,
    # replicas: a replica's credential (REPLICA_CALLS)
    "ReportLiveness": Role.ADMIN,
    "CreateJoinToken": Role.ADMIN, "ListJoinTokens": Role.ADMIN, "RevokeJoinToken": Role.ADMIN,
}
#: All that a node's credential may call (each for its own node only; the endpoint checks the id).
NODE_CALLS = frozenset({"RegisterNode", "Heartbeat", "WatchAssignments", "ReportTaskEvents", "ReportPullProgress"})
#: All that a join token may call.
JOIN_CALLS = frozenset({"RegisterNode"})
#: All that a replica's credential may call.
REPLICA_CALLS = frozenset({"ReportLiveness"})

#: Why each admin-only RPC is admin-only, for the PERMISSION_DENIED message.
_ADMIN_BECAUSE = {
    "SetSchedulable": "node operations", "DrainNode": "node operations",
    "AddReplica": "membership changes", "RemoveReplica": "membership changes",
    "AddUser": "user management", "RemoveUser": "user management", "ListUsers": "user management",
    "ApplyQueues": "queue management", "DeleteQueue": "queue management",
    "RegisterNode": "worker calls", "Heartbeat": "worker calls", "WatchAssignments": "worker calls",
    "ReportTaskEvents": "worker calls", "ReportPullProgress": "worker calls", "ReportLiveness": "replica calls",
    "CreateJoinToken": "join tokens", "ListJoinTokens": "join tokens", "RevokeJoinToken": "join tokens",
}

#: Prefixes of user tokens and join tokens, so a token found in a file says what it is.
TOKEN_PREFIX = "syn_"
JOIN_TOKEN_PREFIX = "synjoin_"


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller."""

    name: str
    role: Role
    groups: tuple[str, ...] = ()
    bootstrap: bool = False  #: the cluster token's admin (or an open cluster's anonymous caller)
    node: str = ""  #: the node whose credential this is ("" for people)
    join_token: str = ""  #: the id of the join token this is ("" for people)
    replica: bool = False  #: a master replica (its credential), for replica-to-leader calls only

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN

    @property
    def confined(self) -> bool:
        """A node's or a join token's identity: worker calls only, never a person's."""
        return bool(self.node or self.join_token or self.replica)


#: The caller of the RPC being served (set by the handler wrapper in synapse.master.api.base.add_to_server).
CALLER: ContextVar[Identity] = ContextVar("synapse_caller")

BOOTSTRAP = Identity(BOOTSTRAP_ADMIN, Role.ADMIN, bootstrap=True)
OPEN = Identity(ANONYMOUS, Role.ADMIN, bootstrap=True)
REPLICA = Identity("replica", Role.USER, replica=True)


def token_key(raft_password: str) -> bytes:
    """The key user tokens are hashed under; only masters can derive it."""
    return hashlib.sha256(b"synapse-user-token\0" + raft_password.encode()).digest()


def token_hash(key: bytes, token: str) -> str:
    return hmac.new(key, token.encode(), hashlib.sha256).hexdigest()


def new_token() -> str:
    """A fresh user token: 256 random bits."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def new_join_token() -> str:
    """A fresh join token: 256 random bits."""
    return JOIN_TOKEN_PREFIX + secrets.token_urlsafe(32)


def identify(master: Master, key: bytes, token: str, common_name: str = "", node_id: str = "",
             node_credential: str = "", replica_credential: str = "") -> Identity | None:
    """The identity these credentials name in this replica's state, if any (see the module doc)."""
    config = master.config
    if replica_credential:
        return REPLICA if hmac.compare_digest(replica_credential.encode(),
                                              master.replica_credential().encode()) else None
    if token:
        if config.token and hmac.compare_digest(token.encode(), config.token.encode()):
            return BOOTSTRAP
        hashed = token_hash(key, token)
        with master.lock:
            name = master.state.user_by_token.get(hashed)
            user = master.state.users.get(name) if name else None
            join = master.state.join_token_by_hash.get(hashed, "")
        if join:
            return Identity(f"join-token/{join}", Role.USER, join_token=join)
        return Identity(user.name, user.role, user.groups) if user else None
    if node_id and node_credential:
        if hmac.compare_digest(node_credential.encode(), master.node_credential(node_id).encode()):
            return Identity(f"node/{node_id}", Role.USER, node=node_id)
        return None
    if config.user_certs and common_name:
        with master.lock:
            user = master.state.users.get(common_name)
        if user is not None:
            return Identity(user.name, user.role, user.groups)
    if not config.token:
        return OPEN
    return None


def denial(method: str, caller: Identity) -> str:
    """Why `caller` may not call `method`, or '' if it may."""
    if caller.confined:
        allowed = NODE_CALLS if caller.node else REPLICA_CALLS if caller.replica else JOIN_CALLS
        if method in allowed:
            return ""
        return (f"{caller.name} may not call {method}: "
                + (f"a node's credential acts only as that node ({', '.join(sorted(allowed))})" if caller.node
                   else "a join token only registers a new node"))
    needed = ACCESS[method]
    if needed is Role.ADMIN and not caller.is_admin:
        return (f"user {caller.name} (role {caller.role.value}) may not call {method}: "
                f"{_ADMIN_BECAUSE.get(method, 'this call')} need the admin role")
    return ""
