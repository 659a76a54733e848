"""`synctl`: the root command group, its global options, and the table of every verb.

A verb lives in the module of its group (`jobs`, `submit`, `nodes`, `queues`, `users`, `cluster`,
`history`); the table names it with its one-line help, so `synctl --help` lists every verb and
`synctl --version` answers without importing one, and a verb that runs imports only its module
(click's lazy group: gRPC and the protobuf messages cost more than the rest of a command's start).
`tests/cluster/test_synctl_cli.py` holds each one-line help to the command's own docstring.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from synapse.client.cli.exits import EXIT_CODES, EXIT_INTERRUPTED
from synapse.common.cli import CONTEXT_SETTINGS, version_option

#: The package whose modules hold the verbs.
PACKAGE = "synapse.client.cli"


class LazyGroup(click.Group):
    """A group that knows its verbs by name (`module:attribute`, one-line help) and imports a
    verb's module only when that verb is resolved; help lists them from the table alone."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy  #: name -> ("module:attribute" under PACKAGE, one-line help); fixed at definition

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        module, _, attr = self.lazy[cmd_name][0].partition(":")
        command: click.Command = getattr(importlib.import_module(f"{PACKAGE}.{module}"), attr)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The verbs and their one-line help, as click writes them, without importing a verb."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(map(len, names))
        rows = []
        for name in names:
            # A stand-in with the table's help shortens it as click shortens the verb's own.
            command = click.Command(name, help=self.lazy[name][1]) if name in self.lazy else self.commands[name]
            if not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


class _Main(LazyGroup):
    """synctl's command group: Ctrl-C exits 130, as a shell reports SIGINT, not click's "Aborted!"
    and 1 (a command following a job first says that the job goes on: `session.interrupted`)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)


#: synctl's verbs: name -> (where it is defined, its one-line help).
VERBS = {
    "alloc": ("alloc:alloc", "Hold a gang (placed and queued like any) and run a command here while it is held, "
              "with SYNAPSE_ALLOC naming it: `alloc --tasks 2 --gpu 8 -- sh` (default: your $SHELL)."),
    "apply": ("queues:apply_file", "Create or update the queues a YAML file lists (`queues:`); the same file "
              "again changes nothing (admin)."),
    "cancel": ("jobs:cancel", "Cancel a job: pending jobs end at once, running gangs are stopped first."),
    "cluster": ("cluster:cluster", "The master replicas."),
    "exec": ("run:exec_in", "Run a command inside a running task's sandbox (its namespaces, cgroup, environment), "
             "as kubectl exec does: yours, or any as admin; recorded in the job's events."),
    "cordon": ("nodes:cordon", "Stop placing new tasks on a node (running ones stay)."),
    "delete": ("queues:delete", "Delete a queue."),
    "drain": ("nodes:drain", "Cordon a node and stop every gang with a task on it (they are requeued)."),
    "hold": ("control:hold", "Hold pending jobs: they keep their place in the queue but are not placed until "
             "released."),
    "history": ("history:history", "Finished jobs from the history store, by end time (times in UTC)."),
    "logs": ("jobs:logs", "Print a job's task output, read straight from the workers that ran it (yours, or "
             "any as admin)."),
    "node": ("nodes:node", "Nodes: join tokens for registering workers (admin)."),
    "preempt": ("queues:preempt", "Which gangs the leader would preempt for pending job JOB_ID now, and why."),
    "release": ("control:release", "Release held jobs: they take part in the next scheduling round, at their "
                "place."),
    "requeue": ("control:requeue", "Stop running jobs' tasks and queue the jobs again: a new attempt at their place, "
                "not charged to max_restarts."),
    "run": ("run:run_job", "Run a job in the foreground, as srun does: each rank's output, stdin to rank 0, "
            "Ctrl-C to every rank, the worst rank's exit status: `run --tasks 2 --gpu 8 -- python train.py`."),
    "step": ("alloc:step", "Run a step inside an allocation (SYNAPSE_ALLOC) at once, never queued, and wait for "
             "it, printing its tasks' output: `step -- hostname`, `step --tasks 1 --gpu 4 -- python x.py`."),
    "submit": ("submit:submit", "Submit job files (several, or `--count N` copies, in one request: all or none), "
               "or a one-off job from flags that runs the command after `--`: `submit -- hostname`, "
               "`submit --tasks 2 --gpu 1 -- python x.py`."),
    "uncordon": ("nodes:uncordon", "Allow new tasks on a node again."),
    "update": ("control:update", "Change a job's priority, time limit or queue, or an array's throttle."),
    "usage": ("history:usage", "GPU-hours and CPU-hours allocated, per user, queue or day, and the cluster's "
              "utilisation (allocated, idle, down) per day, from the history store; with --goodput, where "
              "the GPU time went."),
    "user": ("users:user", "Manage users (admin), or see who you are."),
    "wait": ("jobs:wait_job", "Follow a job (or an array) until it ends, printing its events as `submit --wait` "
             "does; exit 0 if it SUCCEEDED, 1 if it FAILED or was CANCELLED, 2 if it can never start."),
    "whoami": ("users:whoami", "Who the cluster takes you for, and your role."),
}
#: `synctl get`'s objects.
GET = {
    "events": ("history:get_events", "The cluster's events, oldest first; any master serves them."),
    "jobs": ("jobs:get_jobs", "List jobs, oldest first."),
    "nodes": ("nodes:get_nodes", "List nodes with their capacity and use."),
    "queues": ("queues:get_queues", "List queues with their GPU quota and what their gangs hold now."),
    "steps": ("alloc:get_steps", "The steps of an allocation, oldest first: id, status, tasks, exit code, nodes, "
              "command."),
}
#: `synctl describe`'s objects.
DESCRIBE = {
    "job": ("jobs:describe_job", "Status, attempt, placement, events, and for a pending job why it waits; a "
            "job past its retention, from the history store."),
    "node": ("nodes:describe_node", "A node's status, why it is cordoned, its health, labels, how it confines "
             "tasks, and its use."),
    "queue": ("queues:describe_queue", "A queue's quota, who may submit, preemption settings and current use."),
}


@click.group(cls=_Main, lazy=VERBS, context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES)
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
    # Imported here, once a verb runs: the session brings gRPC, which help and --version never need.
    from synapse.client.cli.session import Context
    ctx.obj = Context(masters, token, timeout, ca, cert, key)


@main.group(cls=LazyGroup, lazy=GET)
def get() -> None:
    """List jobs or nodes."""


@main.group(cls=LazyGroup, lazy=DESCRIBE)
def describe() -> None:
    """Show one object in detail."""
