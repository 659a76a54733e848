"""Job dependencies: `after: {ok: [...], any: [...], notok: [...]}`, resolved against the state. Pure.

A dependency names an upstream job, an array (`ok` then means every element succeeded), or one
element (`ID_7`). It is resolved against the replicated state alone: the job while the state holds
it, and once retention has forgotten it, the compact record of its final state that apply keeps
for this purpose (`ClusterState.finished`). So a dependency never breaks because its upstream ended
long ago (Slurm's MinJobAge trap). Each dependency is WAITING, MET, or NEVER (it can never be met:
the upstream ended the wrong way; a requeued attempt is not an end).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any, Protocol

from synapse.core.jobs.arrays import JobArray, split_element_id
from synapse.core.model import Job, JobStatus


class ClusterState(Protocol):
    """What resolving reads of synapse.core.state.fsm.ClusterState (which imports this module)."""

    @property
    def jobs(self) -> Mapping[str, Job]: ...
    @property
    def arrays(self) -> Mapping[str, JobArray]: ...
    @property
    def array_live(self) -> Mapping[str, Set[str]]: ...
    @property
    def finished(self) -> Mapping[str, str]: ...

#: The kinds of dependency, as the job file spells them (Slurm's afterok, afterany, afternotok).
KINDS = ("ok", "any", "notok")
#: At most this many dependencies per job.
MAX_DEPENDENCIES = 100
#: The typed cause a job fails with when a dependency can never be met.
NEVER_SATISFIED = "DependencyNeverSatisfied"
#: What a job may ask for when a dependency can never be met.
ON_UNSATISFIABLE = ("fail", "wait")


class DependencyState(enum.StrEnum):
    WAITING = "waiting"  #: the upstream has not ended
    MET = "met"
    NEVER = "never"  #: the upstream ended in a way that can never meet it


@dataclass(frozen=True, slots=True)
class Resolved:
    """One dependency of a job, resolved now."""

    kind: str
    upstream: str
    state: DependencyState
    upstream_status: str  #: the upstream's status as the state knows it ("" when it is not known at all)

    def describe(self) -> str:
        return f"after{self.kind} {self.upstream} ({self.upstream_status or 'unknown'}): {self.state.value}"


def parse_after(doc: Any) -> tuple[tuple[str, str], ...]:
    """The `after` mapping of a job file as (kind, job id) pairs; raises ValueError naming the part."""
    if doc is None:
        return ()
    if not isinstance(doc, dict):
        raise ValueError("must be a mapping such as {ok: [ID, ...], any: [...], notok: [...]}")
    out: list[tuple[str, str]] = []
    for kind, ids in doc.items():
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
        if isinstance(ids, str):
            ids = [ids]
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) and i for i in ids):
            raise ValueError(f"{kind}: must be a non-empty list of job ids")
        out += [(str(kind), i) for i in ids]
    return tuple(out)


def parse_after_flag(text: str) -> tuple[tuple[str, str], ...]:
    """`synctl submit --after ok:ID,any:ID2` (a bare ID means ok)."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        kind, sep, job_id = part.partition(":")
        if not sep:
            kind, job_id = "ok", part
        kind = kind.removeprefix("after")
        if kind not in KINDS or not job_id:
            raise ValueError(f"cannot read {part!r}: use KIND:ID with KIND one of {', '.join(KINDS)}")
        out.append((kind, job_id))
    return tuple(out)


def after_problem(after: tuple[tuple[str, str], ...]) -> str:
    """Why a list of dependencies is malformed on its own, or ''."""
    if len(after) > MAX_DEPENDENCIES:
        return f"at most {MAX_DEPENDENCIES} dependencies"
    for kind, upstream in after:
        if kind not in KINDS:
            return f"unknown kind {kind!r} (known: {', '.join(KINDS)})"
        if not upstream or len(upstream) > 256:
            return "a job id must be 1-256 characters"
    return ""


def upstream_status(state: ClusterState, upstream: str) -> str:
    """The upstream's status as the state knows it: a job's, an array's, an element's not yet a
    job (PENDING; CANCELLED if it or its array was cancelled first; FAILED if its array ended on a
    dependency never met), a forgotten job's final one; '' if unknown."""
    job = state.jobs.get(upstream)
    if job is not None:
        return job.status.value
    array = state.arrays.get(upstream)
    if array is not None:
        return array.status(any(state.jobs[j].status.has_gang for j in state.array_live.get(array.id, ()))).value
    final = state.finished.get(upstream)
    if final is not None:
        return final
    element = split_element_id(upstream)
    if element is not None:
        array = state.arrays.get(element[0])
        position = array.position_of(element[1]) if array is not None else -1
        if array is not None and position >= 0:
            if array.cancelled or element[1] in array.skipped:
                return JobStatus.CANCELLED.value
            if position >= array.next:
                return JobStatus.PENDING.value
            if array.never_satisfied:
                return JobStatus.FAILED.value
    return ""


def known(state: ClusterState, upstream: str) -> bool:
    """True when a dependency on `upstream` can be resolved (the submission check)."""
    return bool(upstream_status(state, upstream))


def resolve_one(kind: str, status: str) -> DependencyState:
    """A dependency of this kind on an upstream in this status."""
    if status not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED):
        return DependencyState.NEVER if not status else DependencyState.WAITING
    if kind == "any":
        return DependencyState.MET
    ok = status == JobStatus.SUCCEEDED
    return DependencyState.MET if ok == (kind == "ok") else DependencyState.NEVER


def resolve(state: ClusterState, after: tuple[tuple[str, str], ...]) -> list[Resolved]:
    """Each dependency, resolved against the state."""
    out = []
    for kind, upstream in after:
        status = upstream_status(state, upstream)
        verdict = resolve_one(kind, status)
        array = state.arrays.get(upstream)
        if kind == "ok" and array is not None and (array.failed or array.cancelled_count):
            # One element failed or was cancelled: no need to wait for the others to know.
            verdict = DependencyState.NEVER
        out.append(Resolved(kind, upstream, verdict, status))
    return out
