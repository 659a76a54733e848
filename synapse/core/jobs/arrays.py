"""Job arrays: Slurm's index syntax, the array's one record, and its elements' ids. Pure.

An array is one SubmitJob entry holding the spec, the index set and the throttle (`0-99%8`: indices
0..99, at most 8 elements with a gang at once). Its elements are jobs `ID_INDEX`, each a gang with
its own attempts; but an element is made a job (materialised) only when it may run: the array
keeps one never-placed element in the queue at a time (the next index), and apply materialises
the one after when that one is placed or ends. So 10,000 pending elements are one record, a
few ranges and one queued job, not 10,000 jobs (Slurm splits its one record the same way).

Index specs: `0-99` (a range), `0-15:4` (a step: 0,4,8,12), `1,3,7` (a list), combined with
commas, and `%N` at the end for the throttle. Indices are kept sorted and unique, as ranges.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from synapse.core.model import JobSpec, JobStatus

#: The largest array any cluster accepts (a cluster file's `max_array_size` may only lower it
#: below this; its default is DEFAULT_MAX_ARRAY_SIZE).
MAX_ARRAY_SIZE = 1_000_000
DEFAULT_MAX_ARRAY_SIZE = 10_000
#: Indices are below this (they become part of job ids).
MAX_INDEX = 10_000_000
#: The longest index spec accepted.
MAX_SPEC_CHARS = 10_000
#: ASCII digits only (`\d` takes other scripts' digits too, which int() may refuse)
_PART_RE = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")
_NUMBER_RE = re.compile(r"[0-9]+")

Ranges = tuple[tuple[int, int, int], ...]  #: (first, last, step), ascending and disjoint


class ArraySpecError(ValueError):
    """An index spec that does not parse, is empty, or is too large."""


def parse_array(text: str, limit: int = MAX_ARRAY_SIZE) -> tuple[Ranges, int]:
    """(ranges, throttle) of an index spec such as `0-99:2%8`; throttle 0 means none."""
    text = str(text).strip()
    if not text:
        raise ArraySpecError("is empty")
    if len(text) > MAX_SPEC_CHARS:
        raise ArraySpecError(f"is longer than {MAX_SPEC_CHARS} characters")
    body, pct, throttle_text = text.partition("%")
    throttle = 0
    if pct:
        if not _NUMBER_RE.fullmatch(throttle_text) or int(throttle_text) < 1:
            raise ArraySpecError(f"throttle after % must be a whole number of at least 1, not {throttle_text!r}")
        throttle = int(throttle_text)
    indices: set[int] = set()
    for part in body.replace(" ", "").split(","):
        m = _PART_RE.fullmatch(part)
        if not m:
            raise ArraySpecError(f"cannot read {part!r}: use ranges (0-99), steps (0-15:4), lists (1,3,7) "
                                 "and %N for the most running at once")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        step = int(m.group(3)) if m.group(3) is not None else 1
        if last < first:
            raise ArraySpecError(f"range {part!r} ends before it starts")
        if step < 1:
            raise ArraySpecError(f"step in {part!r} must be at least 1")
        if last >= MAX_INDEX:
            raise ArraySpecError(f"indices must be below {MAX_INDEX}")
        if len(indices) + (last - first) // step + 1 > limit:
            raise ArraySpecError(f"has more than {limit} elements (the cluster's max_array_size)")
        indices.update(range(first, last + 1, step))
    return compress(sorted(indices)), throttle


def compress(indices: list[int]) -> Ranges:
    """Sorted unique indices as ranges of equal steps (greedy)."""
    out: list[tuple[int, int, int]] = []
    i = 0
    while i < len(indices):
        if i + 1 < len(indices):
            step = indices[i + 1] - indices[i]
            j = i + 1
            while j + 1 < len(indices) and indices[j + 1] - indices[j] == step:
                j += 1
            if j > i + 1 or step == 1:
                out.append((indices[i], indices[j], step))
                i = j + 1
                continue
        out.append((indices[i], indices[i], 1))
        i += 1
    return tuple(out)


def format_ranges(ranges: Ranges) -> str:
    """Ranges as an index spec (`0-99:2,101`), without the throttle."""
    parts = []
    for first, last, step in ranges:
        if first == last:
            parts.append(str(first))
        else:
            parts.append(f"{first}-{last}" + (f":{step}" if step != 1 else ""))
    return ",".join(parts)


def format_spec(ranges: Ranges, throttle: int) -> str:
    """The canonical spec a job file would give: ranges, then `%N`."""
    return format_ranges(ranges) + (f"%{throttle}" if throttle else "")


def size_of(ranges: Ranges) -> int:
    return sum((last - first) // step + 1 for first, last, step in ranges)


def element_id(array_id: str, index: int) -> str:
    return f"{array_id}_{index}"


def split_element_id(job_id: str) -> tuple[str, int] | None:
    """(array id, index) of an element id `ID_INDEX`, or None if it does not look like one (the
    index as `element_id` writes it: ASCII digits, no leading zero)."""
    head, sep, tail = job_id.rpartition("_")
    if not sep or not head or len(tail) > 8 or not _NUMBER_RE.fullmatch(tail) or tail != str(int(tail)):
        return None
    return head, int(tail)


@dataclass(slots=True)
class JobArray:
    """An array's one record in the replicated state. Mutated only by apply (synapse.core.state.fsm)."""

    id: str
    spec: JobSpec  #: every element's spec; `spec.array` is the canonical index spec
    request_id: str
    user: str
    submitted_at: float
    seq: int  #: the submission order of the array itself
    throttle: int  #: the most elements with a gang at once (0: no limit); SetArrayThrottle changes it
    next: int = 0  #: position of the next index that is not yet a job
    rep: str = ""  #: the materialised element that was never placed yet, "" if none
    #: indices cancelled before becoming jobs (kept once `next` passes them: they read CANCELLED)
    skipped: set[int] = field(default_factory=set)
    cancelled: bool = False  #: `cancel ID`: no more elements become jobs
    #: a dependency can never be met: no more elements become jobs, and those that never did count as FAILED
    never_satisfied: bool = False
    succeeded: int = 0  #: elements ended SUCCEEDED (and so on); counted by apply when an element ends
    failed: int = 0
    cancelled_count: int = 0
    finished_at: float = 0.0  #: when its last element ended
    #: when its first element started (every task of it); set by apply from command-set version 6
    #: (model.NEVER_RAN_VERSION: an older replica keeps none), 0 until then
    started_at: float = 0.0
    #: derived from spec.array (not in snapshots): the ranges, and the count before each range
    ranges: Ranges = ()
    count: int = 0  #: derived: how many indices
    _starts: list[int] = field(default_factory=list)  #: derived: the position of each range's first index
    _firsts: list[int] = field(default_factory=list)  #: derived: each range's first index

    def __post_init__(self) -> None:
        if not self.ranges:
            self.ranges = parse_array(self.spec.array)[0]
        self._starts, self._firsts, self.count = [], [r[0] for r in self.ranges], 0
        for first, last, step in self.ranges:
            self._starts.append(self.count)
            self.count += (last - first) // step + 1

    def index_at(self, position: int) -> int:
        """The index at a position of the sorted index set."""
        i = bisect.bisect_right(self._starts, position) - 1
        first, _last, step = self.ranges[i]
        return first + (position - self._starts[i]) * step

    def position_of(self, index: int) -> int:
        """The position of an index in the sorted set, or -1 if it is not one of the array's."""
        i = bisect.bisect_right(self._firsts, index) - 1
        if i < 0:
            return -1
        first, last, step = self.ranges[i]
        if index > last or (index - first) % step:
            return -1
        return self._starts[i] + (index - first) // step

    def waiting_ranges(self) -> Ranges:
        """The never-placed elements as ranges: the queued one (`rep`) and those not yet jobs."""
        out: list[tuple[int, int, int]] = []
        if self.rep:
            rep = split_element_id(self.rep)
            if rep is not None:
                out.append((rep[1], rep[1], 1))
        if self.skipped_ahead():  # rare (cancel ID_7 of an element not yet a job): spell the rest out
            rest = [self.index_at(p) for p in range(self.next, self.count) if self.index_at(p) not in self.skipped]
            return compress(sorted({*(r[0] for r in out), *rest}))
        if self.next < self.count:
            i = bisect.bisect_right(self._starts, self.next) - 1
            first, last, step = self.ranges[i]
            tail = [(self.index_at(self.next), last, step), *self.ranges[i + 1:]]
            if out and tail[0][0] - tail[0][2] == out[0][0]:
                out = [(out[0][0], *tail[0][1:])]
            else:
                out.append(tail[0])
            out += tail[1:]
        return tuple(out)

    def remaining(self) -> int:
        """Elements not yet jobs and not cancelled."""
        return self.count - self.next - self.skipped_ahead()

    def skipped_ahead(self) -> int:
        """Cancelled indices that `next` has not passed yet."""
        return sum(1 for index in self.skipped if self.position_of(index) >= self.next) if self.skipped else 0

    @property
    def ended(self) -> int:
        return self.succeeded + self.failed + self.cancelled_count

    @property
    def done(self) -> bool:
        return self.ended >= self.count

    def status(self, has_gang: bool) -> JobStatus:
        """The array's status as one job's: ended once every element ended, SUCCEEDED only if all did."""
        if self.done:
            if self.succeeded == self.count:
                return JobStatus.SUCCEEDED
            return JobStatus.FAILED if self.failed else JobStatus.CANCELLED
        return JobStatus.RUNNING if has_gang else JobStatus.PENDING


def folded_id(array_id: str, ranges: Ranges) -> str:
    """Elements folded into one line's id, as squeue shows them: `ID_[5-99]`."""
    return f"{array_id}_[{format_ranges(ranges)}]"
