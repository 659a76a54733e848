"""`synctl`: the command-line client. Every command works against any master address.

Errors are one clear line on stderr and a non-zero exit: 2 for bad input (an invalid job file,
an unknown id), 3 when the cluster cannot be reached, 4 for refused credentials, 1 for a job
that ended other than SUCCEEDED under `submit --wait`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
import grpc
import yaml

from synapse.client.jobfile import load_job_file
from synapse.client.master_client import (
    AuthError,
    ClientError,
    ClusterUnavailable,
    MasterClient,
    PermissionDenied,
    TLSError,
    new_request_id,
    parse_addresses,
)
from synapse.common.cli import CONTEXT_SETTINGS, version_option
from synapse.common.cli import fail as common_fail
from synapse.common.tls import TLSFiles, channel_credentials
from synapse.core import codec
from synapse.core.jobspec import JobFileError, parse_job
from synapse.core.quantity import format_cpu, format_memory
from synapse.core.queues import QueueFileError, parse_queue_file, queue_name_problem
from synapse.proto import api_pb2, api_pb2_grpc

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
#: Exit codes (README, "synctl"): 2 refused or bad input, 3 cluster unreachable, 4 not
#: authenticated, 5 authenticated but not allowed.
EXIT_DENIED = 5


class Context:
    def __init__(self, masters: str, token: str, timeout: float, tls: TLSFiles) -> None:
        self.masters, self.token, self.timeout, self.tls = masters, token, timeout, tls
        self._client: MasterClient | None = None

    @property
    def client(self) -> MasterClient:
        if self._client is None:
            if not self.masters:
                fail("no masters given: use --masters host:port[,host:port…] or set SYNAPSE_MASTERS", 2)
            self._client = MasterClient(self.masters, self.token, deadline=self.timeout, tls=self.tls)
        return self._client


def fail(message: str, code: int = 2) -> NoReturn:
    common_fail("synctl", message, code)


def run(action: Callable[[], Any]) -> Any:
    """Run a client action, turning its failures into one line and an exit code."""
    try:
        return action()
    except TLSError as exc:
        fail(f"TLS failed: {exc.message} (check --ca / SYNAPSE_CA, --cert, --key)", 4)
    except PermissionDenied as exc:
        fail(exc.message, EXIT_DENIED)
    except AuthError as exc:
        fail(f"authentication failed: {exc.message} (check --token / SYNAPSE_TOKEN)", 4)
    except ClientError as exc:
        prefix = {grpc.StatusCode.NOT_FOUND: "not found", grpc.StatusCode.INVALID_ARGUMENT: "rejected"}
        fail(f"{prefix.get(exc.code, exc.code.name.lower())}: {exc.message}", 2)
    except ClusterUnavailable as exc:
        fail(f"cluster unreachable: {exc}", 3)


def emit(data: Any, output: str, table: Callable[[Any], str]) -> None:
    if output == "json":
        click.echo(json.dumps(data, indent=2))
    elif output == "yaml":
        click.echo(yaml.safe_dump(data, sort_keys=False).rstrip())
    else:
        click.echo(table(data))


def render_table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def job_dict(info: api_pb2.JobInfo) -> dict[str, Any]:
    spec = codec.job_spec_from_proto(info.spec)
    return {
        "id": info.id, "name": spec.name, "status": info.status, "attempt": info.attempt,
        "max_restarts": spec.max_restarts, "priority": spec.priority, "tasks_requested": spec.tasks,
        "queue": spec.queue or "default", "grace_s": spec.grace or None,
        "resources": {"cpu": format_cpu(spec.resources.cpu), "memory": format_memory(spec.resources.memory),
                      "gpu": spec.resources.gpu},
        "topology": {"pack": spec.topology.pack or "lowest", "mode": spec.topology.mode.value},
        "command": list(spec.command), "request_id": info.request_id, "user": info.user or None,
        "cancelled_by": info.cancelled_by or None,
        "submitted_at": info.submitted_at, "started_at": info.started_at or None,
        "finished_at": info.finished_at or None,
        "tasks": [{"index": t.index, "rank": t.rank, "node": t.node_id, "gpus": list(t.gpus), "state": t.state,
                   "exit_code": t.exit_code if t.has_exit_code else None, "reason": t.reason or None,
                   "reason_message": t.reason_message or None} for t in info.tasks],
        "failure": info.failure or None, "gpu_model": spec.gpu_model or None,
        "waiting": info.waiting or None, "shortfalls": list(info.shortfalls), "reservation": info.reservation or None,
        "events": [{"at": e.at, "reason": e.kind, "kind": e.kind, "message": e.message} for e in info.events],
    }


def node_dict(n: api_pb2.NodeInfo) -> dict[str, Any]:
    capacity, used = codec.resources_from_proto(n.capacity), codec.resources_from_proto(n.used)
    return {"id": n.id, "address": n.address, "topology": "/".join(n.topology), "status": n.status,
            "schedulable": n.schedulable, "cordon_reason": n.cordon_reason or None, "health": n.health or None,
            "labels": dict(sorted(n.labels.items())), "isolation": n.isolation or None,
            "gpus": capacity.gpu, "gpus_used": used.gpu,
            "gpus_in_use": list(n.gpus_in_use), "cpu": format_cpu(capacity.cpu),
            "cpu_used": format_cpu(used.cpu), "memory": format_memory(capacity.memory),
            "memory_used": format_memory(used.memory), "live_tasks": n.live_tasks}


def _labels(n: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in n["labels"].items() if k == "gpu_model") or "-"


def _worker_channel(obj: Context, address: str, node_id: str) -> grpc.Channel:
    """A channel to a worker's log service: over TLS when the cluster uses it, checking that the
    worker's certificate was issued to that node (not merely to some host at that address)."""
    if not obj.tls.enabled:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, channel_credentials(obj.tls),
                               options=[("grpc.ssl_target_name_override", node_id)])


def when(ts: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else "-"


OUTPUT = click.option("-o", "--output", type=click.Choice(["table", "json", "yaml"]), default="table",
                      show_default=True, help="output format")


@click.group(context_settings=CONTEXT_SETTINGS)
@version_option("synctl")
@click.option("--masters", envvar="SYNAPSE_MASTERS", default="",
              help="comma-separated master API addresses (any replica works) [env: SYNAPSE_MASTERS]")
@click.option("--token", envvar="SYNAPSE_TOKEN", default="", help="cluster token [env: SYNAPSE_TOKEN]")
@click.option("--timeout", type=float, default=30.0, show_default=True,
              help="seconds to keep trying (across failovers) before giving up")
@click.option("--ca", envvar="SYNAPSE_CA", default="", help="CA of the masters' TLS certificates [env: SYNAPSE_CA]")
@click.option("--cert", envvar="SYNAPSE_CERT", default="", help="client certificate, if the cluster wants one")
@click.option("--key", envvar="SYNAPSE_KEY", default="", help="its private key")
@click.pass_context
def main(ctx: click.Context, masters: str, token: str, timeout: float, ca: str, cert: str, key: str) -> None:
    """Submit and inspect gang jobs on a Synapse cluster."""
    ctx.obj = Context(masters, token, timeout, TLSFiles(ca, cert, key))


@main.command(context_settings={"ignore_unknown_options": False})
@click.argument("job_file", required=False, type=click.Path(dir_okay=False))
@click.argument("command", nargs=-1)
@click.option("--request-id", help="idempotency key: the same id always yields the same job")
@click.option("--wait", is_flag=True, help="follow the job until it ends; exit 0 only if it SUCCEEDED")
@click.option("--name", help="job name (shorthand without a file)")
@click.option("--tasks", type=int, help="gang size")
@click.option("--cpu", help="cpu per task, e.g. 4 or 500m")
@click.option("--mem", "--memory", "memory", help="memory per task, e.g. 16Gi")
@click.option("--gpu", type=int, help="GPUs per task")
@click.option("--image", help="container image for an external runtime")
@click.option("--pack", help="topology level to pack the gang in (rack, block, zone, node)")
@click.option("--required", is_flag=True, help="wait rather than spread beyond --pack")
@click.option("--priority", type=int)
@click.option("--max-restarts", type=int)
@click.option("--time-limit", help="e.g. 2h; lets the job backfill ahead of a reservation")
@click.option("--env", "env", multiple=True, help="NAME=value (repeatable)")
@click.option("--queue", help="the queue to submit to (overrides the job file's; default: the default queue)")
@OUTPUT
@click.pass_obj
def submit(obj: Context, job_file: str | None, command: tuple[str, ...], request_id: str | None, wait: bool,
           output: str, **flags: Any) -> None:
    """Submit a job file, or a one-off job from flags: `submit --tasks 2 --gpu 1 -- python x.py`."""
    shorthand = bool(command) or any(flags[k] is not None for k in ("tasks", "cpu", "memory", "gpu", "name",
                                                                     "image"))
    try:
        if shorthand:
            spec = parse_job(_flags_to_doc(([job_file] if job_file else []) + list(command), flags))
        elif job_file:
            spec = load_job_file(job_file)
        else:
            raise JobFileError("(arguments)", "give a job file, or flags and a command: submit --gpu 1 -- python x.py")
    except JobFileError as exc:
        fail(f"invalid job{'' if shorthand or not job_file else ' file ' + job_file}: {exc}", 2)
    if flags["queue"]:
        problem = queue_name_problem(flags["queue"])
        if problem:
            fail(f"invalid job: queue: {problem}", 2)
        spec = dataclasses.replace(spec, queue=flags["queue"])
    rid = request_id or new_request_id()
    job_id = run(lambda: obj.client.submit(codec.job_spec_to_proto(spec), request_id=rid))
    if output == "table":
        click.echo(job_id)
    else:
        emit({"id": job_id, "request_id": rid}, output, str)
    if wait:
        sys.exit(_follow(obj, job_id, quiet=output != "table"))


def _flags_to_doc(argv: list[str], flags: dict[str, Any]) -> dict[str, Any]:
    if not argv:
        raise JobFileError("command", "give a job file, or a command after -- (e.g. -- python train.py)")
    doc: dict[str, Any] = {"name": flags["name"] or os.path.basename(argv[0]).replace(" ", "-")[:40] or "job",
                           "command": argv, "tasks": flags["tasks"] or 1, "resources": {}}
    for key, field in (("cpu", "cpu"), ("memory", "memory"), ("gpu", "gpu")):
        if flags[key] is not None:
            doc["resources"][field] = flags[key]
    for key in ("image", "priority", "max_restarts", "time_limit"):
        if flags[key] is not None:
            doc[key] = flags[key]
    if flags["pack"]:
        doc["topology"] = {"pack": flags["pack"], "mode": "required" if flags["required"] else "preferred"}
    env = {}
    for item in flags["env"]:
        key, sep, value = item.partition("=")
        if not sep:
            raise JobFileError("env", f"expected NAME=value, got {item!r}")
        env[key] = value
    if env:
        doc["env"] = env
    return doc


def _follow(obj: Context, job_id: str, quiet: bool = False) -> int:
    seen_events = 0
    while True:
        info = run(lambda: obj.client.get_job(job_id))
        for event in info.events[seen_events:]:
            if not quiet:
                click.echo(f"{when(event.at)}  {event.kind:<10} {event.message}")
        seen_events = len(info.events)
        if info.status in TERMINAL:
            return 0 if info.status == "SUCCEEDED" else 1
        time.sleep(0.25)


@main.group()
def get() -> None:
    """List jobs or nodes."""


@get.command("jobs")
@click.option("--status", multiple=True, help="only jobs in this status (repeatable)")
@click.option("--user", default="", help="only jobs this user submitted")
@OUTPUT
@click.pass_obj
def get_jobs(obj: Context, status: tuple[str, ...], user: str, output: str) -> None:
    """List jobs, oldest first."""
    jobs = [job_dict(j) for j in run(lambda: obj.client.list_jobs([s.upper() for s in status], user=user))]
    emit(jobs, output, lambda rows: render_table(
        ["ID", "NAME", "USER", "STATUS", "ATTEMPT", "TASKS", "GPU/TASK", "SUBMITTED"],
        [[j["id"], j["name"], j["user"] or "-", j["status"], j["attempt"], j["tasks_requested"],
          j["resources"]["gpu"], when(j["submitted_at"])] for j in rows]))


@get.command("nodes")
@OUTPUT
@click.pass_obj
def get_nodes(obj: Context, output: str) -> None:
    """List nodes with their capacity and use."""
    nodes = [node_dict(n) for n in run(obj.client.list_nodes)]
    emit(nodes, output, lambda rows: render_table(
        ["ID", "STATUS", "SCHEDULABLE", "TOPOLOGY", "GPUS", "LABELS", "CPU", "MEMORY", "TASKS", "ADDRESS", "REASON"],
        [[n["id"], n["status"], "yes" if n["schedulable"] else "no", n["topology"],
          f"{n['gpus_used']}/{n['gpus']}", _labels(n), f"{n['cpu_used']}/{n['cpu']}",
          f"{n['memory_used']}/{n['memory']}", n["live_tasks"], n["address"],
          n["cordon_reason"] or (f"unhealthy: {n['health']}" if n["health"] else "")] for n in rows]))


@main.group()
def describe() -> None:
    """Show one object in detail."""


@describe.command("job")
@click.argument("job_id")
@OUTPUT
@click.pass_obj
def describe_job(obj: Context, job_id: str, output: str) -> None:
    """Status, attempt, placement, events, and for a pending job why it waits."""
    job = job_dict(run(lambda: obj.client.get_job(job_id)))
    emit(job, output, _describe_table)


def _describe_table(j: dict[str, Any]) -> str:
    r = j["resources"]
    cancelled = f" (cancelled by {j['cancelled_by']})" if j["cancelled_by"] else ""
    lines = [f"Job:        {j['id']} ({j['name']})", f"Status:     {j['status']}{cancelled}",
             f"User:       {j['user'] or '-'}   Queue: {j['queue']}",
             f"Attempt:    {j['attempt']} of {j['max_restarts'] + 1}",
             f"Gang:       {j['tasks_requested']} task(s) x cpu {r['cpu']}, memory {r['memory']}, gpu {r['gpu']}",
             f"Topology:   pack {j['topology']['pack']} ({j['topology']['mode']})",
             f"Priority:   {j['priority']}", f"Command:    {' '.join(j['command'])}",
             f"Submitted:  {when(j['submitted_at'])}   Started: {when(j['started_at'])}   "
             f"Finished: {when(j['finished_at'])}"]
    if j["waiting"]:
        lines.append(f"Waiting:    {j['waiting']}")
        lines += [f"  - {s}" for s in j["shortfalls"]]
    if j["reservation"]:
        lines.append(f"Reserved:   {j['reservation']}")
    if j["failure"]:
        lines.append(f"Failed:     {j['failure']}")
    if j["tasks"]:
        lines += ["Tasks:", "  " + render_table(["INDEX", "RANK", "NODE", "GPUS", "STATE", "EXIT", "REASON"], [
            [t["index"], t["rank"], t["node"], ",".join(map(str, t["gpus"])) or "-", t["state"],
             "-" if t["exit_code"] is None else t["exit_code"],
             (t["reason"] or "-") + (f" ({t['reason_message']})" if t["reason_message"] else "")]
            for t in j["tasks"]]).replace("\n", "\n  ")]
    lines += ["Events:"] + [f"  {when(e['at'])}  {e['kind']:<10} {e['message']}" for e in j["events"]]
    return "\n".join(lines)


@describe.command("node")
@click.argument("node_id")
@OUTPUT
@click.pass_obj
def describe_node(obj: Context, node_id: str, output: str) -> None:
    """A node's status, why it is cordoned, its health, labels, how it confines tasks, and its use."""
    found = [node_dict(n) for n in run(obj.client.list_nodes) if n.id == node_id]
    if not found:
        fail(f"not found: unknown node {node_id}")
    emit(found[0], output, _describe_node_table)


def _describe_node_table(n: dict[str, Any]) -> str:
    lines = [f"Node:         {n['id']}   Address: {n['address']}", f"Status:       {n['status']}",
             f"Schedulable:  {'yes' if n['schedulable'] else 'no: ' + (n['cordon_reason'] or 'cordoned')}",
             f"Health:       {'failing: ' + n['health'] if n['health'] else 'passing (or no health check)'}",
             f"Topology:     {n['topology']}",
             f"Labels:       {', '.join(f'{k}={v}' for k, v in n['labels'].items()) or '-'}",
             f"Isolation:    {n['isolation'] or 'unknown (the worker did not say)'}",
             f"GPUs:         {n['gpus_used']}/{n['gpus']} in use"
             + (f" (indices {','.join(map(str, n['gpus_in_use']))})" if n["gpus_in_use"] else ""),
             f"CPU:          {n['cpu_used']}/{n['cpu']}", f"Memory:       {n['memory_used']}/{n['memory']}",
             f"Tasks:        {n['live_tasks']}"]
    return "\n".join(lines)


@main.command()
@click.argument("job_id")
@click.option("--task", "task_index", type=int, help="only this task index (default: all)")
@click.option("--attempt", type=int, help="attempt number (default: the latest that ran)")
@click.option("-f", "--follow", is_flag=True, help="keep printing while the tasks run")
@click.pass_obj
def logs(obj: Context, job_id: str, task_index: int | None, attempt: int | None, follow: bool) -> None:
    """Print a job's task output, read straight from the workers that ran it (yours, or any as admin)."""
    access = run(lambda: obj.client.call("LogAccess", api_pb2.LogAccessRequest(job_id=job_id, attempt=attempt or 0)))
    tickets = {t.index: t for t in access.tickets}
    indices = [task_index] if task_index is not None else sorted(tickets)
    if any(i not in tickets for i in indices):
        fail(f"job {job_id} has tasks 0..{len(tickets) - 1}", 2)
    prefix = len(indices) > 1

    def stream(index: int) -> None:
        ticket = tickets[index]
        channel = _worker_channel(obj, ticket.address, ticket.node_id)
        request = api_pb2.ReadLogRequest(job_id=job_id, attempt=access.attempt, index=index, follow=follow,
                                         ticket=ticket.ticket)
        try:
            for chunk in api_pb2_grpc.WorkerStub(channel).ReadLog(request):
                text = chunk.data.decode(errors="replace")
                if prefix:
                    text = "".join(f"[task {index}] {line}" for line in text.splitlines(keepends=True))
                click.echo(text, nl=False)
        except grpc.RpcError as exc:
            click.echo(f"synctl: task {index} on {ticket.node_id}: {exc.details() or exc.code().name}", err=True)
        finally:
            channel.close()

    threads = [threading.Thread(target=stream, args=(i,)) for i in indices] if follow else []
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not follow:
        for i in indices:
            stream(i)


@main.command()
@click.argument("job_id")
@click.option("--reason", default="", help="recorded in the job's events")
@click.pass_obj
def cancel(obj: Context, job_id: str, reason: str) -> None:
    """Cancel a job: pending jobs end at once, running gangs are stopped first."""
    click.echo(f"{job_id}: {run(lambda: obj.client.cancel(job_id, reason))}")


def _schedulable(obj: Context, node_id: str, schedulable: bool, reason: str = "") -> None:
    run(lambda: obj.client.call("SetSchedulable", api_pb2.SetSchedulableRequest(
        node_id=node_id, schedulable=schedulable, reason=reason)))


@main.command()
@click.argument("node_id")
@click.option("--reason", default="", help="why, shown with the node (get nodes, describe node)")
@click.pass_obj
def cordon(obj: Context, node_id: str, reason: str) -> None:
    """Stop placing new tasks on a node (running ones stay). A health check never lifts it."""
    _schedulable(obj, node_id, False, reason)
    click.echo(f"{node_id}: cordoned")


@main.command()
@click.argument("node_id")
@click.pass_obj
def uncordon(obj: Context, node_id: str) -> None:
    """Allow new tasks on a node again."""
    _schedulable(obj, node_id, True)
    click.echo(f"{node_id}: schedulable")


@main.command()
@click.argument("node_id")
@click.pass_obj
def drain(obj: Context, node_id: str) -> None:
    """Cordon a node and stop every gang with a task on it (they are requeued)."""
    reply = run(lambda: obj.client.call("DrainNode", api_pb2.DrainNodeRequest(node_id=node_id)))
    click.echo(f"{node_id}: drained; stopped {len(reply.jobs_stopped)} job(s)"
               + (": " + ", ".join(reply.jobs_stopped) if reply.jobs_stopped else ""))


@main.group()
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
            replicas.append({"id": s.id, "address": address, "reachable": True, "state": s.state, "term": s.term,
                             "commit_index": s.commit_index, "applied_index": s.applied_index,
                             "commands_applied": s.commands_applied, "digest": s.digest[:12],
                             "leader": s.leader_api or None, "connected_to": list(s.connected),
                             "raft_address": s.raft_address, "log_start": s.log_start,
                             "command_version": s.command_version or None, "cluster_version": s.cluster_version})
            if s.state == "leader":
                matched = dict(s.match_index)
        except (ClientError, ClusterUnavailable) as exc:
            replicas.append({"id": None, "address": address, "reachable": False, "error": str(exc)})
    for r in replicas:  # the leader's view of each follower: a replica catching up shows it rising
        if r.get("raft_address") in matched:
            r["matched_index"] = matched[r["raft_address"]]
    leaders = [r for r in replicas if r.get("state") == "leader"]
    if not any(r["reachable"] for r in replicas):
        fail("cluster unreachable: no master answered", 3)
    top = max(leaders, key=lambda r: r["term"]) if leaders else None
    data = {"leader": {"id": top["id"], "address": top["address"]} if top else None,
            "term": top["term"] if top else max((r.get("term", 0) for r in replicas), default=0),
            "cluster_version": top["cluster_version"] if top else None, "replicas": replicas}
    emit(data, output, lambda d: (f"leader: {d['leader']['id']} at {d['leader']['address']} (term {d['term']})"
                                  if d["leader"] else "leader: none")
         + f"\ncluster version: {d['cluster_version'] or 'unknown (no leader)'}\n" + render_table(
        ["ID", "ADDRESS", "STATE", "TERM", "COMMIT", "APPLIED", "MATCHED", "DIGEST", "VERSION", "REACHABLE"],
        [[r.get("id") or "?", r["address"], r.get("state", "-"), r.get("term", "-"), r.get("commit_index", "-"),
          r.get("applied_index", "-"), r.get("matched_index", "-"), r.get("digest", "-"),
          r.get("command_version") or "-", "yes" if r["reachable"] else "no"]
         for r in d["replicas"]]))


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


def _amounts(r: api_pb2.Resources, limit: bool) -> dict[str, Any]:
    """A queue's amounts as a user writes them; in a limit, a negative amount is no limit."""
    out: dict[str, Any] = {}
    for key, value, show in (("gpu", r.gpu, str), ("cpu", r.cpu_millis, format_cpu),
                             ("memory", r.memory_bytes, format_memory)):
        if limit and value < 0:
            continue
        out[key] = value if key == "gpu" else show(value)
    return out


def queue_dict(q: api_pb2.QueueInfo) -> dict[str, Any]:
    s = q.spec
    return {"name": s.name, "parent": s.parent or None, "weight": s.weight,
            "guaranteed": _amounts(s.guaranteed, False), "max": _amounts(s.max, True),
            "lending_limit": _amounts(s.lending_limit, True), "users": list(s.users), "groups": list(s.groups),
            "preemption": {"rules": list(s.preemption_rules), "min_runtime_s": s.min_runtime_s,
                           "max_grace_s": s.max_grace_s},
            "usage": _amounts(q.usage, False), "pending": q.pending, "running": q.running,
            **({"implicit": True} if q.implicit else {})}


@main.command("apply")
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
        queues=[codec.queue_to_proto(q) for q in queues])))
    for verb, names in (("created", reply.created), ("configured", reply.changed), ("unchanged", reply.unchanged)):
        for name in names:
            click.echo(f"queue/{name} {verb}")


def _queues(obj: Context) -> list[dict[str, Any]]:
    return [queue_dict(q) for q in run(lambda: obj.client.call("ListQueues", api_pb2.ListQueuesRequest())).queues]


def _gpus(amounts: dict[str, Any]) -> str:
    return str(amounts["gpu"]) if "gpu" in amounts else "-"


def event_dict(e: api_pb2.ClusterEventInfo) -> dict[str, Any]:
    return {"seq": e.seq, "at": e.at, "type": e.type, "topic": e.topic, "reason": e.reason,
            "object": e.object_id, "message": e.message}


@get.command("events")
@click.option("--for", "subject", default="", help="job/ID or node/ID: only that object's events")
@click.option("--after", type=int, default=0, help="only events after this cursor (seq)")
@click.option("-w", "--watch", is_flag=True, help="keep printing new events (JSON lines with -o json)")
@OUTPUT
@click.pass_obj
def get_events(obj: Context, subject: str, after: int, watch: bool, output: str) -> None:
    """The cluster's events, oldest first; any master serves them. With --watch, a dropped
    connection is resumed from the last event printed, on any master: no gap, no repeat."""
    kind, _, ident = subject.partition("/")
    if subject and (kind not in ("job", "node") or not ident):
        fail("--for: job/ID or node/ID", 2)
    request = api_pb2.WatchEventsRequest(after=after, follow=watch, job_id=ident if kind == "job" else "",
                                         node_id=ident if kind == "node" else "")
    if not watch:
        _, stream = obj.client.stream("WatchEvents", request, timeout=obj.timeout)
        events = run(lambda: [event_dict(e) for e in _events(stream)])
        emit(events, output, lambda rows: render_table(
            ["SEQ", "TIME", "TYPE", "REASON", "OBJECT", "MESSAGE"],
            [[e["seq"], when(e["at"]), e["type"], e["reason"], f"{e['topic']}/{e['object']}", e["message"]]
             for e in rows]))
        return
    addresses, tried = parse_addresses(obj.masters), 0
    while True:
        address = addresses[tried % len(addresses)]
        try:
            stub = obj.client.stub(address)
            for e in stub.WatchEvents(request, metadata=obj.client.metadata):
                request.after = e.seq
                line = event_dict(e)
                if output == "json":
                    click.echo(json.dumps(line), nl=True)
                else:
                    click.echo(f"{e.seq:<7} {when(e.at)}  {e.type:<8} {e.reason:<16} {e.topic}/{e.object_id}  "
                               f"{e.message}")
                sys.stdout.flush()
                tried = 0
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                              grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.INVALID_ARGUMENT):
                fail(f"{exc.code().name.lower()}: {exc.details()}", 4 if exc.code() == grpc.StatusCode.UNAUTHENTICATED
                     else 2)
            tried += 1
            if tried > 3 * len(addresses):
                fail(f"cluster unreachable: {exc.details()}", 3)
            time.sleep(min(2.0, 0.1 * tried))


def _events(stream) -> list:
    try:
        return list(stream)
    except grpc.RpcError as exc:
        raise ClientError(exc.code(), exc.details() or exc.code().name) from None


@get.command("queues")
@OUTPUT
@click.pass_obj
def get_queues(obj: Context, output: str) -> None:
    """List queues with their GPU quota and what their gangs hold now."""
    emit(_queues(obj), output, lambda rows: render_table(
        ["NAME", "PARENT", "WEIGHT", "GPU USED", "GPU GUARANTEED", "GPU MAX", "PENDING", "RUNNING"],
        [[q["name"], q["parent"] or "-", f"{q['weight']:g}", _gpus(q["usage"]), _gpus(q["guaranteed"]),
          _gpus(q["max"]), q["pending"], q["running"]] for q in rows]))


@describe.command("queue")
@click.argument("name")
@OUTPUT
@click.pass_obj
def describe_queue(obj: Context, name: str, output: str) -> None:
    """A queue's quota, who may submit, preemption settings and current use."""
    queue = next((q for q in _queues(obj) if q["name"] == name), None)
    if queue is None:
        fail(f"not found: unknown queue {name}", 2)
    emit(queue, output, lambda q: yaml.safe_dump(q, sort_keys=False).rstrip())


@main.command()
@click.argument("job_id")
@click.option("--what-if", "what_if", is_flag=True, required=True,
              help="show the plan without committing it (the only mode: the leader preempts on its own)")
@OUTPUT
@click.pass_obj
def preempt(obj: Context, job_id: str, what_if: bool, output: str) -> None:
    """Which gangs the leader would preempt for pending job JOB_ID now, and why."""
    reply = run(lambda: obj.client.call("PreemptWhatIf", api_pb2.PreemptWhatIfRequest(job_id=job_id)))
    data = {"job": job_id, "possible": reply.possible, "rule": reply.rule or None, "victims": list(reply.victims),
            "nodes": list(reply.nodes), "explanation": reply.explanation,
            "lost_gpu_seconds": reply.lost_gpu_seconds if reply.possible else None}
    emit(data, output, lambda d: (
        f"would preempt {', '.join(d['victims'])} (rule {d['rule']}) and hold {', '.join(d['nodes'])}\n"
        f"{d['explanation']}" if d["possible"] else f"no preemption for {job_id}: {d['explanation']}"))


@main.group()
def delete() -> None:
    """Delete a queue."""


@delete.command("queue")
@click.argument("name")
@click.pass_obj
def delete_queue(obj: Context, name: str) -> None:
    """Delete a queue; refused while it holds unfinished jobs or has child queues (admin)."""
    run(lambda: obj.client.call("DeleteQueue", api_pb2.DeleteQueueRequest(name=name)))
    click.echo(f"queue/{name} deleted")


def user_dict(u: api_pb2.UserInfo) -> dict[str, Any]:
    return {"name": u.name, "role": u.role, "groups": list(u.groups), "created_at": u.created_at or None,
            "created_by": u.created_by or None, "token_set_at": u.token_set_at or None,
            **({"bootstrap": True} if u.bootstrap else {})}


def _emit_token(reply: api_pb2.UserToken, output: str, verb: str) -> None:
    data = {**user_dict(reply.user), "token": reply.token}
    emit(data, output, lambda d: (
        f"user {d['name']} {verb} (role {d['role']}, groups {','.join(d['groups']) or '-'}).\n"
        f"Its token, shown this once (the cluster keeps only a keyed hash):\n\n"
        f"export SYNAPSE_TOKEN={d['token']}"))


@main.group()
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
    users = [user_dict(u) for u in run(lambda: obj.client.call("ListUsers", api_pb2.ListUsersRequest())).users]
    emit(users, output, lambda rows: render_table(
        ["NAME", "ROLE", "GROUPS", "CREATED", "BY", "TOKEN SET"],
        [[u["name"], u["role"], ",".join(u["groups"]) or "-", when(u["created_at"]), u["created_by"] or "-",
          when(u["token_set_at"])] for u in rows]))


@main.command()
@OUTPUT
@click.pass_obj
def whoami(obj: Context, output: str) -> None:
    """Who the cluster takes you for, and your role."""
    me = user_dict(run(lambda: obj.client.call("WhoAmI", api_pb2.WhoAmIRequest())))
    emit(me, output, lambda d: f"{d['name']} (role {d['role']}"
         + (", the cluster token's built-in admin" if d.get("bootstrap") else "")
         + (f", groups {','.join(d['groups'])}" if d["groups"] else "") + ")")


if __name__ == "__main__":
    main()
