"""What `synctl history` and `synctl usage` print, and the times they accept. Pure.

`-o sacct` is Slurm's `sacct --parsable2 --allocations` with the field list Open XDMoD ingests
(`SACCT_FIELDS`), times in UTC as XDMoD wants them, one line per job (its last run; with
`duplicates`, a line for every run, as `sacct --duplicates`). `synapse-sim import-sacct` reads it.
"""

from __future__ import annotations

import math
import re
import zlib
from datetime import UTC, datetime
from typing import Any

from synapse.client.render import goodput_dict, goodput_line, table
from synapse.core.jobs.quantity import QuantityError, format_cpu, format_memory, parse_duration
from synapse.core.model import NEVER_RAN
from synapse.proto import api_pb2
from synapse.rpc import convert

#: The fields, in order, of `sacct --format` as Open XDMoD's shredder ingests them.
SACCT_FIELDS = ("JobID", "JobIDRaw", "Cluster", "Partition", "Account", "Group", "GID", "User", "UID", "Submit",
                "Eligible", "Start", "End", "Elapsed", "ExitCode", "State", "NNodes", "NCPUS", "ReqCPUS", "ReqMem",
                "ReqGRES", "ReqTRES", "AllocTRES", "Timelimit", "NodeList", "JobName")
#: Slurm's state for a run's outcome, when it is not the job's own final state.
_SLURM_STATE = {"Completed": "COMPLETED", "Error": "FAILED", "Signal": "FAILED", "OOMKilled": "OUT_OF_MEMORY",
                "TimeLimit": "TIMEOUT", "NodeLost": "NODE_FAIL", "GpuError": "NODE_FAIL", "Preempted": "PREEMPTED",
                "Cancelled": "CANCELLED", "Requeued": "REQUEUED",
                # Slurm cancels a job whose dependency can never be met (kill_invalid_depend)
                "DependencyNeverSatisfied": "CANCELLED"}
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2})?)?$")


class TimeError(ValueError):
    """A time a user gave that is neither a duration back from now nor a date."""


def parse_time(text: str, field: str, now: float) -> float:
    """Seconds since the epoch from `7d` / `12h` (that long before `now`) or a UTC date
    `2026-11-01[THH:MM[:SS]]`; 0 for ''. TimeError names the field."""
    text = text.strip()
    if not text:
        return 0.0
    if _DATE_RE.match(text):
        try:
            return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()
        except ValueError:
            pass
    else:
        try:
            return now - parse_duration(text)
        except QuantityError:
            pass
    raise TimeError(f"{field}: {text!r} is neither a duration back from now (7d, 12h, 90m) nor a UTC date "
                    "(2026-11-01 or 2026-11-01T08:00)")


def utc(ts: float) -> str:
    """A timestamp as `2026-11-01T08:00:00` (UTC), or Unknown for none (as sacct prints it)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S") if ts else "Unknown"


def slurm_duration(seconds: float) -> str:
    """`[D-]HH:MM:SS`, as sacct prints Elapsed and Timelimit."""
    s = int(round(seconds))
    days, s = divmod(s, 86400)
    text = f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}-{text}" if days else text


# ---- history -------------------------------------------------------------------------------------

def run_dict(r: api_pb2.HistoryRun) -> dict[str, Any]:
    """A run; one whose command never ran (an image not pulled, a mount refused) has no exit code."""
    return {"attempt": r.attempt, "start": r.start, "running": r.running or None, "end": r.end,
            "elapsed_s": round(r.end - r.start, 3), "nodes": list(r.nodes), "tasks": r.tasks, "outcome": r.outcome,
            "reason": r.reason or None, "exit_code": None if r.outcome in NEVER_RAN else r.exit_code,
            "gpu_seconds": round(r.gpu_seconds, 3),
            "cpu_seconds": round(r.cpu_seconds, 3), "checkpoint_at": r.checkpoint_at or None}


def history_dict(j: api_pb2.HistoryJob) -> dict[str, Any]:
    """A finished job; one that never ran (cancelled, or failed on a dependency) has no start, and
    one whose last run never ran its command has no exit code (None)."""
    return {"id": j.job_id, "name": j.name, "user": j.user or None, "queue": j.queue, "priority": j.priority,
            "state": j.state, "reason": j.reason, "detail": j.detail or None,
            "exit_code": j.exit_code if j.start and j.reason not in NEVER_RAN else None,
            "submit": j.submit, "eligible": j.eligible, "start": j.start or None, "end": j.end,
            "elapsed_s": round(j.end - j.start, 3) if j.start else 0.0,
            "wait_s": round((j.start or j.end) - j.eligible, 3), "attempts": j.attempts, "tasks": j.tasks,
            "nodes": list(j.nodes), "resources": {"cpu": format_cpu(j.resources.cpu_millis),
                                                  "memory": format_memory(j.resources.memory_bytes),
                                                  "gpu": j.resources.gpu},
            "gpu_seconds": round(j.gpu_seconds, 3), "cpu_seconds": round(j.cpu_seconds, 3),
            "time_limit_s": j.time_limit_s or None, "cancelled_by": j.cancelled_by or None,
            "preemptions": j.preemptions, "runs": [run_dict(r) for r in j.runs],
            "goodput": goodput_dict(convert.goodput_from_proto(j.goodput))}


def history_table(jobs: list[dict[str, Any]]) -> str:
    return table(["ID", "USER", "QUEUE", "STATE", "REASON", "EXIT", "START (UTC)", "END (UTC)", "ELAPSED", "GPUS",
                  "ATTEMPTS"],
                 [[j["id"], j["user"] or "-", j["queue"], j["state"], j["reason"], _or_dash(j["exit_code"]),
                   utc(j["start"]) if j["start"] else "-", utc(j["end"]), slurm_duration(j["elapsed_s"]),
                   j["resources"]["gpu"] * j["tasks"], j["attempts"]] for j in jobs])


def _or_dash(value: Any) -> Any:
    return "-" if value is None else value


def history_description(j: dict[str, Any]) -> str:
    """A job past its retention, as the history store holds it."""
    lines = [f"Job {j['id']} ({j['name']}), from history: {j['state']} ({j['reason']})",
             f"  user {j['user'] or '-'}, queue {j['queue']}, {j['tasks']} task(s) of {j['resources']['gpu']} GPU, "
             f"{j['resources']['cpu']} cpu, {j['resources']['memory']} memory",
             f"  submitted {utc(j['submit'])}, started {utc(j['start']) if j['start'] else 'never'}, ended "
             f"{utc(j['end'])} (UTC); waited {slurm_duration(j['wait_s'])}, ran {slurm_duration(j['elapsed_s'])}",
             f"  exit code {_or_dash(j['exit_code'])}; {j['attempts']} attempt(s), {j['preemptions']} preemption(s); "
             f"{j['gpu_seconds'] / 3600:.3f} GPU-hours"]
    if j["goodput"]["held_gpu_hours"] > 0:
        lines.append(f"  goodput {goodput_line(j['goodput'])}")
    if j["detail"]:
        lines.append(f"  why: {j['detail']}")
    if j["cancelled_by"]:
        lines.append(f"  cancelled by {j['cancelled_by']}")
    if j["runs"]:
        lines.append("Runs:")
        lines += ["  " + line for line in table(
            ["ATTEMPT", "START (UTC)", "END (UTC)", "OUTCOME", "EXIT", "NODES", "REASON"],
            [[r["attempt"], utc(r["start"]), utc(r["end"]), r["outcome"], _or_dash(r["exit_code"]),
              ",".join(r["nodes"]), r["reason"] or "-"] for r in j["runs"]]).splitlines()]
    return "\n".join(lines)


def _uid(name: str) -> int:
    """A stable numeric id for a user name (Synapse users have none; XDMoD wants a number)."""
    return 100_000 + zlib.crc32(name.encode()) % 900_000 if name else 0


def _exit(code: int) -> str:
    """Slurm's `code:signal`."""
    return f"0:{code - 128}" if 128 < code <= 192 else f"{code}:0"


def sacct_lines(jobs: list[api_pb2.HistoryJob], cluster: str, header: bool = True,
                duplicates: bool = False) -> list[str]:
    """`sacct --parsable2` lines for these jobs (see the module docstring)."""
    out = ["|".join(SACCT_FIELDS)] if header else []
    for j in jobs:
        runs = list(j.runs) if duplicates else list(j.runs[-1:])
        if not runs:
            out.append(_sacct_row(j, None, cluster, final=True))
        for i, run in enumerate(runs):
            out.append(_sacct_row(j, run, cluster, final=i == len(runs) - 1))
    return out


def _sacct_row(j: api_pb2.HistoryJob, run: api_pb2.HistoryRun | None, cluster: str, final: bool) -> str:
    res = j.resources
    tasks = run.tasks if run is not None and run.tasks else j.tasks  # each run at the size it ran (elastic)
    cpus = math.ceil(res.cpu_millis * tasks / 1000)
    mem = f"{math.ceil(res.memory_bytes * tasks / (1 << 20))}M"
    req = f"cpu={cpus},mem={mem},node={len(j.nodes) or 1}" + (f",gres/gpu={res.gpu * tasks}" if res.gpu else "")
    if final:
        state = {"SUCCEEDED": "COMPLETED", "CANCELLED": f"CANCELLED by {_uid(j.cancelled_by)}"}.get(
            j.state, _SLURM_STATE.get(j.reason, "FAILED"))
    else:  # an earlier run: requeued after it ended (sacct --duplicates shows these)
        state = _SLURM_STATE[run.outcome] if run is not None and run.outcome in ("Preempted", "NodeLost", "GpuError") \
            else "REQUEUED"
    nodes = list(dict.fromkeys(run.nodes)) if run is not None else []
    start, end = (run.start, run.end) if run is not None else (0.0, j.end)
    alloc = (f"cpu={cpus},mem={mem},node={len(nodes)}" + (f",gres/gpu={res.gpu * tasks}" if res.gpu else "")) \
        if run is not None else ""
    fields = [j.job_id, j.job_id, cluster, j.queue, j.queue, j.user, str(_uid(j.user)), j.user, str(_uid(j.user)),
              utc(j.submit), utc(j.eligible), utc(start) if run is not None else "None", utc(end),
              slurm_duration(end - start) if run is not None else "00:00:00",
              _exit(run.exit_code if run is not None else j.exit_code), state, str(len(nodes) or len(j.nodes) or 1),
              str(cpus), str(cpus), mem, f"gpu:{res.gpu * tasks}" if res.gpu else "", req, alloc,
              slurm_duration(j.time_limit_s) if j.time_limit_s else "UNLIMITED", ",".join(nodes) or "None",
              j.name]
    return "|".join(f.replace("|", "/") for f in fields)


# ---- usage ---------------------------------------------------------------------------------------

def usage_dicts(reply: api_pb2.GetUsageReply, goodput: bool = False) -> list[dict[str, Any]]:
    """The usage rows; with `goodput`, each with where its GPU time went (render.goodput_dict)."""
    return [{"key": r.key, "gpu_hours": round(r.gpu_hours, 3), "cpu_hours": round(r.cpu_hours, 3), "jobs": r.jobs,
             **({"goodput": goodput_dict(convert.goodput_from_proto(r.goodput))} if goodput else {})}
            for r in reply.rows]


#: The GPU-hours of a goodput dict (render.goodput_dict), in the order the goodput view shows them.
GOODPUT_HOURS = ("held_gpu_hours", "kept_gpu_hours", "lost_failures_gpu_hours", "lost_restarts_gpu_hours",
                 "lost_other_gpu_hours", "requeue_wait_gpu_hours")


def goodput_table(rows: list[dict[str, Any]], by: str) -> str:
    """`synctl usage --goodput`: per user, queue or day, of the jobs that ended, the GPU-hours held,
    kept and lost by cause, the requeue wait, and the goodput; then the total."""
    total: dict[str, Any] = {k: sum(r["goodput"][k] for r in rows) for k in GOODPUT_HOURS}
    total["goodput"] = total["kept_gpu_hours"] / total["held_gpu_hours"] if total["held_gpu_hours"] else None

    def line(key: str, g: dict[str, Any]) -> list[str]:
        return [key, *(f"{g[k]:.3f}" for k in GOODPUT_HOURS),
                "-" if g["goodput"] is None else f"{g['goodput'] * 100:.1f}%"]

    return table([by.upper(), "HELD", "KEPT", "LOST:FAILURES", "LOST:RESTARTS", "LOST:OTHER", "REQUEUE-WAIT",
                  "GOODPUT"], [line(r["key"] or "-", r["goodput"]) for r in rows]
                 + ([line("TOTAL", total)] if rows else [])) + "\n(GPU-hours of the jobs that ended in the period)"


def cluster_dict(u: api_pb2.ClusterUsage) -> dict[str, Any]:
    """One day's (or the period's) cluster utilisation, hours rounded to the thousandth."""
    out: dict[str, Any] = {"day": u.day} if u.day else {}
    for kind in ("gpu", "cpu"):
        hours = {state: getattr(u, f"{state}_{kind}_hours") for state in ("allocated", "idle", "down")}
        total = sum(hours.values())
        out[kind] = {**{f"{state}_hours": round(h, 3) for state, h in hours.items()},
                     "allocated_percent": round(100 * hours["allocated"] / total, 1) if total else 0.0}
    return out


def usage_report(reply: api_pb2.GetUsageReply, goodput: bool = False) -> dict[str, Any]:
    """What `synctl usage -o json|yaml` prints: the usage rows (with `goodput`, their goodput) and
    the cluster's utilisation."""
    return {"usage": usage_dicts(reply, goodput), "cluster": {"days": [cluster_dict(d) for d in reply.cluster_days],
                                                              "total": cluster_dict(reply.cluster_total)}}


def usage_table(rows: list[dict[str, Any]], by: str) -> str:
    total = ["TOTAL", f"{sum(r['gpu_hours'] for r in rows):.3f}", f"{sum(r['cpu_hours'] for r in rows):.3f}",
             sum(r["jobs"] for r in rows)]
    return table([by.upper(), "GPU-HOURS", "CPU-HOURS", "JOBS"],
                 [[r["key"] or "-", f"{r['gpu_hours']:.3f}", f"{r['cpu_hours']:.3f}", r["jobs"]] for r in rows]
                 + ([total] if rows else []))


def _utilization_row(label: str, u: dict[str, Any]) -> list[str]:
    gpu, cpu = u["gpu"], u["cpu"]
    return [label, f"{gpu['allocated_hours']:.3f}", f"{gpu['idle_hours']:.3f}", f"{gpu['down_hours']:.3f}",
            f"{gpu['allocated_percent']:.1f}%", f"{cpu['allocated_percent']:.1f}%"]


def usage_report_table(report: dict[str, Any], by: str, goodput: bool = False) -> str:
    """The usage table (with `goodput`, the goodput view), then the cluster's GPU utilisation per UTC
    day and over the period."""
    if goodput:
        return goodput_table(report["usage"], by)
    cluster = report["cluster"]
    if not cluster["days"]:
        return usage_table(report["usage"], by) + "\n\nCluster utilisation: no samples in the period"
    return (usage_table(report["usage"], by) + "\n\nCluster utilisation (GPU-hours, sampled by the leader)\n"
            + table(["DAY (UTC)", "ALLOCATED", "IDLE", "DOWN", "GPU ALLOC", "CPU ALLOC"],
                    [_utilization_row(d["day"], d) for d in cluster["days"]]
                    + [_utilization_row("TOTAL", cluster["total"])]))
