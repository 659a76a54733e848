"""The read-only web dashboard every master serves: server-rendered HTML, no JavaScript at all.

Pages: `/` overview, `/nodes` (a rack x node x GPU heatmap: each GPU in its gang's colour, nodes
reserved or held for a waiting gang marked), `/nodes/ID` (a node's timeline), `/queues`, `/jobs`
(filter, sort, paginate; each pending job's wait and why), `/jobs/ID` (gang map, events, why it waits),
`/masters` (this replica's Raft view), `/history` and `/usage` (from the history store,
synapse.master.dashboard_history). Every page is rendered from this replica's applied state,
read under the state lock into plain values first. Everything shown is escaped; job environment
values are never shown. `synapse.master.http` serves it behind the token (or a signed-in session).
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlencode

from synapse.core.jobs.quantity import format_pull, format_start, format_wait
from synapse.core.model import DEFAULT_QUEUE, JobStatus, NodeStatus, gang_unprepared, topology_path
from synapse.core.schedule import fairshare
from synapse.master import dashboard_history

if TYPE_CHECKING:
    from synapse.core.model import Job
    from synapse.core.schedule.estimate import Estimate
    from synapse.core.schedule.scheduler import WaitReason
    from synapse.master.replica import Master

PAGE_SIZE = 50
#: The heatmap's gang colours (see gang_classes): dark enough against the page, and none near free
#: (grey), down (red) or cordoned (amber).
PALETTE = ("#0969da", "#1a7f37", "#8250df", "#6e4b2a", "#bf3989", "#0a7c8c", "#3d4f9f", "#5a6d1f", "#7d2e61",
           "#1b5e3b", "#2f6f9f", "#6639ba")
STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1b1f24;background:#f6f8fa}
header{background:#1b1f24;padding:8px 16px}header a{color:#e6edf3;margin-right:16px;text-decoration:none}
main{padding:16px}table{border-collapse:collapse;background:#fff;margin:8px 0}
td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:left}th a{color:inherit}
.gpu{width:14px;height:14px;padding:0}.used{background:#1f883d}.free{background:#d0d7de}
.down{background:#cf222e}.cordoned{background:#bf8700}.rack{display:inline-block;vertical-align:top;margin-right:16px}
.muted{color:#656d76}.Warning{color:#cf222e}form.inline{display:inline}
tr.reserved td.gpu{outline:2px solid #1b1f24;outline-offset:-2px}
td.gpu.free.reserved,.swatch.reserved{background:repeating-linear-gradient(45deg,#d0d7de 0 3px,#fff 3px 6px)}
td.note{border:0;font-size:12px}form.signout{display:inline;float:right}.swatch{display:inline-block;width:14px;height:14px;vertical-align:middle}
""" + "".join(f".g{i}{{background:{colour}}}" for i, colour in enumerate(PALETTE)) + "\n"
SORTS = {"submitted": lambda j: j["submitted_at"], "name": lambda j: j["name"], "state": lambda j: j["state"],
         "queue": lambda j: j["queue"], "user": lambda j: j["user"], "gpus": lambda j: j["gpus"],
         "wait": lambda j: j["wait_s"], "reason": lambda j: j["reason"]}


#: The header's sign-out button: it ends this replica's session (POST, so no link prefetch signs one out).
SIGN_OUT = '<form class="signout" method="post" action="/logout"><button type="submit">Sign out</button></form>'


def _page(title: str, body: str, sign_out: bool = True) -> str:
    nav = "".join(f'<a href="{href}">{name}</a>' for href, name in (
        ("/", "Overview"), ("/nodes", "Nodes"), ("/queues", "Queues"), ("/jobs", "Jobs"), ("/history", "History"),
        ("/usage", "Usage"), ("/masters", "Masters"))) + (SIGN_OUT if sign_out else "")
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)} · Synapse</title>'
            f'<link rel="stylesheet" href="/static/style.css"></head><body><header>{nav}</header>'
            f"<main><h1>{escape(title)}</h1>{body}</main></body></html>")


def _facts(rows: list[list[str]]) -> str:
    """A two-column table of labelled values."""
    return "<table>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + " UTC" if ts else "-"


def _job_link(job_id: str) -> str:
    return f'<a href="/jobs/{quote(job_id)}">{escape(job_id)}</a>'


def _reason_cell(job: dict[str, Any]) -> str:
    """A pending job's typed wait reason, its detail, and whether nodes are kept for it."""
    if job["state"] != JobStatus.PENDING.value:
        return ""
    code = (f'<b class="reason">{escape(job["reason"])}</b>' if job["reason"]
            else '<span class="muted">not yet known</span>')
    detail = f" {escape(job['why'])}" if job["why"] else ""
    kept = ' <span class="muted">(nodes kept for it: see Nodes)</span>' if job["reserved"] else ""
    return code + detail + kept


def _start_cell(estimate: Estimate | None, now: float) -> str:
    """A pending job's estimated start (synctl's START): the leader's, from its last round."""
    if estimate is None:
        return "unknown: not yet weighed by a round"
    return format_start(estimate.at, estimate.why, now)


def _type_mark(job: dict[str, Any]) -> str:
    """An interactive job's mark in a list of jobs (a session: `synctl run --pty`, `synctl alloc`)."""
    return ' <span class="muted">[interactive]</span>' if job.get("interactive") else ""


def _node_link(node_id: str) -> str:
    return f'<a href="/nodes/{quote(node_id)}">{escape(node_id)}</a>'


def login_page(message: str = "") -> str:
    note = f'<p class="Warning">{escape(message)}</p>' if message else ""
    return _page("Sign in", f'{note}<form method="post" action="/login"><label>Token '
                            '<input type="password" name="token" autocomplete="current-password"></label> '
                            '<button type="submit">Sign in</button></form>'
                            '<p class="muted">Or send <code>Authorization: Bearer TOKEN</code>. A sign-in holds '
                            'on this master only.</p>', sign_out=False)


@dataclass(frozen=True, slots=True)
class NodeMark:
    """A node kept for a waiting gang: by the scheduler's reservation or by a preemption's hold."""

    job_id: str
    why: str  #: what keeps it, for people


def gang_classes(gangs: Iterable[str]) -> dict[str, str]:
    """Each gang's colour class on the heatmap, `gangs` oldest first: its own slot in PALETTE (a hash
    of its id: the same on every replica and every load) unless an older gang on the page took it,
    then the next free one. So up to len(PALETTE) gangs never share a colour, a gang keeps its
    colour while it runs unless an older one it gave way to ends, and past that many gangs colours
    repeat (each cell's title names its gang)."""
    taken: set[int] = set()
    out: dict[str, str] = {}
    for job_id in gangs:
        slot = zlib.crc32(job_id.encode()) % len(PALETTE)
        while slot in taken and len(taken) < len(PALETTE):
            slot = (slot + 1) % len(PALETTE)
        taken.add(slot)
        out[job_id] = f"g{slot}"
    return out


#: The legend lists at most this many gangs (each cell's title names its gang anyway).
LEGEND_GANGS = 40


def heatmap(nodes: list[dict[str, Any]], colours: dict[str, str], marks: dict[str, list[NodeMark]],
            note: str = "") -> str:
    """The nodes page: per rack a node x GPU table, each GPU in the colour of the gang holding it
    (`colours`, from gang_classes; its job id and task index as the cell's title), nodes kept for a
    waiting gang outlined (their free GPUs hatched) and named beside the row; a legend of states,
    gangs and the kept nodes."""
    racks: dict[str, list[dict[str, Any]]] = {}
    for n in nodes:
        racks.setdefault(n["rack"], []).append(n)
    blocks = []
    for rack, members in sorted(racks.items()):
        rows = []
        for n in members:
            kept = marks.get(n["id"], [])
            kept_text = "".join(f"; kept for job {m.job_id}: {m.why}" for m in kept)
            klass = "down" if n["status"] != NodeStatus.READY.value else ("cordoned" if not n["schedulable"] else "")
            cells = []
            for g in range(n["gpus"]):
                holder = n["owner"].get(g)
                if holder is not None:
                    cls, what = f"used {colours[holder[0]]}", f"job {holder[0]} task {holder[1]}"
                else:
                    cls, what = klass or ("free reserved" if kept else "free"), klass or "free"
                cells.append(f'<td class="gpu {cls}" data-node="{escape(n["id"])}" data-gpu="{g}"'
                             + (f' data-job="{escape(holder[0])}"' if holder else "")
                             + f' title="{escape(n["id"])} GPU {g}: {escape(what + kept_text)}"></td>')
            side = ('<td class="note">for ' + ", ".join(_job_link(m.job_id) for m in kept) + "</td>") if kept else ""
            row_class = ' class="reserved"' if kept else ""
            head_title = f' title="{escape(kept_text[2:])}"' if kept else ""
            rows.append(f"<tr{row_class}><th{head_title}>{_node_link(n['id'])}</th>{''.join(cells)}{side}</tr>")
        blocks.append(f'<div class="rack"><h2>{escape(rack)}</h2><table class="heatmap">{"".join(rows)}</table>'
                      "</div>")
    legend = ('<p><span class="swatch used"></span> used (in its gang\'s colour) '
              '<span class="swatch free"></span> free <span class="swatch reserved"></span> free, kept for a '
              'waiting gang (the node is outlined) '
              '<span class="swatch cordoned"></span> cordoned <span class="swatch down"></span> down</p>')
    gangs = list(colours)
    if gangs:
        shown = "".join(f'<span class="swatch {colours[j]}" title="{escape(j)}"></span> {_job_link(j)} '
                        for j in gangs[:LEGEND_GANGS])
        more = f" and {len(gangs) - LEGEND_GANGS} more" if len(gangs) > LEGEND_GANGS else ""
        legend += f'<p class="gangs">Gangs: {shown}{more}</p>'
    waiting: dict[str, list[tuple[str, str]]] = {}
    for node_id, kept in sorted(marks.items()):
        for m in kept:
            waiting.setdefault(m.job_id, []).append((node_id, m.why))
    if waiting:
        legend += "<p>Kept for waiting gangs:</p><ul class=\"kept\">" + "".join(
            f"<li>{_job_link(job)}: {', '.join(_node_link(node) for node, _ in kept)} "
            f"({escape('; '.join(sorted({why for _, why in kept})))})</li>" for job, kept in sorted(waiting.items())) \
            + "</ul>"
    return (f'<p class="muted">{escape(note)}</p>' if note else "") + legend + "".join(blocks)


class Dashboard:
    """Renders the pages of one replica."""

    def __init__(self, master: Master) -> None:
        self.m = master

    def render(self, path: str, query: str) -> tuple[int, str]:
        """(status, HTML) for a GET of `path`."""
        args = {k: v[-1] for k, v in parse_qs(query).items()}
        parts = [p for p in path.split("/") if p]
        if not parts:
            return 200, self.overview()
        if parts == ["nodes"]:
            return 200, self.nodes()
        if len(parts) == 2 and parts[0] == "nodes":
            return self.node(parts[1])
        if parts == ["queues"]:
            return 200, self.queues()
        if parts == ["jobs"]:
            return 200, self.jobs(args)
        if len(parts) == 2 and parts[0] == "jobs":
            return self.job(parts[1])
        if parts == ["masters"]:
            return 200, self.masters()
        if parts == ["history"]:
            return 200, _page("History", dashboard_history.history_page(self.m.history, args, _table, _when, _job_link))
        if parts == ["usage"]:
            return 200, _page("Usage", dashboard_history.usage_page(self.m.history, args, _table))
        return 404, _page("Not found", f"<p>No page at {escape(path)}.</p>")

    # ---- reads (under the lock, into plain values) ---------------------------------------------

    def _jobs(self) -> list[dict[str, Any]]:
        now = time.time()
        view = self.m.leader_view()
        waiting = view.waiting() if view is not None else {}
        reserving = {r.job_id for r in view.reservations()} if view is not None else set()
        with self.m.lock:
            state = self.m.state
            estimates = view.estimates(state, now) if view is not None else {}
            out = []
            for j in state.jobs.values():
                pending = j.status is JobStatus.PENDING
                code, why = self._why_waiting(j, waiting.get(j.id)) if pending else ("", "")
                out.append({"id": j.id, "name": j.spec.name, "state": j.status.value, "queue": state.queue_of(j),
                            "user": j.user or "-", "gpus": j.spec.total.gpu, "tasks": j.spec.tasks,
                            "attempt": j.attempt, "submitted_at": j.submitted_at,
                            # the same figure as synctl's WAIT: from submission, so far while pending
                            "wait": format_wait(pending, j.submitted_at, j.started_at, now),
                            "wait_s": (now if pending else j.started_at or j.submitted_at) - j.submitted_at,
                            "reason": code, "why": why, "reserved": j.id in reserving or j.id in state.holds,
                            "start": "-" if not pending else _start_cell(estimates.get(j.id), now) if view is not None
                            else "unknown: the leader's (open this page on the leader)",
                            "interactive": j.spec.interactive, "held_by": j.held_by})
            return out

    @staticmethod
    def _why_waiting(job: Job, reason: WaitReason | None) -> tuple[str, str]:
        """A pending job's typed wait reason (a PENDING_REASONS code) and its detail: the leader's
        last round when this replica leads, else what the leader last recorded in the log (the code,
        and the message of the Waiting event that recorded it)."""
        if reason is not None:
            return reason.code, reason.message
        recorded = next((e.message for e in reversed(job.events) if e.kind == "Waiting"), "")
        return job.pending_reason, recorded.removeprefix(f"{job.pending_reason}: ")

    def _nodes(self) -> list[dict[str, Any]]:
        with self.m.lock:
            state = self.m.state
            out = []
            for node in sorted(state.nodes.values(), key=lambda n: (n.topology, n.id)):
                owner = {}
                for task, _ in state.tasks_on_node(node.id):
                    for gpu in task.gpus:
                        owner[gpu] = (task.job_id, task.index)
                out.append({"id": node.id, "rack": topology_path(node.topology), "status": node.status.value,
                            "schedulable": node.schedulable, "gpus": node.capacity.gpu, "used": node.used.gpu,
                            "owner": owner, "address": node.address})
            return out

    def _marks(self) -> tuple[dict[str, list[NodeMark]], str]:
        """Nodes kept for waiting gangs, and a note when this replica cannot know them all.

        Preemption holds are replicated, so every replica marks them. The scheduler's reservations
        are the leader's alone: remade every round and never written to the log (that would grow
        it with every round), so a follower cannot show them. An operator who opens a follower's
        page expects what the cluster does, not an empty map: the page says that the leader's page
        shows them rather than marking nothing silently."""
        with self.m.lock:
            holds = list(self.m.state.holds.values())
        view = self.m.leader_view()
        marks: dict[str, list[NodeMark]] = {}
        for r in view.reservations() if view is not None else ():
            start = "unknown" if math.isinf(r.starts_at) else _when(r.starts_at)
            why = f"reserved by the scheduler in {topology_path(r.domain)}, expected free at {start}"
            for node_id in sorted(r.nodes):
                marks.setdefault(node_id, []).append(NodeMark(r.job_id, why))
        for h in holds:
            for node_id in h.nodes:
                marks.setdefault(node_id, []).append(
                    NodeMark(h.job_id, f"held while its preemption victims stop ({', '.join(h.victims)})"))
        note = ""
        if view is None:
            leader = self.m.leader_api_address()
            note = ("This replica follows the leader: the scheduler's reservations are the leader's decisions, "
                    "remade every round and not replicated, so only preemption holds are marked here. Open this "
                    f"page on the leader (API address {leader or 'unknown: no leader known'}) to see both.")
        return marks, note

    # ---- pages ---------------------------------------------------------------------------------

    def overview(self) -> str:
        jobs, nodes = self._jobs(), self._nodes()
        by_state: dict[str, int] = {}
        for j in jobs:
            by_state[j["state"]] = by_state.get(j["state"], 0) + 1
        total, used = sum(n["gpus"] for n in nodes), sum(n["used"] for n in nodes)
        raft = self.m.raft
        summary = _facts([
            ["Replica", f"{escape(self.m.replica.id)} ({'leader' if raft.is_leader() else 'follower'}, term "
                        f"{raft.term()})"],
            ["GPUs", f"{used} used of {total}"],
            ["Nodes", f"{len(nodes)} ({sum(1 for n in nodes if n['status'] == 'READY')} ready)"],
            ["Jobs", ", ".join(f"{n} {escape(s)}" for s, n in sorted(by_state.items())) or "none"]])
        node_rows = [[_node_link(n["id"]), escape(n["rack"]), n["status"] + ("" if n["schedulable"] else " (cordoned)"),
                      f"{n['used']}/{n['gpus']}"] for n in nodes]
        running = [j for j in jobs if j["state"] in ("SCHEDULED", "RUNNING", "STOPPING")]
        job_rows = [[_job_link(j["id"]), escape(j["name"]) + _type_mark(j), j["state"], escape(j["queue"]),
                     escape(j["user"]), str(j["gpus"])] for j in running]
        return _page("Overview", summary + "<h2>Nodes</h2>" + _table(["Node", "Rack", "Status", "GPUs"], node_rows)
                     + "<h2>Running jobs</h2>" + _table(["Job", "Name", "State", "Queue", "User", "GPUs"], job_rows))

    def nodes(self) -> str:
        marks, note = self._marks()
        nodes = self._nodes()
        with self.m.lock:
            jobs = self.m.state.jobs
            gangs = sorted({job for n in nodes for job, _ in n["owner"].values()},
                           key=lambda j: (jobs[j].seq if j in jobs else 0, j))
        return _page("Nodes", heatmap(nodes, gang_classes(gangs), marks, note))

    def node(self, node_id: str) -> tuple[int, str]:
        node = next((n for n in self._nodes() if n["id"] == node_id), None)
        if node is None:
            return 404, _page("Not found", f"<p>No node {escape(node_id)}.</p>")
        with self.m.lock:
            events = [e for e in self.m.state.cluster_events
                      if (e.topic == "node" and e.object_id == node_id) or f" on {node_id}" in e.message][-200:]
        jobs = sorted({job for job, _ in node["owner"].values()})
        rows = [[_when(e.at), f'<span class="{e.type}">{escape(e.reason)}</span>',
                 _job_link(e.object_id) if e.topic == "job" else escape(e.object_id), escape(e.message)]
                for e in reversed(events)]
        return 200, _page(f"Node {node_id}", _facts([
            ["Rack", escape(node["rack"])], ["Status", node["status"] + ("" if node["schedulable"] else " (cordoned)")],
            ["GPUs", f"{node['used']}/{node['gpus']}"], ["Jobs now", ", ".join(map(_job_link, jobs)) or "none"]])
            + "<h2>Timeline</h2>" + _table(["Time", "Reason", "Object", "Message"], rows))

    def queues(self) -> str:
        with self.m.lock:
            state = self.m.state
            names = sorted({DEFAULT_QUEUE, *state.queues})
            waiting: dict[str, int] = {}
            for j in state.pending_jobs():
                waiting[state.queue_of(j)] = waiting.get(state.queue_of(j), 0) + 1
            rows = []
            now, half_life = time.time(), state.usage_half_life
            for name in names:
                q = state.queues.get(name)
                usage = state.queue_usage.get(name)
                pending = waiting.get(name, 0)
                remembered = fairshare.value_at(state.queue_decay.get(name), now, half_life) / 3600
                rows.append([escape(name), escape(q.parent) if q and q.parent else "-", f"{q.weight:g}" if q else "1",
                             str(usage.gpu if usage else 0), f"{remembered:.1f}", str(q.guaranteed.gpu) if q else "0",
                             str(q.max.gpu) if q and q.max.gpu >= 0 else "-", str(pending)])
        return _page("Queues", _table(["Queue", "Parent", "Weight", "GPUs used", "GPU-hours (decayed)", "Guaranteed",
                                       "Max", "Pending"], rows))

    def jobs(self, args: dict[str, str]) -> str:
        jobs = self._jobs()
        for field in ("state", "queue", "user"):
            if args.get(field):
                jobs = [j for j in jobs if j[field] == args[field]]
        sort = args.get("sort", "submitted")
        jobs.sort(key=SORTS.get(sort, SORTS["submitted"]), reverse=args.get("order") == "desc")
        try:
            page = max(1, int(args.get("page", "1")))
        except ValueError:
            page = 1
        shown = jobs[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]

        def link(**changes: str) -> str:
            return "/jobs?" + urlencode({**args, **changes})

        def flip(key: str) -> str:
            return "desc" if sort == key and args.get("order") != "desc" else "asc"

        headers = [f'<a href="{escape(link(sort=key, order=flip(key)))}">{label}</a>'
                   for key, label in (("name", "Name"), ("state", "State"), ("queue", "Queue"), ("user", "User"),
                                      ("gpus", "GPUs"), ("submitted", "Submitted"), ("wait", "Wait"),
                                      ("reason", "Why waiting"))] + ["Start"]
        rows = [[_job_link(j["id"]) + f" {escape(j['name'])}" + _type_mark(j),
                 j["state"] + (f" (held by {escape(j['held_by'])})" if j["held_by"] else ""), escape(j["queue"]),
                 escape(j["user"]), str(j["gpus"]), _when(j["submitted_at"]), j["wait"], _reason_cell(j),
                 escape(j["start"])]
                for j in shown]
        options = "".join(f'<option value="{s.value}"{" selected" if args.get("state") == s.value else ""}>'
                          f"{s.value}</option>" for s in JobStatus)
        form = (f'<form method="get" action="/jobs">State <select name="state"><option value="">any</option>{options}'
                f'</select> Queue <input name="queue" value="{escape(args.get("queue", ""))}"> User '
                f'<input name="user" value="{escape(args.get("user", ""))}"> '
                '<button type="submit">Filter</button></form>')
        pages = max(1, -(-len(jobs) // PAGE_SIZE))
        nav = (f'<p>{len(jobs)} job(s), page {page} of {pages} '
               + (f'<a href="{escape(link(page=str(page - 1)))}">previous</a> ' if page > 1 else "")
               + (f'<a href="{escape(link(page=str(page + 1)))}">next</a>' if page < pages else "") + "</p>")
        return _page("Jobs", form + nav + _table(headers, rows))

    def job(self, job_id: str) -> tuple[int, str]:
        with self.m.lock:
            state = self.m.state
            job = state.jobs.get(job_id)
        if job is None:
            archived = dashboard_history.archived_job(self.m.history, job_id, _facts, _table, _when)
            if archived:
                return 200, _page(f"Job {job_id}", archived)
            return 404, _page("Not found", f"<p>No job {escape(job_id)}.</p>")
        with self.m.lock:
            state = self.m.state
            spec = job.spec
            pulling = {t.index for t in gang_unprepared(job)} if job.status is JobStatus.SCHEDULED else set()
            gang = [(t.rank, t.index, t.node_id, topology_path(state.nodes[t.node_id].topology)
                     if t.node_id in state.nodes else "-", t.gpus, t.state.value
                     + (" (pulling image)" if t.index in pulling else " (image ready)" if pulling else ""))
                    for t in job.tasks]
            events = list(job.events)
            queue, user, status, attempt = state.queue_of(job), job.user or "-", job.status.value, job.attempt
            held_by = job.held_by
            view = self.m.leader_view()
            waiting = view.wait_reason(job.id) if view is not None and job.status is JobStatus.PENDING else None
            why = waiting.describe(state) if waiting is not None else ""
            estimate = view.estimates(state, time.time()).get(job.id) if view is not None and waiting is not None \
                else None
            hold = state.holds.get(job.id)
        facts = [["Name", escape(spec.name) + (" (interactive)" if spec.interactive else "")],
                 ["State", status + (f" (held by {escape(held_by)})" if held_by else "")], ["Attempt", str(attempt)],
                 ["Queue", escape(queue)],
                 ["User", escape(user)], ["Gang", f"{spec.tasks} task(s) x {spec.resources.gpu} GPU(s)"],
                 ["Command", escape(" ".join(spec.command))],
                 ["Environment", escape(", ".join(f"{k}=***" for k, _ in spec.env)) or "-"]]
        if spec.secrets:
            facts.append(["Secrets", escape(", ".join(f"{x.name}=***" for x in spec.secrets))])
        if spec.image:
            nodes = {n for _, _, n, _, _, _ in gang}
            late = {n for _, i, n, _, _, _ in gang if i in pulling}
            heard = {n: self.m.pull_progress.get((job_id, attempt, n)) for n in late}
            late_text = ", ".join(n + (f" {format_pull(*h[:3])}" if (h := heard[n]) else "") for n in sorted(late))
            progress = f": pulling, {len(nodes - late)} of {len(nodes)} nodes ready " \
                       f"(waiting: {escape(late_text)})" if late else ""
            facts.append(["Image", escape(spec.image) + progress])
        if waiting is not None:
            facts.append(["Waiting", escape(why)])
        if estimate is not None:
            facts.append(["Start", escape(_start_cell(estimate, time.time()) + f" ({estimate.detail})")])
        elif status == "PENDING" and not self.m.raft.is_leader():
            facts.append(["Waiting", "the leader knows why: open this page on the leader"])
        if hold is not None:
            facts.append(["Holds", escape(", ".join(hold.nodes)) + f" (preempted {escape(', '.join(hold.victims))})"])
        gang_rows = [[str(r), str(i), _node_link(n), escape(rack), ",".join(map(str, gpus)) or "-", st]
                     for r, i, n, rack, gpus, st in sorted(gang)]
        event_rows = [[_when(e.at), escape(e.kind), escape(e.message)] for e in events]
        return 200, _page(f"Job {job_id}", _facts(facts) + "<h2>Gang</h2>"
                          + _table(["Rank", "Task", "Node", "Rack", "GPUs", "State"], gang_rows)
                          + "<h2>Events</h2>" + _table(["Time", "Kind", "Message"], event_rows))

    def masters(self) -> str:
        raft = self.m.raft
        status = raft.status()
        rows = [[escape(self.m.replica.id) + " (this one)", "leader" if raft.is_leader() else "follower",
                 escape(self.m.replica.raft), str(status.get("raft_term", 0)), str(status.get("commit_idx", 0)),
                 str(status.get("last_applied", 0)), "-"]]
        for partner in raft.partners():
            connected = status.get(f"partner_node_status_server_{partner}") == 2
            rows.append([escape(self.m.api_of_raft(partner) or partner), "leader" if partner == raft.leader() else
                         "follower", escape(partner), "-", "-", "-", "connected" if connected else "not connected"])
        return _page("Masters", _table(["Replica", "Role", "Raft", "Term", "Commit", "Applied", "Link"], rows))
