"""The access rules themselves: every RPC has one, and token hashes are keyed (serving
refuses an RPC without one: tests/cluster/test_access.py)."""

from __future__ import annotations

import hashlib

import pytest

from synapse.core.model import Role
from synapse.master import access
from synapse.proto import api_pb2


def test_every_master_rpc_names_the_role_it_needs():
    methods = {m.name for m in api_pb2.DESCRIPTOR.services_by_name["Master"].methods}
    assert set(access.ACCESS) == methods


@pytest.mark.parametrize("method", sorted(m for m, r in access.ACCESS.items() if r is Role.ADMIN))
def test_admin_rpcs_refuse_users_and_say_why(method):
    alice = access.Identity("alice", Role.USER)
    why = access.denial(method, alice)
    assert why.startswith(f"user alice (role user) may not call {method}:") and "admin role" in why
    assert access.denial(method, access.Identity("root2", Role.ADMIN)) == ""


def test_user_rpcs_let_users_in():
    alice = access.Identity("alice", Role.USER)
    assert all(access.denial(m, alice) == "" for m, r in access.ACCESS.items() if r is Role.USER)


def test_token_hashes_are_keyed_by_the_raft_password():
    token = access.new_token()
    assert token.startswith("syn_") and len(token) > 40
    one, two = access.token_key("password-1"), access.token_key("password-2")
    assert access.token_hash(one, token) != access.token_hash(two, token)
    assert access.token_hash(one, token) != hashlib.sha256(token.encode()).hexdigest()
    assert access.token_hash(one, token) == access.token_hash(one, token)
