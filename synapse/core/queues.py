"""Queue files and the rules queues follow, checked alike by synctl, the API and apply.

    queues:
      - name: research                 # an organisation (a top-level queue)
        guaranteed: {gpu: 64}
      - name: vision
        parent: research               # two levels at most: organisation, then team
        weight: 2                      # fair share
        guaranteed: {gpu: 16, cpu: 256, memory: 2Ti}
        max: {gpu: 32}                 # how far it may borrow; a resource left out has no cap
        lending_limit: {gpu: 8}        # how much of its guarantee others may borrow
        users: [alice]                 # who may submit (with groups); both empty: everyone
        groups: [team-vision]
        preemption: {rules: [reclaim, priority, backfill, fair_share], min_runtime: 10m, max_grace: 5m}
        max_per_user: {gpu: 64, jobs: 200}   # one user's running GPUs, and pending+running jobs, here
        interactive: {max_duration: 8h}      # the longest an interactive job may run here (default 8h)
"""

from __future__ import annotations

import math
import re
from typing import Any

from synapse.core.identity import groups_problem
from synapse.core.jobs.quantity import QuantityError, parse_cpu, parse_duration, parse_memory
from synapse.core.model import UNLIMITED, Queue, Resources

PREEMPTION_RULES = ("reclaim", "priority", "backfill", "fair_share")
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_FIELDS = {"name", "parent", "weight", "guaranteed", "max", "lending_limit", "users", "groups", "preemption",
           "max_per_user", "interactive"}
#: The longest interactive max_duration a queue may set.
MAX_INTERACTIVE_S = 7 * 86400
_RESOURCES = {"gpu", "cpu", "memory"}
MAX_QUEUES = 1000


class QueueFileError(ValueError):
    """A queue file (or queue) that cannot be applied; names the field and why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def queue_name_problem(name: str) -> str:
    if not _NAME_RE.match(name):
        return f"queue name {name[:40]!r}: 1-63 lower-case letters, digits or '-', not starting or ending with '-'"
    return ""


def _amounts(doc: Any, field: str, default: int) -> Resources:
    if doc is None:
        return Resources(default, default, default)
    if not isinstance(doc, dict):
        raise QueueFileError(field, "must be a mapping of gpu, cpu, memory")
    unknown = sorted(set(map(str, doc)) - _RESOURCES)
    if unknown:
        raise QueueFileError(f"{field}.{unknown[0]}", "unknown resource (known: cpu, gpu, memory)")
    values = {}
    for key, parse in (("gpu", None), ("cpu", parse_cpu), ("memory", parse_memory)):
        raw = doc.get(key)
        if raw is None:
            values[key] = default
            continue
        try:
            if parse is None:
                if isinstance(raw, bool) or not isinstance(raw, int):
                    raise QuantityError("must be a whole number of GPUs")
                value = raw
            else:
                value = parse(str(raw))
        except QuantityError as exc:
            raise QueueFileError(f"{field}.{key}", str(exc)) from None
        if value < 0:
            raise QueueFileError(f"{field}.{key}", "must not be negative")
        values[key] = value
    return Resources(cpu=values["cpu"], memory=values["memory"], gpu=values["gpu"])


def _names(doc: Any, field: str) -> tuple[str, ...]:
    if doc is None:
        return ()
    if not isinstance(doc, list) or not all(isinstance(x, str) for x in doc):
        raise QueueFileError(field, "must be a list of names")
    return tuple(doc)


def parse_queue(doc: Any, where: str = "queue") -> Queue:
    """One queue from its YAML mapping."""
    if not isinstance(doc, dict):
        raise QueueFileError(where, "must be a mapping")
    unknown = sorted(set(map(str, doc)) - _FIELDS)
    if unknown:
        raise QueueFileError(f"{where}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(_FIELDS))})")
    name = doc.get("name")
    if not isinstance(name, str):
        raise QueueFileError(f"{where}.name", "required, a string")
    where = f"queue {name}" if name else where
    parent = doc.get("parent") or ""
    if not isinstance(parent, str):
        raise QueueFileError(f"{where}.parent", "must be a queue name")
    weight = doc.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise QueueFileError(f"{where}.weight", "must be a number")
    pre = doc.get("preemption") or {}
    if not isinstance(pre, dict) or set(map(str, pre)) - {"rules", "min_runtime", "max_grace"}:
        raise QueueFileError(f"{where}.preemption", "must be a mapping of rules, min_runtime, max_grace")
    try:
        min_runtime = parse_duration(str(pre.get("min_runtime", 0)))
        max_grace = parse_duration(str(pre.get("max_grace", 0)))
    except QuantityError as exc:
        raise QueueFileError(f"{where}.preemption", str(exc)) from None
    user_gpu, user_jobs = _per_user(doc.get("max_per_user"), f"{where}.max_per_user")
    interactive = doc.get("interactive") or {}
    if not isinstance(interactive, dict) or set(map(str, interactive)) - {"max_duration"}:
        raise QueueFileError(f"{where}.interactive", "must be a mapping of max_duration")
    try:
        interactive_max = parse_duration(str(interactive.get("max_duration", 0)))
    except QuantityError as exc:
        raise QueueFileError(f"{where}.interactive.max_duration", str(exc)) from None
    queue = Queue(name=name, parent=parent, weight=float(weight),
                  guaranteed=_amounts(doc.get("guaranteed"), f"{where}.guaranteed", 0),
                  max=_amounts(doc.get("max"), f"{where}.max", UNLIMITED),
                  lending_limit=_amounts(doc.get("lending_limit"), f"{where}.lending_limit", UNLIMITED),
                  users=_names(doc.get("users"), f"{where}.users"), groups=_names(doc.get("groups"), f"{where}.groups"),
                  preemption_rules=_names(pre.get("rules"), f"{where}.preemption.rules"),
                  min_runtime=min_runtime, max_grace=max_grace, user_gpu=user_gpu, user_jobs=user_jobs,
                  interactive_max=interactive_max)
    problem = queue_problem(queue)
    if problem:
        raise QueueFileError(where, problem)
    return queue


def _per_user(doc: Any, field: str) -> tuple[int, int]:
    """(gpu, jobs) of a `max_per_user` mapping; a limit left out is UNLIMITED."""
    if doc is None:
        return UNLIMITED, UNLIMITED
    if not isinstance(doc, dict):
        raise QueueFileError(field, "must be a mapping of gpu, jobs")
    unknown = sorted(set(map(str, doc)) - {"gpu", "jobs"})
    if unknown:
        raise QueueFileError(f"{field}.{unknown[0]}", "unknown limit (known: gpu, jobs)")
    out = []
    for key in ("gpu", "jobs"):
        raw = doc.get(key)
        if raw is None:
            out.append(UNLIMITED)
            continue
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
            raise QueueFileError(f"{field}.{key}", "must be a whole number of at least 1 (leave it out for no limit)")
        out.append(raw)
    return out[0], out[1]


def parse_queue_file(doc: Any) -> list[Queue]:
    """The `queues:` list of a queue file, each queue checked and the batch checked as a whole
    against itself (parents, duplicates); apply checks it again against the cluster's queues."""
    if not isinstance(doc, dict) or set(map(str, doc)) != {"queues"}:
        raise QueueFileError("(file)", "must be a mapping with one key, queues")
    if not isinstance(doc["queues"], list) or not doc["queues"]:
        raise QueueFileError("queues", "must be a non-empty list")
    queues = [parse_queue(q, f"queues[{i}]") for i, q in enumerate(doc["queues"])]
    problem = batch_problem({}, queues, allow_missing_parents=True)
    if problem:
        raise QueueFileError("queues", problem)
    return queues


def _limit_below(limit: Resources, floor: Resources) -> str:
    for key in ("gpu", "cpu", "memory"):
        cap = getattr(limit, key)
        if cap != UNLIMITED and cap < getattr(floor, key):
            return key
    return ""


def queue_problem(q: Queue) -> str:
    """Why this queue is not valid on its own, or ''."""
    problem = queue_name_problem(q.name)
    if problem:
        return problem
    if q.parent and queue_name_problem(q.parent):
        return f"parent: {queue_name_problem(q.parent)}"
    if q.parent == q.name:
        return "parent: a queue cannot be its own parent"
    if not (math.isfinite(q.weight) and 0 < q.weight <= 1000):
        return "weight: must be above 0 and at most 1000"
    if min(q.guaranteed.cpu, q.guaranteed.memory, q.guaranteed.gpu) < 0:
        return "guaranteed: must not be negative"
    for field, amounts in (("max", q.max), ("lending_limit", q.lending_limit)):
        if any(v < 0 and v != UNLIMITED for v in (amounts.cpu, amounts.memory, amounts.gpu)):
            return f"{field}: must not be negative"
    below = _limit_below(q.max, q.guaranteed)
    if below:
        return f"max.{below}: below guaranteed.{below}"
    for field, values in (("users", q.users), ("groups", q.groups)):
        problem = groups_problem(values)
        if problem:
            return f"{field}: {problem.removeprefix('groups: ')}"
    unknown = [r for r in q.preemption_rules if r not in PREEMPTION_RULES]
    if unknown:
        return f"preemption.rules: unknown rule {unknown[0]!r} (known: {', '.join(PREEMPTION_RULES)})"
    if not (0 <= q.min_runtime <= 366 * 86400 and 0 <= q.max_grace <= 86400):
        return "preemption: min_runtime at most 366 days, max_grace at most 1 day"
    for key, limit in (("gpu", q.user_gpu), ("jobs", q.user_jobs)):
        if limit != UNLIMITED and limit < 1:
            return f"max_per_user.{key}: at least 1 (leave it out for no limit)"
    if not 0 <= q.interactive_max <= MAX_INTERACTIVE_S:
        return "interactive.max_duration: at most 7 days"
    return ""


def batch_problem(existing: dict[str, Queue], batch: list[Queue], allow_missing_parents: bool = False) -> str:
    """Why these queues cannot replace or join `existing`, or ''. The tree has two levels: a
    parent must be a top-level queue, and a queue with children cannot get a parent."""
    names = [q.name for q in batch]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        return f"queue {dupes[0]} is listed twice"
    merged = {**existing, **{q.name: q for q in batch}}
    if len(merged) > MAX_QUEUES:
        return f"at most {MAX_QUEUES} queues"
    for q in batch:
        problem = queue_problem(q)
        if problem:
            return f"queue {q.name}: {problem}"
        if not q.parent:
            continue
        parent = merged.get(q.parent)
        if parent is None:
            if allow_missing_parents:
                continue
            return f"queue {q.name}: parent: unknown queue {q.parent}"
        if parent.parent:
            return f"queue {q.name}: parent: {q.parent} is itself a team (two levels at most: organisation, team)"
    for q in merged.values():
        if q.parent and any(child.parent == q.name for child in merged.values()):
            return f"queue {q.name}: has child queues, so it cannot have a parent (two levels at most)"
    return ""
