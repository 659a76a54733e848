"""The worker's bookkeeping as a state machine: events in, instructions out.

Only `WorkerState.handle` changes the state. The agent (`agent.py`) turns network messages and
process observations into events, and carries out the instructions it gets back: start a task,
signal one, report to the master. Nothing here does I/O, so every rule is tested by feeding
events and asserting the exact instructions.

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
  being on the node (`TaskPrepared`: its gang starts once every task is, synapse.master.dispatch).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from synapse.core.model import Assignment, EndReason
from synapse.worker.runtime import Handle

Key = tuple[str, int, int]


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
class TaskPrepared:
    """A held task's image is on the node: the master hears it, and lists the task unheld once every
    task of its gang is prepared."""

    key: Key


@dataclass(frozen=True, slots=True)
class ReportsAcknowledged:
    reports: tuple[Report, ...]


@dataclass(frozen=True, slots=True)
class Tick:
    pass


# ---- instructions ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Start:
    assignment: Assignment


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


@dataclass(slots=True)
class WorkerState:
    """What this worker runs and what the master has yet to hear."""

    stop_grace: float = 10.0  #: seconds between SIGTERM and SIGKILL
    known: tuple[int, int] = (0, 0)  #: newest (term, version) of assignments applied
    tasks: dict[Key, LocalTask] = field(default_factory=dict)  #: tasks not yet exited and reported
    done: set[Key] = field(default_factory=set)  #: keys that ran here and ended: never started again
    unreported: list[Report] = field(default_factory=list)  #: facts the master has not acknowledged

    def handle(self, event: object, now: float) -> list[Start | Signal]:
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
            case TaskPrepared():
                task = self.tasks.get(event.key)
                if task is not None and task.phase == "starting" and task.handle is None:
                    self.unreported.append(Report(event.key, started=False, prepared=True))
                return []
            case TaskStartFailed():
                self._exited(event.key, 127, event.reason, event.cause, event.node_side)
                return []
            case TaskExited():
                self._exited(event.key, event.exit_code, event.reason, event.cause)
                return []
            case ReportsAcknowledged():
                acked = set(event.reports)
                self.unreported = [r for r in self.unreported if r not in acked]
                return []
            case Tick():
                return self._escalate(now)
        raise TypeError(f"unknown event {event!r}")

    def _assigned(self, event: AssignmentsReceived, now: float) -> list[Start | Signal]:
        if (event.term, event.version) < self.known:
            return []
        self.known = (event.term, event.version)
        wanted = {a.key: a for a in event.assignments if not a.stop}
        stops = {a.key: a for a in event.assignments if a.stop}
        listed = {a.key for a in event.assignments}
        out: list[Start | Signal] = []
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
        return out

    def _notice(self, key: Key, task: LocalTask, sig: int, now: float) -> list[Start | Signal]:
        """Give the task its checkpoint notice `sig` once (0: none asked), or once it has a process."""
        if not sig or task.noticed_at is not None:
            return []
        if task.handle is None:
            task.notice_pending = sig
            return []
        task.notice_pending, task.noticed_at = 0, now
        return [Signal(key, task.handle, sig)]

    def _stop(self, key: Key, task: LocalTask, a: Assignment | None, now: float) -> list[Start | Signal]:
        """Stop a task no longer wanted (`a`: its stop listing, None if it is no longer listed):
        with a notice, the signal now (unless given already) and SIGTERM `notice` seconds after it;
        else SIGTERM now. SIGKILL follows SIGTERM after the grace (_escalate)."""
        task.phase, task.stop_requested_at = "stopping", now
        task.grace = a.grace if a is not None and a.grace > 0 else None
        sig = notice_signal(a.notice_signal) if a is not None and a.notice > 0 else 0
        if task.handle is None:  # not started: nothing to save, SIGTERM once it has a process
            return []
        out = self._notice(key, task, sig, now) if sig else []
        if sig and task.noticed_at is not None and now < task.noticed_at + a.notice:  # type: ignore[union-attr]
            task.term_at = task.noticed_at + a.notice  # type: ignore[union-attr]
            task.stop_requested_at = None  # the grace counts from SIGTERM
            return out
        return out + [Signal(key, task.handle, signal.SIGTERM)]

    def _exited(self, key: Key, code: int, reason: str, cause: str, node_side: bool = False) -> None:
        task = self.tasks.pop(key, None)
        if task is None:
            return
        self.done.add(key)
        self.unreported.append(Report(key, started=False, exit_code=code, reason=reason, cause=cause,
                                      node_side=node_side))

    def _escalate(self, now: float) -> list[Start | Signal]:
        out: list[Start | Signal] = []
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

    def running(self) -> list[LocalTask]:
        """Tasks with a process to watch."""
        return [t for t in self.tasks.values() if t.handle is not None]
