"""synctl's verbs on queues: `apply` (a queue file), `get queues`, `describe queue`, `delete queue`,
and `preempt --what-if` (what the leader would preempt for a pending job)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import yaml

from synapse.client import render
from synapse.client.cli.session import OUTPUT, Context, emit, fail, run
from synapse.client.master_client import ClientError, ClusterUnavailable
from synapse.core.jobs import wire
from synapse.core.jobs.quantity import format_cpu, format_memory
from synapse.core.model import Queue, Resources
from synapse.core.queues import QueueFileError, parse_queue_file
from synapse.proto import api_pb2


@click.command("apply")
@click.argument("file", type=click.Path(dir_okay=False))
@click.pass_obj
def apply_file(obj: Context, file: str) -> None:
    """Create or update the queues a YAML file lists (`queues:`); the same file again changes nothing (admin)."""
    try:
        queues = parse_queue_file(yaml.safe_load(Path(file).read_text()))
    except OSError as exc:
        fail(f"cannot read {file}: {exc.strerror}", 2)
    except yaml.YAMLError as exc:
        fail(f"{file}: not valid YAML: {exc}", 2)
    except QueueFileError as exc:
        fail(f"invalid queue file {file}: {exc}", 2)
    reply = run(lambda: obj.client.call("ApplyQueues", api_pb2.ApplyQueuesRequest(
        queues=[wire.queue_to_proto(q) for q in queues])))
    for line in render.applied(reply):
        click.echo(line)
    try:
        nodes = obj.client.list_nodes()
        every = obj.client.call("ListQueues", api_pb2.ListQueuesRequest()).queues
    except (ClientError, ClusterUnavailable):
        return  # the queues are applied; what follows is advice
    capacity = sum((wire.resources_from_proto(n.capacity) for n in nodes), Resources())
    for line in guarantee_warnings(queues, [wire.queue_from_proto(q.spec) for q in every], capacity, len(nodes)):
        click.echo(f"synctl: warning: {line}", err=True)


def guarantee_warnings(applied: list[Queue], every: list[Queue], capacity: Resources, nodes: int) -> list[str]:
    """Guarantees the cluster cannot honour (`apply` still applies them: nodes may join later):
    each applied queue's beyond the registered nodes' capacity, and the top-level queues' together
    beyond it. Nothing while no node is registered."""
    if not nodes:
        return []
    amounts: dict[str, Callable[[int], str]] = {"gpu": str, "cpu": format_cpu, "memory": format_memory}

    def cluster(key: str) -> str:
        return f"the cluster has {amounts[key](getattr(capacity, key))} ({nodes} node(s))"

    out, beyond = [], set()
    for q in applied:
        for key, show in amounts.items():
            if getattr(q.guaranteed, key) > getattr(capacity, key):
                out.append(f"queue/{q.name} guarantees {key} {show(getattr(q.guaranteed, key))}, but {cluster(key)}")
                beyond.add(key)
    top = [q for q in every if not q.parent]
    for key, show in amounts.items():
        total = sum(getattr(q.guaranteed, key) for q in top)
        if key not in beyond and total > getattr(capacity, key):
            names = ", ".join(q.name for q in top if getattr(q.guaranteed, key))
            out.append(f"the top-level queues ({names}) guarantee {key} {show(total)} together, but {cluster(key)}")
    return out


def _queues(obj: Context) -> list[dict[str, Any]]:
    reply = run(lambda: obj.client.call("ListQueues", api_pb2.ListQueuesRequest()))
    return [render.queue_dict(q) for q in reply.queues]


@click.command("queues")
@OUTPUT
@click.pass_obj
def get_queues(obj: Context, output: str) -> None:
    """List queues with their GPU quota and what their gangs hold now."""
    emit(_queues(obj), output, render.queues_table)


@click.command("queue")
@click.argument("name")
@OUTPUT
@click.pass_obj
def describe_queue(obj: Context, name: str, output: str) -> None:
    """A queue's quota, who may submit, preemption settings and current use."""
    queue = next((q for q in _queues(obj) if q["name"] == name), None)
    if queue is None:
        fail(f"not found: unknown queue {name}", 2)
    emit(queue, output, render.queue_description)


@click.command()
@click.argument("job_id")
@click.option("--what-if", "what_if", is_flag=True, required=True,
              help="show the plan without committing it (the only mode: the leader preempts on its own)")
@OUTPUT
@click.pass_obj
def preempt(obj: Context, job_id: str, what_if: bool, output: str) -> None:
    """Which gangs the leader would preempt for pending job JOB_ID now, and why."""
    reply = run(lambda: obj.client.call("PreemptWhatIf", api_pb2.PreemptWhatIfRequest(job_id=job_id)))
    emit(render.preempt_dict(job_id, reply), output, render.preempt_text)


@click.group()
def delete() -> None:
    """Delete a queue."""


@delete.command("queue")
@click.argument("name")
@click.pass_obj
def delete_queue(obj: Context, name: str) -> None:
    """Delete a queue; refused while it holds unfinished jobs or has child queues (admin)."""
    run(lambda: obj.client.call("DeleteQueue", api_pb2.DeleteQueueRequest(name=name)))
    click.echo(f"queue/{name} deleted")
