"""`synctl`: the command-line client. Every command works against any master address.

Errors are one clear line on stderr and a non-zero exit; `synctl --help` lists the exit codes
(EXIT_CODES).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import click
import grpc
import yaml

from synapse.client import accounting, render
from synapse.client.jobfile import load_job_file, load_secrets, resolve_paths
from synapse.client.master_client import (
    AuthError,
    ClientError,
    ClusterUnavailable,
    MasterClient,
    PermissionDenied,
    TLSError,
    UnknownHosts,
    address_problem,
    new_request_id,
    parse_addresses,
)
from synapse.common.cli import CONTEXT_SETTINGS, version_option
from synapse.common.cli import fail as common_fail
from synapse.common.tls import TLSFiles, channel_credentials
from synapse.core import codec
from synapse.core.arrays import ArraySpecError, format_ranges, parse_array
from synapse.core.dependencies import parse_after_flag
from synapse.core.jobspec import JobFileError, check_workflow, parse_job
from synapse.core.model import JobSpec, JobStatus, Queue, Resources
from synapse.core.quantity import QuantityError, format_cpu, format_memory, parse_duration
from synapse.core.queues import QueueFileError, parse_queue_file, queue_name_problem
from synapse.proto import api_pb2, api_pb2_grpc

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
#: What each exit code means (docs/using/synctl.md; shown by `synctl --help`).
EXIT_CODES = """\b
Exit codes:
  0    success; with submit --wait or wait: the job SUCCEEDED
  1    the job ended FAILED or CANCELLED (submit --wait, wait)
  2    bad input or a refusal: an invalid job file, flag or --masters address (or a host that
       does not resolve), an unknown id; or a job that can never start (submit --wait, wait)
  3    cluster unreachable: every address refused connections for 1 s (before any master
       answered), or no master answered usefully within --timeout
  4    not authenticated: an unknown token, or TLS failed (unreadable --ca, a certificate that
       does not verify)
  5    permission denied: not your job, or an admin-only command
  130  interrupted (Ctrl-C); a job being followed goes on"""
EXIT_DENIED = 5
EXIT_INTERRUPTED = 130
#: How long every master address may refuse connections, before any master answered, until a
#: command gives up (exit 3; MasterClient.absent_s): a mistyped port or a cluster that is down fails
#: within 2 s of the command's start, not after --timeout.
ABSENT_S = 1.0
#: Wait reasons (JobInfo.waiting_code, one of synapse.core.scheduler.PENDING_REASONS) that no job's
#: end lifts: no domain the gang may use is large enough even idle, or a dependency can never be
#: met and the job was told to wait anyway. Following such a job stops at once (exit 2).
NEVER_STARTS = frozenset({"Unschedulable", "DependencyNeverSatisfied"})


class Context:
    def __init__(self, masters: str, token: str, timeout: float, tls: TLSFiles) -> None:
        self.masters, self.token, self.timeout, self.tls = masters, token, timeout, tls
        self._client: MasterClient | None = None

    @property
    def client(self) -> MasterClient:
        if self._client is None:
            addresses = parse_addresses(self.masters)
            if not addresses:
                fail("no masters given: use --masters host:port[,host:port…] or set SYNAPSE_MASTERS", 2)
            problem = next(filter(None, map(address_problem, addresses)), "")
            if problem:
                fail(f"bad master address {problem} (--masters / SYNAPSE_MASTERS)", 2)
            if self.tls.enabled:
                try:
                    self.tls.read()
                except OSError as exc:
                    fail(f"TLS failed: cannot read {exc.filename}: {exc.strerror} (check --ca / SYNAPSE_CA, "
                         "--cert, --key)", 4)
            self._client = MasterClient(addresses, self.token, deadline=self.timeout, tls=self.tls,
                                        absent_s=ABSENT_S)
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
        prefix = {grpc.StatusCode.NOT_FOUND: "not found", grpc.StatusCode.INVALID_ARGUMENT: "rejected",
                  grpc.StatusCode.ALREADY_EXISTS: "refused"}
        fail(f"{prefix.get(exc.code, exc.code.name.lower())}: {exc.message}", 2)
    except UnknownHosts as exc:
        fail(f"bad master address: {exc} (--masters / SYNAPSE_MASTERS)", 2)
    except ClusterUnavailable as exc:
        fail(f"cluster unreachable: {exc}", 3)


def emit(data: Any, output: str, text: Callable[[Any], str]) -> None:
    click.echo(render.formatted(data, output, text))


def _worker_channel(obj: Context, address: str, node_id: str) -> grpc.Channel:
    """A channel to a worker's log service: over TLS when the cluster uses it, checking that the
    worker's certificate was issued to that node (not merely to some host at that address)."""
    if not obj.tls.enabled:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, channel_credentials(obj.tls),
                               options=[("grpc.ssl_target_name_override", node_id)])


class _Main(click.Group):
    """synctl's command group: Ctrl-C exits 130, as a shell reports SIGINT, not click's "Aborted!"
    and 1 (a command following a job first says that the job goes on: `_interrupted`)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)


def _interrupted(job_id: str, again: str, status: str = "") -> NoReturn:
    """Ctrl-C while following a job: it goes on; say how to come back to it."""
    fail(f"interrupted; job {job_id} goes on{f' ({status})' if status else ''}: `synctl {again}` follows it "
         f"again, `synctl cancel {job_id}` cancels it", EXIT_INTERRUPTED)


OUTPUT = click.option("-o", "--output", type=click.Choice(["table", "json", "yaml"]), default="table",
                      show_default=True, help="output format")


@click.group(cls=_Main, context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES)
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


class _Submit(click.Command):
    """`submit`: the words after the first `--` are the command to run, never a job file."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            ctx.meta["synctl.command"] = args[args.index("--") + 1:]
            args = args[:args.index("--")]
        return super().parse_args(ctx, args)


@main.command(cls=_Submit, context_settings={"ignore_unknown_options": False})
@click.argument("job_file", required=False, type=click.Path(dir_okay=False))
@click.argument("command", nargs=-1)
@click.option("--request-id", help="idempotency key: the same id always yields the same job")
@click.option("--wait", is_flag=True, help="follow the job until it ends, as `synctl wait` does")
@click.option("--name", help="job name (shorthand without a file)")
@click.option("--tasks", type=int, help="gang size")
@click.option("--cpu", help="cpu per task, e.g. 4 or 500m")
@click.option("--mem", "--memory", "memory", help="memory per task, e.g. 16Gi")
@click.option("--gpu", type=int, help="GPUs per task")
@click.option("--image", help="container image the tasks run in (see docs: Container images)")
@click.option("--pack", help="topology level to pack the gang in (rack, block, zone, node)")
@click.option("--required", is_flag=True, help="wait rather than spread beyond --pack")
@click.option("--priority", type=int)
@click.option("--max-restarts", type=int)
@click.option("--time-limit", help="e.g. 2h; lets the job backfill ahead of a reservation")
@click.option("--env", "env", multiple=True, help="NAME=value (repeatable)")
@click.option("--queue", help="the queue to submit to (overrides the job file's; default: the default queue)")
@click.option("--array", help="an array of gangs, Slurm's syntax: 0-99%8, 0-15:4, 1,3,7 (overrides the file's)")
@click.option("--after", help="dependencies: ok:ID,any:ID,notok:ID (added to the file's)")
@click.option("--singleton", is_flag=True, default=None, help="run only while no job of this name and user runs")
@OUTPUT
@click.pass_obj
def submit(obj: Context, job_file: str | None, command: tuple[str, ...], request_id: str | None, wait: bool,
           output: str, **flags: Any) -> None:
    """Submit a job file, or a one-off job from flags that runs the command after `--`:
    `submit -- hostname`, `submit --tasks 2 --gpu 1 -- python x.py`."""
    after_dashes = click.get_current_context().meta.get("synctl.command")
    if after_dashes is not None:
        if job_file or command:
            fail("invalid job: give a job file or a command after --, not both", 2)
        command = tuple(after_dashes)
    shorthand = bool(command) or any(flags[k] is not None for k in ("tasks", "cpu", "memory", "gpu", "name",
                                                                     "image"))
    secrets: dict[str, str] = {}
    try:
        if after_dashes is not None and not command:
            raise JobFileError("command", "give the command to run after -- (e.g. -- python train.py)")
        if shorthand:
            spec = resolve_paths(parse_job(_flags_to_doc(([job_file] if job_file else []) + list(command), flags)),
                                 os.getcwd())
        elif job_file:
            spec, secrets = load_job_file(job_file), load_secrets(job_file)
        else:
            raise JobFileError("(arguments)", "give a job file, or flags and a command: submit --gpu 1 -- python x.py")
        spec = _workflow_flags(spec, flags)
    except JobFileError as exc:
        hint = " (a command to run goes after --: submit -- CMD ARGS…)" \
            if not shorthand and job_file and not os.path.exists(job_file) else ""
        fail(f"invalid job{'' if shorthand or not job_file else ' file ' + job_file}: {exc}{hint}", 2)
    if flags["queue"]:
        problem = queue_name_problem(flags["queue"])
        if problem:
            fail(f"invalid job: queue: {problem}", 2)
        spec = dataclasses.replace(spec, queue=flags["queue"])
    rid = request_id or new_request_id()
    reply = run(lambda: obj.client.submit_job(codec.job_spec_to_proto(spec), request_id=rid, secrets=secrets))
    for line in reply.warnings:
        click.echo(f"synctl: warning: {line}", err=True)
    job_id = reply.job_id
    click.echo(render.submitted(job_id, rid, output))
    if wait:
        sys.exit(_follow(obj, job_id, quiet=output != "table"))


def _workflow_flags(spec: JobSpec, flags: dict[str, Any]) -> JobSpec:
    """`--array`, `--after` and `--singleton` over a job file's (or flags') spec."""
    if flags["array"]:
        try:
            ranges, throttle = parse_array(flags["array"])
        except ArraySpecError as exc:
            raise JobFileError("array", str(exc)) from None
        spec = dataclasses.replace(spec, array=format_ranges(ranges), array_throttle=throttle)
    if flags["after"]:
        try:
            after = parse_after_flag(flags["after"])
        except ValueError as exc:
            raise JobFileError("after", str(exc)) from None
        spec = dataclasses.replace(spec, after=spec.after + after)
    if flags["singleton"]:
        spec = dataclasses.replace(spec, singleton=True)
    check_workflow(spec)
    return spec


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
    """Print a job's events until it ends; the exit code: 0 it SUCCEEDED, 1 it FAILED or was
    CANCELLED, 2 it can never start (NEVER_STARTS; why on stderr, the job stays), 130 Ctrl-C (the
    job goes on). A job forgotten since it ended is looked up in the history store."""
    seen_events, status = 0, ""
    try:
        while True:
            try:
                info = run(lambda: _live_job(obj, job_id))
            except LookupError as gone:
                status = gone.args[0].state
                click.echo(f"synctl: job {job_id} ended {status} (from the history store)", err=True)
                return 0 if status == "SUCCEEDED" else 1
            status = info.status
            for event in info.events[seen_events:]:
                if not quiet:
                    click.echo(render.job_event_line(event))
            seen_events = len(info.events)
            if info.status in TERMINAL:
                return 0 if info.status == "SUCCEEDED" else 1
            if info.waiting_code in NEVER_STARTS:
                click.echo(f"synctl: job {job_id} can never start: {info.waiting} (it stays {info.status}: "
                           f"`synctl cancel {job_id}` removes it)", err=True)
                return 2
            time.sleep(0.25)
    except KeyboardInterrupt:
        _interrupted(job_id, f"wait {job_id}", status)


@main.command("wait")
@click.argument("job_id")
@click.pass_obj
def wait_job(obj: Context, job_id: str) -> None:
    """Follow a job (or an array) until it ends, printing its events as `submit --wait` does;
    exit 0 if it SUCCEEDED, 1 if it FAILED or was CANCELLED, 2 if it can never start."""
    sys.exit(_follow(obj, job_id))


@main.group()
def get() -> None:
    """List jobs or nodes."""


@get.command("jobs")
@click.option("--status", multiple=True, type=click.Choice([s.value for s in JobStatus], case_sensitive=False),
              help="only jobs in this status (repeatable)")
@click.option("--user", default="", help="only jobs this user submitted")
@OUTPUT
@click.pass_obj
def get_jobs(obj: Context, status: tuple[str, ...], user: str, output: str) -> None:
    """List jobs, oldest first."""
    jobs = [render.job_dict(j) for j in run(lambda: obj.client.list_jobs(list(status), user=user))]
    emit(jobs, output, render.jobs_table)


@get.command("nodes")
@click.option("-o", "--output", type=click.Choice(["table", "wide", "json", "yaml"]), default="table",
              show_default=True, help="output format (wide: also the images each node holds)")
@click.pass_obj
def get_nodes(obj: Context, output: str) -> None:
    """List nodes with their capacity and use."""
    nodes = [render.node_dict(n) for n in run(obj.client.list_nodes)]
    emit(nodes, output, lambda data: render.nodes_table(data, wide=output == "wide"))


@main.group()
def describe() -> None:
    """Show one object in detail."""


@describe.command("job")
@click.argument("job_id")
@OUTPUT
@click.pass_obj
def describe_job(obj: Context, job_id: str, output: str) -> None:
    """Status, attempt, placement, events, and for a pending job why it waits; a job past its
    retention, from the history store."""
    try:
        job = render.job_dict(run(lambda: _live_job(obj, job_id)))
    except LookupError as gone:
        emit(accounting.history_dict(gone.args[0]), output, accounting.history_description)
        return
    emit(job, output, render.job_description)


def _live_job(obj: Context, job_id: str) -> api_pb2.JobInfo:
    """The job from the state; LookupError(HistoryJob) once only the history store holds it."""
    try:
        return obj.client.get_job(job_id)
    except ClientError as exc:
        if exc.code != grpc.StatusCode.NOT_FOUND:
            raise
        try:
            found = obj.client.call("ListHistory", api_pb2.ListHistoryRequest(job_id=job_id)).jobs
        except ClientError:
            raise exc from None  # no store, or it fails: the job is unknown, as before
        if not found:
            raise
        raise LookupError(found[0]) from None


@describe.command("node")
@click.argument("node_id")
@OUTPUT
@click.pass_obj
def describe_node(obj: Context, node_id: str, output: str) -> None:
    """A node's status, why it is cordoned, its health, labels, how it confines tasks, and its use."""
    found = [render.node_dict(n) for n in run(obj.client.list_nodes) if n.id == node_id]
    if not found:
        fail(f"not found: unknown node {node_id}")
    emit(found[0], output, render.node_description)


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
                click.echo(render.task_log(chunk.data.decode(errors="replace"), index, prefix), nl=False)
        except grpc.RpcError as exc:
            click.echo(f"synctl: task {index} on {ticket.node_id}: {exc.details() or exc.code().name}", err=True)
        finally:
            channel.close()

    # Daemon threads: on Ctrl-C the process exits without waiting for streams that never end.
    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in indices] if follow else []
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    except KeyboardInterrupt:
        _interrupted(job_id, f"logs -f {job_id}")
    if not follow:
        for i in indices:
            stream(i)


@main.command()
@click.argument("job_id")
@click.option("--reason", default="", help="recorded in the job's events")
@click.pass_obj
def cancel(obj: Context, job_id: str, reason: str) -> None:
    """Cancel a job: pending jobs end at once, running gangs are stopped first. An array's id
    cancels every element; ID_7, one."""
    click.echo(f"{job_id}: {run(lambda: obj.client.cancel(job_id, reason))}")


@main.command()
@click.argument("job_id")
@click.option("--throttle", type=int, required=True, help="the most elements of the array running at once; 0: no limit")
@click.pass_obj
def update(obj: Context, job_id: str, throttle: int) -> None:
    """Change a running array's throttle (Slurm's ArrayTaskThrottle)."""
    if throttle < 0:
        fail("invalid update: throttle: 0 (no limit) or more", 2)
    reply = run(lambda: obj.client.call("UpdateJob", api_pb2.UpdateJobRequest(job_id=job_id, throttle=throttle)))
    click.echo(reply.message)


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
    click.echo(render.drained(node_id, reply.jobs_stopped))


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
    for line in render.applied(reply):
        click.echo(line)
    try:
        nodes = obj.client.list_nodes()
        every = obj.client.call("ListQueues", api_pb2.ListQueuesRequest()).queues
    except (ClientError, ClusterUnavailable):
        return  # the queues are applied; what follows is advice
    capacity = sum((codec.resources_from_proto(n.capacity) for n in nodes), Resources())
    for line in guarantee_warnings(queues, [codec.queue_from_proto(q.spec) for q in every], capacity, len(nodes)):
        click.echo(f"synctl: warning: {line}", err=True)


def guarantee_warnings(applied: list[Queue], every: list[Queue], capacity: Resources, nodes: int) -> list[str]:
    """Guarantees the cluster cannot honour (`apply` still applies them: nodes may join later):
    each applied queue's beyond the registered nodes' capacity, and the top-level queues' together
    beyond it. Nothing while no node is registered."""
    if not nodes:
        return []
    amounts = {"gpu": str, "cpu": format_cpu, "memory": format_memory}
    cluster = lambda key: f"the cluster has {amounts[key](getattr(capacity, key))} ({nodes} node(s))"
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
        events = run(lambda: [render.event_dict(e) for e in _events(obj, request)])
        emit(events, output, render.events_table)
        return

    def follow() -> None:
        while True:  # a follow stream does not end; if one did, open it again
            for e in _events(obj, request):
                click.echo(render.watched_event(render.event_dict(e), output))
                sys.stdout.flush()

    run(follow)


def _events(obj: Context, request: api_pb2.WatchEventsRequest) -> Iterator[api_pb2.ClusterEventInfo]:
    """The events `request` asks for, from any master; a broken stream resumes, on any master, after
    the last event it gave: no gap, no repeat."""
    stream = obj.client.watch("WatchEvents", lambda: request, leader=False, deadline=obj.timeout,
                              try_timeout=None if request.follow else obj.timeout)
    for e in stream:
        request.after = e.seq
        yield e


@get.command("queues")
@OUTPUT
@click.pass_obj
def get_queues(obj: Context, output: str) -> None:
    """List queues with their GPU quota and what their gangs hold now."""
    emit(_queues(obj), output, render.queues_table)


@describe.command("queue")
@click.argument("name")
@OUTPUT
@click.pass_obj
def describe_queue(obj: Context, name: str, output: str) -> None:
    """A queue's quota, who may submit, preemption settings and current use."""
    queue = next((q for q in _queues(obj) if q["name"] == name), None)
    if queue is None:
        fail(f"not found: unknown queue {name}", 2)
    emit(queue, output, render.queue_description)


@main.command()
@click.argument("job_id")
@click.option("--what-if", "what_if", is_flag=True, required=True,
              help="show the plan without committing it (the only mode: the leader preempts on its own)")
@OUTPUT
@click.pass_obj
def preempt(obj: Context, job_id: str, what_if: bool, output: str) -> None:
    """Which gangs the leader would preempt for pending job JOB_ID now, and why."""
    reply = run(lambda: obj.client.call("PreemptWhatIf", api_pb2.PreemptWhatIfRequest(job_id=job_id)))
    emit(render.preempt_dict(job_id, reply), output, render.preempt_text)


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


def _emit_token(reply: api_pb2.UserToken, output: str, verb: str) -> None:
    emit(render.token_dict(reply), output, lambda d: render.token_text(d, verb))


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
    users = [render.user_dict(u) for u in run(lambda: obj.client.call("ListUsers", api_pb2.ListUsersRequest())).users]
    emit(users, output, render.users_table)


@main.group()
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


@main.command()
@OUTPUT
@click.pass_obj
def whoami(obj: Context, output: str) -> None:
    """Who the cluster takes you for, and your role."""
    me = render.user_dict(run(lambda: obj.client.call("WhoAmI", api_pb2.WhoAmIRequest())))
    emit(me, output, render.whoami_text)



# ---- history and accounting ----------------------------------------------------------------------

def _times(since: str, until: str) -> tuple[float, float]:
    now = time.time()
    try:
        return accounting.parse_time(since, "--since", now), accounting.parse_time(until, "--until", now)
    except accounting.TimeError as exc:
        fail(str(exc), 2)


SINCE = click.option("--since", default="", help="from this long ago (7d, 12h) or this UTC date (2026-11-01)")
UNTIL = click.option("--until", default="", help="until this long ago or this UTC date (default: now)")


@main.command("history")
@click.option("--user", default="", help="only jobs this user submitted")
@click.option("--queue", default="", help="only jobs of this queue")
@click.option("--state", default="", help="only jobs that ended SUCCEEDED, FAILED or CANCELLED")
@click.option("--job", "job_id", default="", help="only this job")
@SINCE
@UNTIL
@click.option("--limit", type=int, default=None,
              help="at most this many jobs, 0 for all [default: 1000 for a table, all otherwise]")
@click.option("-o", "--output", type=click.Choice(["table", "json", "yaml", "sacct"]), default="table",
              show_default=True, help="output format; sacct: `sacct --parsable2` with Open XDMoD's fields")
@click.option("--noheader", is_flag=True, help="with -o sacct: no header line (as XDMoD's shredder wants)")
@click.option("--duplicates", is_flag=True, help="with -o sacct: a line for every run, not only the last")
@click.option("--cluster", "cluster_name", default="synapse", show_default=True, help="with -o sacct: Cluster")
@click.pass_obj
def history(obj: Context, user: str, queue: str, state: str, job_id: str, since: str, until: str,
            limit: int | None, output: str, noheader: bool, duplicates: bool, cluster_name: str) -> None:
    """Finished jobs from the history store, by end time (times in UTC)."""
    start, end = _times(since, until)
    if limit is None:
        limit = 1000 if output == "table" else 0
    state = state.upper()
    if state and state not in TERMINAL:
        fail(f"--state: must be one of {', '.join(sorted(TERMINAL))}, not {state!r}", 2)
    if limit < 0:
        fail("--limit: must not be negative", 2)
    jobs: list[api_pb2.HistoryJob] = []
    after_end, after_id = 0.0, ""
    while True:
        request = api_pb2.ListHistoryRequest(
            user=user, queue=queue, state=state, job_id=job_id, since=start, until=end,
            limit=min(5000, limit - len(jobs)) if limit else 5000, after_end=after_end, after_id=after_id)
        reply = run(lambda r=request: obj.client.call("ListHistory", r, try_timeout=30))
        jobs += reply.jobs
        if not reply.more or not reply.jobs or (limit and len(jobs) >= limit):
            if reply.more and output == "table":
                click.echo(f"(the first {len(jobs)} jobs; --limit 0 for all)", err=True)
            break
        after_end, after_id = reply.jobs[-1].end, reply.jobs[-1].job_id
    if output == "sacct":
        for line in accounting.sacct_lines(jobs, cluster_name, header=not noheader, duplicates=duplicates):
            click.echo(line)
        return
    emit([accounting.history_dict(j) for j in jobs], output, accounting.history_table)


@main.command("usage")
@click.option("--by", type=click.Choice(["user", "queue", "day"]), default="user", show_default=True,
              help="sum GPU- and CPU-hours per user, queue or UTC day")
@click.option("--goodput", is_flag=True,
              help="the goodput view: GPU-hours held, kept and lost (failures, restarts, other stops), the "
                   "requeue wait, and kept/held, of the jobs that ended")
@SINCE
@UNTIL
@OUTPUT
@click.pass_obj
def usage(obj: Context, by: str, goodput: bool, since: str, until: str, output: str) -> None:
    """GPU-hours and CPU-hours allocated, per user, queue or day, and the cluster's utilisation
    (allocated, idle, down) per day, from the history store; with --goodput, where the GPU time
    went."""
    start, end = _times(since, until)
    reply = run(lambda: obj.client.call("GetUsage", api_pb2.GetUsageRequest(by=by, since=start, until=end)))
    emit(accounting.usage_report(reply, goodput), output,
         lambda report: accounting.usage_report_table(report, by, goodput))


if __name__ == "__main__":
    main()
