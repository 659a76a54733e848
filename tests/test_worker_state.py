"""The worker's state machine, fed events; asserts the exact instructions that come out."""

import signal

from synapse.core.model import Assignment
from synapse.worker.runtime import Handle
from synapse.worker.state import (
    AssignmentsReceived,
    Report,
    ReportsAcknowledged,
    Signal,
    Start,
    TaskExited,
    TaskStarted,
    TaskStartFailed,
    Tick,
    WorkerState,
)


def assignment(job="j", attempt=1, index=0, stop=False, port=29500):
    return Assignment(job_id=job, attempt=attempt, index=index, rank=index, world_size=2, local_rank=0,
                      local_world_size=1, node_rank=index, master_addr="h", master_port=port, gpus=(0,),
                      command=("true",), env=(), stop=stop)


HANDLE = Handle(pid=4242, start_ticks=1, exit_file="/x.exit", log_file="/x.log")


def test_starts_what_is_wanted_once_and_reports_it():
    s = WorkerState()
    a = assignment()
    assert s.handle(AssignmentsReceived(1, 10, (a,)), now=0) == [Start(a)]
    assert s.handle(AssignmentsReceived(1, 11, (a,)), now=0) == []  # already starting
    assert s.handle(TaskStarted(a.key, HANDLE), now=0) == []
    assert s.unreported == [Report(a.key, started=True)]
    s.handle(ReportsAcknowledged((Report(a.key, started=True),)), now=0)
    assert s.unreported == []


def test_older_assignments_are_ignored():
    s = WorkerState()
    a, b = assignment(index=0), assignment(index=1)
    s.handle(AssignmentsReceived(2, 5, (a,)), now=0)
    s.handle(TaskStarted(a.key, HANDLE), now=0)
    # A late message from the previous leader (term 1) would stop `a` and start `b`: ignored.
    assert s.handle(AssignmentsReceived(1, 99, (b,)), now=0) == []
    assert s.known == (2, 5) and list(s.tasks) == [a.key]


def test_unwanted_task_gets_sigterm_then_sigkill_after_grace():
    s = WorkerState(stop_grace=10)
    a = assignment()
    s.handle(AssignmentsReceived(1, 1, (a,)), now=0)
    s.handle(TaskStarted(a.key, HANDLE), now=0)
    assert s.handle(AssignmentsReceived(1, 2, (assignment(stop=True),)), now=5) == \
        [Signal(a.key, HANDLE, signal.SIGTERM)]
    assert s.handle(Tick(), now=14) == []
    assert s.handle(Tick(), now=15) == [Signal(a.key, HANDLE, signal.SIGKILL)]
    assert s.handle(Tick(), now=16) == []  # killed once
    s.handle(TaskExited(a.key, -9), now=17)
    assert s.unreported[-1] == Report(a.key, started=False, exit_code=-9)


def test_a_task_that_ended_is_never_started_again():
    s = WorkerState()
    a = assignment()
    s.handle(AssignmentsReceived(1, 1, (a,)), now=0)
    s.handle(TaskStarted(a.key, HANDLE), now=0)
    s.handle(TaskExited(a.key, 0), now=1)
    # The master has not applied the exit yet and still lists the task: it must not run twice.
    assert s.handle(AssignmentsReceived(1, 2, (a,)), now=2) == []
    # A new attempt is a new key and does start.
    a2 = assignment(attempt=2)
    assert s.handle(AssignmentsReceived(1, 3, (a2,)), now=3) == [Start(a2)]


def test_stop_while_starting_signals_once_started():
    s = WorkerState()
    a = assignment()
    s.handle(AssignmentsReceived(1, 1, (a,)), now=0)
    assert s.handle(AssignmentsReceived(1, 2, ()), now=0) == []  # no process yet to signal
    assert s.handle(TaskStarted(a.key, HANDLE), now=0) == [Signal(a.key, HANDLE, signal.SIGTERM)]


def test_task_unknown_to_the_state_is_killed():
    s = WorkerState()
    assert s.handle(TaskStarted(("x", 1, 0), HANDLE), now=0) == [Signal(("x", 1, 0), HANDLE, signal.SIGKILL)]


def test_a_started_rank_0_of_another_attempt_holds_its_master_port():
    s = WorkerState()
    a, b = assignment(job="a", port=23456), assignment(job="b", port=23456)
    s.handle(AssignmentsReceived(1, 1, (a, b, assignment(job="a", index=1, port=23456))), now=0)
    assert s.master_port_holder(a) is None and s.master_port_holder(b) is None  # neither started yet
    s.handle(TaskStarted(a.key, HANDLE), now=0)
    assert s.master_port_holder(b) == a.key
    assert s.master_port_holder(a) is None  # its own attempt's does not count
    assert s.master_port_holder(assignment(job="b", attempt=2, port=23457)) is None
    assert s.master_port_holder(assignment(job="a", attempt=2, port=23456)) == a.key  # an old attempt does
    s.handle(TaskExited(a.key, 0), now=1)
    assert s.master_port_holder(b) is None


def test_a_rank_0_not_started_for_its_port_reports_that_cause():
    s = WorkerState()
    a = assignment()
    s.handle(AssignmentsReceived(1, 1, (a,)), now=0)
    s.handle(TaskStartFailed(a.key, "MASTER_PORT 29500 in use on node n", "MasterPortInUse"), now=0)
    assert s.unreported == [Report(a.key, started=False, exit_code=127, reason="MASTER_PORT 29500 in use on node n",
                                   cause="MasterPortInUse")]
    assert a.key in s.done and not s.tasks
