"""The worker's state machine, fed events; asserts the exact instructions that come out."""

import signal

from synapse.core.model import Assignment
from synapse.worker.runtime import Handle
from synapse.worker.state import (
    MACHINE_RESTARTED,
    AssignmentsReceived,
    Create,
    Discard,
    ImageFailed,
    ImageReady,
    Outbox,
    PullStarted,
    Report,
    ReportsAcknowledged,
    SavedTask,
    Signal,
    Start,
    StateView,
    TaskCreated,
    TaskExited,
    TaskSetUp,
    TaskStarted,
    TaskStartFailed,
    Tick,
    Unpin,
    WorkerState,
    notice_signal,
)


def assignment(job="j", attempt=1, index=0, stop=False, port=29500, grace=0.0, notice_signal="", notice=0.0,
               hold=False):
    return Assignment(job_id=job, attempt=attempt, index=index, rank=index, world_size=2, local_rank=0,
                      local_world_size=1, node_rank=index, master_addr="h", master_port=port, gpus=(0,),
                      command=("true",), env=(), stop=stop, grace=grace, notice_signal=notice_signal, notice=notice,
                      hold=hold)


def running(s: WorkerState, a: Assignment, now: float = 0) -> None:
    s.handle(AssignmentsReceived(1, 1, (a,)), now=now)
    s.handle(TaskStarted(a.key, HANDLE), now=now)


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


# ---- the checkpoint notice -----------------------------------------------------------------------


def test_a_planned_stop_signals_waits_its_notice_then_terms_then_kills_after_the_grace():
    s = WorkerState(stop_grace=10)
    a = assignment()
    running(s, a)
    drain = assignment(stop=True, grace=5, notice_signal="USR1", notice=3)
    assert s.handle(AssignmentsReceived(1, 2, (drain,)), now=10) == [Signal(a.key, HANDLE, signal.SIGUSR1)]
    assert s.handle(AssignmentsReceived(1, 3, (drain,)), now=11) == []  # listed again: one notice
    assert s.handle(Tick(), now=12.9) == []
    assert s.handle(Tick(), now=13) == [Signal(a.key, HANDLE, signal.SIGTERM)]
    assert s.handle(Tick(), now=17.9) == []  # the grace counts from SIGTERM, not from the notice
    assert s.handle(Tick(), now=18) == [Signal(a.key, HANDLE, signal.SIGKILL)]
    assert s.handle(Tick(), now=30) == []
    s.validate()


def test_a_notice_while_wanted_is_given_once_and_the_stop_after_it_terms_when_the_notice_is_over():
    s = WorkerState(stop_grace=10)
    a = assignment()
    running(s, a)
    noticed = assignment(notice_signal="USR1", notice=120)  # its time limit is near
    assert s.handle(AssignmentsReceived(1, 2, (noticed,)), now=100) == [Signal(a.key, HANDLE, signal.SIGUSR1)]
    assert s.handle(AssignmentsReceived(1, 3, (noticed,)), now=101) == []
    # The stop at the limit: the notice is over, SIGTERM at once and no second notice.
    limit = assignment(stop=True, notice_signal="USR1", notice=120)
    assert s.handle(AssignmentsReceived(1, 4, (limit,)), now=220) == [Signal(a.key, HANDLE, signal.SIGTERM)]
    s.validate()


def test_a_planned_stop_during_an_earlier_notice_terms_when_that_notice_is_over():
    s = WorkerState()
    a = assignment()
    running(s, a)
    s.handle(AssignmentsReceived(1, 2, (assignment(notice_signal="USR1", notice=60),)), now=100)
    drain = assignment(stop=True, notice_signal="USR1", notice=60)
    assert s.handle(AssignmentsReceived(1, 3, (drain,)), now=130) == []  # noticed at 100
    assert s.handle(Tick(), now=159) == []
    assert s.handle(Tick(), now=160) == [Signal(a.key, HANDLE, signal.SIGTERM)]
    s.validate()


def test_a_stop_that_is_not_planned_terms_at_once_even_during_a_notice():
    s = WorkerState(stop_grace=10)
    a = assignment()
    running(s, a)
    s.handle(AssignmentsReceived(1, 2, (assignment(notice_signal="USR1", notice=60),)), now=100)
    cancel = assignment(stop=True, grace=2)
    assert s.handle(AssignmentsReceived(1, 3, (cancel,)), now=110) == [Signal(a.key, HANDLE, signal.SIGTERM)]
    assert s.handle(Tick(), now=112) == [Signal(a.key, HANDLE, signal.SIGKILL)]
    b = assignment(job="b")
    assert s.handle(AssignmentsReceived(1, 4, (cancel, b)), now=115) == [Start(b)]
    s.handle(TaskStarted(b.key, HANDLE), now=115)
    unlisted = s.handle(AssignmentsReceived(1, 5, (cancel,)), now=120)
    assert unlisted == [Signal(b.key, HANDLE, signal.SIGTERM)]
    s.validate()


def test_a_task_stopped_before_its_process_started_gets_sigterm_without_a_notice():
    s = WorkerState()
    a = assignment()
    s.handle(AssignmentsReceived(1, 1, (a,)), now=0)
    drain = assignment(stop=True, notice_signal="USR1", notice=30)
    assert s.handle(AssignmentsReceived(1, 2, (drain,)), now=1) == []
    assert s.handle(TaskStarted(a.key, HANDLE), now=2) == [Signal(a.key, HANDLE, signal.SIGTERM)]
    assert s.handle(Tick(), now=10.9) == []
    assert s.handle(Tick(), now=11) == [Signal(a.key, HANDLE, signal.SIGKILL)]  # the grace from the stop, as ever
    s.validate()


def test_a_notice_for_a_task_still_starting_is_given_once_it_has_a_process():
    s = WorkerState()
    a = assignment()
    s.handle(AssignmentsReceived(1, 1, (a,)), now=0)
    assert s.handle(AssignmentsReceived(1, 2, (assignment(notice_signal="HUP", notice=60),)), now=1) == []
    s.validate()
    assert s.handle(TaskStarted(a.key, HANDLE), now=2) == [Signal(a.key, HANDLE, signal.SIGHUP)]
    assert s.tasks[a.key].noticed_at == 2
    s.validate()


def test_a_signal_this_machine_does_not_know_is_no_notice():
    assert notice_signal("USR2") == signal.SIGUSR2 and notice_signal("") == 0 and notice_signal("NOPE") == 0
    s = WorkerState()
    a = assignment()
    running(s, a)
    odd = assignment(stop=True, notice_signal="NOPE", notice=30)
    assert s.handle(AssignmentsReceived(1, 2, (odd,)), now=1) == [Signal(a.key, HANDLE, signal.SIGTERM)]


# ---- tasks in images: pulled, held for the gang, released --------------------------------------------

IMAGE = object()  #: stands for the store's Image: the state only hands it back


def test_a_task_not_held_starts_with_its_image_once_pulled():
    s = WorkerState()
    a = assignment()
    assert s.handle(AssignmentsReceived(1, 1, (a,)), now=0) == [Start(a)]
    assert s.waits_for_image(a.key)
    assert s.handle(ImageReady(a.key, IMAGE), now=1) == [Start(a, IMAGE)]
    assert s.handle(TaskStarted(a.key, HANDLE), now=2) == []
    assert not s.waits_for_image(a.key) and s.unreported == [Report(a.key, started=True)]
    s.validate()


CREATED = Handle(pid=5151, start_ticks=2, exit_file="/c.exit", log_file="/c.log")


def test_a_held_task_is_created_prepared_and_started_by_opening_its_gate_when_a_listing_releases_it():
    s = WorkerState()
    a = assignment(hold=True)
    s.handle(AssignmentsReceived(1, 1, (a,)), now=0)
    assert s.handle(ImageReady(a.key, IMAGE), now=1) == [Create(a, IMAGE)]  # set up now, gated
    assert s.handle(TaskCreated(a.key, CREATED), now=1) == []
    # Prepared for the master once its sandbox is at its gate: the release must not race its set-up.
    assert s.unreported == [] and s.prepared == {a.key: IMAGE} and s.created == {a.key: CREATED}
    assert s.handle(TaskSetUp(a.key), now=1) == []
    assert s.unreported == [Report(a.key, started=False, prepared=True)]
    assert s.running() == [] and s.tasks[a.key].handle is None  # not polled, not adopted: it has not run
    assert s.handle(AssignmentsReceived(1, 2, (a,)), now=2) == []  # still held
    assert s.handle(AssignmentsReceived(0, 9, (assignment(),)), now=3) == []  # an old leader's: ignored
    # Released: the created process starts (the agent opens its gate, then reports it started).
    assert s.handle(AssignmentsReceived(1, 3, (assignment(),)), now=4) == [Start(a, IMAGE, CREATED)]
    assert s.prepared == {} and s.created == {}
    s.validate()
    assert s.handle(TaskStarted(a.key, CREATED), now=4) == []
    assert s.unreported[-1] == Report(a.key, started=True) and s.running()[0].handle == CREATED
    s.validate()


def created(s: WorkerState, a: Assignment) -> None:
    """`a` listed held, its image here, its sandbox created (as CREATED), not yet at its gate."""
    s.handle(AssignmentsReceived(1, 1, (a,)), now=0)
    s.handle(ImageReady(a.key, IMAGE), now=1)
    s.handle(TaskCreated(a.key, CREATED), now=1)


def test_a_held_task_whose_creation_failed_ends_unprepared():
    s = WorkerState()
    a = assignment(hold=True)
    s.handle(AssignmentsReceived(1, 1, (a,)), now=0)
    s.handle(ImageReady(a.key, IMAGE), now=1)
    assert s.handle(TaskStartFailed(a.key, "mount /x: not under a prefix"), now=1) == []
    assert s.unreported == [Report(a.key, started=False, exit_code=127, reason="mount /x: not under a prefix",
                                   cause="Error")]
    assert not s.prepared and not s.created and a.key in s.done
    s.validate()


def test_a_created_task_that_is_no_longer_prepared_is_killed():
    s = WorkerState()
    a = assignment(hold=True)
    created(s, a)
    other = Handle(pid=6161, start_ticks=3, exit_file="/o.exit", log_file="/o.log")
    assert s.handle(TaskCreated(a.key, other), now=1) == [Signal(a.key, other, signal.SIGKILL)]  # a second one
    assert s.handle(TaskCreated(("gone", 1, 0), other), now=1) == [Signal(("gone", 1, 0), other, signal.SIGKILL)]
    assert s.created == {a.key: CREATED}
    s.handle(TaskSetUp(a.key), now=1)
    s.handle(TaskSetUp(("gone", 1, 0)), now=1)  # no longer created: nothing to say
    assert s.unreported == [Report(a.key, started=False, prepared=True)]
    s.validate()


def test_a_listing_that_releases_a_task_before_its_image_is_here_starts_it_when_pulled():
    s = WorkerState()
    a = assignment(hold=True)
    s.handle(AssignmentsReceived(1, 1, (a,)), now=0)
    s.handle(AssignmentsReceived(1, 2, (assignment(),)), now=1)
    assert s.handle(ImageReady(a.key, IMAGE), now=2) == [Start(a, IMAGE)]


def test_a_prepared_task_stopped_ends_and_its_container_goes_with_its_created_process():
    s = WorkerState()
    a, b = assignment(hold=True), assignment(index=1, hold=True)
    s.handle(AssignmentsReceived(1, 1, (a, b)), now=0)
    s.handle(ImageReady(a.key, IMAGE), now=1)  # a: prepared, not yet created
    s.handle(ImageReady(b.key, IMAGE), now=1)
    s.handle(TaskCreated(b.key, CREATED), now=1)
    stop_b = assignment(index=1, hold=True, stop=True)
    # b's process is killed (SIGKILL: its command never ran); a has none.
    assert s.handle(AssignmentsReceived(1, 2, (stop_b,)), now=2) == [Discard(a), Discard(b, CREATED)]
    assert s.unreported[-2:] == [Report(k, started=False, exit_code=127, reason="stopped before its gang started",
                                        cause="Error") for k in (a.key, b.key)]
    assert not s.tasks and not s.prepared and not s.created and {a.key, b.key} <= s.done
    assert s.handle(AssignmentsReceived(1, 3, (assignment(index=1),)), now=3) == []  # never started, even released
    s.validate()


def test_a_created_task_is_forgotten_by_a_restarted_worker():
    a = assignment(hold=True)
    s = WorkerState.restore(stop_grace=3, known=(1, 1), done=[], unreported=[],
                            tasks=[SavedTask(a, "starting", None)], now=5)  # runtime.find killed it
    assert s.tasks == {} and s.handle(AssignmentsReceived(1, 2, (a,)), now=6) == [Start(a)]


def test_a_task_stopped_while_its_image_is_pulled_ends_at_once_and_the_pull_only_unpins():
    s = WorkerState()
    a, b = assignment(), assignment(index=1)
    s.handle(AssignmentsReceived(1, 1, (a, b)), now=0)
    s.handle(PullStarted(a.key), now=0)
    s.handle(PullStarted(b.key), now=0)
    assert s.handle(AssignmentsReceived(1, 2, (b,)), now=1) == []
    assert s.unreported == [Report(a.key, started=False, exit_code=127,
                                   reason="stopped while its image was being pulled", cause="Error")]
    assert s.handle(ImageReady(a.key, IMAGE), now=2) == [Unpin(a.key)]
    assert s.handle(ImageFailed(b.key, "node n: image x: NOT_FOUND: gone", node_side=False), now=3) == []
    assert s.unreported[-1] == Report(b.key, started=False, exit_code=127, reason="node n: image x: NOT_FOUND: gone",
                                      cause="ImagePullFailed")
    assert not s.tasks
    s.validate()


# ---- restored after a restart, and read by other threads --------------------------------------------

def test_restore_readopts_tasks_with_a_process_and_forgets_the_others():
    starting, running_, stopping, never = (assignment(index=i) for i in range(4))
    s = WorkerState.restore(stop_grace=3, known=(2, 7), done=[("old", 1, 0)], unreported=[Report(("old", 1, 0), False)],
                            tasks=[SavedTask(starting, "starting", HANDLE), SavedTask(running_, "running", HANDLE,
                                                                                    noticed=True),
                                   SavedTask(stopping, "stopping", HANDLE), SavedTask(never, "starting", None)],
                            now=50)
    assert (s.stop_grace, s.known, s.done) == (3, (2, 7), {("old", 1, 0)})
    assert sorted(s.tasks) == [starting.key, running_.key, stopping.key]
    assert {t.phase for t in s.tasks.values()} == {"running"}  # a stop's timers did not survive: listed again
    assert s.unreported == [Report(("old", 1, 0), False), Report(starting.key, started=True)]
    assert s.tasks[running_.key].noticed_at == 50 and s.tasks[starting.key].noticed_at is None
    # The next listing stops the one that was stopping, and never starts the forgotten one twice.
    assert s.handle(AssignmentsReceived(2, 8, (starting, running_, never)), now=51) == \
        [Start(never), Signal(stopping.key, HANDLE, signal.SIGTERM)]
    s.validate()


def test_the_view_is_a_copy_of_one_moment():
    s = WorkerState()
    a = assignment()
    assert s.view() == StateView()
    running(s, a)
    view = s.view()
    assert view == StateView((1, 1), (Report(a.key, started=True),), frozenset({a.key}), ("running",),
                             {a.key: (a, HANDLE)})
    s.handle(ReportsAcknowledged(view.unreported), now=1)
    s.handle(TaskExited(a.key, 0), now=1)
    assert view.unreported == (Report(a.key, started=True),) and a.key in view.tasks  # unchanged
    assert view.processes == {a.key: (a, HANDLE)}
    assert s.view().tasks == frozenset() and s.view().unreported == (Report(a.key, started=False),)
    assert s.view().processes == {}


def test_a_task_that_died_with_its_machine_is_reported_ended_by_its_node():
    """A worker back after its machine restarted (another boot id) finds its tasks dead without an
    exit status: NodeLost and node-side (the gang requeues uncharged, without this node), not
    Signal (a failure charged to the job). Without a restart the same end stays Signal."""
    a, b = assignment(), assignment(index=1)
    for rebooted, expected in ((True, Report(a.key, started=False, exit_code=-1, reason=MACHINE_RESTARTED,
                                             cause="NodeLost", node_side=True)),
                               (False, Report(a.key, started=False, exit_code=-1, reason="no exit status",
                                              cause="Signal"))):
        s = WorkerState.restore(stop_grace=3, known=(1, 1), done=[], unreported=[],
                                tasks=[SavedTask(a, "running", HANDLE), SavedTask(b, "starting", None)], now=5,
                                rebooted=rebooted)
        assert set(s.tasks) == {a.key}  # adopted as ever: its end is found and its container dropped
        assert s.handle(TaskExited(a.key, -1, "no exit status", "Signal"), now=6) == []
        assert s.unreported == [expected] and a.key in s.done
        s.validate()


def test_the_outbox_holds_back_what_the_master_acknowledged_until_the_main_loop_takes_it_in():
    start, end = Report(("j", 1, 0), started=True), Report(("j", 1, 0), started=False, exit_code=0)
    outbox = Outbox()
    assert outbox.due((start,)) == [start]
    outbox.acknowledged([start])
    assert outbox.due((start,)) == []  # the acknowledgement still waits in the main loop's queue
    assert outbox.due((start, end)) == [end]
    assert outbox.due((end,)) == [end]  # taken in: forgotten, so the end is all that is left
    outbox.acknowledged([end])
    assert outbox.due(()) == []
    assert outbox.due((end,)) == [end]  # a report owed again (a new agent's restore) goes again
