"""Which pending jobs a scheduling round may consider: held jobs, array throttles, dependencies,
singletons. Pure.

A job held back here takes no part in the round: it gets no plan and no reservation, and waits
with a reason that names what it waits on (a pending reason code of synapse.core.schedule.scheduler). One
`Gate` serves one round: it counts the plans the round has made, so a throttle of 4 is never
exceeded by one round placing five elements.

The gate also says which further elements of an array a round may place after the queued one
(`next_elements`): an array keeps one unplaced element queued (synapse.core.jobs.arrays), and apply
makes the next index a job as each is placed, so a round that places the queued element may plan
the following indices under the ids they will have, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from synapse.core.jobs import dependencies
from synapse.core.jobs.arrays import element_id
from synapse.core.jobs.dependencies import DependencyState
from synapse.core.model import Job, JobSpec, Plan
from synapse.core.schedule.placement import ClusterView, place
from synapse.core.schedule.view import ClusterRead

#: Elements of one array a round may plan beyond the queued one: the next round places more. It
#: keeps a round short (the leader holds the state's lock through it): on 256 idle nodes, a round
#: placing 33 elements took ~3 ms here, one placing 256 over 200 ms (bench/workflows.py).
MAX_ELEMENTS_PER_ROUND = 32

#: Pending reason codes of held-back jobs.
NEVER = dependencies.NEVER_SATISFIED  #: a dependency can never be met (the job asked to wait, or is about to fail)
DEPENDENCY = "Dependency"  #: a dependency is not met yet
SINGLETON = "Singleton"  #: another job of its name and user holds a gang
THROTTLE = "ArrayThrottle"  #: its array has as many elements running as its throttle allows
HELD = "Held"  #: its owner or an admin holds it (synctl hold, submit --hold) until released
HELD_CODES = frozenset({NEVER, DEPENDENCY, SINGLETON, THROTTLE, HELD})


@dataclass(frozen=True, slots=True)
class Held:
    """Why a job is kept out of the round."""

    code: str
    message: str


class Gate:
    """One round's view of what holds jobs back; `placed` tells it of the round's plans."""

    def __init__(self, state: ClusterRead) -> None:
        self.state = state
        self._running: dict[str, int] = {}  #: array id -> elements holding a gang, with this round's plans
        self._names: set[tuple[str, str]] | None = None  #: (user, name) of jobs holding a gang, when needed
        self._planned: set[tuple[str, str]] = set()  #: (user, name) of the jobs this round planned

    def held(self, job: Job) -> Held | None:
        """Why `job` may not take part in this round, or None."""
        if job.held_by:
            return Held(HELD, f"held by {job.held_by}")
        spec = job.spec
        if spec.after:
            resolved = dependencies.resolve(self.state, spec.after)
            never = [r for r in resolved if r.state is DependencyState.NEVER]
            if never:
                r = never[0]
                return Held(NEVER, f"after{r.kind} {r.upstream}: it ended {r.upstream_status or 'unknown'}, so this "
                                   "dependency can never be met")
            waiting = [r for r in resolved if r.state is DependencyState.WAITING]
            if waiting:
                names = ", ".join(f"after{r.kind} {r.upstream} ({r.upstream_status})" for r in waiting[:3])
                more = f" and {len(waiting) - 3} more" if len(waiting) > 3 else ""
                return Held(DEPENDENCY, f"waits for {names}{more}")
        if job.array_id:
            array = self.state.arrays.get(job.array_id)
            if array is not None and array.throttle and self.running(job.array_id) >= array.throttle:
                return Held(THROTTLE, f"array {array.id} has {self.running(job.array_id)} element(s) running, "
                                      f"its throttle (%{array.throttle})")
        if spec.singleton and ((job.user, spec.name) in self._planned or (job.user, spec.name) in self.names()):
            return Held(SINGLETON, f"singleton: another job named {spec.name} of user {job.user or '-'} is running")
        return None

    def running(self, array_id: str) -> int:
        if array_id not in self._running:
            live = self.state.array_live.get(array_id, ())
            self._running[array_id] = sum(1 for j in live if self.state.jobs[j].status.has_gang)
        return self._running[array_id]

    def names(self) -> set[tuple[str, str]]:
        """(user, name) of the jobs holding a gang in the state (this round's plans are apart)."""
        if self._names is None:
            self._names = {(j.user, j.spec.name) for j in self.state.jobs.values() if j.status.has_gang}
        return self._names

    def placed(self, job: Job) -> None:
        """The round planned `job` (or an element under its id): count it against throttles and singletons."""
        if job.array_id:
            self._running[job.array_id] = self.running(job.array_id) + 1
        self._planned.add((job.user, job.spec.name))

    def next_elements(self, job: Job) -> list[Job]:
        """After the queued element `job` is planned: the array's next elements this round may plan,
        as the jobs apply will make of them (in index order), within the throttle."""
        array = self.state.arrays.get(job.array_id) if job.array_id else None
        if array is None or array.rep != job.id or job.spec.singleton or array.cancelled:
            return []
        room = MAX_ELEMENTS_PER_ROUND
        if array.throttle:
            room = min(room, array.throttle - self.running(array.id))
        out: list[Job] = []
        position = array.next
        while len(out) < room and position < array.count:
            index = array.index_at(position)
            position += 1
            if index in array.skipped:
                continue
            out.append(Job(id=element_id(array.id, index), spec=job.spec, request_id="",
                           submitted_at=job.submitted_at, seq=job.seq, user=job.user, array_id=array.id,
                           array_index=index))
        return out

    def more_elements(self, view: ClusterView, job: Job, spec: JobSpec,
                      may_continue: Callable[[], bool] = lambda: True) -> Iterator[Plan]:
        """Plans for the array's next elements once the queued element `job` is planned, each
        claimed on `view`, until one does not fit or `may_continue()` (asked before each) says no."""
        for element in self.next_elements(job):
            if not may_continue():
                return
            plan = place(view, element.id, 1, spec, with_reasons=False).plan
            if plan is None:
                return
            view.claim(plan, job.spec.resources)
            self.placed(element)
            yield plan
