"""The trace format: one CSV row per job, and the cluster shape it was made for.

    # synapse-sim trace v1
    # cluster: nodes=64 gpus_per_node=8 racks=8
    # generated: mix=gang-heavy load=0.9 days=7 seed=1 ...
    id,submit_s,gpus,nodes,duration_s,time_limit_s,exit_code,queue,user,array,after
    j000001,12.5,16,2,3600,7200,0,,,,
    sweep,20,8,1,600,0,0,,,0-99%8,
    merge,21,8,1,300,0,0,,,,ok:sweep

Columns (`id`, `submit_s`, `gpus` and `duration_s` are required; the others may be left out):

* `id` — unique job name.
* `submit_s` — submission time, seconds from the start of the trace (rows may come in any order).
* `gpus` — GPUs of the whole gang, at least 1.
* `nodes` — tasks of the gang, one per node at most; each task gets `gpus / nodes` GPUs (it must
  divide). Empty or 0: the fewest tasks that fit the cluster's nodes.
* `duration_s` — how long the job runs once started, alone in one rack. A gang placed across racks
  runs longer (the replay's spread penalty); a job reaching its time limit is ended there.
* `time_limit_s` — what the user asked for (Slurm's `--time`); 0 or empty: none. Backfill relies
  on it; the replay ends a job when it is reached, as Slurm and Synapse's leader do.
* `exit_code` — 0 for a job that succeeds, anything else for one that fails after `duration_s`.
* `queue`, `user` — the queue it is submitted to (empty: the default queue), and who submitted it.
* `name` — the job's name (Slurm's `JobName`): with `user` and `gpus`, what a run-time predictor
  recognises a resubmitted job by. Written only when some job has one.
* `array` — an array of gangs (synapse.core.jobs.arrays: `0-99%8`): the row stands for one element per
  index, each with the row's GPUs, nodes, duration and exit code; element `i` is job `ID_i`.
* `after` — dependencies, as `synctl submit --after` takes them: `ok:ID,any:ID2,notok:ID3` (quoted
  in the CSV when it has commas). Each must name a row submitted earlier (or an element `ID_i`
  of an earlier array row).

Comment lines start with `#`; `# cluster:` gives the shape the trace was made for, which `run`
uses unless told otherwise.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

from synapse.core.jobs.arrays import ArraySpecError, parse_array, split_element_id
from synapse.core.jobs.dependencies import parse_after_flag
from synapse.core.model import Resources

VERSION_LINE = "# synapse-sim trace v1"
COLUMNS = ("id", "submit_s", "gpus", "nodes", "duration_s", "time_limit_s", "exit_code", "queue", "user", "array",
           "after", "name")
REQUIRED = ("id", "submit_s", "gpus", "duration_s")
#: Columns named otherwise than the TraceJob field they hold.
_FIELDS = {"submit_s": "submit", "duration_s": "duration", "time_limit_s": "time_limit"}
#: What each GPU brings with it on a node: 8 cores and 64 GiB (a typical 8-GPU node: 64, 512 GiB).
CPU_PER_GPU = 8_000
MEMORY_PER_GPU = 64 << 30


class TraceError(ValueError):
    """A trace (or cluster shape) that cannot be replayed; the message names the line and why."""


@dataclass(frozen=True, slots=True)
class ClusterShape:
    """Identical GPU nodes spread evenly over racks."""

    nodes: int = 64
    gpus_per_node: int = 8
    racks: int = 8

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1 or self.racks < 1:
            raise TraceError("cluster: nodes, gpus per node and racks must each be at least 1")
        if self.racks > self.nodes:
            raise TraceError(f"cluster: {self.racks} racks for {self.nodes} nodes; at most one rack per node")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def rack_of(self, i: int) -> int:
        """The rack of node number `i` (racks get consecutive nodes, as evenly as they divide)."""
        return i * self.racks // self.nodes

    @property
    def rack_gpus(self) -> int:
        """GPUs of the smallest rack: a gang this size or smaller fits in any rack."""
        return min(sum(1 for i in range(self.nodes) if self.rack_of(i) == r) for r in range(self.racks)) \
            * self.gpus_per_node

    def node_capacity(self) -> Resources:
        g = self.gpus_per_node
        return Resources(CPU_PER_GPU * g, MEMORY_PER_GPU * g, g)

    def describe(self) -> str:
        return f"nodes={self.nodes} gpus_per_node={self.gpus_per_node} racks={self.racks}"

    @classmethod
    def parse(cls, text: str) -> ClusterShape:
        """From `nodes=64 gpus_per_node=8 racks=8` (a trace's `# cluster:` line)."""
        values = {}
        for part in text.split():
            key, _, value = part.partition("=")
            if key not in ("nodes", "gpus_per_node", "racks") or not value.isdigit():
                raise TraceError(f"cluster: cannot read {part!r} (expected nodes=N gpus_per_node=N racks=N)")
            values[key] = int(value)
        return cls(**values)


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    submit: float  #: seconds from the start of the trace
    gpus: int  #: of the whole gang
    nodes: int  #: tasks of the gang; 0: derived from the cluster's node size
    duration: float  #: seconds of running, alone in one rack
    time_limit: float = 0.0  #: seconds; 0: none
    exit_code: int = 0
    queue: str = ""
    user: str = ""
    array: str = ""  #: an index spec with its throttle, e.g. `0-99%8`; "" for one job
    after: str = ""  #: dependencies, `ok:ID,any:ID2`; "" for none
    name: str = ""  #: the job's name (a recurring job's template); "" for none

    @property
    def job_name(self) -> str:
        """The name it is submitted under: its `name`, else its id (a job of its own kind)."""
        return self.name or self.id

    @property
    def dependencies(self) -> tuple[tuple[str, str], ...]:
        return parse_after_flag(self.after) if self.after else ()

    def tasks_on(self, shape: ClusterShape) -> int:
        """Tasks of the gang on this cluster: `nodes`, or the fewest that fit a node each."""
        if self.nodes:
            return self.nodes
        return next(t for t in range(1, self.gpus + 1) if self.gpus % t == 0 and self.gpus // t <= shape.gpus_per_node)

    def problem_on(self, shape: ClusterShape) -> str:
        """Why this job can never run on the cluster, or ''."""
        if self.gpus > shape.gpus:
            return f"asks for {self.gpus} GPUs; the cluster has {shape.gpus}"
        tasks = self.tasks_on(shape)
        if self.gpus % tasks:
            return f"{self.gpus} GPUs do not divide over {tasks} nodes"
        if self.gpus // tasks > shape.gpus_per_node:
            return f"asks for {self.gpus // tasks} GPUs a node; nodes have {shape.gpus_per_node}"
        if tasks > shape.nodes:
            return f"asks for {tasks} nodes; the cluster has {shape.nodes}"
        return ""


@dataclass(slots=True)
class Trace:
    jobs: list[TraceJob]  #: in submission order
    shape: ClusterShape | None = None  #: from the `# cluster:` line, if any
    comments: tuple[str, ...] = ()  #: other comment lines, without the leading '# '

    def check(self, shape: ClusterShape) -> None:
        """Raise TraceError naming the first job that can never run on `shape`."""
        for job in self.jobs:
            problem = job.problem_on(shape)
            if problem:
                raise TraceError(f"job {job.id} {problem} ({shape.describe()})")

    @property
    def horizon(self) -> float:
        """The span of submissions, seconds."""
        return self.jobs[-1].submit if self.jobs else 0.0


def _number(raw: str, column: str, *, integer: bool = False, default: float | None = None) -> float:
    raw = raw.strip()
    if not raw:
        if default is None:
            raise TraceError(f"{column} is empty")
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise TraceError(f"{column} {raw[:30]!r} is not {'a whole number' if integer else 'a number'}") from None
    if not math.isfinite(value):
        raise TraceError(f"{column} {raw[:30]!r} is not a finite number")
    return value


def _job(row: dict[str, str]) -> TraceJob:
    def get(column: str) -> str:
        return row.get(column) or ""  # a missing optional column reads as empty

    job = TraceJob(
        id=get("id").strip(),
        submit=_number(get("submit_s"), "submit_s"),
        gpus=int(_number(get("gpus"), "gpus", integer=True)),
        nodes=int(_number(get("nodes"), "nodes", integer=True, default=0)),
        duration=_number(get("duration_s"), "duration_s"),
        time_limit=_number(get("time_limit_s"), "time_limit_s", default=0.0),
        exit_code=int(_number(get("exit_code"), "exit_code", integer=True, default=0)),
        queue=get("queue").strip(), user=get("user").strip(), array=get("array").strip(),
        after=get("after").strip(), name=get("name").strip())
    if not job.id:
        raise TraceError("id is empty")
    if job.array:
        try:
            parse_array(job.array)
        except ArraySpecError as exc:
            raise TraceError(f"array {job.array[:30]!r}: {exc}") from None
    try:
        job.dependencies  # noqa: B018 - parsed for its errors
    except ValueError as exc:
        raise TraceError(f"after: {exc}") from None
    for name, value in (("submit_s", job.submit), ("duration_s", job.duration), ("time_limit_s", job.time_limit),
                        ("nodes", job.nodes)):
        if value < 0:
            raise TraceError(f"{name} must not be negative, not {value:g}")
    if job.gpus < 1:
        raise TraceError(f"gpus must be at least 1, not {job.gpus}")
    if job.nodes and job.gpus % job.nodes:
        raise TraceError(f"{job.gpus} GPUs do not divide over {job.nodes} nodes")
    return job


def parse(text: str, where: str = "trace") -> Trace:
    """A trace from CSV text; TraceError names `where`, the line and the problem."""
    shape, comments, lines = None, [], []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            body = line.lstrip("#").strip()
            if body.startswith("cluster:"):
                try:
                    shape = ClusterShape.parse(body.removeprefix("cluster:"))
                except TraceError as exc:
                    raise TraceError(f"{where}:{number}: {exc}") from None
            elif line != VERSION_LINE and body:
                comments.append(body)
        elif line.strip():
            lines.append((number, line))
    if not lines:
        raise TraceError(f"{where}: no header row (expected columns {','.join(COLUMNS)})")
    reader = csv.reader(io.StringIO("\n".join(line for _, line in lines)))
    header = [h.strip() for h in next(reader)]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        optional = ", ".join(c for c in COLUMNS if c not in REQUIRED)
        raise TraceError(f"{where}:{lines[0][0]}: missing column(s) {', '.join(missing)} "
                         f"(required: {', '.join(REQUIRED)}; optional: {optional})")
    jobs, seen = [], set()
    for (number, _), values in zip(lines[1:], reader, strict=True):
        if len(values) != len(header):
            raise TraceError(f"{where}:{number}: {len(values)} field(s), the header has {len(header)}")
        try:
            job = _job(dict(zip(header, values, strict=True)))
        except TraceError as exc:
            raise TraceError(f"{where}:{number}: {exc}") from None
        if job.id in seen:
            raise TraceError(f"{where}:{number}: job id {job.id} appears twice")
        seen.add(job.id)
        jobs.append(job)
    jobs.sort(key=lambda j: j.submit)
    _check_dependencies(jobs, where)
    return Trace(jobs, shape, tuple(comments))


def _has_index(array: str, index: int) -> bool:
    return bool(array) and any(first <= index <= last and (index - first) % step == 0
                               for first, last, step in parse_array(array)[0])


def _check_dependencies(jobs: list[TraceJob], where: str) -> None:
    """Every dependency names a row submitted before its own (by submission time)."""
    earlier: dict[str, TraceJob] = {}
    for job in jobs:
        for _kind, upstream in job.dependencies:
            element = split_element_id(upstream)
            base = earlier.get(upstream) or (earlier.get(element[0]) if element else None)
            if base is None or (upstream not in earlier and (element is None
                                                             or not _has_index(base.array, element[1]))):
                raise TraceError(f"{where}: job {job.id}: after: {upstream} is not a job (or array element) "
                                 "submitted before it")
        earlier[job.id] = job


def read(path: str | Path) -> Trace:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read: {exc}") from None
    return parse(text, str(path))


def dumps(trace: Trace) -> str:
    out = io.StringIO()
    out.write(VERSION_LINE + "\n")
    if trace.shape is not None:
        out.write(f"# cluster: {trace.shape.describe()}\n")
    for comment in trace.comments:
        out.write(f"# {comment}\n")
    writer = csv.writer(out, lineterminator="\n")
    # Without names the columns are those of the traces written before names existed.
    columns = COLUMNS if any(job.name for job in trace.jobs) else COLUMNS[:-1]
    writer.writerow(columns)
    for job in trace.jobs:
        writer.writerow([_cell(getattr(job, column)) for column in (_FIELDS.get(c, c) for c in columns)])
    return out.getvalue()


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if value != int(value) else str(int(value))
    return str(value)
