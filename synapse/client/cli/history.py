"""synctl's verbs on the past: `get events` (the cluster's event log, or a watch on it), and, from
the history store, `history` (finished jobs, also as Slurm's sacct lines) and `usage`."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Iterator

import click

from synapse.client import accounting, render
from synapse.client.cli.jobs import TERMINAL
from synapse.client.cli.session import OUTPUT, Context, emit, fail, run
from synapse.proto import api_pb2


@click.command("events")
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


def _times(since: str, until: str) -> tuple[float, float]:
    now = time.time()
    try:
        return accounting.parse_time(since, "--since", now), accounting.parse_time(until, "--until", now)
    except accounting.TimeError as exc:
        fail(str(exc), 2)


SINCE = click.option("--since", default="", help="from this long ago (7d, 12h) or this UTC date (2026-11-01)")
UNTIL = click.option("--until", default="", help="until this long ago or this UTC date (default: now)")


@click.command("history")
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
        reply: api_pb2.ListHistoryReply = run(functools.partial(obj.client.call, "ListHistory", request,
                                                                try_timeout=30))
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


@click.command("usage")
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
