"""The process runtime and the shim, with real subprocesses."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from synapse.core.jobs.jobspec import NOTICE_SIGNALS
from synapse.core.model import Assignment
from synapse.worker import fence
from synapse.worker.runtime import ProcessRuntime, alive, exit_code, stop_all, task_env
from tests.support import paths


def assignment(index, command, job="job.with.dots-1"):
    return Assignment(job_id=job, attempt=2, index=index, rank=index, world_size=2, local_rank=index,
                      local_world_size=2, node_rank=0, master_addr="10.0.0.1", master_port=29600,
                      gpus=(index * 2, index * 2 + 1), command=tuple(command), env=(("FOO", "bar"),))


def wait_gone(handle, timeout=10.0):
    deadline = time.monotonic() + timeout
    while alive(handle) and time.monotonic() < deadline:
        ProcessRuntime.reap()
        time.sleep(0.02)
    assert not alive(handle)


def test_two_tasks_of_one_gang_keep_separate_files_and_exit_codes(tmp_path):
    runtime = ProcessRuntime(tmp_path)
    a0, a1 = assignment(0, ["sh", "-c", "echo rank=$RANK cuda=$CUDA_VISIBLE_DEVICES foo=$FOO; exit 0"]), \
        assignment(1, ["sh", "-c", "echo rank=$RANK; exit 7"])
    h0, h1 = runtime.start(a0), runtime.start(a1)
    wait_gone(h0)
    wait_gone(h1)
    assert (exit_code(h0), exit_code(h1)) == (0, 7)
    assert open(h0.log_file).read() == "rank=0 cuda=0,1 foo=bar\n"
    assert runtime.find(a1).pid == h1.pid and runtime.find(a0).exit_file != runtime.find(a1).exit_file


def test_stop_reaches_the_whole_process_group_and_records_the_signal(tmp_path):
    runtime = ProcessRuntime(tmp_path)
    handle = runtime.start(assignment(0, ["sh", "-c", "sleep 30 & wait"]))
    time.sleep(0.3)
    runtime.signal(handle, signal.SIGTERM)
    wait_gone(handle)
    assert exit_code(handle) == 128 + signal.SIGTERM  # as shells (and Kubernetes) report it


def test_sigkill_after_grace_when_the_task_ignores_sigterm(tmp_path):
    runtime = ProcessRuntime(tmp_path)
    handle = runtime.start(assignment(0, ["sh", "-c", "trap '' TERM; sleep 30"]))
    time.sleep(0.3)
    started = time.monotonic()
    stop_all(runtime, [handle], grace=0.5)
    assert not alive(handle) and time.monotonic() - started < 5
    assert exit_code(handle) is None  # killed with its shim: no status recorded, reported as killed


def test_the_shim_outlives_every_notice_signal_and_the_task_handles_it(tmp_path):
    """A checkpoint notice goes to the task's whole group, its shim too: the shim must live on to
    record the status, and the task's own trap must run (jobspec.NOTICE_SIGNALS, shim.sh)."""
    runtime = ProcessRuntime(tmp_path)
    handles = {name: runtime.start(assignment(i, ["sh", "-c", f"trap 'echo saved on {name}; exit 0' {name}; "
                                                               "echo trapped; while :; do sleep 0.05; done"],
                                              job=f"n{i}"))
               for i, name in enumerate(NOTICE_SIGNALS)}
    # Signalled once its trap is set (a fixed 0.5 s was too short on a loaded machine: a signal
    # before the trap ends the task, or is lost for a signal ignored by default).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(
            os.path.exists(h.log_file) and "trapped" in open(h.log_file).read() for h in handles.values()):
        time.sleep(0.05)
    for name, handle in handles.items():
        runtime.signal(handle, signal.Signals[f"SIG{name}"])
    for name, handle in handles.items():
        wait_gone(handle)
        log = open(handle.log_file).read()  # the shell may first say how its `sleep` ended
        assert exit_code(handle) == 0 and log.endswith(f"saved on {name}\n"), (name, log)


def test_missing_command_exits_127(tmp_path):
    runtime = ProcessRuntime(tmp_path)
    handle = runtime.start(assignment(0, ["/no/such/binary"]))
    wait_gone(handle)
    assert exit_code(handle) == 127


def test_task_env_has_what_torch_distributed_expects():
    env = task_env(assignment(1, ["x"]))
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
                                "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "SYNAPSE_ATTEMPT", "SYNAPSE_TASK_INDEX",
                                "FOO")} == {
        "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "0",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29600", "CUDA_VISIBLE_DEVICES": "2,3", "SYNAPSE_ATTEMPT": "2",
        "SYNAPSE_TASK_INDEX": "1", "FOO": "bar"}


def test_restarted_agent_adopts_a_task_forked_just_before_a_crash(tmp_path):
    """The state file says 'starting' (no pid yet): the shim's own mark lets the next agent adopt
    it instead of starting a second instance; a task that never forked is simply forgotten."""
    import dataclasses
    import json

    from synapse.core.model import Resources
    from synapse.worker.agent import WorkerAgent
    from synapse.worker.state import Report
    from synapse.worker.statefile import STATE_FILE

    forked, never = assignment(0, ["sleep", "30"]), assignment(1, ["sleep", "30"])
    handle = ProcessRuntime(tmp_path).start(forked)
    tasks_dir = ProcessRuntime(tmp_path).task_files(forked)[0].parent
    deadline = time.monotonic() + 10
    while not fence.shims(tasks_dir) and time.monotonic() < deadline:  # the shim is up (a restart comes later)
        time.sleep(0.02)
    assert [s.pid for s in fence.shims(tasks_dir)] == [handle.pid]
    tasks = [{"assignment": dataclasses.asdict(a), "phase": "starting", "handle": None} for a in (forked, never)]
    (tmp_path / STATE_FILE).write_text(json.dumps({"known": [3, 40], "done": [], "unreported": [], "tasks": tasks}))
    agent = WorkerAgent(node_id="n1", address="127.0.0.1", topology=(), capacity=Resources(1000, 1, 1),
                        masters=["127.0.0.1:1"], token="", data_dir=tmp_path)
    try:
        agent._load_state()
        assert list(agent.state.tasks) == [forked.key]
        assert agent.state.tasks[forked.key].handle.pid == handle.pid
        assert agent.state.unreported == [Report(forked.key, started=True)]
        assert agent.state.known == (3, 40)
    finally:
        agent.log_server.stop(grace=0)
        stop_all(agent.runtime, [handle], grace=0.5)


def test_a_worker_started_with_signals_ignored_gives_its_tasks_them_back():
    """A worker started under `nohup` (SIGHUP ignored) passed the ignore to every task, and a shell
    cannot trap a signal ignored when it started: a job whose notice is SIGHUP never saw it. The
    runtime turns each ignored task signal into a handler that does nothing, which exec resets."""
    script = textwrap.dedent("""
        import signal, subprocess, sys, tempfile
        from pathlib import Path
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if sys.argv[1] == "runtime":
            from synapse.worker.runtime import ProcessRuntime
            ProcessRuntime(Path(tempfile.mkdtemp()))
        out = subprocess.run(["sh", "-c", "trap 'echo caught HUP' HUP; trap 'echo caught TERM' TERM; "
                              "kill -HUP $$; kill -TERM $$; echo done"], capture_output=True, text=True).stdout
        signal.raise_signal(signal.SIGHUP)  # this process still survives it
        print(out.replace(chr(10), " ").strip())
    """)
    runs = {kind: subprocess.run([sys.executable, "-c", script, kind], capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": str(paths.ROOT)},
                                 timeout=60)
            for kind in ("runtime", "plain")}
    assert runs["runtime"].stdout.strip() == "caught HUP caught TERM done", runs["runtime"]
    assert runs["plain"].stdout.strip() == "done", runs["plain"]  # the control: ignored, not trapped


def test_a_childs_start_ticks_worked_out_from_the_boot_clock_are_those_proc_gives():
    """The runtime takes a new shim's start time from the boot clock around its fork (reading
    /proc/PID/stat at once waits for the child's exec); it must be the very value /proc gives, or
    the worker takes its own task for a stranger (pid reuse guard) and ends it."""
    children = []
    try:
        for _ in range(60):
            tick = fence.boot_tick()
            proc = subprocess.Popen(["/bin/sh", "-c", "sleep 1"], start_new_session=True)
            worked_out = fence.child_start_ticks(proc.pid, tick)
            children.append((proc, worked_out, fence.child_start_ticks(proc.pid, tick - 1)))  # this one reads /proc
        for proc, worked_out, read in children:
            assert worked_out == read == fence.process_start_ticks(proc.pid) > 0
    finally:
        for proc, _, _ in children:
            proc.kill()
            proc.wait()
