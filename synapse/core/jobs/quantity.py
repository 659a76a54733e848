"""Parsing of resource quantities and durations as users write them in job files and flags, and
their short forms for people (synctl's tables, the dashboard).

Internally cpu is an integer number of millicores, memory an integer number of bytes and time a
float number of seconds: integers keep the replicated arithmetic exact on every replica.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

_MEMORY_SUFFIXES = {
    "": 1,
    "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}
_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKMGTP]i?)?[bB]?\s*$")
_CPU_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(m?)\s*$")
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class QuantityError(ValueError):
    """A quantity string that cannot be understood."""


def parse_memory(value: int | float | str) -> int:
    """Bytes from `64Gi`, `512M`, `1.5Gi`, `1024` or a number of bytes."""
    if isinstance(value, bool):
        raise QuantityError(f"memory must be a size such as 64Gi, not {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise QuantityError(f"memory must not be negative: {value!r}")
        return int(value)
    match = _MEMORY_RE.match(str(value))
    if not match:
        raise QuantityError(f"memory must be a size such as 64Gi, 512M or 1024, not {value!r}")
    number, suffix = match.groups()
    return int(float(number) * _MEMORY_SUFFIXES[suffix or ""])


def parse_cpu(value: int | float | str) -> int:
    """Millicores from `16`, `0.5` or `500m`."""
    if isinstance(value, bool):
        raise QuantityError(f"cpu must be a number of cores such as 4 or 500m, not {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise QuantityError(f"cpu must not be negative: {value!r}")
        return int(round(value * 1000))
    match = _CPU_RE.match(str(value))
    if not match:
        raise QuantityError(f"cpu must be a number of cores such as 4, 0.5 or 500m, not {value!r}")
    number, milli = match.groups()
    return int(round(float(number))) if milli else int(round(float(number) * 1000))


def parse_duration(value: int | float | str) -> float:
    """Seconds from `2h`, `90m`, `1h30m`, `45s`, `1d` or a plain number of seconds."""
    if isinstance(value, bool):
        raise QuantityError(f"duration must be such as 2h or 90m, not {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise QuantityError(f"duration must not be negative: {value!r}")
        return float(value)
    text = str(value).strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    parts = _DURATION_RE.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text.replace(" ", ""):
        raise QuantityError(f"duration must be such as 2h, 90m, 1h30m or 45s, not {value!r}")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)


def format_memory(num_bytes: int) -> str:
    """The shortest exact binary form (`64Gi`), else bytes."""
    for suffix in ("Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _MEMORY_SUFFIXES[suffix]
        if num_bytes and num_bytes % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    return str(num_bytes)


def format_cpu(millicores: int) -> str:
    """`16` for whole cores, else `500m`."""
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores}m"


def format_duration(seconds: float) -> str:
    """A duration as people read it: 45s, 12m, 3h05m, 2d04h."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_moment(at: float, now: float) -> str:
    """A moment in prose the leader writes (wait reasons, which the log keeps and any replica shows
    later): `14:02 UTC`, with its date when not on `now`'s UTC day, `unknown` for none (inf). Never
    an epoch, and never relative: a duration would be stale by the time it is read."""
    if not math.isfinite(at) or at <= 0:
        return "unknown"
    moment = datetime.fromtimestamp(at, UTC)
    clock = moment.strftime("%H:%M UTC")
    return clock if moment.date() == datetime.fromtimestamp(now, UTC).date() else f"{moment:%Y-%m-%d} {clock}"


def format_wait(pending: bool, submitted_at: float, started_at: float, now: float) -> str:
    """How long a job has waited: so far while pending, until its start once started ('-' before)."""
    if pending:
        return format_duration(now - submitted_at)
    return format_duration(started_at - submitted_at) if started_at else "-"


def format_start(at: float | None, why: str, now: float) -> str:
    """A pending job's estimated start for people, as of `now`: "now", "in ~25 min" (within two
    hours), "at 14:02 UTC" (later), or "unknown: <why>" for none."""
    if at is None or not math.isfinite(at) or at <= 0:
        return f"unknown: {why or 'no estimate'}"
    ahead = at - now
    if ahead < 60:
        return "now"
    if ahead < 2 * 3600:
        return f"in ~{round(ahead / 60)} min"
    return f"at {format_moment(at, now)}"


def format_pull(phase: str, done_bytes: int, total_bytes: int) -> str:
    """A node's image pull for people: "45% of 1.2Gi" while layers download, else its phase."""
    if phase == "layers" and total_bytes > 0:
        return f"{100 * done_bytes // total_bytes}% of {format_memory(total_bytes)}"
    return phase
