"""The worker's bookkeeping as a state machine: events in, instructions out.

One writer: only `WorkerState.handle(event, now)` changes a `WorkerState`, and only the agent's main
loop calls it (a restarted agent builds its state with `WorkerState.restore`, never by writing
fields). The agent (`agent.py`) turns network messages, process observations and image pulls into
events, and carries out the instructions it gets back: start a task, signal one, unpin an image.
Its other threads never touch the state: they put events on the main loop's queue, and read the
`StateView` the main loop publishes after every event (a frozen copy, replaced whole, so a reader
sees one moment's state or the next, never half of a change). What is not here is I/O bookkeeping
with one writer each (named in the agent: the pulls' progress, the heartbeat's replica order, the
health check's result). `tests/unit/test_layout.py` fails on code in synapse/worker that writes to the
state, or to a task of it, anywhere but in this module. Nothing here does I/O, so every rule is
tested by feeding events and asserting the exact instructions.

Rules:
* Assignments older than the newest (term, version) seen are ignored: a worker never goes back in
  time when an old leader's message arrives late.
* Level-triggered: whatever runs and is not wanted is stopped; whatever is wanted and has never
  run here is started. A task key (job, attempt, index) is started at most once, ever.
* Stop = SIGTERM to the task's process group, SIGKILL once the grace period has passed.
* The checkpoint notice: a task listed with `notice_signal` gets that signal once, as soon as it
  has a process. Listed while still wanted, that is all (its time limit is near: the stop follows
  from the master). Listed with `stop`, SIGTERM waits until `notice` seconds after the signal, then
  SIGKILL after the grace as ever: signal, wait `notice`, SIGTERM, wait `grace`, SIGKILL. A task
  stopped before its process started has nothing to save and gets SIGTERM at once; a stop without
  a notice (a cancellation, a failure, an unlisted task) is SIGTERM at once, even after a notice.
* Every start and exit is reported until the master acknowledges it; so is a held task's image
  being on the node (the master's `TaskPrepared`: its gang starts once every task is,
  synapse.master.dispatch).
* A task in an image starts once the node's image store holds it (`ImageReady`), at once unless the
  newest listing holds it for its gang; a held task keeps its image pinned until a listing releases
  it (then it starts) or stops it (then it ends, its container dropped). A task stopped while its
  image is pulled ends at once, with nothing to save; the pull's outcome then only unpins the image.
* A held task whose image is here is created at once (`Create`: its sandbox set up, its command
  waiting at a gate, synapse.worker.runtime; `TaskCreated`) and reported prepared once its set-up
  is done (`TaskSetUp`, or the sandbox ended: its start then says how), so a gang's release does
  not race its sandboxes' set-up;
  its release is then a `Start` carrying the created process, which the agent starts by opening
  the gate. A created task stopped before its release is discarded with its process (SIGKILL:
  its command never ran). Until its gate opens a created task has no process here (`handle` is
  None, it is not polled, and a restarted worker does not adopt it).
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from synapse.core.model import Assignment, EndReason
from synapse.worker.runtime import Handle

if TYPE_CHECKING:  # the state only holds the store's images; it never imports the store
    from synapse.images.model import Image

Key = tuple[str, int, int]
#: What a task that died with its machine is reported as (with cause NodeLost).
MACHINE_RESTARTED = "its machine restarted while its worker was away (the boot id changed): the task died with it"


def notice_signal(name: str) -> int:
    """The number of a checkpoint notice's signal (jobspec.NOTICE_SIGNALS spelling), 0 for none or a
    name this machine does not know (the task then gets no notice, and SIGTERM as without one)."""
    try:
        return int(signal.Signals[f"SIG{name}"]) if name else 0
    except KeyError:
        return 0


# ---- events ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class AssignmentsReceived:
    term: int
    version: int
    assignments: tuple[Assignment, ...]
    node_status: str = "READY"


@dataclass(frozen=True, slots=True)
class TaskStarted:
    key: Key
    handle: Handle


@dataclass(frozen=True, slots=True)
class TaskStartFailed:
    key: Key
    reason: str
    #: MasterPortInUse when rank 0's port was taken, ImagePullFailed when its image could not be had
    cause: str = EndReason.ERROR
    node_side: bool = False  #: with ImagePullFailed: the failure lies in the node


@dataclass(frozen=True, slots=True)
class TaskExited:
    key: Key
    exit_code: int
    reason: str = ""
    cause: str = ""  #: Completed, Error, Signal or OOMKilled (runtime.read_outcome)


@dataclass(frozen=True, slots=True)
class TaskCreated:
    """A held task's sandbox is being set up, to wait at its gate (the agent carried out `Create`)."""

    key: Key
    handle: Handle  #: the created task's shim: its process group is the task's, once its gate opens


@dataclass(frozen=True, slots=True)
class TaskSetUp:
    """A created task's sandbox reached its gate (or ended before it: its start then shows how)."""

    key: Key


@dataclass(frozen=True, slots=True)
class PullStarted:
    """The agent asked the image store for a task's image; the outcome comes as `ImageReady` or
    `ImageFailed`."""

    key: Key


@dataclass(frozen=True, slots=True)
class ImageReady:
    """The image store holds a task's image now, pinned for the task. A held task is then prepared:
    the master hears it, and lists the task unheld once every task of its gang is prepared."""

    key: Key
    image: Image  #: the store's Image


@dataclass(frozen=True, slots=True)
class ImageFailed:
    """The image store could not get a task's image."""

    key: Key
    message: str  #: names the node, the image and the cause
    node_side: bool  #: another node may succeed


@dataclass(frozen=True, slots=True)
class ReportsAcknowledged:
    reports: tuple[Report, ...]


@dataclass(frozen=True, slots=True)
class Tick:
    pass


# ---- instructions ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Start:
    """Start the task: at once if it needs no image or `image` is its image in the store; else have
    its image pulled first (the outcome comes back as `ImageReady` or `ImageFailed`). With `created`,
    the task was created gated (`Create`): starting it is opening its gate."""

    assignment: Assignment
    image: Image | None = None  #: the store's Image, pinned for the task, once it is on the node
    created: Handle | None = None  #: the created task's process, waiting at its gate


@dataclass(frozen=True, slots=True)
class Create:
    """Set up a held task's sandbox now, its command waiting at a gate until its `Start` (the
    outcome comes back as `TaskCreated` or `TaskStartFailed`)."""

    assignment: Assignment
    image: Image  #: the store's Image, pinned for the task


@dataclass(frozen=True, slots=True)
class Unpin:
    """No process will use the image pulled for this task: release the task's pin on it."""

    key: Key


@dataclass(frozen=True, slots=True)
class Discard:
    """A prepared task that will never start: kill its created process (if it was created), drop its
    container's files and unpin its image."""

    assignment: Assignment
    handle: Handle | None = None  #: the created task's process, waiting at its gate


@dataclass(frozen=True, slots=True)
class Signal:
    key: Key
    handle: Handle
    signal: int


@dataclass(frozen=True, slots=True)
class Report:
    """One fact for the master: a task started, or exited with a code, or (`prepared`) holds its image."""

    key: Key
    started: bool
    exit_code: int = 0
    reason: str = ""
    cause: str = ""
    node_side: bool = False  #: with ImagePullFailed: the failure lies in the node, another may succeed
    prepared: bool = False  #: not started: its image is here, it waits for its gang (neither started nor exited)


class Outbox:
    """(report thread) Which of the state's unacknowledged reports to send: all but those the master
    has acknowledged and the main loop has not taken in yet (ReportsAcknowledged waits in its
    queue). Without it a report thread woken while its call was out (any change on the main loop
    wakes it while reports are owed) sent those again at once: a second call and a second log
    entry for a task's start or end, and the next report, a gang's start, queued behind it."""

    def __init__(self) -> None:
        self._acked: set[Report] = set()

    def due(self, unreported: tuple[Report, ...]) -> list[Report]:
        """The reports to send now, from the main loop's published `unreported`."""
        self._acked &= set(unreported)  # taken in by the main loop: gone from both
        return [r for r in unreported if r not in self._acked]

    def acknowledged(self, batch: list[Report]) -> None:
        self._acked.update(batch)


Instruction = Start | Create | Signal | Unpin | Discard


@dataclass(slots=True)
class LocalTask:
    assignment: Assignment
    phase: str = "starting"  #: starting -> running -> (stopping ->) exited
    handle: Handle | None = None
    stop_requested_at: float | None = None
    grace: float | None = None  #: this stop's seconds from SIGTERM to SIGKILL, if the master set one
    killed: bool = False  #: SIGKILL sent
    exit_code: int | None = None
    #: the checkpoint notice's signal, once one is asked for and the task has no process yet to get it
    notice_pending: int = 0
    noticed_at: float | None = None  #: when the task was given its checkpoint notice
    #: a stop with a notice: when SIGTERM is due (None: sent with the stop, or not stopping)
    term_at: float | None = None
    machine_restarted: bool = False  #: re-adopted after its machine restarted: it died with it


@dataclass(frozen=True, slots=True)
class SavedTask:
    """A task as the state file kept it, with the process the agent found for it."""

    assignment: Assignment
    phase: str
    handle: Handle | None  #: None: it never got a process
    noticed: bool = False  #: it had been given its checkpoint notice


@dataclass(frozen=True, slots=True)
class StateView:
    """What the agent's other threads may read of the state: a copy the main loop publishes whole
    after every event (`WorkerState.view`)."""

    known: tuple[int, int] = (0, 0)  #: the watch asks for assignments newer than this
    unreported: tuple[Report, ...] = ()  #: what the reporter sends
    tasks: frozenset[Key] = frozenset()  #: the live tasks (the log service follows their logs)
    phases: tuple[str, ...] = ()  #: each live task's phase (the metrics count them)
    #: each live task with a process: its assignment and process (the attach service finds them here)
    processes: Mapping[Key, tuple[Assignment, Handle]] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(slots=True)
class WorkerState:
    """What this worker runs and what the master has yet to hear. Every field, and every field of
    its tasks, is changed by `handle` alone, on the agent's main loop (the module's docstring)."""

    stop_grace: float = 10.0  #: seconds between SIGTERM and SIGKILL
    known: tuple[int, int] = (0, 0)  #: newest (term, version) of assignments applied
    tasks: dict[Key, LocalTask] = field(default_factory=dict)  #: tasks not yet exited and reported
    done: set[Key] = field(default_factory=set)  #: keys that ran here and ended: never started again
    unreported: list[Report] = field(default_factory=list)  #: facts the master has not acknowledged
    holds: dict[Key, bool] = field(default_factory=dict)  #: the newest listing's hold of each task it lists
    #: tasks whose image the store is getting (PullStarted until ImageReady or ImageFailed, even
    #: once the task has ended)
    pulling: set[Key] = field(default_factory=set)
    #: held tasks whose image is on the node (key -> the store's Image, pinned): each starts when a
    #: listing no longer holds it
    prepared: dict[Key, Image] = field(default_factory=dict)
    #: prepared tasks created gated (key -> the process waiting at its gate): started by opening it
    created: dict[Key, Handle] = field(default_factory=dict)

    @classmethod
    def restore(cls, *, stop_grace: float, known: tuple[int, int], done: Iterable[Key], unreported: Iterable[Report],
                tasks: Iterable[SavedTask], now: float, rebooted: bool = False) -> WorkerState:
        """The state a restarted agent goes on from, as its state file kept it. A task without a
        process is forgotten (the master lists it again, and it starts then); one that was starting
        runs, reported started again; one that was stopping runs until a listing stops it again (its
        stop's timers did not survive); one given its notice is not given it again, and a stop with
        a notice waits from `now`.

        After the machine restarted (`rebooted`: its boot id changed) every task that had a process
        died with it: each is adopted as ever (its end found, its container dropped) but reported
        ended by its node (NodeLost, `node_side`), so its gang requeues uncharged and without this
        node, as when the master declares the node DOWN first. Read as an ordinary exit (no exit
        status: Signal) it failed the job for its machine's fault."""
        state = cls(stop_grace=stop_grace, known=known, done=set(done), unreported=list(unreported))
        for saved in tasks:
            if saved.handle is None:
                continue
            a = saved.assignment
            phase = "running" if saved.phase in ("starting", "stopping") else saved.phase
            state.tasks[a.key] = LocalTask(a, phase=phase, handle=saved.handle,
                                           noticed_at=now if saved.noticed else None, machine_restarted=rebooted)
            if saved.phase == "starting":
                state.unreported.append(Report(a.key, started=True))
        return state

    def view(self) -> StateView:
        """A frozen copy of what other threads may read."""
        return StateView(self.known, tuple(self.unreported), frozenset(self.tasks),
                         tuple(t.phase for t in self.tasks.values()),
                         MappingProxyType({k: (t.assignment, t.handle) for k, t in self.tasks.items()
                                           if t.handle is not None}))

    def handle(self, event: object, now: float) -> list[Instruction]:
        """Apply one event; returns what the agent must do. Reports accumulate in `unreported`."""
        match event:
            case AssignmentsReceived():
                return self._assigned(event, now)
            case TaskStarted():
                task = self.tasks.get(event.key)
                if task is None:
                    return [Signal(event.key, event.handle, signal.SIGKILL)]  # unknown: must not run
                task.handle = event.handle
                if task.phase == "starting":
                    task.phase = "running"
                self.unreported.append(Report(event.key, started=True))
                if task.phase == "stopping":  # a stop arrived while it was starting: nothing to save
                    task.term_at = None
                    return [Signal(event.key, event.handle, signal.SIGTERM)]
                return self._notice(event.key, task, task.notice_pending, now)
            case TaskCreated():
                return self._created(event)
            case TaskSetUp():
                if event.key in self.created and self.tasks[event.key].phase == "starting":
                    self.unreported.append(Report(event.key, started=False, prepared=True))
                return []
            case PullStarted():
                self.pulling.add(event.key)
                return []
            case ImageReady() | ImageFailed():
                self.pulling.discard(event.key)
                return self._pulled(event)
            case TaskStartFailed():
                self._exited(event.key, 127, event.reason, event.cause, event.node_side)
                return []
            case TaskExited():
                task = self.tasks.get(event.key)
                if task is not None and task.machine_restarted:
                    self._exited(event.key, event.exit_code, MACHINE_RESTARTED, EndReason.NODE_LOST, node_side=True)
                else:
                    self._exited(event.key, event.exit_code, event.reason, event.cause)
                return []
            case ReportsAcknowledged():
                acked = set(event.reports)
                self.unreported = [r for r in self.unreported if r not in acked]
                return []
            case Tick():
                return self._escalate(now)
        raise TypeError(f"unknown event {event!r}")

    def _assigned(self, event: AssignmentsReceived, now: float) -> list[Instruction]:
        if (event.term, event.version) < self.known:
            return []
        self.known = (event.term, event.version)
        self.holds = {a.key: a.hold for a in event.assignments}
        wanted = {a.key: a for a in event.assignments if not a.stop}
        stops = {a.key: a for a in event.assignments if a.stop}
        listed = {a.key for a in event.assignments}
        out: list[Instruction] = []
        for key, a in sorted(wanted.items()):
            if key not in self.tasks and key not in self.done:
                self.tasks[key] = LocalTask(a)
                out.append(Start(a))
            elif key in self.tasks and self.tasks[key].phase in ("starting", "running"):
                out += self._notice(key, self.tasks[key], notice_signal(a.notice_signal), now)
        for key, task in sorted(self.tasks.items()):
            if key not in wanted and task.phase in ("starting", "running"):
                out += self._stop(key, task, stops.get(key), now)
        # Tombstones the master no longer lists can go: a new attempt has a new key anyway.
        self.done &= listed | {r.key for r in self.unreported}
        return out + self._release()

    def _release(self) -> list[Instruction]:
        """After a listing: end the tasks it stopped while their image was pulled (the pull's outcome
        only unpins it: `_pulled`) or while they were held with their image; start the prepared
        tasks it no longer holds."""
        out: list[Instruction] = []
        for key, task in sorted(self.tasks.items()):
            if task.phase == "stopping" and task.handle is None and key in self.pulling:
                self._exited(key, 127, "stopped while its image was being pulled", EndReason.ERROR)
            elif task.phase == "stopping" and task.handle is None and key in self.prepared:
                out.append(Discard(task.assignment, self.created.pop(key, None)))
                self._exited(key, 127, "stopped before its gang started", EndReason.ERROR)
        for key in sorted(self.prepared):
            if not self.holds.get(key, True):
                out.append(Start(self.tasks[key].assignment, self.prepared.pop(key), self.created.pop(key, None)))
        return out

    def _created(self, event: TaskCreated) -> list[Instruction]:
        """A held task's sandbox sets up, to wait at its gate (prepared for the master once it is
        there: `TaskSetUp`); started at once if a listing released it meanwhile. One that is no
        longer prepared (it ended, or started another way) must never run."""
        task = self.tasks.get(event.key)
        if task is None or event.key not in self.prepared or event.key in self.created:
            return [Signal(event.key, event.handle, signal.SIGKILL)]
        self.created[event.key] = event.handle
        if not self.holds.get(event.key, True):
            return [Start(task.assignment, self.prepared.pop(event.key), self.created.pop(event.key))]
        return []

    def waits_for_image(self, key: Key) -> bool:
        """The task is to start once its image is on the node, and it is not yet."""
        task = self.tasks.get(key)
        return task is not None and task.phase == "starting" and task.handle is None and key not in self.prepared

    def _pulled(self, event: ImageReady | ImageFailed) -> list[Instruction]:
        """A pull ended: start its task, or hold it prepared for its gang, or end it ImagePullFailed;
        for a task that no longer waits for it, only unpin the image."""
        if not self.waits_for_image(event.key):
            return [Unpin(event.key)]
        a = self.tasks[event.key].assignment
        if isinstance(event, ImageFailed):
            self._exited(a.key, 127, event.message, EndReason.IMAGE_PULL_FAILED, event.node_side)
            return []
        if self.holds.get(a.key, a.hold):  # the gang waits for the image on its other nodes: create it
            self.prepared[a.key] = event.image
            return [Create(a, event.image)]
        return [Start(a, event.image)]

    def _notice(self, key: Key, task: LocalTask, sig: int, now: float) -> list[Instruction]:
        """Give the task its checkpoint notice `sig` once (0: none asked), or once it has a process."""
        if not sig or task.noticed_at is not None:
            return []
        if task.handle is None:
            task.notice_pending = sig
            return []
        task.notice_pending, task.noticed_at = 0, now
        return [Signal(key, task.handle, sig)]

    def _stop(self, key: Key, task: LocalTask, a: Assignment | None, now: float) -> list[Instruction]:
        """Stop a task no longer wanted (`a`: its stop listing, None if it is no longer listed):
        with a notice, the signal now (unless given already) and SIGTERM `notice` seconds after it;
        else SIGTERM now. SIGKILL follows SIGTERM after the grace (_escalate)."""
        task.phase, task.stop_requested_at = "stopping", now
        task.grace = a.grace if a is not None and a.grace > 0 else None
        sig = notice_signal(a.notice_signal) if a is not None and a.notice > 0 else 0
        if task.handle is None:  # not started: nothing to save, SIGTERM once it has a process
            return []
        out = self._notice(key, task, sig, now) if sig else []
        if sig and a is not None and task.noticed_at is not None and now < task.noticed_at + a.notice:
            task.term_at = task.noticed_at + a.notice
            task.stop_requested_at = None  # the grace counts from SIGTERM
            return out
        return out + [Signal(key, task.handle, signal.SIGTERM)]

    def _exited(self, key: Key, code: int, reason: str, cause: str, node_side: bool = False) -> None:
        task = self.tasks.pop(key, None)
        if task is None:
            return
        self.prepared.pop(key, None)
        self.created.pop(key, None)
        self.done.add(key)
        self.unreported.append(Report(key, started=False, exit_code=code, reason=reason, cause=cause,
                                      node_side=node_side))

    def _escalate(self, now: float) -> list[Instruction]:
        out: list[Instruction] = []
        for key, task in sorted(self.tasks.items()):
            if task.phase == "stopping" and task.term_at is not None and now >= task.term_at \
                    and task.handle is not None:  # the notice is over
                task.term_at, task.stop_requested_at = None, now
                out.append(Signal(key, task.handle, signal.SIGTERM))
                continue
            if (task.phase == "stopping" and not task.killed and task.handle is not None
                    and task.stop_requested_at is not None
                    and now - task.stop_requested_at >= (task.grace if task.grace is not None else self.stop_grace)):
                task.killed = True
                out.append(Signal(key, task.handle, signal.SIGKILL))
        return out

    def master_port_holder(self, a: Assignment) -> Key | None:
        """A started rank 0 of another attempt that this worker runs with `a`'s MASTER_PORT: its
        rendezvous may hold the port, or may be about to bind it (the agent checks before it starts
        a rank 0; synapse.core.rendezvous)."""
        for key, task in sorted(self.tasks.items()):
            other = task.assignment
            if (task.handle is not None and other.rank == 0 and other.master_port == a.master_port
                    and key[:2] != a.key[:2]):
                return key
        return None

    def validate(self) -> None:
        """Raise AssertionError if the bookkeeping contradicts itself (tests call it after each scenario)."""
        for key, task in self.tasks.items():
            assert key == task.assignment.key, f"task {key} filed under another key"
            assert key not in self.done, f"task {key} both live and done"
            assert task.term_at is None or (task.phase == "stopping" and task.noticed_at is not None
                                            and task.stop_requested_at is None), \
                f"task {key} waits for SIGTERM without a notice, or after it"
            assert not (task.notice_pending and task.handle is not None), f"task {key} has a process and a notice owed"
        for key in self.pulling:
            assert key not in self.tasks or (self.tasks[key].handle is None and key not in self.prepared), \
                f"task {key} pulled and started or prepared"
        for key in self.prepared:
            task = self.tasks.get(key)
            assert task is not None and task.phase == "starting" and task.handle is None, \
                f"task {key} prepared but gone, started or stopping"
        for key in self.created:
            assert key in self.prepared, f"task {key} created but not prepared"

    def running(self) -> list[LocalTask]:
        """Tasks with a process to watch."""
        return [t for t in self.tasks.values() if t.handle is not None]
