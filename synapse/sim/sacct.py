"""A trace from a Slurm accounting export, so a cluster's own history can be replayed.

    sacct --allusers --starttime 2024-05-01 --endtime 2024-06-01 --parsable2 \\
          --format JobID,JobName,Submit,Start,End,State,AllocTRES,ReqTRES,NNodes,Timelimit,User > sacct.txt

Fields are `|`-separated with a header line; `JobID`, `Submit`, `Start`, `End`, `State`, `NNodes`,
`Timelimit` and one of `AllocTRES` or `ReqTRES` are required (`User` and `JobName` are kept when
present: with the size, they are what the leader's run-time predictor knows a resubmitted job by).

* Job steps (`123.batch`, `123.extern`, `123.0`) are skipped: the allocation's own row is the job.
* Array tasks (`123_4`) and heterogeneous components (`123+0`) are jobs of their own; a pending
  array range (`123_[5-9]`) never ran and is skipped.
* States: COMPLETED succeeds; FAILED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED, BOOT_FAIL,
  DEADLINE, REQUEUED and CANCELLED after starting fail after the time they ran. Jobs that never
  started (PENDING, CANCELLED before a start) or have not ended (RUNNING, SUSPENDED...) are
  skipped: their run time is unknown.
* GPUs: `gres/gpu=N` (or `gres/gpu:TYPE=N`) of AllocTRES, else of ReqTRES; CPU-only jobs are
  skipped. GPUs that do not divide evenly over the nodes are rounded up to a whole number a node.
* Timelimit: minutes, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM` or `D-HH:MM:SS`; UNLIMITED or Partition_Limit mean none.

A row that cannot be read raises TraceError naming its line.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from pathlib import Path

from synapse.sim.trace import Trace, TraceError, TraceJob

REQUIRED = ("JobID", "Submit", "Start", "End", "State", "NNodes", "Timelimit")
SUCCEEDED = {"COMPLETED"}
FAILED = {"FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REQUEUED",
          "CANCELLED"}
NOT_ENDED = {"PENDING", "RUNNING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "REVOKED", "SIGNALING",
             "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "CONFIGURING", "COMPLETING"}
_GPU_RE = re.compile(r"(?:^|,)gres/gpu(?::[^=,]+)?=(\d+)")
_MISSING = {"", "Unknown", "None", "N/A"}


def _time(raw: str, field: str) -> float | None:
    if raw in _MISSING:
        return None
    try:
        return datetime.fromisoformat(raw).timestamp()
    except ValueError:
        raise TraceError(f"{field} {raw[:30]!r} is not a time like 2024-05-01T10:00:00") from None


def parse_timelimit(raw: str) -> float:
    """Seconds of a Slurm time limit; 0 for none."""
    raw = raw.strip()
    if raw in _MISSING or raw in ("UNLIMITED", "Partition_Limit", "INVALID"):
        return 0.0
    days, _, clock = raw.rpartition("-")
    try:
        parts = [int(p) for p in clock.split(":")]
        day_count = int(days) if days else 0
    except ValueError:
        raise TraceError(f"Timelimit {raw[:30]!r} is not a Slurm time (minutes, MM:SS, [D-]HH:MM:SS, D-HH)") from None
    if len(parts) > 3:
        raise TraceError(f"Timelimit {raw[:30]!r} is not a Slurm time (minutes, MM:SS, [D-]HH:MM:SS, D-HH)")
    if days:  # days-hours, days-hours:minutes, days-hours:minutes:seconds
        hours, minutes, seconds = (parts + [0, 0])[:3]
    elif len(parts) == 3:  # hours:minutes:seconds
        hours, minutes, seconds = parts
    else:  # minutes, minutes:seconds
        hours, minutes, seconds = 0, parts[0], (parts + [0])[1]
    seconds = hours * 3600 + minutes * 60 + seconds
    return float(day_count * 86400 + seconds)


def _gpus(row: dict[str, str]) -> int:
    for field in ("AllocTRES", "ReqTRES"):
        found = _GPU_RE.search(row.get(field, ""))
        if found:
            return int(found.group(1))
    return 0


def parse(text: str, where: str = "sacct") -> tuple[Trace, dict[str, int]]:
    """The trace, and how many rows were skipped for each reason."""
    lines = [(n, line.rstrip("\r\n")) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise TraceError(f"{where}: empty (expected sacct --parsable2 output with a header line)")
    header_line, header_text = lines[0]
    header = header_text.split("|")
    missing = [f for f in REQUIRED if f not in header]
    if not ("AllocTRES" in header or "ReqTRES" in header):
        missing.append("AllocTRES or ReqTRES")
    if missing:
        raise TraceError(f"{where}:{header_line}: missing field(s) {', '.join(missing)} (export with "
                         f"sacct --parsable2 --format {','.join(REQUIRED)},AllocTRES,User,JobName)")
    skipped = {"job steps": 0, "never started": 0, "not ended": 0, "cpu only": 0}
    rows = []
    for number, line in lines[1:]:
        values = line.split("|")
        if len(values) == len(header) + 1 and values[-1] == "":  # --parsable (not 2) ends rows with '|'
            values.pop()
        if len(values) != len(header):
            raise TraceError(f"{where}:{number}: {len(values)} field(s), the header has {len(header)}")
        row = dict(zip(header, values, strict=True))
        try:
            parsed = _row(row, skipped)
        except TraceError as exc:
            raise TraceError(f"{where}:{number}: {exc}") from None
        if parsed is not None:
            rows.append(parsed)
    if not rows:
        raise TraceError(f"{where}: no job that ran on GPUs and ended (skipped: {_describe(skipped)})")
    origin = min(submit for submit, _ in rows)
    jobs = [TraceJob(**{**fields, "submit": round(submit - origin, 1)}) for submit, fields in rows]
    jobs.sort(key=lambda j: j.submit)
    seen: set[str] = set()
    for job in jobs:
        if job.id in seen:
            raise TraceError(f"{where}: job {job.id} appears twice")
        seen.add(job.id)
    first = datetime.fromtimestamp(origin).isoformat(timespec="seconds")
    return Trace(jobs, None, (f"imported: {Path(where).name}, submissions from {first}; skipped: "
                              f"{_describe(skipped)}",)), skipped


def _describe(skipped: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in skipped.items()) or "none"


def _row(row: dict[str, str], skipped: dict[str, int]) -> tuple[float, dict] | None:
    job_id = row["JobID"].strip()
    if not job_id:
        raise TraceError("JobID is empty")
    if "." in job_id:
        skipped["job steps"] += 1
        return None
    state = row["State"].split()[0] if row["State"].strip() else ""  # "CANCELLED by 1234"
    submit, start, end = _time(row["Submit"], "Submit"), _time(row["Start"], "Start"), _time(row["End"], "End")
    if "[" in job_id or start is None or state == "PENDING":
        skipped["never started"] += 1
        return None
    if state in NOT_ENDED or end is None:
        skipped["not ended"] += 1
        return None
    if state not in SUCCEEDED | FAILED:
        raise TraceError(f"State {row['State'][:30]!r} is not a Slurm job state")
    if submit is None:
        raise TraceError("Submit is missing")
    if end < start or start < submit:
        raise TraceError(f"times out of order: Submit {row['Submit']}, Start {row['Start']}, End {row['End']}")
    gpus = _gpus(row)
    if gpus == 0:
        skipped["cpu only"] += 1
        return None
    try:
        nodes = int(row["NNodes"])
    except ValueError:
        raise TraceError(f"NNodes {row['NNodes'][:30]!r} is not a whole number") from None
    if nodes < 1:
        raise TraceError(f"NNodes must be at least 1, not {nodes}")
    gpus = math.ceil(gpus / nodes) * nodes
    return submit, {"id": job_id, "gpus": gpus, "nodes": nodes, "duration": max(1.0, end - start),
                    "time_limit": parse_timelimit(row["Timelimit"]),
                    "exit_code": 0 if state in SUCCEEDED else 1, "user": row.get("User", "").strip(),
                    "name": row.get("JobName", "").strip()}


def read(path: str | Path) -> tuple[Trace, dict[str, int]]:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read: {exc}") from None
    return parse(text, str(path))
