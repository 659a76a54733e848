"""`synctl alloc` (Slurm's salloc), `synctl step` (a step inside it) and `synctl get steps`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import click
import grpc

from synapse.client import render
from synapse.client.attach import worker_channel
from synapse.client.cli.jobs import NEVER_STARTS, TERMINAL
from synapse.client.cli.session import OUTPUT, AfterDashes, Context, emit, fail, run
from synapse.client.master_client import ClientError, ClusterUnavailable, new_request_id
from synapse.client.steps import ALLOC_ENV, REACHED, exit_status, start_step, step_spec, wait_step
from synapse.core.jobs import wire
from synapse.core.jobs.jobspec import JobFileError, check_spec
from synapse.core.jobs.quantity import QuantityError, parse_cpu, parse_duration, parse_memory
from synapse.core.model import JobSpec, PackMode, Resources, TopologySpec
from synapse.proto import api_pb2, api_pb2_grpc

#: How often `synctl alloc` looks why its allocation waits (one that can never start ends it).
NEVER_STARTS_CHECK_S = 5.0
#: After telling its command the allocation ended (SIGHUP, then SIGTERM), how long before SIGKILL.
KILL_AFTER_S = 5.0


@click.command("alloc", cls=AfterDashes)
@click.option("--name", default="alloc", show_default=True, help="the allocation's name")
@click.option("--tasks", type=int, default=1, show_default=True, help="gang size: tasks held together")
@click.option("--cpu", help="cpu per task, e.g. 4 or 500m")
@click.option("--mem", "--memory", "memory", help="memory per task, e.g. 16Gi")
@click.option("--gpu", type=int, help="GPUs per task")
@click.option("--pack", help="topology level to pack the gang in (rack, block, zone, node)")
@click.option("--required", is_flag=True, help="wait rather than spread beyond --pack")
@click.option("--priority", type=int, default=0)
@click.option("--queue", default="", help="the queue to allocate from (default: the default queue)")
@click.option("--time-limit", help="e.g. 4h: the allocation ends then, whatever runs; at most (and by default) its "
              "queue's interactive max_duration, 8h unless the queue sets one")
@click.option("--idle-timeout", help="end the allocation after this long with no step running, e.g. 30m "
                                     "[default: 30m]")
@click.pass_obj
def alloc(obj: Context, /, **flags: Any) -> None:
    """Hold a gang (placed and queued like any) and run a command here while it is held, with
    SYNAPSE_ALLOC naming it: `alloc --tasks 2 --gpu 8 -- sh` (default: your $SHELL). Inside,
    `synctl step -- CMD` runs steps on its nodes at once. It ends when the command exits (its exit
    status is the command's), at its time limit, or after its idle timeout with no step running."""
    command = click.get_current_context().meta.get("synctl.command") or [os.environ.get("SHELL", "/bin/sh")]
    spec = _alloc_spec(flags)
    client = obj.client
    rid = new_request_id()
    alloc_id = run(lambda: client.submit_job(wire.job_spec_to_proto(spec), request_id=rid)).job_id
    click.echo(f"synctl: allocation {alloc_id}: pending", err=True)
    # Until the command runs, SIGTERM and SIGHUP (a closed terminal) are an interruption, as Ctrl-C:
    # the allocation is cancelled rather than left to its idle timeout.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        info = _granted(obj, alloc_id)
        nodes = sorted({t.node_id for t in info.tasks})
        env = {**os.environ, ALLOC_ENV: alloc_id, "SYNAPSE_ALLOC_NODES": ",".join(nodes), **_client_env(obj)}
        try:
            child = subprocess.Popen(command, env=env)
        except OSError as exc:
            why = exc.strerror or str(exc)
            run(lambda: client.cancel(alloc_id, f"its command did not start: {why}"))
            fail(f"cannot run {command[0]}: {why}", 127)
        # From here (not before: a disposition ignored at its exec would stay ignored in it) Ctrl-C
        # belongs to the command, which shares this terminal's foreground group; a SIGTERM or SIGHUP
        # to synctl goes on to the command, and the allocation is released once the command is gone.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda n, _f: child.send_signal(n))
    except KeyboardInterrupt:
        run(lambda: client.cancel(alloc_id, "its synctl alloc was interrupted before its command ran"))
        click.echo(f"synctl: allocation {alloc_id} cancelled", err=True)
        sys.exit(130)
    click.echo(f"synctl: allocation {alloc_id} granted on {', '.join(nodes)}", err=True)
    ended: list[str] = []
    watcher = threading.Thread(target=_watch, args=(obj, alloc_id, child, ended), daemon=True)
    watcher.start()
    code = child.wait()
    for sig, handler in {signal.SIGINT: signal.default_int_handler, **previous}.items():
        signal.signal(sig, handler)
    status = 128 - code if code < 0 else code
    if not ended:
        try:
            client.cancel(alloc_id, f"its command exited with status {status}")
        except ClientError as exc:
            click.echo(f"synctl: allocation {alloc_id} not cancelled: {exc.message}", err=True)
    click.echo(f"synctl: allocation {alloc_id} " + (f"ended: {ended[0]}" if ended else "released"), err=True)
    sys.exit(status)


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def _alloc_spec(flags: dict[str, Any]) -> JobSpec:
    """The allocation's spec from `alloc`'s flags, checked as the masters will."""
    try:
        resources = Resources(parse_cpu(flags["cpu"]) if flags["cpu"] else 0,
                              parse_memory(flags["memory"]) if flags["memory"] else 0, flags["gpu"] or 0)
        resources = resources if resources != Resources() else Resources(cpu=1000)  # a task asks for something
        spec = JobSpec(name=flags["name"], tasks=flags["tasks"], resources=resources, command=(),
                       topology=TopologySpec(flags["pack"] or "",
                                             PackMode.REQUIRED if flags["required"] else PackMode.PREFERRED),
                       priority=flags["priority"], queue=flags["queue"],
                       time_limit=parse_duration(flags["time_limit"]) if flags["time_limit"] else 0.0,
                       alloc=True, idle_timeout=parse_duration(flags["idle_timeout"]) if flags["idle_timeout"] else 0.0,
                       interactive=True)  # a session: bounded by its queue's interactive max_duration
        check_spec(spec)
    except (QuantityError, JobFileError) as exc:
        fail(f"invalid allocation: {exc}", 2)
    return spec


def _granted(obj: Context, alloc_id: str) -> api_pb2.JobInfo:
    """The allocation once it runs (exit 1 if it ended first, 2 if it can never start): its events
    followed as they apply, and why it waits looked at every NEVER_STARTS_CHECK_S."""
    while True:
        try:
            info = run(lambda: wait_step(obj.client, alloc_id, until=frozenset({"RUNNING", "STOPPING", *TERMINAL}),
                                         deadline=time.monotonic() + NEVER_STARTS_CHECK_S))
        except TimeoutError:
            info = run(lambda: obj.client.get_job(alloc_id))
        if info.status == "RUNNING":
            return info
        if info.status in TERMINAL or info.status == "STOPPING":
            fail(f"allocation {alloc_id} ended {info.status} before it was granted", 1)
        if info.waiting_code in NEVER_STARTS:
            obj.client.cancel(alloc_id, "it can never start")
            fail(f"allocation {alloc_id} can never start: {info.waiting}", 2)


def _client_env(obj: Context) -> dict[str, str]:
    """What a `synctl` inside the command needs to reach the same cluster as this one."""
    out = {"SYNAPSE_MASTERS": obj.masters, "SYNAPSE_TOKEN": obj.token, "SYNAPSE_CA": obj.tls.ca,
           "SYNAPSE_CERT": obj.tls.cert, "SYNAPSE_KEY": obj.tls.key}
    return {k: v for k, v in out.items() if v}


def _watch(obj: Context, alloc_id: str, child: subprocess.Popen[bytes], ended: list[str]) -> None:
    """While the command runs: once the allocation no longer runs (idle timeout, time limit, a lost
    node, a cancel), say why and end the command (SIGHUP, as a closed terminal does; then SIGTERM
    and, KILL_AFTER_S later, SIGKILL). It follows the allocation's events as they apply (any master
    serves them): no request per second for the hours a session lasts."""
    stopped = {REACHED[s] for s in ("STOPPING", *TERMINAL)}
    request = api_pb2.WatchEventsRequest(job_id=alloc_id, follow=True)
    try:
        why = next(e.message for e in obj.client.watch("WatchEvents", lambda: request, leader=False)
                   if e.reason in stopped)
    except (ClientError, ClusterUnavailable, StopIteration):
        return  # the masters are gone for good: the command goes on, as a job's tasks do
    if child.poll() is not None:
        return  # the command ended first: its end is what stops the allocation
    ended.append(why)
    click.echo(f"\nsynctl: allocation {alloc_id} ended ({why}); ending its command", err=True)
    for sig in (signal.SIGHUP, signal.SIGTERM):
        if child.poll() is None:
            child.send_signal(sig)
    try:
        child.wait(KILL_AFTER_S)
    except subprocess.TimeoutExpired:
        child.kill()


@click.command("step", cls=AfterDashes)
@click.option("--alloc", "alloc_id", envvar=ALLOC_ENV, default="", help="the allocation [env: SYNAPSE_ALLOC]")
@click.option("--tasks", type=int, help="tasks of the step [default: one per task of the allocation]")
@click.option("--cpu", help="cpu per task [default: an even share of an allocation task's]")
@click.option("--mem", "--memory", "memory", help="memory per task [default: an even share]")
@click.option("--gpu", type=int, help="GPUs per task [default: an even share]")
@click.option("--env", "env", multiple=True, help="NAME=value (repeatable)")
@click.option("--label", is_flag=True, help="prefix each output line with its task's rank")
@click.pass_obj
def step(obj: Context, alloc_id: str, tasks: int | None, cpu: str | None, memory: str | None, gpu: int | None,
         env: tuple[str, ...], label: bool) -> None:
    """Run a step inside an allocation (SYNAPSE_ALLOC) at once, never queued, and wait for it,
    printing its tasks' output: `step -- hostname`, `step --tasks 1 --gpu 4 -- python x.py`. Exits
    with the highest exit status of its tasks; refused (exit 1) when it does not fit beside the
    allocation's running steps."""
    command = click.get_current_context().meta.get("synctl.command") or []
    if not command:
        fail("give the command to run after --: step -- CMD ARGS…", 2)
    if not alloc_id:
        fail(f"no allocation: run inside `synctl alloc` ({ALLOC_ENV} set) or give --alloc", 2)
    try:
        pairs = tuple(_env_pair(item) for item in env)
        parsed_cpu = parse_cpu(cpu) if cpu else None
        parsed_memory = parse_memory(memory) if memory else None
    except (QuantityError, ValueError) as exc:
        fail(f"invalid step: {exc}", 2)
    client = obj.client
    info = run(lambda: client.get_job(alloc_id))
    spec = step_spec(info, tuple(command), tasks=tasks, cpu=parsed_cpu, memory=parsed_memory, gpu=gpu, env=pairs)
    try:
        step_id = start_step(client, alloc_id, spec)
    except ClientError as exc:
        fail(exc.message, 1)
    try:
        started = wait_step(client, step_id, until=frozenset({"RUNNING", "STOPPING", *TERMINAL}))
        output = StepOutput(obj, step_id, len(started.tasks), label)
        ended = wait_step(client, step_id)
        output.finish()
    except KeyboardInterrupt:
        client.cancel(step_id, "its synctl step was interrupted")
        click.echo(f"synctl: step {step_id} cancelled", err=True)
        sys.exit(130)
    code = exit_status(ended)
    if ended.status != "SUCCEEDED":
        click.echo(f"synctl: step {step_id} {ended.status}" + (f": {ended.failure}" if ended.failure else ""),
                   err=True)
    sys.exit(code)


def _env_pair(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep:
        raise ValueError(f"env: expected NAME=value, got {item!r}")
    return key, value


class StepOutput:
    """Every task's output of a step, streamed from its workers while it runs (their log service
    follows a task's log), and its tail read once the step has ended: a follow ends only once the
    worker forgets the task, later than the step's end is known, so `finish` cuts the follows and
    reads on from where each stopped."""

    def __init__(self, obj: Context, job_id: str, tasks: int, label: bool) -> None:
        self.obj, self.job_id, self.label = obj, job_id, label
        access = run(lambda: obj.client.call("LogAccess", api_pb2.LogAccessRequest(job_id=job_id)))
        self.attempt = access.attempt
        self.tickets = list(access.tickets[:tasks])  #: one per task, by index
        self.offsets = {t.index: 0 for t in self.tickets}  #: how far each task's log was printed
        self.calls: dict[int, Any] = {}  #: the follow stream of each task, while it is open
        self.lock = threading.Lock()
        self.channels = {t.index: worker_channel(obj.tls, t.address, t.node_id) for t in self.tickets}
        self.threads = [threading.Thread(target=self._read, args=(t, True), daemon=True) for t in self.tickets]
        for thread in self.threads:
            thread.start()

    def _read(self, ticket: api_pb2.LogTicket, follow: bool) -> None:
        request = api_pb2.ReadLogRequest(job_id=self.job_id, attempt=self.attempt, index=ticket.index, follow=follow,
                                         ticket=ticket.ticket, offset=self.offsets[ticket.index])
        try:
            call = api_pb2_grpc.WorkerStub(self.channels[ticket.index]).ReadLog(request)
            if follow:
                self.calls[ticket.index] = call
            for chunk in call:
                with self.lock:
                    click.echo(render.task_log(chunk.data.decode(errors="replace"), ticket.index, self.label), nl=False)
                    self.offsets[ticket.index] = chunk.offset
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                click.echo(f"synctl: task {ticket.index} on {ticket.node_id}: {exc.details() or exc.code().name}",
                           err=True)

    def finish(self) -> None:
        """The step ended: stop following, print what each task wrote since, close the channels."""
        for call in list(self.calls.values()):
            call.cancel()
        for thread in self.threads:
            thread.join(5.0)
        for ticket in self.tickets:
            self._read(ticket, False)
        for channel in self.channels.values():
            channel.close()


@click.command("steps")
@click.argument("alloc_id")
@OUTPUT
@click.pass_obj
def get_steps(obj: Context, alloc_id: str, output: str) -> None:
    """The steps of an allocation, oldest first: id, status, tasks, exit code, nodes, command."""
    steps = [render.step_dict(j) for j in run(lambda: obj.client.list_jobs(alloc_id=alloc_id))]
    emit(steps, output, render.steps_table)
