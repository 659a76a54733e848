"""`synctl submit`: job files (several, or N copies, in one request), or a one-off job from flags and
the command after `--`."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

import click

from synapse.client import render
from synapse.client.cli.session import OUTPUT, AfterDashes, Context, fail, run
from synapse.client.jobfile import load_job_file, load_secrets, resolve_paths
from synapse.client.master_client import job_request, new_request_id
from synapse.core.jobs import wire
from synapse.core.jobs.arrays import ArraySpecError, format_ranges, parse_array
from synapse.core.jobs.dependencies import parse_after_flag
from synapse.core.jobs.jobspec import MAX_NAME, JobFileError, check_workflow, parse_job
from synapse.core.model import JobSpec
from synapse.core.queues import queue_name_problem


def job_flags(command: Any) -> Any:
    """The flags that make a one-off job (`submit`, `run`): name, gang size, resources, image,
    packing, priority, restarts, time limit, env, queue."""
    for option in reversed((
            click.option("--name", help="job name (shorthand without a file)"),
            click.option("--tasks", type=int, help="gang size"),
            click.option("--cpu", help="cpu per task, e.g. 4 or 500m"),
            click.option("--mem", "--memory", "memory", help="memory per task, e.g. 16Gi"),
            click.option("--gpu", type=int, help="GPUs per task"),
            click.option("--image", help="container image the tasks run in (see docs: Container images)"),
            click.option("--pack", help="topology level to pack the gang in (rack, block, zone, node)"),
            click.option("--required", is_flag=True, help="wait rather than spread beyond --pack"),
            click.option("--priority", type=int),
            click.option("--max-restarts", type=int),
            click.option("--time-limit", help="e.g. 2h; lets the job backfill ahead of a reservation"),
            click.option("--env", "env", multiple=True, help="NAME=value (repeatable)"),
            click.option("--queue", help="the queue to submit to (overrides the job file's; default: the default "
                                         "queue)"))):
        command = option(command)
    return command


def flags_spec(argv: list[str], flags: dict[str, Any]) -> JobSpec:
    """The one-off job that `job_flags` and the command `argv` describe; JobFileError if it is not one."""
    return _queue_flag(resolve_paths(parse_job(_flags_to_doc(argv, flags)), os.getcwd()), flags)


def _queue_flag(spec: JobSpec, flags: dict[str, Any]) -> JobSpec:
    """`--queue` over the spec's queue."""
    if not flags["queue"]:
        return spec
    problem = queue_name_problem(flags["queue"])
    if problem:
        raise JobFileError("queue", problem)
    return dataclasses.replace(spec, queue=flags["queue"])


@click.command(cls=AfterDashes, context_settings={"ignore_unknown_options": False})
@click.argument("job_file", required=False, type=click.Path(dir_okay=False))
@click.argument("command", nargs=-1, metavar="[JOB_FILE]...")
@click.option("--request-id", help="idempotency key: the same id always yields the same job (several: R-1, R-2, ...)")
@click.option("--count", type=click.IntRange(1), default=1,
              help="submit N copies of the job (of each job file), named NAME-1 to NAME-N, in one request")
@click.option("--wait", is_flag=True, help="follow the job until it ends, as `synctl wait` does")
@click.option("--hold", is_flag=True, help="queue it held: it is not placed until `synctl release JOB`")
@job_flags
@click.option("--array", help="an array of gangs, Slurm's syntax: 0-99%8, 0-15:4, 1,3,7 (overrides the file's)")
@click.option("--after", help="dependencies: ok:ID,any:ID,notok:ID (added to the file's)")
@click.option("--singleton", is_flag=True, default=None, help="run only while no job of this name and user runs")
@OUTPUT
@click.pass_obj
def submit(obj: Context, /, job_file: str | None, command: tuple[str, ...], request_id: str | None, count: int,
           wait: bool, hold: bool, output: str, **flags: Any) -> None:
    """Submit job files (several, or `--count N` copies, in one request: all or none), or a one-off
    job from flags that runs the command after `--`: `submit -- hostname`, `submit --tasks 2 --gpu 1
    -- python x.py`."""
    after_dashes = click.get_current_context().meta.get("synctl.command")
    if after_dashes is not None:
        if job_file or command:
            fail("invalid job: give a job file or a command after --, not both", 2)
        command = tuple(after_dashes)
    # Flags make a one-off job, whose command may also come without `--` (`submit --gpu 1 python x.py`);
    # without them every word is a job file.
    shorthand = after_dashes is not None or any(flags[k] is not None for k in ("tasks", "cpu", "memory", "gpu",
                                                                               "name", "image"))
    files = [] if shorthand or not job_file else [job_file, *command]
    jobs: list[tuple[JobSpec, dict[str, str]]] = []
    file = job_file or ""  #: the job file being read
    try:
        if after_dashes is not None and not command:
            raise JobFileError("command", "give the command to run after -- (e.g. -- python train.py)")
        if shorthand:
            jobs.append((_workflow_flags(flags_spec(([job_file] if job_file else []) + list(command), flags), flags),
                         {}))
        elif not files:
            raise JobFileError("(arguments)", "give a job file, or flags and a command: submit --gpu 1 -- python x.py")
        for path in files:
            file = path
            jobs.append((_workflow_flags(_queue_flag(load_job_file(path), flags), flags), load_secrets(path)))
    except JobFileError as exc:
        where = "" if shorthand or not file else " file " + file
        hint = " (a command to run goes after --: submit -- CMD ARGS…)" \
            if not shorthand and file and not os.path.exists(file) else ""
        fail(f"invalid job{where}: {exc}{hint}", 2)
    jobs = [(copy, secrets) for spec, secrets in jobs for copy in numbered_copies(spec, count)]
    if wait and len(jobs) > 1:
        fail("--wait follows one job: submit them, then `synctl wait ID` each", 2)
    rids = request_ids(request_id, len(jobs))
    requests = [job_request(wire.job_spec_to_proto(spec), rid, secrets, hold)
                for (spec, secrets), rid in zip(jobs, rids, strict=True)]
    replies = run(lambda: obj.client.submit_jobs(requests))
    for reply in replies:
        for line in reply.warnings:
            click.echo(f"synctl: warning: {line}", err=True)
    click.echo(render.submitted([reply.job_id for reply in replies], rids, output))
    if wait:
        from synapse.client.cli.jobs import follow_job  # here: `run` shares this module, not jobs' imports
        sys.exit(follow_job(obj, replies[0].job_id, quiet=output != "table"))


def numbered_copies(spec: JobSpec, count: int) -> list[JobSpec]:
    """`count` copies of `spec` named NAME-1 to NAME-N (the name cut so that each stays within
    MAX_NAME); the spec itself when `count` is 1."""
    if count == 1:
        return [spec]
    return [dataclasses.replace(spec, name=f"{spec.name[:MAX_NAME - len(str(k)) - 1]}-{k}")
            for k in range(1, count + 1)]


def request_ids(given: str | None, n: int) -> list[str]:
    """The request ids of `n` jobs submitted together: `given` for one, `given`-1 to `given`-N for
    several (so the same command retried yields the same jobs); new ones without it."""
    if not given:
        return [new_request_id() for _ in range(n)]
    return [given] if n == 1 else [f"{given}-{k}" for k in range(1, n + 1)]


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
