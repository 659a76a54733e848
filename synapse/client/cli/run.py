"""`synctl run` (Slurm's srun) and `synctl exec` (kubectl exec): work in the foreground.

`run` starts a job (`start`: a new gang; inside an allocation, SYNAPSE_ALLOC set, `start_step_of`:
a step of it) and attaches to it (`attach`): every rank's output as it comes, rank 0's stdin,
Ctrl-C to every rank, the exit status of the worst rank. `exec` starts a command in a running
task's sandbox and streams it the same way. With `--pty`, rank 0 (or the exec) gets a
pseudo-terminal of the caller's size, and the caller's terminal is raw until the command ends,
restored on every way out.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import click
import grpc

from synapse.client.attach import Output, TaskStream, exit_status, worker_channel
from synapse.client.cli.exits import EXIT_INTERRUPTED
from synapse.client.cli.session import AfterDashes, Context, fail, run
from synapse.client.cli.submit import flags_spec, job_flags
from synapse.client.master_client import ClientError, new_request_id
from synapse.client.steps import ALLOC_ENV, start_step, step_spec
from synapse.core.jobs import wire
from synapse.core.jobs.jobspec import JobFileError
from synapse.core.jobs.quantity import QuantityError, parse_cpu, parse_memory
from synapse.core.model import STDIN_ENV, JobSpec
from synapse.proto import api_pb2

#: Two Ctrl-Cs this close together kill rather than interrupt (srun's rule).
DOUBLE_INTERRUPT_S = 1.0
#: How often a job that has not started yet is asked again: soon at first (a gang on an idle
#: cluster starts in milliseconds), then every quarter second.
FIRST_POLL_S, MAX_POLL_S = 0.005, 0.25
#: the first pause while the masters record a job's end (reads without a barrier cost them little)
END_FIRST_POLL_S = 0.002
#: After the tasks' streams end, how long the masters may take to record how the tasks ended.
END_WAIT_S = 30.0
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
#: Ways a job ends without its tasks having run: the exit status `run` gives then.
EXIT_NOT_STARTED = 1


class NeverStarts(Exception):
    """The job waits for what will never come (no domain could hold it even idle): why."""


def interactive(spec: JobSpec) -> JobSpec:
    """The spec marked as an interactive job (`run --pty`: a person at a terminal), which the
    interactive job rules then bound (its queue's maximum duration, no preemption within the
    queue's guarantee: synapse.core.submission, synapse.core.schedule.preemption)."""
    return dataclasses.replace(spec, interactive=True)


def start(obj: Context, spec: JobSpec, secrets: dict[str, str] | None = None) -> str:
    """Start the job `run` attaches to, and return its id: a new gang (inside an allocation,
    `start_step_of` starts a step of it instead)."""
    reply = run(lambda: obj.client.submit_job(wire.job_spec_to_proto(spec), request_id=new_request_id(),
                                              secrets=secrets or {}))
    for line in reply.warnings:
        click.echo(f"synctl: warning: {line}", err=True)
    return str(reply.job_id)


#: The job flags that describe a gang of its own: inside an allocation a step takes its allocation's.
GANG_ONLY_FLAGS = ("name", "image", "pack", "required", "priority", "max_restarts", "time_limit", "queue")


def start_step_of(obj: Context, alloc_id: str, spec: JobSpec, flags: dict[str, Any]) -> str:
    """Inside allocation `alloc_id` (SYNAPSE_ALLOC, set by `synctl alloc`): start `spec`'s command as a
    step of it, on its nodes at once and never queued, as `srun` inside `salloc` does; its job id.
    `--tasks`, `--cpu`, `--mem` and `--gpu` shape the step as for `synctl step` (a share of the
    allocation's tasks by default); a step that does not fit beside the running ones is refused."""
    given = [name for name in GANG_ONLY_FLAGS if flags.get(name)]
    if given:
        fail(f"inside allocation {alloc_id}, run starts a step of it: --{given[0].replace('_', '-')} is the "
             "allocation's (unset SYNAPSE_ALLOC for a gang of its own)", 2)
    try:
        cpu = parse_cpu(flags["cpu"]) if flags["cpu"] else None
        memory = parse_memory(flags["memory"]) if flags["memory"] else None
    except QuantityError as exc:
        fail(f"invalid step: {exc}", 2)
    alloc = run(lambda: obj.client.get_job(alloc_id, applied=True))  # its shape never changes
    step = step_spec(alloc, spec.command, tasks=flags["tasks"], cpu=cpu, memory=memory, gpu=flags["gpu"],
                     env=spec.env)
    try:
        return start_step(obj.client, alloc_id, step)
    except ClientError as exc:
        fail(exc.message, 1)


@click.command("run", cls=AfterDashes)
@click.argument("command", nargs=-1, metavar="-- CMD [ARGS]...")
@job_flags
@click.option("--pty", is_flag=True, help="give rank 0 a pseudo-terminal (a shell: `run --pty -- bash`)")
@click.option("--label/--no-label", default=None,
              help="prefix each line with [rank N] (default: when there is more than one rank)")
@click.pass_obj
def run_job(obj: Context, /, command: tuple[str, ...], pty: bool, label: bool | None, **flags: Any) -> None:
    """Run a job in the foreground, as srun does: each rank's output, stdin to rank 0, Ctrl-C to every
    rank, the worst rank's exit status: `run --tasks 2 --gpu 8 -- python train.py`."""
    argv = click.get_current_context().meta.get("synctl.command")
    if argv is None or command:
        fail("invalid job: give the command to run after -- (run [flags] -- CMD ARGS…)", 2)
    try:
        spec = flags_spec(list(argv), flags)
    except JobFileError as exc:
        fail(f"invalid job: {exc}", 2)
    env = {**dict(spec.env), STDIN_ENV: "pty" if pty else "pipe"}
    if pty and os.environ.get("TERM"):
        env.setdefault("TERM", os.environ["TERM"])
    spec = dataclasses.replace(spec, env=tuple(sorted(env.items())))
    if pty:
        spec = interactive(spec)
    alloc_id = os.environ.get(ALLOC_ENV, "")
    job_id = start_step_of(obj, alloc_id, spec, flags) if alloc_id else start(obj, spec)
    try:
        code = attach(obj, job_id, label=label, pty=pty)
    except KeyboardInterrupt:  # before it started (attached, Ctrl-C goes to the tasks): srun cancels too
        obj.client.cancel(job_id, "synctl run: interrupted before it started")
        fail(f"interrupted; job {job_id} cancelled", EXIT_INTERRUPTED)
    except NeverStarts as never:
        obj.client.cancel(job_id, "synctl run: it can never start")
        fail(f"job {job_id} can never start: {never} (cancelled)", 2)
    _exit(code)


@click.command("exec", cls=AfterDashes)
@click.argument("job_id")
@click.argument("command", nargs=-1, metavar="-- CMD [ARGS]...")
@click.option("--task", "index", type=int, default=0, show_default=True, help="the task (index) to run in")
@click.option("--pty", is_flag=True, help="on a pseudo-terminal (a shell: `exec JOB --pty -- bash`)")
@click.pass_obj
def exec_in(obj: Context, /, job_id: str, command: tuple[str, ...], index: int, pty: bool) -> None:
    """Run a command inside a running task's sandbox (its namespaces, cgroup, environment), as kubectl
    exec does: yours, or any as admin; recorded in the job's events."""
    argv = click.get_current_context().meta.get("synctl.command")
    if not argv or command:
        fail("give the command to run after -- (exec JOB [--task N] -- CMD ARGS…)", 2)
    access = run(lambda: obj.client.call("AttachAccess", api_pb2.AttachAccessRequest(
        job_id=job_id, command=list(argv), index=index)))
    ticket = access.tickets[0]
    rows, cols = _window()
    opening = api_pb2.AttachOpen(job_id=job_id, attempt=access.attempt, index=index, command=list(argv), pty=pty,
                                 window=api_pb2.WindowSize(rows=rows, cols=cols), term=os.environ.get("TERM", ""))
    output = Output(sys.stdout.buffer, sys.stderr.buffer, label=False, ranks={})
    # An exec ticket starts its command once: a broken stream is not opened again.
    stream = TaskStream(opening, lambda: (worker_channel(obj.tls, ticket.address, ticket.node_id), ticket.ticket),
                        output, gone=lambda: True)
    with _Terminal(pty and sys.stdin.isatty()):
        _drive([stream], stream, pty, on_kill=lambda: stream.send(api_pb2.AttachInput(signal=signal.SIGKILL)))
    if stream.exit_code is None:
        fail(f"exec in task {index} of job {job_id}: {stream.error or 'the worker did not say how it ended'}", 1)
    _exit(stream.exit_code)


def attach(obj: Context, job_id: str, label: bool | None = None, pty: bool = False) -> int:
    """Attach to a job until it ends and return its exit status (`exit_status`): every task's output
    (lines labelled `[rank N] ` when `label`, by default when it has more than one), the caller's
    stdin to rank 0, Ctrl-C as SIGINT to every rank (twice within a second: the job is cancelled),
    the terminal's size to rank 0 (`pty`). A job that requeues is attached to again."""
    attempt, info = 0, None
    with _Terminal(pty and sys.stdin.isatty()):
        while True:
            access = _placed(obj, job_id, after=attempt)
            if access is None:  # ended without (another) attempt that ran
                info = None
                break
            attempt = access.attempt
            _attach_attempt(obj, job_id, access, label, pty)
            info = _ended(obj, job_id, attempt)
            if info.status not in TERMINAL and info.attempt > attempt:
                click.echo(f"synctl: job {job_id} restarts (attempt {info.attempt})", err=True)
                continue
            break
    if info is None:
        info = run(lambda: obj.client.get_job(job_id))
    tasks = [t for t in info.tasks if t.attempt == attempt] if attempt else []
    if not tasks:
        why = info.failure or (f"cancelled by {info.cancelled_by}" if info.cancelled_by else "") or info.waiting
        click.echo(f"synctl: job {job_id} ended {info.status} without running: {why or 'see synctl describe job'}",
                   err=True)
        return EXIT_NOT_STARTED
    code, why = exit_status(tasks)
    if why:
        click.echo(f"synctl: job {job_id} ended {info.status}: {why}", err=True)
    return code


def _attach_attempt(obj: Context, job_id: str, access: api_pb2.AttachAccessReply, label: bool | None,
                    pty: bool) -> None:
    """Stream one attempt's tasks until each has ended."""
    tickets = {t.index: t for t in access.tickets}
    ranks = {t.index: t.rank for t in access.tickets}
    output = Output(sys.stdout.buffer, sys.stderr.buffer, label=len(tickets) > 1 if label is None else label,
                    ranks=ranks)
    attempt_over = threading.Event()
    rows, cols = _window()

    def connect(index: int) -> Callable[[], tuple[grpc.Channel, str]]:
        opened = [False]

        def fresh() -> tuple[grpc.Channel, str]:
            """The first time, the ticket in hand; after a break, a new one and the worker's address
            as the masters know it now (a worker restarted may listen elsewhere)."""
            ticket = tickets[index]
            if opened[0]:
                renewed = obj.client.call("AttachAccess", api_pb2.AttachAccessRequest(job_id=job_id))
                if renewed.attempt != access.attempt:
                    attempt_over.set()
                else:
                    ticket = {t.index: t for t in renewed.tickets}[index]
            opened[0] = True
            return worker_channel(obj.tls, ticket.address, ticket.node_id), ticket.ticket
        return fresh

    streams = [TaskStream(api_pb2.AttachOpen(job_id=job_id, attempt=access.attempt, index=i,
                                             window=api_pb2.WindowSize(rows=rows, cols=cols)),
                          connect(i), output, gone=attempt_over.is_set) for i in sorted(tickets)]
    rank0 = next((s for s in streams if ranks.get(s.open.index) == 0), streams[0])

    def cancel() -> None:
        click.echo(f"synctl: cancelling job {job_id}", err=True)
        try:
            obj.client.cancel(job_id, "synctl run: interrupted twice")
        except (ClientError, Exception) as exc:  # the streams still end when the tasks do
            click.echo(f"synctl: cancel failed: {exc}", err=True)
    _drive(streams, rank0, pty, on_kill=cancel)


def _drive(streams: list[TaskStream], stdin_to: TaskStream, pty: bool, on_kill: Callable[[], None]) -> None:
    """Run the streams until every one has ended: the caller's stdin to `stdin_to`, its window size
    too (pty), Ctrl-C (SIGINT) to all, and `on_kill` for a second one within DOUBLE_INTERRUPT_S."""
    for stream in streams:
        stream.thread.start()
    threading.Thread(target=_forward_stdin, args=(stdin_to,), name="stdin", daemon=True).start()
    last_interrupt = [0.0]

    def interrupt(signum: int, frame: object) -> None:
        now = time.monotonic()
        if now - last_interrupt[0] < DOUBLE_INTERRUPT_S:
            on_kill()
        else:
            click.echo("synctl: interrupt sent to every task (again within 1 s to kill)", err=True)
            for stream in streams:
                stream.send(api_pb2.AttachInput(signal=signal.SIGINT))
        last_interrupt[0] = now

    def resize(signum: int, frame: object) -> None:
        rows, cols = _window()
        stdin_to.send(api_pb2.AttachInput(window=api_pb2.WindowSize(rows=rows, cols=cols)))

    def hang_up(signum: int, frame: object) -> None:
        for stream in streams:  # the caller went: so does what it ran
            stream.send(api_pb2.AttachInput(signal=signal.SIGHUP))
        on_kill()
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, handler) for sig, handler in
                ((signal.SIGINT, interrupt), (signal.SIGWINCH, resize), (signal.SIGTERM, hang_up),
                 (signal.SIGHUP, hang_up))}
    try:
        for stream in streams:
            while not stream.done.wait(0.1):
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for stream in streams:
            stream.close_input()


def _forward_stdin(to: TaskStream) -> None:
    """(stdin thread) The caller's stdin to one task, then its end."""
    try:
        fd = sys.stdin.fileno()
    except (OSError, ValueError, AttributeError):
        to.send(api_pb2.AttachInput(stdin_eof=True))
        return
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:
            data = b""
        if not data:
            to.send(api_pb2.AttachInput(stdin_eof=True))
            return
        to.send(api_pb2.AttachInput(stdin=data))


def _placed(obj: Context, job_id: str, after: int) -> api_pb2.AttachAccessReply | None:
    """Attach tickets for the job's first attempt later than `after` once it is placed; None if the
    job ends first; NeverStarts if it waits for what never comes. Says once on stderr why it waits."""
    pause, told, asked_at = FIRST_POLL_S, False, time.monotonic()

    def ask() -> api_pb2.AttachAccessReply | None:
        try:
            reply: api_pb2.AttachAccessReply = obj.client.call("AttachAccess",
                                                               api_pb2.AttachAccessRequest(job_id=job_id))
            return reply
        except ClientError as exc:
            if exc.code == grpc.StatusCode.FAILED_PRECONDITION:  # not placed yet
                return None
            raise

    while True:
        access = run(ask)
        if access is not None and access.attempt > after:
            return access
        if pause >= MAX_POLL_S or time.monotonic() - asked_at > 1.0:
            info = run(lambda: obj.client.get_job(job_id))
            if info.status in TERMINAL:
                return None
            from synapse.client.cli.jobs import NEVER_STARTS  # only once it waits: jobs' imports cost ~50 ms
            if info.waiting_code in NEVER_STARTS:
                raise NeverStarts(info.waiting)
            if not told and info.status == "PENDING":
                click.echo(f"synctl: job {job_id} waits: {info.waiting or 'queued'}", err=True)
                told = True
            asked_at = time.monotonic()
        time.sleep(pause)
        pause = min(pause * 2, MAX_POLL_S)


def _ended(obj: Context, job_id: str, attempt: int) -> api_pb2.JobInfo:
    """The job once the masters know how `attempt` ended (terminal, or a later attempt), or after END_WAIT_S."""
    deadline, pause = time.monotonic() + END_WAIT_S, END_FIRST_POLL_S
    while True:
        # From what the leader applied, without a barrier: it applies only what is committed, so a
        # job seen ended has ended, and one not yet seen is asked again a moment later.
        info = run(lambda: obj.client.get_job(job_id, applied=True))
        if info.status in TERMINAL or info.attempt > attempt or time.monotonic() > deadline:
            return info
        time.sleep(pause)
        pause = min(pause * 2, MAX_POLL_S)


def _exit(code: int) -> None:
    """Exit with `code` once the output is out, skipping the interpreter's teardown: gRPC's (its
    channels closed, its threads joined) took 0.2-0.45 s after the command was done, on a loaded
    machine, and a foreground command's caller waits for every bit of it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _window() -> tuple[int, int]:
    """The caller's terminal size (rows, cols); (0, 0) without one."""
    try:
        size = os.get_terminal_size(sys.stdin.fileno())
    except (OSError, ValueError, AttributeError):
        return 0, 0
    return size.lines, size.columns


class _Terminal:
    """The caller's terminal in raw mode for as long as the block runs (when `active`), restored on
    every way out of it: an end, an exception, Ctrl-C, SIGTERM or SIGHUP (they raise SystemExit)."""

    def __init__(self, active: bool) -> None:
        self.active = active
        self.saved: list[Any] | None = None

    def __enter__(self) -> _Terminal:
        if self.active:
            import termios
            import tty
            fd = sys.stdin.fileno()
            self.saved = termios.tcgetattr(fd)
            tty.setraw(fd, termios.TCSANOW)  # not TCSAFLUSH: what was typed ahead is the command's
        return self

    def __exit__(self, *exc: object) -> None:
        if self.saved is not None:
            import termios
            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, self.saved)
