"""What synctl prints: replies turned into json-able dicts, and those dicts into tables and text.

Pure functions, no I/O and no RPC: `-o json` and `-o yaml` print the dicts as they are (their keys
are an interface scripts rely on); the table forms are for people. Times show in local time.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from synapse.core.goodput import Goodput
from synapse.core.jobs import wire
from synapse.core.jobs.quantity import (
    format_cpu,
    format_duration,
    format_memory,
    format_pull,
    format_start,
    format_wait,
)
from synapse.core.model import DEFAULT_IDLE_TIMEOUT_S, EndReason
from synapse.proto import api_pb2, types_pb2
from synapse.rpc import convert


def formatted(data: Any, output: str, text: Callable[[Any], str]) -> str:
    """`data` as `output` asks: json, yaml, or `text(data)` for a table."""
    if output == "json":
        return json.dumps(data, indent=2)
    if output == "yaml":
        import yaml  # only for -o yaml: a tenth of synctl's start

        return yaml.safe_dump(data, sort_keys=False).rstrip()
    return text(data)


def table(headers: list[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns as wide as their widest cell, two spaces apart."""
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def when(ts: float | None) -> str:
    """A timestamp as local HH:MM:SS, or "-" for none."""
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else "-"


# ---- jobs ----------------------------------------------------------------------------------------

#: The reasons a task fails for of itself: a failed job whose attempt has one such task points at its
#: log (not Signal: a task stopped because another of its gang failed ends so too).
OWN_FAILURES = frozenset({EndReason.ERROR, EndReason.OOM_KILLED, EndReason.COMMAND_NOT_FOUND})

def job_dict(info: api_pb2.JobInfo) -> dict[str, Any]:
    spec = wire.job_spec_from_proto(info.spec)
    return {
        "id": info.id, "name": spec.name, "status": info.status, "attempt": info.attempt,
        "type": "interactive" if spec.interactive else "batch", "held_by": info.held_by or None,
        "time_limit_s": spec.time_limit or None,
        "max_restarts": spec.max_restarts, "priority": spec.priority, "tasks_requested": spec.tasks,
        "tasks_min": spec.tasks_min or None,
        "queue": spec.queue or "default", "grace_s": spec.grace or None,
        "resources": {"cpu": format_cpu(spec.resources.cpu), "memory": format_memory(spec.resources.memory),
                      "gpu": spec.resources.gpu},
        "topology": {"pack": spec.topology.pack or "lowest", "mode": spec.topology.mode.value},
        "command": list(spec.command), "request_id": info.request_id, "user": info.user or None,
        "cancelled_by": info.cancelled_by or None,
        "submitted_at": info.submitted_at, "started_at": info.started_at or None,
        "finished_at": info.finished_at or None,
        "tasks": [{"index": t.index, "rank": t.rank, "node": t.node_id, "gpus": list(t.gpus), "state": t.state,
                   "exit_code": t.exit_code if t.has_exit_code else None, "reason": t.reason or None,
                   "reason_message": t.reason_message or None, **({"prepared": True} if t.prepared else {})}
                  for t in info.tasks],
        "image": spec.image or None, "mounts": [{"source": s, "target": t, "readonly": ro} for s, t, ro in spec.mounts],
        "image_pull_timeout_s": spec.image_pull_timeout or None,
        "secrets": [x.name for x in spec.secrets],  # by name alone: the API never carries their values
        "pulls": {p.node_id: {"phase": p.phase, "done_bytes": p.done_bytes, "total_bytes": p.total_bytes}
                  for p in info.pulls},
        "failure": info.failure or None, "gpu_model": spec.gpu_model or None,
        "waiting": info.waiting or None, "waiting_code": info.waiting_code or None,
        "restarts_used": info.restarts_used, "requeues": info.requeues,
        "excluded_nodes": list(info.excluded_nodes),
        "shortfalls": list(info.shortfalls), "reservation": info.reservation or None,
        "prediction": info.prediction or None,
        **estimate_dict(info),
        "events": [{"at": e.at, "reason": e.kind, "kind": e.kind, "message": e.message} for e in info.events],
        "array": _array_dict(info, spec), "failure_cause": info.failure_cause or None,
        "dependencies": [{"kind": d.kind, "job": d.job_id, "upstream_status": d.upstream_status or None,
                          "state": d.state} for d in info.dependencies],
        "singleton": spec.singleton or None,
        "checkpoint": {"signal": spec.checkpoint.signal, "notice_s": spec.checkpoint.notice}
        if spec.has_checkpoint else None,
        "progress": {"step": info.step if info.step >= 0 else None,
                     "checkpoint_at": info.checkpoint_at or None,
                     "checkpoint_step": info.checkpoint_step if info.checkpoint_step >= 0 else None,
                     "at": info.progress_at} if info.progress_at else None,
        "goodput": goodput_dict(convert.goodput_from_proto(info.goodput)) if info.HasField("goodput") else None,
        "allocation": {"steps": info.step_count, "idle_since": info.idle_since or None,
                       "idle_timeout_s": spec.idle_timeout or DEFAULT_IDLE_TIMEOUT_S} if spec.alloc else None,
        "alloc_id": info.alloc_id or None,
    }


def step_dict(info: api_pb2.JobInfo) -> dict[str, Any]:
    """One step of an allocation as `get steps` shows it: its exit code is its tasks' highest."""
    spec = wire.job_spec_from_proto(info.spec)
    codes = [t.exit_code for t in info.tasks if t.has_exit_code]
    return {"id": info.id, "status": info.status, "tasks": spec.tasks, "command": list(spec.command),
            "nodes": sorted({t.node_id for t in info.tasks}), "exit_code": max(codes) if codes else None,
            "started_at": info.started_at or None, "finished_at": info.finished_at or None}


def steps_table(steps: list[dict[str, Any]]) -> str:
    """`get steps ALLOC`."""
    return table(["ID", "STATUS", "TASKS", "EXIT", "NODES", "COMMAND"],
                 [[s["id"], s["status"], s["tasks"], "-" if s["exit_code"] is None else s["exit_code"],
                   ",".join(s["nodes"]), " ".join(s["command"])[:60]] for s in steps])


def estimate_dict(info: api_pb2.JobInfo) -> dict[str, Any]:
    """A pending job's estimated start: `estimated_start` (epoch seconds, None when unknown) and what
    it rests on; every key None for a job that is not pending."""
    if info.status != "PENDING" or not info.estimate_basis:
        return {"estimated_start": None, "estimate_basis": None, "estimate_detail": None, "estimate_why": None,
                "estimate_ahead": []}
    return {"estimated_start": info.estimated_start or None, "estimate_basis": info.estimate_basis,
            "estimate_detail": info.estimate_detail or None, "estimate_why": info.estimate_why or None,
            "estimate_ahead": [{"job": a.job_id, "ends_at": a.ends_at} for a in info.estimate_ahead]}


def start_column(j: dict[str, Any], now: float) -> str:
    """`get jobs`' START: for a pending job "in ~25 min" (within 2 h), "at 14:02 UTC" (later), "now",
    or "unknown: <why>"; "-" for the others."""
    if j["status"] != "PENDING" or j.get("estimate_basis") is None:
        return "-"
    return format_start(j["estimated_start"], j["estimate_why"] or "", now)


def goodput_dict(g: Goodput) -> dict[str, Any]:
    """GPU-hours by where they went, and the goodput (None while nothing was held: JSON has no nan)."""
    out: dict[str, Any] = g.hours()
    out["goodput"] = None if math.isnan(g.goodput) else g.goodput
    return out


def goodput_line(g: dict[str, Any]) -> str:
    """A job's (or a queue's) goodput in a line: the GPU-hours held, kept and lost, by cause."""
    ratio = "-" if g["goodput"] is None else f"{g['goodput'] * 100:.1f}%"
    return (f"{ratio} of {g['held_gpu_hours']:.3f} GPU-h held kept; lost: failures "
            f"{g['lost_failures_gpu_hours']:.3f}, restarts {g['lost_restarts_gpu_hours']:.3f}, other stops "
            f"{g['lost_other_gpu_hours']:.3f} GPU-h; requeue wait {g['requeue_wait_gpu_hours']:.3f} GPU-h")


def _array_dict(info: api_pb2.JobInfo, spec: Any) -> dict[str, Any] | None:
    """An array (or element)'s array part; `line_id` folds never-placed elements: `ID_[5-99]`."""
    if not info.array_id:
        return None
    out: dict[str, Any] = {"id": info.array_id, "index": info.array_index if info.array_index >= 0 else None,
                           "indices": spec.array, "line_id": info.id}
    if info.array_waiting:
        out["waiting"] = info.array_waiting
        out["line_id"] = f"{info.array_id}_[{info.array_waiting}]"
    if info.HasField("array"):
        a = info.array
        out.update({"total": a.total, "throttle": a.throttle or None, "running": a.running, "waiting_count": a.waiting,
                    "succeeded": a.succeeded, "failed": a.failed, "cancelled": a.cancelled})
    return out


def waited(j: dict[str, Any], now: float) -> str:
    """How long a job has waited: so far while pending, until its start once started."""
    return format_wait(j["status"] == "PENDING", j["submitted_at"], j["started_at"], now)


def jobs_table(jobs: list[dict[str, Any]], now: float | None = None) -> str:
    """`get jobs`; WAIT is measured up to `now` (default: this machine's clock) for pending jobs."""
    now = time.time() if now is None else now
    return table(["ID", "NAME", "TYPE", "USER", "STATUS", "ATTEMPT", "TASKS", "GPU/TASK", "SUBMITTED", "WAIT",
                  "START"],
                 [[j["array"]["line_id"] if j["array"] else j["id"], j["name"], j.get("type", "batch"),
                   j["user"] or "-", status_column(j), j["attempt"], tasks_column(j),
                   j["resources"]["gpu"], when(j["submitted_at"]), waited(j, now), start_column(j, now)] for j in jobs])


def status_column(j: dict[str, Any]) -> str:
    """A job's status as `get jobs` shows it: a held job's says so (it waits for a release, not room)."""
    return f"{j['status']} (held)" if j.get("held_by") else j["status"]


def tasks_column(j: dict[str, Any]) -> str:
    """A gang's size: its task count; for an elastic gang the tasks its attempt holds, of its range."""
    if not j.get("tasks_min"):
        return str(j["tasks_requested"])
    span = f"{j['tasks_min']}-{j['tasks_requested']}"
    return f"{len(j['tasks'])} of {span}" if j["tasks"] else span


def job_description(j: dict[str, Any]) -> str:
    """`describe job`: status, attempt, placement, events, and for a pending job why it waits."""
    r = j["resources"]
    cancelled = f" (cancelled by {j['cancelled_by']})" if j["cancelled_by"] else ""
    held = f" (held by {j['held_by']}: `synctl release {j['id']}`)" if j.get("held_by") else ""
    session = "   Type: interactive" if j.get("type") == "interactive" else ""
    lines = [f"Job:        {j['id']} ({j['name']}){session}", f"Status:     {j['status']}{cancelled}{held}",
             f"User:       {j['user'] or '-'}   Queue: {j['queue']}",
             f"Attempt:    {j['attempt']} (restarts used {j['restarts_used']} of max_restarts {j['max_restarts']}"
             + (f"; requeued {j['requeues']} time(s), not charged: node lost, GPU error, drain, preemption, resize "
                "or synctl requeue)" if j["requeues"] else ")"),
             f"Gang:       {tasks_column(j)} task(s) x cpu {r['cpu']}, memory {r['memory']}, gpu {r['gpu']}",
             f"Topology:   pack {j['topology']['pack']} ({j['topology']['mode']})",
             f"Priority:   {j['priority']}"
             + (f"   Time limit: {format_duration(j['time_limit_s'])}" if j.get("time_limit_s") else ""),
             f"Command:    {' '.join(j['command']) or '(the image' + chr(39) + 's entrypoint)'}",
             *([f"Image:      {j['image']}" + (f"   {image_progress(j)}" if image_progress(j) else "")]
               if j.get("image") else []),
             *(["Secrets:    " + ", ".join(j["secrets"]) + " (given to the tasks; values never shown)"]
               if j.get("secrets") else []),
             *(["Mounts:     " + ", ".join(f"{m['source']} -> {m['target']}" + (" (read-only)" * m["readonly"])
                                           for m in j["mounts"])] if j.get("mounts") else []),
             *([f"Checkpoint: SIG{j['checkpoint']['signal']} {j['checkpoint']['notice_s']:g}s before a planned stop "
                "(time limit, preemption, drain, resize), then SIGTERM"] if j.get("checkpoint") else []),
             f"Submitted:  {when(j['submitted_at'])}   Started: {when(j['started_at'])}   "
             f"Finished: {when(j['finished_at'])}"]
    if j.get("allocation"):
        al = j["allocation"]
        idle = f"; idle since {when(al['idle_since'])}" if al["idle_since"] and j["status"] == "RUNNING" else ""
        lines.append(f"Allocation: {al['steps']} step(s) started (`synctl get steps {j['id']}`); ends after "
                     f"{al['idle_timeout_s']:g}s with no step running{idle}")
    if j.get("alloc_id"):
        lines.append(f"Step of:    allocation {j['alloc_id']}")
    a = j["array"]
    if a and a["index"] is None:
        lines.append(f"Array:      [{a['indices']}] {a['total']} element(s), throttle {a['throttle'] or 'none'}: "
                     f"{a['waiting_count']} waiting, {a['running']} running, {a['succeeded']} succeeded, "
                     f"{a['failed']} failed, {a['cancelled']} cancelled")
        if a.get("waiting"):
            lines.append(f"  waiting elements: {a['line_id']}")
    elif a:
        lines.append(f"Array:      element {a['index']} of {a['id']} [{a['indices']}]")
    for d in j["dependencies"]:
        lines.append(f"Depends:    after{d['kind']} {d['job']} ({d['upstream_status'] or 'unknown'}): {d['state']}")
    if j["waiting"]:
        lines.append(f"Waiting:    {j['waiting']}")
        lines += [f"  - {s}" for s in j["shortfalls"]]
    if j["reservation"]:
        lines.append(f"Reserved:   {j['reservation']}")
    if j.get("prediction"):
        lines.append(f"Predicted:  {j['prediction']}")
    if j.get("estimate_basis"):
        lines.append(f"Start:      {start_column(j, time.time())}"
                     + (f" ({j['estimate_detail']})" if j.get("estimate_detail") else ""))
    if j.get("excluded_nodes"):
        lines.append(f"Excluded:   {', '.join(j['excluded_nodes'])} (they ended earlier attempts: never placed there "
                     "again)")
    p = j.get("progress")
    if p:
        checkpoint = (f"checkpoint {when(p['checkpoint_at'])}" + (f" (step {p['checkpoint_step']})"
                      if p["checkpoint_step"] is not None else "")) if p["checkpoint_at"] else "no checkpoint"
        step = f"step {p['step']}, " if p["step"] is not None else ""
        lines.append(f"Progress:   {step}{checkpoint} (reported {when(p['at'])})")
    g = j.get("goodput")
    if g and g["held_gpu_hours"] > 0:
        lines.append(f"Goodput:    {goodput_line(g)}")
    if j["failure"]:
        lines.append(f"Failed:     {j['failure']}")
        if j["tasks"]:  # the output is for the job's owner and admins: describe says where to read it
            failed = [t["index"] for t in j["tasks"] if t["reason"] in OWN_FAILURES]
            task = f" --task {failed[0]}" if len(failed) == 1 else ""
            lines.append(f"Output:     synctl logs {j['id']} --attempt {j['attempt']}{task}")
    if j["tasks"]:
        lines += ["Tasks:", "  " + table(["INDEX", "RANK", "NODE", "GPUS", "STATE", "EXIT", "REASON"], [
            [t["index"], t["rank"], t["node"], ",".join(map(str, t["gpus"])) or "-", t["state"],
             "-" if t["exit_code"] is None else t["exit_code"],
             (t["reason"] or "-") + (f" ({t['reason_message']})" if t["reason_message"] else "")]
            for t in j["tasks"]]).replace("\n", "\n  ")]
    lines += ["Events:"] + [f"  {when(e['at'])}  {e['kind']:<10} {e['message']}" for e in j["events"]]
    return "\n".join(lines)


def image_progress(j: dict[str, Any]) -> str:
    """While a gang in an image waits for it: "pulling image: 1 of 2 nodes ready (waiting: w2)"; ""
    otherwise. A task counts as ready once its node holds the image, or once it started."""
    if j["status"] != "SCHEDULED" or not j["tasks"]:
        return ""
    nodes: dict[str, bool] = {}
    for t in j["tasks"]:
        ready = t.get("prepared", False) or t["state"] != "ASSIGNED"
        nodes[t["node"]] = nodes.get(t["node"], True) and ready
    if all(nodes.values()):
        return ""
    waiting = [n + _pull_state(j.get("pulls", {}).get(n)) for n, ready in sorted(nodes.items()) if not ready]
    return (f"pulling image: {sum(nodes.values())} of {len(nodes)} nodes ready "
            f"(waiting: {', '.join(waiting)})")


def _pull_state(pull: dict[str, Any] | None) -> str:
    """A node's pull as the leader last heard it: " 45% of 1.2Gi", " unpack"; "" if not heard."""
    return f" {format_pull(pull['phase'], pull['done_bytes'], pull['total_bytes'])}" if pull else ""


def job_event_line(event: api_pb2.JobEvent) -> str:
    """One of a job's events as `submit --wait` follows them."""
    return f"{when(event.at)}  {event.kind:<10} {event.message}"


def submitted(job_ids: list[str], request_ids: list[str], output: str) -> str:
    """`submit`'s answer: the job ids, one a line, in a table; else each with the request id that
    made it (one job: that object, as always; several: a list of them)."""
    if output == "table":
        return "\n".join(job_ids)
    made = [{"id": job_id, "request_id": rid} for job_id, rid in zip(job_ids, request_ids, strict=True)]
    return formatted(made[0] if len(made) == 1 else made, output, str)


# ---- nodes ---------------------------------------------------------------------------------------

def node_dict(n: api_pb2.NodeInfo) -> dict[str, Any]:
    capacity, used = wire.resources_from_proto(n.capacity), wire.resources_from_proto(n.used)
    return {"id": n.id, "address": n.address, "topology": "/".join(n.topology), "status": n.status,
            "schedulable": n.schedulable, "spare": n.spare, "cordon_reason": n.cordon_reason or None,
            "health": n.health or None, "labels": dict(sorted(n.labels.items())), "isolation": n.isolation or None,
            "gpus": capacity.gpu, "gpus_used": used.gpu,
            "gpus_in_use": list(n.gpus_in_use), "cpu": format_cpu(capacity.cpu),
            "cpu_used": format_cpu(used.cpu), "memory": format_memory(capacity.memory),
            "memory_used": format_memory(used.memory), "live_tasks": n.live_tasks, "images": list(n.images)}


def _labels(n: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in n["labels"].items() if k == "gpu_model") or "-"


def nodes_table(nodes: list[dict[str, Any]], wide: bool = False) -> str:
    """`get nodes`; `wide` adds the images each node holds, as far as the replicated state knows."""
    return table(
        ["ID", "STATUS", "SCHEDULABLE", "TOPOLOGY", "GPUS", "LABELS", "CPU", "MEMORY", "TASKS", "ADDRESS", "REASON"]
        + (["IMAGES"] if wide else []),
        [[n["id"], n["status"], ("yes" if n["schedulable"] else "no") + (", spare" if n.get("spare") else ""),
          n["topology"],
          f"{n['gpus_used']}/{n['gpus']}", _labels(n), f"{n['cpu_used']}/{n['cpu']}",
          f"{n['memory_used']}/{n['memory']}", n["live_tasks"], n["address"],
          n["cordon_reason"] or (f"unhealthy: {n['health']}" if n["health"] else "")]
         + ([",".join(n["images"]) or "-"] if wide else []) for n in nodes])


def node_description(n: dict[str, Any]) -> str:
    """`describe node`: status, why it is cordoned, health, labels, how it confines tasks, its use."""
    lines = [f"Node:         {n['id']}   Address: {n['address']}", f"Status:       {n['status']}",
             f"Schedulable:  {'yes' if n['schedulable'] else 'no: ' + (n['cordon_reason'] or 'cordoned')}"
             + ("; a spare (restarts after a lost node, and jobs with a time limit it may evict)"
                if n.get("spare") else ""),
             f"Health:       {'failing: ' + n['health'] if n['health'] else 'passing (or no health check)'}",
             f"Topology:     {n['topology']}",
             f"Labels:       {', '.join(f'{k}={v}' for k, v in n['labels'].items()) or '-'}",
             f"Isolation:    {n['isolation'] or 'unknown (the worker did not say)'}",
             f"GPUs:         {n['gpus_used']}/{n['gpus']} in use"
             + (f" (indices {','.join(map(str, n['gpus_in_use']))})" if n["gpus_in_use"] else ""),
             f"CPU:          {n['cpu_used']}/{n['cpu']}", f"Memory:       {n['memory_used']}/{n['memory']}",
             f"Tasks:        {n['live_tasks']}"]
    return "\n".join(lines)


def drained(node_id: str, jobs_stopped: Sequence[str]) -> str:
    return (f"{node_id}: drained; stopped {len(jobs_stopped)} job(s)"
            + (": " + ", ".join(jobs_stopped) if jobs_stopped else ""))


def task_log(text: str, index: int, prefix: bool) -> str:
    """A chunk of a task's log; with `prefix` (several tasks at once) each line names its task."""
    return "".join(f"[task {index}] {line}" for line in text.splitlines(keepends=True)) if prefix else text


# ---- the master replicas -------------------------------------------------------------------------

def replica_dict(address: str, s: api_pb2.ReplicaStatusReply) -> dict[str, Any]:
    return {"id": s.id, "address": address, "reachable": True, "state": s.state, "term": s.term,
            "commit_index": s.commit_index, "applied_index": s.applied_index,
            "commands_applied": s.commands_applied, "digest": s.digest[:12],
            "leader": s.leader_api or None, "connected_to": list(s.connected),
            "raft_address": s.raft_address, "log_start": s.log_start,
            "command_version": s.command_version or None, "cluster_version": s.cluster_version,
            "applied_version": s.applied_version or None}


def unreachable_replica(address: str, error: str) -> dict[str, Any]:
    return {"id": None, "address": address, "reachable": False, "error": error}


def cluster_dict(replicas: list[dict[str, Any]], matched: dict[str, int]) -> dict[str, Any]:
    """`cluster status`: the replicas, each with the leader's match index for it (`matched`, by Raft
    address), and the leader of the highest term among them."""
    for r in replicas:  # the leader's view of each follower: a replica catching up shows it rising
        if r.get("raft_address") in matched:
            r["matched_index"] = matched[r["raft_address"]]
    leaders = [r for r in replicas if r.get("state") == "leader"]
    top = max(leaders, key=lambda r: r["term"]) if leaders else None
    return {"leader": {"id": top["id"], "address": top["address"]} if top else None,
            "term": top["term"] if top else max((r.get("term", 0) for r in replicas), default=0),
            "cluster_version": top["cluster_version"] if top else None, "replicas": replicas}


def cluster_text(d: dict[str, Any]) -> str:
    return (f"leader: {d['leader']['id']} at {d['leader']['address']} (term {d['term']})"
            if d["leader"] else "leader: none") \
        + f"\ncluster version: {d.get('cluster_version') or 'unknown (no leader)'}\n" + table(
        ["ID", "ADDRESS", "STATE", "TERM", "COMMIT", "APPLIED", "MATCHED", "DIGEST", "VERSION", "REACHABLE"],
        [[r.get("id") or "?", r["address"], r.get("state", "-"), r.get("term", "-"), r.get("commit_index", "-"),
          r.get("applied_index", "-"), r.get("matched_index", "-"), r.get("digest", "-"),
          r.get("command_version") or "-", "yes" if r["reachable"] else "no"]
         for r in d["replicas"]])


# ---- queues --------------------------------------------------------------------------------------

def _amounts(r: types_pb2.Resources, limit: bool) -> dict[str, Any]:
    """A queue's amounts as a user writes them; in a limit, a negative amount is no limit."""
    out: dict[str, Any] = {}
    for key, value, show in (("gpu", r.gpu, str), ("cpu", r.cpu_millis, format_cpu),
                             ("memory", r.memory_bytes, format_memory)):
        if limit and value < 0:
            continue
        out[key] = value if key == "gpu" else show(value)
    return out


def queue_dict(q: api_pb2.QueueInfo) -> dict[str, Any]:
    s = q.spec
    per_user = {k: v for k, v in (("gpu", s.max_per_user_gpu), ("jobs", s.max_per_user_jobs)) if v > 0}
    return {"name": s.name, "parent": s.parent or None, "weight": s.weight,
            "guaranteed": _amounts(s.guaranteed, False), "max": _amounts(s.max, True),
            "lending_limit": _amounts(s.lending_limit, True), "users": list(s.users), "groups": list(s.groups),
            "preemption": {"rules": list(s.preemption_rules), "min_runtime_s": s.min_runtime_s,
                           "max_grace_s": s.max_grace_s},
            **({"max_per_user": per_user} if per_user else {}),
            **({"interactive": {"max_duration_s": s.interactive_max_duration_s}}
               if s.interactive_max_duration_s else {}),
            "usage": _amounts(q.usage, False), "decayed_gpu_hours": round(q.decayed_gpu_hours, 3),
            "pending": q.pending, "running": q.running, **({"implicit": True} if q.implicit else {})}


def _gpus(amounts: dict[str, Any]) -> str:
    return str(amounts["gpu"]) if "gpu" in amounts else "-"


def queues_table(queues: list[dict[str, Any]]) -> str:
    return table(["NAME", "PARENT", "WEIGHT", "GPU USED", "GPU-H DECAYED", "GPU GUARANTEED", "GPU MAX", "PENDING",
                  "RUNNING"],
                 [[q["name"], q["parent"] or "-", f"{q['weight']:g}", _gpus(q["usage"]),
                   f"{q['decayed_gpu_hours']:.1f}", _gpus(q["guaranteed"]), _gpus(q["max"]), q["pending"],
                   q["running"]] for q in queues])


def queue_description(q: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(q, sort_keys=False).rstrip()


def applied(reply: api_pb2.ApplyQueuesReply) -> list[str]:
    """`apply`'s answer: a line for each queue, saying what became of it."""
    return [f"queue/{name} {verb}" for verb, names in
            (("created", reply.created), ("configured", reply.changed), ("unchanged", reply.unchanged))
            for name in names]


# ---- events --------------------------------------------------------------------------------------

def event_dict(e: api_pb2.ClusterEventInfo) -> dict[str, Any]:
    return {"seq": e.seq, "at": e.at, "type": e.type, "topic": e.topic, "reason": e.reason,
            "object": e.object_id, "message": e.message}


def events_table(events: list[dict[str, Any]]) -> str:
    return table(["SEQ", "TIME", "TYPE", "REASON", "OBJECT", "MESSAGE"],
                 [[e["seq"], when(e["at"]), e["type"], e["reason"], f"{e['topic']}/{e['object']}", e["message"]]
                  for e in events])


def watched_event(e: dict[str, Any], output: str) -> str:
    """One event as `get events --watch` prints it: a JSON line with `-o json`, else a table row."""
    if output == "json":
        return json.dumps(e)
    return (f"{e['seq']:<7} {when(e['at'])}  {e['type']:<8} {e['reason']:<16} {e['topic']}/{e['object']}  "
            f"{e['message']}")


# ---- preemption ----------------------------------------------------------------------------------

def preempt_dict(job_id: str, reply: api_pb2.PreemptWhatIfReply) -> dict[str, Any]:
    return {"job": job_id, "possible": reply.possible, "rule": reply.rule or None, "victims": list(reply.victims),
            "nodes": list(reply.nodes), "explanation": reply.explanation,
            "lost_gpu_seconds": reply.lost_gpu_seconds if reply.possible else None}


def preempt_text(d: dict[str, Any]) -> str:
    if not d["possible"]:
        return f"no preemption for {d['job']}: {d['explanation']}"
    return (f"would preempt {', '.join(d['victims'])} (rule {d['rule']}) and hold {', '.join(d['nodes'])}\n"
            f"{d['explanation']}")


# ---- users ---------------------------------------------------------------------------------------

def user_dict(u: api_pb2.UserInfo) -> dict[str, Any]:
    return {"name": u.name, "role": u.role, "groups": list(u.groups), "created_at": u.created_at or None,
            "created_by": u.created_by or None, "token_set_at": u.token_set_at or None,
            **({"bootstrap": True} if u.bootstrap else {})}


def token_dict(reply: api_pb2.UserToken) -> dict[str, Any]:
    return {**user_dict(reply.user), "token": reply.token}


def token_text(d: dict[str, Any], verb: str) -> str:
    """A new token, with how to use it: shown once, the cluster keeps only a keyed hash."""
    return (f"user {d['name']} {verb} (role {d['role']}, groups {','.join(d['groups']) or '-'}).\n"
            f"Its token, shown this once (the cluster keeps only a keyed hash):\n\n"
            f"export SYNAPSE_TOKEN={d['token']}")


def users_table(users: list[dict[str, Any]]) -> str:
    return table(["NAME", "ROLE", "GROUPS", "CREATED", "BY", "TOKEN SET"],
                 [[u["name"], u["role"], ",".join(u["groups"]) or "-", when(u["created_at"]), u["created_by"] or "-",
                   when(u["token_set_at"])] for u in users])


# ---- join tokens ---------------------------------------------------------------------------------

def join_token_dict(t: api_pb2.JoinTokenInfo) -> dict[str, Any]:
    return {"id": t.id, "created_at": t.created_at, "created_by": t.created_by, "expires_at": t.expires_at or None,
            "max_uses": t.max_uses or None, "uses": t.uses, "nodes": list(t.nodes)}


def join_token_text(d: dict[str, Any]) -> str:
    """A new join token, with where it goes: shown once, the cluster keeps only a keyed hash."""
    expires = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d["expires_at"])) if d["expires_at"] else "never"
    return (f"join token {d['id']} created (expires {expires}, uses {d['max_uses'] or 'unlimited'}).\n"
            "It registers new nodes only; shown this once (the cluster keeps only a keyed hash).\n"
            "Put it in the worker's --join-token-file (SYNAPSE_JOIN_TOKEN_FILE):\n\n"
            f"{d['token']}")


def join_tokens_table(tokens: list[dict[str, Any]]) -> str:
    return table(["ID", "CREATED", "BY", "EXPIRES", "USES", "NODES"],
                 [[t["id"], when(t["created_at"]), t["created_by"] or "-",
                   time.strftime("%Y-%m-%d %H:%M", time.localtime(t["expires_at"])) if t["expires_at"] else "never",
                   f"{t['uses']}/{t['max_uses'] or '-'}", ",".join(t["nodes"][-5:]) or "-"] for t in tokens])


def whoami_text(d: dict[str, Any]) -> str:
    return (f"{d['name']} (role {d['role']}"
            + (", the cluster token's built-in admin" if d.get("bootstrap") else "")
            + (f", groups {','.join(d['groups'])}" if d["groups"] else "") + ")")
