"""The gRPC metadata Synapse's processes exchange: credentials and the leader hint.

Every RPC carries `authorization: Bearer <token>` (the cluster token, or a user's token); the
master resolves it to an identity (synapse.master.access). Worker calls also carry the node's
credential.
"""

from __future__ import annotations

#: Metadata key of the cluster token: `authorization: Bearer <token>`.
METADATA_KEY = "authorization"
#: Trailing metadata key naming the leader's API address on a redirect.
LEADER_METADATA_KEY = "synapse-leader"
#: Metadata key of the credential a worker got from RegisterNode: an HMAC only masters can make.
NODE_CREDENTIAL_KEY = "synapse-node-credential"


def client_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return ((METADATA_KEY, f"Bearer {token}"),) if token else ()

