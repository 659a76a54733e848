"""The dashboard's history pages, from the history store: `/history` (finished jobs: filter, sort,
page) and `/usage` (GPU-hours per queue per UTC day, a stacked bar chart drawn as inline SVG:
no script, no inline style, as the Content-Security-Policy demands). Blocking store calls are fine
here: the dashboard runs on the HTTP server's own threads."""

from __future__ import annotations

import time
from collections.abc import Callable
from html import escape
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

if TYPE_CHECKING:  # SQLAlchemy's: imported by masters with a history store only
    from synapse.history.exporter import History

#: How the dashboard draws a table (headers, rows), a fact list (label, value rows), a time, a job's link.
Table = Callable[[list[str], list[list[str]]], str]
Facts = Callable[[list[list[str]]], str]
When = Callable[[float], str]
JobLink = Callable[[str], str]

#: Rows a history page shows; jobs a history page sorts, at most (the most recent of the filter).
PAGE_SIZE = 50
WINDOW = 5000
#: Bar colours of the usage chart, one per queue in turn.
COLOURS = ("#1f883d", "#0969da", "#bf8700", "#8250df", "#cf222e", "#1b7c83", "#9a6700", "#6e7781")
SORTS = {"end": "end_at", "user": "user_name", "queue": "queue", "state": "state", "gpu_hours": "gpu_seconds",
         "elapsed": "elapsed"}
DAY = 86400.0


def _days(args: dict[str, str], default: int) -> int:
    try:
        return max(1, min(3650, int(args.get("days", default))))
    except ValueError:
        return default


#: What the history pages say of a cluster without a history store.
NO_HISTORY = ('<p class="muted">This cluster keeps no job history (set <code>history.url</code> in the cluster '
              "file).</p>")


def history_page(history: History | None, args: dict[str, str], table: Table, when: When, job_link: JobLink) -> str:
    """The body of /history (the caller wraps it in the page)."""
    if history is None:
        return NO_HISTORY
    from synapse.history.store import JobQuery, StoreError

    days = _days(args, 7)
    state = args.get("state", "")
    query = JobQuery(user=args.get("user", ""), queue=args.get("queue", ""),
                     state=state if state in ("SUCCEEDED", "FAILED", "CANCELLED") else "",
                     since=time.time() - days * DAY, limit=WINDOW)
    try:
        rows, more = history.store.jobs(query)
    except StoreError as exc:
        return f'<p class="Warning">The history store is unavailable: {escape(str(exc))}</p>'
    for r in rows:
        r["elapsed"] = r["end_at"] - r["start_at"] if r["start_at"] else 0.0
    sort = args.get("sort", "end") if args.get("sort") in SORTS else "end"
    rows.sort(key=lambda r: r[SORTS[sort]], reverse=args.get("order", "desc") == "desc")
    try:
        page = max(1, int(args.get("page", "1")))
    except ValueError:
        page = 1
    shown = rows[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]

    def link(**changes: str) -> str:
        return "/history?" + urlencode({**args, **changes})

    def flip(key: str) -> str:
        return "asc" if sort == key and args.get("order", "desc") == "desc" else "desc"

    headers = ["Job"] + [f'<a href="{escape(link(sort=key, order=flip(key), page="1"))}">{label}</a>'
                         for key, label in (("state", "State"), ("queue", "Queue"), ("user", "User"),
                                            ("gpu_hours", "GPU-hours"), ("elapsed", "Elapsed s"), ("end", "Ended"))]
    body = [[job_link(r["job_id"]) + f" {escape(r['name'])}", f"{r['state']} ({escape(r['reason'])})",
             escape(r["queue"]), escape(r["user_name"] or "-"), f"{r['gpu_seconds'] / 3600:.2f}",
             f"{r['elapsed']:.0f}", when(r["end_at"])] for r in shown]
    options = "".join(f'<option value="{s}"{" selected" if state == s else ""}>{s}</option>'
                      for s in ("SUCCEEDED", "FAILED", "CANCELLED"))
    form = (f'<form method="get" action="/history">State <select name="state"><option value="">any</option>'
            f'{options}</select> Queue <input name="queue" value="{escape(args.get("queue", ""))}"> User '
            f'<input name="user" value="{escape(args.get("user", ""))}"> Last <input name="days" size="4" '
            f'value="{days}"> days <button type="submit">Filter</button></form>')
    pages = max(1, -(-len(rows) // PAGE_SIZE))
    nav = (f"<p>{len(rows)}{'+' if more else ''} job(s) that ended in the last {days} day(s), page {page} of {pages} "
           + (f'<a href="{escape(link(page=str(page - 1)))}">previous</a> ' if page > 1 else "")
           + (f'<a href="{escape(link(page=str(page + 1)))}">next</a>' if page < pages else "") + "</p>")
    return form + nav + table(headers, body)


def archived_job(history: History | None, job_id: str, facts: Facts, table: Table, when: When) -> str:
    """The body of /jobs/ID for a job the state forgot, from the store; '' if it holds none either."""
    if history is None:
        return ""
    from synapse.history.store import JobQuery, StoreError

    try:
        rows, _ = history.store.jobs(JobQuery(job_id=job_id, limit=1))
    except StoreError:
        return ""
    if not rows:
        return ""
    r = rows[0]
    body = facts([["Name", escape(r["name"])], ["State", f"{r['state']} ({escape(r['reason'])})"],
                  ["Why", escape(r["detail"]) or "-"], ["Queue", escape(r["queue"])],
                  ["User", escape(r["user_name"] or "-")], ["Exit code", str(r["exit_code"])],
                  ["Gang", f"{r['tasks']} task(s) x {r['gpus']} GPU(s)"], ["Submitted", when(r["submit_at"])],
                  ["Ended", when(r["end_at"])], ["GPU-hours", f"{r['gpu_seconds'] / 3600:.2f}"]])
    runs = [[str(x["attempt"]), when(x["start_at"]), when(x["end_at"]), escape(x["outcome"]), str(x["exit_code"]),
             escape(x["nodes"]), escape(x["reason"]) or "-"] for x in r["runs"]]
    return ('<p class="muted">Past its retention: from the history store.</p>' + body + "<h2>Runs</h2>"
            + table(["Attempt", "Start", "End", "Outcome", "Exit", "Nodes", "Reason"], runs))


def usage_page(history: History | None, args: dict[str, str], table: Table) -> str:
    """The body of /usage: a chart of GPU-hours per queue per day, and the totals per queue and user."""
    if history is None:
        return NO_HISTORY
    from synapse.history.store import StoreError

    days = _days(args, 30)
    since = time.time() - days * DAY
    try:
        daily = history.store.usage("day,queue", since, 0)
        by_queue = history.store.usage("queue", since, 0)
        by_user = history.store.usage("user", since, 0)
    except StoreError as exc:
        return f'<p class="Warning">The history store is unavailable: {escape(str(exc))}</p>'
    form = (f'<form method="get" action="/usage">Last <input name="days" size="4" value="{days}"> days '
            '<button type="submit">Show</button></form>')
    totals = [[escape(r["key"]), f"{r['gpu_seconds'] / 3600:.2f}", f"{r['cpu_seconds'] / 3600:.2f}", str(r["jobs"])]
              for r in by_queue]
    users = [[escape(r["key"] or "-"), f"{r['gpu_seconds'] / 3600:.2f}", f"{r['cpu_seconds'] / 3600:.2f}",
              str(r["jobs"])] for r in by_user]
    return (form + "<h2>GPU-hours per queue per day (UTC)</h2>" + chart(daily)
            + "<h2>Per queue</h2>" + table(["Queue", "GPU-hours", "CPU-hours", "Jobs"], totals)
            + "<h2>Per user</h2>" + table(["User", "GPU-hours", "CPU-hours", "Jobs"], users))


def chart(daily: list[dict[str, Any]], width: int = 720, height: int = 220) -> str:
    """Stacked bars of GPU-hours, one bar a day, one colour a queue, as inline SVG."""
    if not daily:
        return '<p class="muted">No usage in this period.</p>'
    days = sorted({r["key"] for r in daily})
    queues = sorted({r["queue"] for r in daily})
    colour = {q: COLOURS[i % len(COLOURS)] for i, q in enumerate(queues)}
    hours = {(r["key"], r["queue"]): r["gpu_seconds"] / 3600 for r in daily}
    peak = max(sum(hours.get((d, q), 0.0) for q in queues) for d in days) or 1.0
    bar = width / len(days)
    parts = []
    for i, day in enumerate(days):
        y = float(height)
        for q in queues:
            h = hours.get((day, q), 0.0) / peak * (height - 20)
            if h > 0:
                y -= h
                parts.append(f'<rect class="bar" x="{i * bar + 1:.1f}" y="{y:.1f}" width="{max(1.0, bar - 2):.1f}" '
                             f'height="{h:.1f}" fill="{colour[q]}"><title>{escape(day)} {escape(q)}: '
                             f'{hours[(day, q)]:.2f} GPU-hours</title></rect>')
    axis = (f'<text x="0" y="12" font-size="11">{peak:.1f} GPU-hours</text>'
            f'<text x="0" y="{height + 14}" font-size="11">{escape(days[0])}</text>'
            f'<text x="{width}" y="{height + 14}" font-size="11" text-anchor="end">{escape(days[-1])}</text>')
    legend = " ".join(f'<svg width="10" height="10" aria-hidden="true"><rect width="10" height="10" '
                      f'fill="{colour[q]}"/></svg> {escape(q)}' for q in queues)
    return (f'<svg role="img" aria-label="GPU-hours per queue per day" width="{width}" height="{height + 20}" '
            f'viewBox="0 0 {width} {height + 20}">{axis}{"".join(parts)}</svg><p>{legend}</p>')
