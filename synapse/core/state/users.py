"""The identity table: users and their API tokens (only a token's hash is kept).

State: `users`, `user_by_token`. Commands: AddUser, SetUserToken, RemoveUser.
"""

from __future__ import annotations

from synapse.core import commands as c
from synapse.core.commands import Result
from synapse.core.identity import groups_problem, user_name_problem
from synapse.core.model import User
from synapse.core.state.tables import ClusterTables


def add_user(state: ClusterTables, cmd: c.AddUser) -> Result:
    """A new user with a role, groups and a token's hash (the hash must be no other user's)."""
    problem = user_name_problem(cmd.name) or groups_problem(cmd.groups)
    if problem:
        return Result.rejected(problem)
    if cmd.name in state.users:
        return Result.rejected(f"user {cmd.name} already exists")
    if not cmd.token_hash or cmd.token_hash in state.user_by_token:
        return Result.rejected("token hash missing or already in use")
    state.users[cmd.name] = User(name=cmd.name, role=cmd.role, groups=cmd.groups, token_hash=cmd.token_hash,
                                 created_at=cmd.at, created_by=cmd.by, token_set_at=cmd.at)
    state.user_by_token[cmd.token_hash] = cmd.name
    return Result(True, value=cmd.name)


def set_user_token(state: ClusterTables, cmd: c.SetUserToken) -> Result:
    """A user's new token hash (rotation): the old token stops working."""
    user = state.users.get(cmd.name)
    if user is None:
        return Result.not_found(f"unknown user {cmd.name}")
    if not cmd.token_hash or cmd.token_hash in state.user_by_token:
        return Result.rejected("token hash missing or already in use")
    del state.user_by_token[user.token_hash]
    user.token_hash, user.token_set_at = cmd.token_hash, cmd.at
    state.user_by_token[cmd.token_hash] = cmd.name
    return Result(True, value=cmd.name)


def remove_user(state: ClusterTables, cmd: c.RemoveUser) -> Result:
    """Remove a user: its token stops working."""
    user = state.users.pop(cmd.name, None)
    if user is None:
        return Result.not_found(f"unknown user {cmd.name}")
    del state.user_by_token[user.token_hash]
    return Result(True, value=cmd.name)
