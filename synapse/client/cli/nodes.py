"""synctl's verbs on nodes: `get nodes`, `describe node`, `cordon`, `uncordon`, `drain`, and
`node token` (join tokens for registering workers)."""

from __future__ import annotations

import click

from synapse.client import render
from synapse.client.cli.session import OUTPUT, Context, emit, fail, run
from synapse.core.jobs.quantity import QuantityError, parse_duration
from synapse.proto import api_pb2


@click.command("nodes")
@click.option("-o", "--output", type=click.Choice(["table", "wide", "json", "yaml"]), default="table",
              show_default=True, help="output format (wide: also the images each node holds)")
@click.pass_obj
def get_nodes(obj: Context, output: str) -> None:
    """List nodes with their capacity and use."""
    nodes = [render.node_dict(n) for n in run(obj.client.list_nodes)]
    emit(nodes, output, lambda data: render.nodes_table(data, wide=output == "wide"))


@click.command("node")
@click.argument("node_id")
@OUTPUT
@click.pass_obj
def describe_node(obj: Context, node_id: str, output: str) -> None:
    """A node's status, why it is cordoned, its health, labels, how it confines tasks, and its use."""
    found = [render.node_dict(n) for n in run(obj.client.list_nodes) if n.id == node_id]
    if not found:
        fail(f"not found: unknown node {node_id}")
    emit(found[0], output, render.node_description)


def _schedulable(obj: Context, node_id: str, schedulable: bool, reason: str = "") -> None:
    run(lambda: obj.client.call("SetSchedulable", api_pb2.SetSchedulableRequest(
        node_id=node_id, schedulable=schedulable, reason=reason)))


@click.command()
@click.argument("node_id")
@click.option("--reason", default="", help="why, shown with the node (get nodes, describe node)")
@click.pass_obj
def cordon(obj: Context, node_id: str, reason: str) -> None:
    """Stop placing new tasks on a node (running ones stay). A health check never lifts it."""
    _schedulable(obj, node_id, False, reason)
    click.echo(f"{node_id}: cordoned")


@click.command()
@click.argument("node_id")
@click.pass_obj
def uncordon(obj: Context, node_id: str) -> None:
    """Allow new tasks on a node again."""
    _schedulable(obj, node_id, True)
    click.echo(f"{node_id}: schedulable")


@click.command()
@click.argument("node_id")
@click.pass_obj
def drain(obj: Context, node_id: str) -> None:
    """Cordon a node and stop every gang with a task on it (they are requeued)."""
    reply = run(lambda: obj.client.call("DrainNode", api_pb2.DrainNodeRequest(node_id=node_id)))
    click.echo(render.drained(node_id, reply.jobs_stopped))


@click.group()
def node() -> None:
    """Nodes: join tokens for registering workers (admin)."""


@node.group("token")
def node_token() -> None:
    """Join tokens: each may only register new nodes, and each node gets its own credential."""


@node_token.command("create")
@click.option("--ttl", default="24h", show_default=True, help="how long it registers nodes (0: never expires)")
@click.option("--uses", type=click.IntRange(0, 1_000_000), default=0,
              help="how many nodes it registers (0: any number)")
@OUTPUT
@click.pass_obj
def node_token_create(obj: Context, ttl: str, uses: int, output: str) -> None:
    """Create a join token and print it (once)."""
    try:
        seconds = parse_duration(ttl)
    except QuantityError as exc:
        fail(f"--ttl: {exc}")
    reply = run(lambda: obj.client.call("CreateJoinToken", api_pb2.CreateJoinTokenRequest(ttl_s=seconds, uses=uses)))
    emit({**render.join_token_dict(reply.info), "token": reply.token}, output, render.join_token_text)


@node_token.command("list")
@OUTPUT
@click.pass_obj
def node_token_list(obj: Context, output: str) -> None:
    """List join tokens: expiry, uses and the nodes each registered (never the tokens)."""
    reply = run(lambda: obj.client.call("ListJoinTokens", api_pb2.ListJoinTokensRequest()))
    emit([render.join_token_dict(t) for t in reply.tokens], output, render.join_tokens_table)


@node_token.command("revoke")
@click.argument("token_id")
@click.pass_obj
def node_token_revoke(obj: Context, token_id: str) -> None:
    """Revoke a join token: it registers no more nodes (the nodes it registered keep their credentials)."""
    run(lambda: obj.client.call("RevokeJoinToken", api_pb2.RevokeJoinTokenRequest(id=token_id)))
    click.echo(f"join token {token_id} revoked")
