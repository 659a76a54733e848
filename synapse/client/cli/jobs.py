"""synctl's verbs on jobs once submitted: `get jobs`, `describe job`, `wait`, `logs`, `cancel` (holding,
releasing, updating and requeueing a job are synapse.client.cli.control's)."""

from __future__ import annotations

import sys
import threading
import time

import click
import grpc

from synapse.client import accounting, render
from synapse.client.attach import worker_channel
from synapse.client.cli.session import OUTPUT, Context, emit, fail, interrupted, run
from synapse.client.master_client import ClientError
from synapse.core.model import JobStatus
from synapse.proto import api_pb2, api_pb2_grpc

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
#: Wait reasons (JobInfo.waiting_code, one of synapse.core.schedule.scheduler.PENDING_REASONS) that no job's
#: end lifts: no domain the gang may use is large enough even idle, or a dependency can never be
#: met and the job was told to wait anyway. Following such a job stops at once (exit 2).
NEVER_STARTS = frozenset({"Unschedulable", "DependencyNeverSatisfied"})


def follow_job(obj: Context, job_id: str, quiet: bool = False) -> int:
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
        interrupted(job_id, f"wait {job_id}", status)


@click.command("wait")
@click.argument("job_id")
@click.pass_obj
def wait_job(obj: Context, job_id: str) -> None:
    """Follow a job (or an array) until it ends, printing its events as `submit --wait` does;
    exit 0 if it SUCCEEDED, 1 if it FAILED or was CANCELLED, 2 if it can never start."""
    sys.exit(follow_job(obj, job_id))


@click.command("jobs")
@click.option("--status", multiple=True, type=click.Choice([s.value for s in JobStatus], case_sensitive=False),
              help="only jobs in this status (repeatable)")
@click.option("--user", default="", help="only jobs this user submitted")
@OUTPUT
@click.pass_obj
def get_jobs(obj: Context, status: tuple[str, ...], user: str, output: str) -> None:
    """List jobs, oldest first."""
    jobs = [render.job_dict(j) for j in run(lambda: obj.client.list_jobs(list(status), user=user))]
    emit(jobs, output, render.jobs_table)


@click.command("job")
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


@click.command()
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
        channel = worker_channel(obj.tls, ticket.address, ticket.node_id)
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
        interrupted(job_id, f"logs -f {job_id}")
    if not follow:
        for i in indices:
            stream(i)


@click.command()
@click.argument("job_id")
@click.option("--reason", default="", help="recorded in the job's events")
@click.pass_obj
def cancel(obj: Context, job_id: str, reason: str) -> None:
    """Cancel a job: pending jobs end at once, running gangs are stopped first. An array's id
    cancels every element; ID_7, one."""
    click.echo(f"{job_id}: {run(lambda: obj.client.cancel(job_id, reason))}")
