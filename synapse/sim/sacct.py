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

A row that cannot be read (a field count unlike the header's, an unparsable time, size, state or
time limit, times out of order, a job id seen before) is bad: `parse` raises BadRows naming every
bad line and its reason, or, given a list to put them in, leaves them out and imports the rest.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from synapse.sim.trace import Trace, TraceError, TraceJob

REQUIRED = ("JobID", "Submit", "Start", "End", "State", "NNodes", "Timelimit")
SUCCEEDED = {"COMPLETED"}
FAILED = {"FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REQUEUED",
          "CANCELLED"}
NOT_ENDED = {"PENDING", "RUNNING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "REVOKED", "SIGNALING",
             "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "CONFIGURING", "COMPLETING"}
_GPU_RE = re.compile(r"(?:^|,)gres/gpu(?::[^=,]+)?=([^,]*)")
_MISSING = {"", "Unknown", "None", "N/A"}


@dataclass(frozen=True, slots=True)
class BadRow:
    """A row of the export that cannot be read: its line in the file and why."""

    line: int
    reason: str


class BadRows(TraceError):
    """Every bad row of an export that was imported without skipping them: nothing was imported."""

    def __init__(self, where: str, rows: list[BadRow]):
        self.rows = rows  #: the bad rows, in the file's order
        listing = "".join(f"\n  {where}:{r.line}: {r.reason}" for r in rows)
        super().__init__(f"{where}: {len(rows)} bad row(s), nothing imported (--skip-bad imports the others):"
                         f"{listing}")


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
            count = found.group(1)
            if not count.isdigit():
                raise TraceError(f"{field} {found.group(0).lstrip(',')[:30]!r} is not a whole number of GPUs")
            return int(count)
    return 0


def parse(text: str, where: str = "sacct", bad: list[BadRow] | None = None) -> tuple[Trace, dict[str, int]]:
    """The trace and how many rows were skipped for each reason; bad rows go to `bad`, else raise BadRows."""
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
    bad_rows: list[BadRow] = []
    first_seen: dict[str, int] = {}  # job id -> the line it was first imported from
    for number, line in lines[1:]:
        values = line.split("|")
        if len(values) == len(header) + 1 and values[-1] == "":  # --parsable (not 2) ends rows with '|'
            values.pop()
        if len(values) != len(header):
            bad_rows.append(BadRow(number, f"{len(values)} field(s), the header has {len(header)}"))
            continue
        try:
            parsed = _row(dict(zip(header, values, strict=True)), skipped)
        except TraceError as exc:
            bad_rows.append(BadRow(number, str(exc)))
            continue
        if parsed is None:
            continue
        job_id = parsed[1]["id"]
        if job_id in first_seen:
            bad_rows.append(BadRow(number, f"job {job_id} appears twice (first on line {first_seen[job_id]})"))
            continue
        first_seen[job_id] = number
        rows.append(parsed)
    if bad_rows and bad is None:
        raise BadRows(where, bad_rows)
    if bad is not None:
        bad.extend(bad_rows)
    if not rows:
        left_out = describe_skipped(skipped, bad_rows)
        raise TraceError(f"{where}: no job that ran on GPUs and ended (skipped: {left_out})")
    origin = min(submit for submit, _ in rows)
    jobs = [TraceJob(**{**fields, "submit": round(submit - origin, 1)}) for submit, fields in rows]
    jobs.sort(key=lambda j: j.submit)
    first = datetime.fromtimestamp(origin).isoformat(timespec="seconds")
    return Trace(jobs, None, (f"imported: {Path(where).name}, submissions from {first}; skipped: "
                              f"{describe_skipped(skipped, bad_rows)}",)), skipped


def describe_skipped(skipped: dict[str, int], bad_rows: list[BadRow]) -> str:
    """What was left out, as `2 job steps, 1 cpu only, 3 bad rows`."""
    counts = [*(f"{v} {k}" for k, v in skipped.items()), *([f"{len(bad_rows)} bad rows"] if bad_rows else [])]
    return ", ".join(counts) or "none"


def _row(row: dict[str, str], skipped: dict[str, int]) -> tuple[float, dict[str, Any]] | None:
    """(submit time, the trace job's fields), or None for a row the trace leaves out."""
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


def read(path: str | Path, bad: list[BadRow] | None = None) -> tuple[Trace, dict[str, int]]:
    """The trace of an export file (see `parse`)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read: {exc}") from None
    return parse(text, str(path), bad)
