"""synctl's verbs that change a submitted job: `hold`, `release`, `update`, `requeue` (Slurm's
`scontrol hold|release|update|requeue`). The masters check who may do what and apply re-checks it:
a job's owner may hold, release, requeue it, lower its priority and shorten its time limit; raising
the priority or lengthening the limit takes an admin."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from synapse.client.cli.session import Context, fail, run
from synapse.core.jobs.quantity import QuantityError, parse_duration
from synapse.proto import api_pb2


def _each(job_ids: tuple[str, ...], action: Callable[[str], Any]) -> None:
    """Do `action(job_id)` for every job, printing each answer's message; exit with the first failure's
    code once every job was tried."""
    failed = 0
    for job_id in job_ids:
        try:
            click.echo(run(functools.partial(action, job_id)).message)
        except SystemExit as exc:  # `run` printed why; go on with the others
            failed = failed or int(exc.code or 1)
    if failed:
        raise SystemExit(failed)


@click.command()
@click.argument("job_ids", nargs=-1, required=True, metavar="JOB...")
@click.pass_obj
def hold(obj: Context, job_ids: tuple[str, ...]) -> None:
    """Hold pending jobs: they keep their place in the queue but are not placed until released."""
    _each(job_ids, lambda j: obj.client.call("SetJobHold", api_pb2.SetJobHoldRequest(job_id=j, held=True)))


@click.command()
@click.argument("job_ids", nargs=-1, required=True, metavar="JOB...")
@click.pass_obj
def release(obj: Context, job_ids: tuple[str, ...]) -> None:
    """Release held jobs: they take part in the next scheduling round, at their place."""
    _each(job_ids, lambda j: obj.client.call("SetJobHold", api_pb2.SetJobHoldRequest(job_id=j, held=False)))


@click.command()
@click.argument("job_ids", nargs=-1, required=True, metavar="JOB...")
@click.option("--reason", default="", help="recorded in the job's events")
@click.pass_obj
def requeue(obj: Context, job_ids: tuple[str, ...], reason: str) -> None:
    """Stop running jobs' tasks and queue the jobs again: a new attempt at their place, not charged to max_restarts."""
    _each(job_ids, lambda j: obj.client.call("RequeueJob", api_pb2.RequeueJobRequest(job_id=j, reason=reason)))


@click.command()
@click.argument("job_id")
@click.option("--priority", type=int, help="the new priority (raising it takes an admin)")
@click.option("--time-limit", help="the new time limit, e.g. 30m; 0: none (lengthening or lifting takes an admin)")
@click.option("--queue", help="move a pending job to this queue (its rules must take the job)")
@click.option("--throttle", type=int, help="an array's: the most elements running at once; 0: no limit")
@click.pass_obj
def update(obj: Context, job_id: str, priority: int | None, time_limit: str | None, queue: str | None,
           throttle: int | None) -> None:
    """Change a job's priority, time limit or queue, or an array's throttle."""
    fields: dict[str, Any] = {}
    if priority is not None:
        fields["priority"] = priority
    if time_limit is not None:
        try:
            fields["time_limit_s"] = parse_duration(time_limit)
        except QuantityError as exc:
            fail(f"invalid update: time-limit: {exc}", 2)
    if queue is not None:
        fields["queue"] = queue
    if throttle is not None and fields:
        fail("invalid update: --throttle is an array's alone; change the other fields apart", 2)
    if throttle is None and not fields:
        fail("invalid update: give --priority, --time-limit, --queue or (an array's) --throttle", 2)
    if throttle is not None and throttle < 0:
        fail("invalid update: throttle: 0 (no limit) or more", 2)
    request = api_pb2.UpdateJobRequest(job_id=job_id, throttle=throttle or 0, **fields)
    click.echo(run(lambda: obj.client.call("UpdateJob", request)).message)
