"""The gRPC metadata Synapse's processes exchange: credentials and the leader hint.

Every RPC carries `authorization: Bearer <token>` (the cluster token, a user's token, or a join
token that may only register a node); the master resolves it to an identity (synapse.master.access).
A worker's calls carry its node's id and credential instead (or, from a worker started with the
cluster token, as well).
"""

from __future__ import annotations

#: Metadata key of the cluster token: `authorization: Bearer <token>`.
METADATA_KEY = "authorization"
#: Trailing metadata key naming the leader's API address on a redirect.
LEADER_METADATA_KEY = "synapse-leader"
#: Metadata key of the credential a worker got from RegisterNode: an HMAC only masters can make.
NODE_CREDENTIAL_KEY = "synapse-node-credential"
#: Metadata key of the node a credential is for (it makes the credential an identity on its own).
NODE_ID_KEY = "synapse-node-id"
#: Metadata key of a master replica's credential, for the calls replicas make to their leader.
REPLICA_CREDENTIAL_KEY = "synapse-replica-credential"


def client_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return ((METADATA_KEY, f"Bearer {token}"),) if token else ()


def node_metadata(node_id: str, credential: str) -> tuple[tuple[str, str], ...]:
    """What a worker sends to act as its node."""
    return ((NODE_ID_KEY, node_id), (NODE_CREDENTIAL_KEY, credential))

