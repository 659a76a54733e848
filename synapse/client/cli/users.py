"""synctl's verbs on users: `user add|rotate|remove|list` (admin) and `whoami`."""

from __future__ import annotations

import click

from synapse.client import render
from synapse.client.cli.session import OUTPUT, Context, emit, run
from synapse.proto import api_pb2


def _emit_token(reply: api_pb2.UserToken, output: str, verb: str) -> None:
    emit(render.token_dict(reply), output, lambda d: render.token_text(d, verb))


@click.group()
def user() -> None:
    """Manage users (admin), or see who you are."""


@user.command("add")
@click.argument("name")
@click.option("--group", "groups", multiple=True, help="a group the user belongs to (repeatable)")
@click.option("--admin", is_flag=True, help="give the user the admin role (default: user)")
@OUTPUT
@click.pass_obj
def user_add(obj: Context, name: str, groups: tuple[str, ...], admin: bool, output: str) -> None:
    """Add a user and print its token (once)."""
    reply = run(lambda: obj.client.call("AddUser", api_pb2.AddUserRequest(
        name=name, groups=list(groups), role="admin" if admin else "user")))
    _emit_token(reply, output, "added")


@user.command("rotate")
@click.argument("name", required=False, default="")
@OUTPUT
@click.pass_obj
def user_rotate(obj: Context, name: str, output: str) -> None:
    """Issue a new token for NAME (default: yourself); the old one stops working at once."""
    reply = run(lambda: obj.client.call("RotateUserToken", api_pb2.RotateUserTokenRequest(name=name)))
    _emit_token(reply, output, "has a new token")


@user.command("remove")
@click.argument("name")
@click.pass_obj
def user_remove(obj: Context, name: str) -> None:
    """Remove a user: its token stops working on every master. Its jobs keep running."""
    run(lambda: obj.client.call("RemoveUser", api_pb2.RemoveUserRequest(name=name)))
    click.echo(f"user {name} removed")


@user.command("list")
@OUTPUT
@click.pass_obj
def user_list(obj: Context, output: str) -> None:
    """List users (admin)."""
    users = [render.user_dict(u) for u in run(lambda: obj.client.call("ListUsers", api_pb2.ListUsersRequest())).users]
    emit(users, output, render.users_table)


@click.command()
@OUTPUT
@click.pass_obj
def whoami(obj: Context, output: str) -> None:
    """Who the cluster takes you for, and your role."""
    me = render.user_dict(run(lambda: obj.client.call("WhoAmI", api_pb2.WhoAmIRequest())))
    emit(me, output, render.whoami_text)
