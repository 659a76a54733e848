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
* Every start and exit is reported until the master acknowledges it.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from synapse.core.model import Assignment, EndReason
from synapse.worker.runtime import Handle

Key = tuple[str, int, int]


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
    cause: str = EndReason.ERROR  #: MasterPortInUse when rank 0's port was taken (it never started)


@dataclass(frozen=True, slots=True)
class TaskExited:
    key: Key
    exit_code: int
    reason: str = ""
    cause: str = ""  #: Completed, Error, Signal or OOMKilled (runtime.read_outcome)


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
    """One fact for the master: a task started, or exited with a code."""

    key: Key
    started: bool
    exit_code: int = 0
    reason: str = ""
    cause: str = ""


@dataclass(slots=True)
class LocalTask:
    assignment: Assignment
    phase: str = "starting"  #: starting -> running -> (stopping ->) exited
    handle: Handle | None = None
    stop_requested_at: float | None = None
    grace: float | None = None  #: this stop's seconds from SIGTERM to SIGKILL, if the master set one
    killed: bool = False  #: SIGKILL sent
    exit_code: int | None = None


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
                if task.phase == "stopping":  # a stop arrived while it was starting
                    return [Signal(event.key, event.handle, signal.SIGTERM)]
                return []
            case TaskStartFailed():
                self._exited(event.key, 127, event.reason, event.cause)
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
        graces = {a.key: a.grace for a in event.assignments if a.stop and a.grace > 0}
        listed = {a.key for a in event.assignments}
        out: list[Start | Signal] = []
        for key, a in sorted(wanted.items()):
            if key not in self.tasks and key not in self.done:
                self.tasks[key] = LocalTask(a)
                out.append(Start(a))
        for key, task in sorted(self.tasks.items()):
            if key not in wanted and task.phase in ("starting", "running"):
                task.phase, task.stop_requested_at, task.grace = "stopping", now, graces.get(key)
                if task.handle is not None:
                    out.append(Signal(key, task.handle, signal.SIGTERM))
        # Tombstones the master no longer lists can go: a new attempt has a new key anyway.
        self.done &= listed | {r.key for r in self.unreported}
        return out

    def _exited(self, key: Key, code: int, reason: str, cause: str) -> None:
        task = self.tasks.pop(key, None)
        if task is None:
            return
        self.done.add(key)
        self.unreported.append(Report(key, started=False, exit_code=code, reason=reason, cause=cause))

    def _escalate(self, now: float) -> list[Start | Signal]:
        out: list[Start | Signal] = []
        for key, task in sorted(self.tasks.items()):
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

    def running(self) -> list[LocalTask]:
        """Tasks with a process to watch."""
        return [t for t in self.tasks.values() if t.handle is not None]
