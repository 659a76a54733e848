"""`synctl cluster`: the master replicas (status, add-master, remove-master)."""

from __future__ import annotations

import click

from synapse.client import render
from synapse.client.cli.session import OUTPUT, Context, emit, fail, run
from synapse.client.master_client import ClientError, ClusterUnavailable
from synapse.proto import api_pb2


@click.group()
def cluster() -> None:
    """The master replicas."""


@cluster.command("status")
@OUTPUT
@click.pass_obj
def cluster_status(obj: Context, output: str) -> None:
    """Every replica: role, term, commit and applied index, how far the leader knows it has stored
    the log (MATCHED), the command-set version its code applies (VERSION), and who is reachable;
    and the cluster version, the highest every member is known to apply (commands of a newer kind
    wait for it)."""
    client = obj.client
    replicas = []
    matched: dict[str, int] = {}
    for address in list(client.addresses):
        try:
            s = client.replica_status(address, digest=True)
            replicas.append(render.replica_dict(address, s))
            if s.state == "leader":
                matched = dict(s.match_index)
        except (ClientError, ClusterUnavailable) as exc:
            replicas.append(render.unreachable_replica(address, str(exc)))
    if not any(r["reachable"] for r in replicas):
        fail("cluster unreachable: no master answered", 3)
    emit(render.cluster_dict(replicas, matched), output, render.cluster_text)


@cluster.command("add-master")
@click.option("--id", "replica_id", required=True, help="the new replica's id")
@click.option("--raft", "raft_address", required=True, help="its Raft address, host:port")
@click.option("--api", "api_address", required=True, help="its API address, host:port")
@click.pass_obj
def add_master(obj: Context, replica_id: str, raft_address: str, api_address: str) -> None:
    """Add a master replica (one at a time), then start its process with a cluster file listing it."""
    reply = run(lambda: obj.client.call("AddReplica", api_pb2.MembershipRequest(
        id=replica_id, raft_address=raft_address, api_address=api_address)))
    click.echo(reply.message)


@cluster.command("remove-master")
@click.option("--id", "replica_id", required=True, help="the replica to remove")
@click.option("--raft", "raft_address", default="", help="its Raft address if the cluster does not know it")
@click.pass_obj
def remove_master(obj: Context, replica_id: str, raft_address: str) -> None:
    """Remove a master replica (e.g. a dead one being replaced); stop its process afterwards."""
    reply = run(lambda: obj.client.call("RemoveReplica", api_pb2.MembershipRequest(
        id=replica_id, raft_address=raft_address)))
    click.echo(reply.message)
