"""The pieces of `synctl run` and `synctl exec` without a cluster: the exec event in the state
machine, the tickets' purposes, the exit status of a job's ranks, labelled output, and the stdin
host's frames."""

from __future__ import annotations

import io

import pytest

from synapse.client.attach import Output, exit_status
from synapse.common import tickets
from synapse.core import commands as c
from synapse.core.model import Placement
from synapse.proto import api_pb2
from synapse.worker import stdio_host
from tests.support.helpers import checked, cluster, spec

N0, N1 = "r0-n0", "r0-n1"


def running(state, job_id="j", user="alice"):
    checked(state, c.SubmitJob(at=1, by=user, job_id=job_id, request_id=job_id, spec=spec(tasks=2)))
    checked(state, c.CommitPlan(at=2, job_id=job_id, attempt=1, placements=tuple(
        Placement(i, n, tuple(range(8)), i) for i, n in enumerate((N0, N1)))))
    for index, node in ((0, N0), (1, N1)):
        checked(state, c.TaskStarted(at=3, job_id=job_id, attempt=1, index=index, node_id=node))


def test_an_exec_is_a_job_event_naming_who_ran_what_in_which_task():
    state = cluster(racks=1, nodes_per_rack=2)
    running(state)
    assert state.apply(c.RecordExec(at=5, by="alice", job_id="j", attempt=1, index=1, command=("sh", "-c", "ls"))).ok
    event = state.jobs["j"].events[-1]
    assert (event.kind, event.message) == ("Exec", "alice ran in task 1: sh -c ls")
    assert [e.reason for e in state.events_after(0)][-1] == "TaskExec"
    long = ("x" * 400,)
    assert state.apply(c.RecordExec(at=6, by="alice", job_id="j", attempt=1, index=0, command=long)).ok
    assert len(state.jobs["j"].events[-1].message) < 330 and state.jobs["j"].events[-1].message.endswith("…")
    for refused in (c.RecordExec(at=7, job_id="j", attempt=2, index=0, command=("ls",)),
                    c.RecordExec(at=7, job_id="j", attempt=1, index=2, command=("ls",)),
                    c.RecordExec(at=7, job_id="j", attempt=1, index=0, command=()),
                    c.RecordExec(at=7, job_id="ghost", attempt=1, index=0, command=("ls",))):
        assert not state.apply(refused).ok, refused


def test_tickets_open_only_what_they_were_signed_for():
    key, at = "node-credential", 1000.0
    log = tickets.sign(key, "j", 1, 0, at + 60)
    attach = tickets.sign(key, "j", 1, 0, at + 60, tickets.ATTACH)
    exec_ls = tickets.sign(key, "j", 1, 0, at + 60, tickets.exec_purpose(("ls", "-l")))
    assert tickets.problem(key, log, "j", 1, 0, at) == ""
    assert tickets.problem(key, attach, "j", 1, 0, at, tickets.ATTACH) == ""
    assert tickets.problem(key, exec_ls, "j", 1, 0, at, tickets.exec_purpose(["ls", "-l"])) == ""
    assert "not for this task" in tickets.problem(key, log, "j", 1, 0, at, tickets.ATTACH)
    assert "not for this task" in tickets.problem(key, attach, "j", 1, 0, at)
    assert "not for this command" in tickets.problem(key, exec_ls, "j", 1, 0, at, tickets.exec_purpose(["ls"]))
    # the words' boundaries count: `ls -l` is not `ls` with the argument `-l` joined differently
    assert tickets.problem(key, exec_ls, "j", 1, 0, at, tickets.exec_purpose(["ls -l"]))
    assert "expired" in tickets.problem(key, attach, "j", 1, 0, at + 61, tickets.ATTACH)


def task(index, code=None, reason="", rank=None, message=""):
    return api_pb2.TaskInfo(index=index, rank=index if rank is None else rank, exit_code=code or 0,
                            has_exit_code=code is not None, reason=reason, reason_message=message)


@pytest.mark.parametrize("tasks, expected", [
    ([task(0, 0, "Completed"), task(1, 0, "Completed")], (0, "")),
    ([task(0, 3, "Error"), task(1, 3, "Error")], (3, "")),
    # rank 1 failed first; the gang's stop then ended rank 0 with SIGTERM: the failure decides
    ([task(0, 143, "Signal"), task(1, 3, "Error")], (3, "")),
    ([task(0, 1, "Error"), task(1, 139, "Signal")], (139, "")),  # a crash of its own counts
    ([task(0, 130, "Signal")], (130, "")),  # Ctrl-C: 128+SIGINT
    ([task(0, 127, "CommandNotFound")], (127, "")),
    ([task(0, 143, "Cancelled", message="by alice")], (143, "task 0 (rank 0): Cancelled: by alice")),
    ([task(0, None, "ImagePullFailed", message="no such image")], (1, "task 0 (rank 0): ImagePullFailed: "
                                                                      "no such image")),
])
def test_the_exit_status_is_the_worst_ranks(tasks, expected):
    assert exit_status(tasks) == expected


def test_labelled_output_prefixes_whole_lines_and_ends_an_unfinished_one():
    out, err = io.BytesIO(), io.BytesIO()
    output = Output(out, err, label=True, ranks={0: 1, 1: 0})
    output.write(0, "stdout", b"a\nb")
    output.write(1, "stdout", b"x\n")
    output.write(0, "stdout", b"c\n")
    output.write(0, "stderr", b"oops")
    output.flush(0)
    assert out.getvalue() == b"[rank 1] a\n[rank 0] x\n[rank 1] bc\n"
    assert err.getvalue() == b"[rank 1] oops\n"
    plain = io.BytesIO()
    Output(plain, err, label=False, ranks={}).write(0, "stdout", b"raw")
    assert plain.getvalue() == b"raw"


def test_frames_fit_a_pipes_atomic_write():
    frames = stdio_host.frames(stdio_host.DATA, b"y" * 10_000)
    assert len(frames) == 3 and all(len(f) <= stdio_host.MAX_FRAME for f in frames)
    assert stdio_host.frames(stdio_host.END) == [b"E\x00\x00"]
