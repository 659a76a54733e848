"""`synctl run` and `synctl exec` as a user types them: real synctl processes against a 3-master TLS
cluster with 2 workers running real tasks (a pseudo-terminal from Python's pty module where a
terminal is needed)."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from synapse.client.cli.exits import EXIT_DENIED
from synapse.client.cli.main import main
from synapse.client.master_client import MasterClient, PermissionDenied
from synapse.proto import api_pb2
from tests.support.images import busybox_root, needs_root_fs

pytestmark = pytest.mark.slow

SYNCTL = [sys.executable, "-m", "synapse.client.cli"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from tests.support.cluster import LocalCluster

    # A lease of 6.4 s: a worker's restart under a running task must come within it (see
    # test_gang_execution's agent-crash test).
    c = LocalCluster(tmp_path_factory.mktemp("interactive"), 3, 2, 1, 8, heartbeat_timeout=8.0)
    yield c
    c.stop()


def synctl(cluster, *args, token=None, **kw):
    env = {**os.environ, **cluster.env, **({"SYNAPSE_TOKEN": token} if token else {})}
    return subprocess.run([*SYNCTL, *args], env=env, capture_output=True, timeout=60, **kw)


def synctl_bg(cluster, *args, **kw):
    return subprocess.Popen([*SYNCTL, *args], env={**os.environ, **cluster.env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kw)


def job_json(cluster, job_id):
    out = CliRunner().invoke(main, ["describe", "job", job_id, "-o", "json"], env=cluster.env,
                             catch_exceptions=False)
    return json.loads(out.output)


def running_job(cluster, name):
    """The id of the RUNNING job named `name` once there is one."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out = CliRunner().invoke(main, ["get", "jobs", "-o", "json"], env=cluster.env, catch_exceptions=False)
        for job in json.loads(out.output):
            if job["name"] == name and job["status"] == "RUNNING":
                return job["id"]
        time.sleep(0.1)
    raise AssertionError(f"no running job {name}")


def test_run_prints_every_ranks_lines_and_exits_with_the_worst_ranks_code(cluster):
    # Each rank prints, then fails a second later: the first failure stops the gang, so a rank that
    # had not printed by then would print nothing (the next test's race).
    done = synctl(cluster, "run", "--tasks", "2", "--gpu", "8", "--", "sh", "-c", "echo $RANK; sleep 1; exit 3",
                  stdin=subprocess.DEVNULL)
    out = done.stdout.decode()
    assert done.returncode == 3, (out, done.stderr.decode())
    # (the rank the stop ended may add its shell's "Terminated")
    assert {"[rank 0] 0", "[rank 1] 1"} <= set(out.splitlines()), out


def test_the_issues_own_line_prints_its_ranks_labelled_and_exits_3(cluster):
    """Both ranks fail at once, so the first failure's stop may end the other before its shell ran
    (a SIGTERM ends `sh` at once; a loaded machine starts the two up to tens of ms apart): each line
    is a rank's, labelled, and a failed rank's is there. That every rank prints is the test above's
    (each prints a second before it fails)."""
    done = synctl(cluster, "run", "--tasks", "2", "--gpu", "8", "--", "sh", "-c", "echo $RANK; exit 3",
                  stdin=subprocess.DEVNULL)
    assert done.returncode == 3, done.stderr.decode()
    lines = set(done.stdout.decode().splitlines())
    assert lines & {"[rank 0] 0", "[rank 1] 1"}, done.stdout.decode()
    assert lines <= {"[rank 0] 0", "[rank 1] 1", "[rank 0] Terminated", "[rank 1] Terminated"}, done.stdout.decode()


def test_run_of_one_rank_is_unlabelled_and_its_status_is_the_tasks(cluster):
    done = synctl(cluster, "run", "--", "sh", "-c", "echo out; echo err >&2; exit 0", stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr.decode()
    assert sorted(done.stdout.decode().splitlines()) == ["err", "out"]  # the task's log holds both
    label = synctl(cluster, "run", "--label", "--", "sh", "-c", "kill -TERM $$", stdin=subprocess.DEVNULL)
    assert label.returncode == 128 + signal.SIGTERM, label.stderr.decode()


def test_a_job_that_cannot_start_says_why_and_fails(cluster, tmp_path):
    done = synctl(cluster, "run", "--image", f"dir:{tmp_path / 'no-such-image'}", "--", "true",
                  stdin=subprocess.DEVNULL)
    assert done.returncode != 0 and b"ImagePullFailed" in done.stderr, done.stderr.decode()


def test_run_feeds_its_stdin_to_rank_0_only(cluster):
    done = synctl(cluster, "run", "--tasks", "2", "--", "sh", "-c", 'read line; echo "$RANK got $line"',
                  input=b"hello\n")
    lines = sorted(done.stdout.decode().splitlines())
    assert lines == ["[rank 0] 0 got hello", "[rank 1] 1 got "], done.stderr.decode()
    assert done.returncode == 0


def test_stdin_and_the_stream_outlive_a_worker_restart(cluster):
    proc = subprocess.Popen([*SYNCTL, "run", "--name", "restarted", "--", "sh", "-c",
                             "read a; echo got $a; read b; echo got $b"], env={**os.environ, **cluster.env},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    job_id = running_job(cluster, "restarted")
    proc.stdin.write(b"one\n")
    proc.stdin.flush()
    _wait_for(proc.stdout, b"got one")
    node = job_json(cluster, job_id)["tasks"][0]["node"]
    log = cluster.data_dir / "logs" / f"{node}.log"
    before = log.stat().st_size
    cluster.kill_worker(node, with_tasks=False)
    cluster.restart_worker(node)
    # Input typed while synctl has not yet seen its stream break may go down the broken stream and
    # be lost (docs/using/interactive.md says so); once the stream to the restarted worker is
    # ready, input reaches the task.
    deadline = time.monotonic() + 60
    while f"attach: stream ready task={job_id}/" not in log.read_text(errors="replace")[before:]:
        assert time.monotonic() < deadline, "synctl's stream never came back to the restarted worker"
        time.sleep(0.05)
    proc.stdin.write(b"two\n")
    proc.stdin.close()
    _wait_for(proc.stdout, b"got two")
    assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()


def test_run_inside_an_allocation_starts_steps_on_its_nodes(cluster):
    script = "synctl run -- sh -c 'echo step $SYNAPSE_JOB_ID'; echo hi | synctl run --tasks 2 -- cat"
    path = f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"  # synctl as installed
    done = subprocess.run([*SYNCTL, "alloc", "--name", "session", "--tasks", "2", "--gpu", "8", "--", "sh", "-c",
                           script], env={**os.environ, **cluster.env, "PATH": path}, capture_output=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    out = done.stdout.decode()
    assert done.returncode == 0, (out, done.stderr.decode())
    lines = out.splitlines()
    steps = [line for line in lines if line.startswith("[rank") and "step session-" in line]
    assert len(steps) == 2 and all(line.endswith(".0") for line in steps), out  # step 0: one task per node
    assert "[rank 0] hi" in lines, out  # the second step's rank 0 read run's stdin


def test_ctrl_c_reaches_every_rank_and_twice_cancels(cluster):
    script = "trap 'echo interrupted $RANK; exit 0' INT; echo ready $RANK; while :; do sleep 0.1; done"
    proc = synctl_bg(cluster, "run", "--name", "ctrlc", "--tasks", "2", "--", "sh", "-c", script,
                     stdin=subprocess.DEVNULL)
    _wait_for(proc.stdout, b"ready", count=2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert sorted(line for line in out.decode().splitlines() if "interrupted" in line) == [
        "[rank 0] interrupted 0", "[rank 1] interrupted 1"]

    plain = synctl_bg(cluster, "run", "--name", "plain", "--", "sh", "-c", "echo ready; exec sleep 60",
                      stdin=subprocess.DEVNULL)
    _wait_for(plain.stdout, b"ready")
    plain.send_signal(signal.SIGINT)
    plain.communicate(timeout=60)
    assert plain.returncode == 128 + signal.SIGINT

    stubborn = synctl_bg(cluster, "run", "--name", "stubborn", "--", "sh", "-c",
                         "trap '' INT; echo ready; while :; do sleep 0.1; done", stdin=subprocess.DEVNULL)
    _wait_for(stubborn.stdout, b"ready")
    stubborn.send_signal(signal.SIGINT)
    time.sleep(0.2)
    stubborn.send_signal(signal.SIGINT)
    _, err = stubborn.communicate(timeout=60)
    assert stubborn.returncode != 0 and b"cancelling job" in err, err.decode()


def test_run_pty_gives_rank_0_a_terminal_and_returns_the_shells_status(cluster):
    import fcntl
    import struct
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child: synctl on the pseudo-terminal's other side, 33 rows by 101 columns
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
        os.environ.update(cluster.env)
        # The prompt set here: a task inherits the worker's environment, where a PS1 may be exported.
        os.execv(sys.executable, [*SYNCTL, "run", "--pty", "--gpu", "1", "--", "env", "PS1=# ", "sh"])
    try:
        seen = _read_until(fd, pid, b"# ")  # the shell's prompt
        os.write(fd, b"test -t 0 && echo IS-A-TTY; stty size\n")
        seen += _read_until(fd, pid, b"33 101")
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # synctl gets SIGWINCH
        time.sleep(0.5)
        os.write(fd, b"stty size; exit 5\n")
        seen += _read_until_exit(fd, pid)
        status = _status
    finally:
        os.close(fd)
    assert b"IS-A-TTY" in seen, seen
    assert b"40 120" in seen, seen
    assert status == 5, seen


def _read_until(fd, pid, marker: bytes, timeout=60.0) -> bytes:
    seen, deadline = b"", time.monotonic() + timeout
    while marker not in seen:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"no {marker!r} in {seen!r}")
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            seen += os.read(fd, 4096)
    return seen


_status = -1


def _read_until_exit(fd, pid, timeout=60.0) -> bytes:
    global _status
    seen, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                data = os.read(fd, 4096)
            except OSError:
                data = b""
            seen += data
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            _status = os.waitstatus_to_exitcode(status)
            return seen
    os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"synctl run --pty did not end: {seen!r}")


def _wait_for(stream, marker: bytes, count: int = 1, timeout: float = 60.0) -> bytes:
    seen, deadline = b"", time.monotonic() + timeout
    fd = stream.fileno()
    while seen.count(marker) < count:
        assert time.monotonic() < deadline, f"no {marker!r} in {seen!r}"
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            seen += os.read(fd, 4096)
    return seen


def test_exec_runs_in_a_running_task_and_is_recorded(cluster):
    sleeper = synctl_bg(cluster, "run", "--name", "sleeper", "--env", "FOO=bar", "--", "sh", "-c",
                        "echo started; sleep 60", stdin=subprocess.DEVNULL)
    try:
        job_id = running_job(cluster, "sleeper")
        done = synctl(cluster, "exec", job_id, "--", "sh", "-c", 'echo "$FOO $SYNAPSE_JOB_ID $(pwd)"; exit 4')
        assert done.returncode == 4, done.stderr.decode()
        foo, job, cwd = done.stdout.decode().split()
        assert (foo, job) == ("bar", job_id) and cwd.endswith("attempt-1")
        fed = synctl(cluster, "exec", job_id, "--", "cat", input=b"through stdin\n")
        assert fed.stdout == b"through stdin\n" and fed.returncode == 0, fed.stderr.decode()
        pid, fd = pty.fork()
        if pid == 0:  # a shell in the task, on a terminal
            os.environ.update(cluster.env)
            os.execv(sys.executable, [*SYNCTL, "exec", job_id, "--pty", "--", "env", "PS1=# ", "sh"])
        try:
            _read_until(fd, pid, b"# ")
            os.write(fd, b"test -t 0 && echo EXEC-TTY; exit 6\n")
            seen = _read_until_exit(fd, pid)
        finally:
            os.close(fd)
        assert b"EXEC-TTY" in seen and _status == 6, seen
        events = [e for e in job_json(cluster, job_id)["events"] if e["kind"] == "Exec"]
        assert len(events) == 3 and "ran in task 0: sh -c" in events[0]["message"], events
    finally:
        sleeper.send_signal(signal.SIGINT)
        sleeper.send_signal(signal.SIGINT)
        sleeper.communicate(timeout=60)


@needs_root_fs
def test_exec_into_a_task_in_an_image_sees_the_image_and_its_namespaces(cluster, tmp_path):
    root = busybox_root(tmp_path / "root", release="exec-test 1")
    boxed = synctl_bg(cluster, "run", "--name", "boxed", "--image", f"dir:{root}", "--", "sh", "-c",
                      "echo started; exec sleep 60", stdin=subprocess.DEVNULL)
    try:
        job_id = running_job(cluster, "boxed")
        _wait_for(boxed.stdout, b"started")
        done = synctl(cluster, "exec", job_id, "--", "sh", "-c",
                      "cat /etc/os-release; cat /proc/1/cmdline | tr '\\0' ' '; echo; echo $SYNAPSE_JOB_ID")
        assert done.returncode == 0, done.stderr.decode()
        release, init, job = done.stdout.decode().splitlines()
        assert release == "NAME=exec-test 1" and job == job_id
        assert "sandbox" in init or "python" in init, init  # pid 1 is the task's sandbox, not the machine's init
    finally:
        boxed.send_signal(signal.SIGINT)
        boxed.communicate(timeout=60)


def test_exec_is_refused_to_another_user(cluster):
    out = CliRunner().invoke(main, ["user", "add", "mallory", "-o", "json"], env=cluster.env, catch_exceptions=False)
    mallory = json.loads(out.output)["token"]
    sleeper = synctl_bg(cluster, "run", "--name", "victim", "--", "sleep", "60", stdin=subprocess.DEVNULL)
    try:
        job_id = running_job(cluster, "victim")
        done = synctl(cluster, "exec", job_id, "--", "true", token=mallory)
        assert done.returncode == EXIT_DENIED and b"permission denied" in done.stderr, done.stderr.decode()
        client = MasterClient(cluster.addresses, mallory, tls=cluster.tls)
        with pytest.raises(PermissionDenied, match="may not attach to"):
            client.call("AttachAccess", api_pb2.AttachAccessRequest(job_id=job_id))
        client.close()
        assert not [e for e in job_json(cluster, job_id)["events"] if e["kind"] == "Exec"]
    finally:
        sleeper.send_signal(signal.SIGINT)
        sleeper.send_signal(signal.SIGINT)
        sleeper.communicate(timeout=60)
