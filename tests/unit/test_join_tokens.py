"""Workers hold no admin credential (issue 27): join tokens register nodes and nothing else, each
node acts with its own credential, and what a worker keeps on disk opens only that node's calls.

The state machine's rules, on a bare ClusterState; tests/cluster/test_join_tokens.py tries them on a
real local cluster, whose workers `synapse-local` starts with a join token and never with the
cluster token."""

from __future__ import annotations

import pytest

from synapse.core import codec
from synapse.core import commands as c
from synapse.core.model import Resources, Role
from synapse.core.state import snapshot
from synapse.core.state.fsm import ClusterState
from synapse.master import access

CAPACITY = Resources(8000, 1 << 30, 8)


def register(node_id: str, at: float = 10.0) -> c.RegisterNode:
    return c.RegisterNode(at=at, node_id=node_id, address="h:1", topology=("z", "b", "r"), capacity=CAPACITY)


def created(state: ClusterState, token_id: str = "t1", expires_at: float = 0.0, max_uses: int = 0) -> None:
    assert state.apply(c.CreateJoinToken(at=1.0, by="admin", token_id=token_id, token_hash=token_id * 8,
                                         expires_at=expires_at, max_uses=max_uses)).ok


# ---- the state machine -----------------------------------------------------------------------------

def test_a_join_token_registers_new_nodes_within_its_uses_and_expiry():
    state = ClusterState()
    created(state, "t1", expires_at=100.0, max_uses=2)
    assert state.apply(c.JoinNode(at=10, token_id="t1", node=register("n1"))).value == "registered"
    refused = state.apply(c.JoinNode(at=11, token_id="t1", node=register("n1", 11)))
    assert not refused.ok and "re-registering it needs an admin or its own credential" in refused.error
    assert state.apply(c.JoinNode(at=12, token_id="t1", node=register("n2", 12))).ok
    used_up = state.apply(c.JoinNode(at=13, token_id="t1", node=register("n3", 13)))
    assert used_up.error == "join token t1 is used up (2 of 2 uses)" and "n3" not in state.nodes
    token = state.join_tokens["t1"]
    assert (token.uses, token.nodes) == (2, ("n1", "n2"))

    created(state, "t2", expires_at=100.0)
    assert state.apply(c.JoinNode(at=100.0, token_id="t2", node=register("n4", 100))).error == "join token t2 expired"
    assert state.apply(c.RevokeJoinToken(at=20, token_id="t2")).ok
    assert state.apply(c.JoinNode(at=21, token_id="t2", node=register("n4", 21))).code is c.Rejection.NOT_FOUND
    assert "t2" * 8 not in state.join_token_by_hash and set(state.nodes) == {"n1", "n2"}


def test_join_tokens_are_replicated_state_that_survives_a_snapshot_and_the_log():
    state = ClusterState()
    created(state, "t1", max_uses=3)
    join = c.JoinNode(at=10, token_id="t1", node=register("n1"))  # the node's at, term and by are the JoinNode's
    assert codec.decode_command(codec.encode_command(join)) == join
    assert codec.CURRENT.version_of(join) == 2 and codec.CURRENT.version_of(c.RegisterNode(
        at=1, node_id="x", address="", topology=(), capacity=CAPACITY)) == 1
    assert state.apply_bytes(codec.encode_command(join)).ok
    restored = ClusterState.from_snapshot(snapshot.encode(state))
    assert restored.digest() == state.digest() and restored.join_tokens == state.join_tokens
    assert restored.join_token_by_hash == {"t1" * 8: "t1"}


def test_a_state_without_join_tokens_encodes_as_before_them():
    """So a replica of the previous release, which has no such key, digests the same state alike."""
    state = ClusterState()
    assert state.apply(register("n1")).ok
    assert "join_tokens" not in snapshot.encode(state)


# ---- the access table ---------------------------------------------------------------------------

@pytest.mark.parametrize("method", sorted(access.ACCESS))
def test_a_node_or_join_token_identity_may_call_only_worker_calls(method):
    node = access.Identity("node/w1", Role.USER, node="w1")
    join = access.Identity("join-token/t1", Role.USER, join_token="t1")
    assert (access.denial(method, node) == "") == (method in access.NODE_CALLS)
    assert (access.denial(method, join) == "") == (method == "RegisterNode")
    if method not in access.NODE_CALLS:
        assert access.denial(method, node).startswith(f"node/w1 may not call {method}: a node's credential acts only")


# ---- real processes -------------------------------------------------------------------------------


