"""SIGINT, SIGTERM or SIGHUP to anything that starts a local cluster leaves nothing behind.

Each entry point runs as a real program in its own session, as from a terminal: `chaos/run.py`,
`synapse-local demo`, and a pytest run of a cluster test. Once its cluster is up, the signal goes
to its whole process group (Ctrl-C and a closing terminal signal the foreground group). Then,
within a bounded time: the program has exited, and nothing it started remains — no pid its
cluster.json recorded, no process whose command line or environment points into its data dir, no
network namespace, bridge or veth of the tags its ledger recorded (masters in namespaces whenever
this machine can make them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from synapse.core import codec
from synapse.core.model import JobSpec, Resources
from synapse.local import cluster as local
from synapse.local import reaper
from synapse.local.netns import MasterNet
from synapse.local.netns import unavailable as netns_unavailable
from tests.support.cluster import AS_FROM_A_TERMINAL
from tests.support.paths import ROOT

#: Masters in network namespaces when this machine allows it (root and iproute2).
NETNS = not netns_unavailable()
SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
#: Set (to a file to write the data dir to) only in the pytest run the pytest entry point starts.
VICTIM = "SYNAPSE_INTERRUPT_VICTIM"
EXIT_WITHIN_S = 30.0


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def pointing_into(data_dir: Path) -> list[str]:
    """Processes (not this one) whose command line or environment names `data_dir`."""
    needle = str(data_dir.resolve()).encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        cmdline = _read(f"/proc/{entry.name}/cmdline")
        if needle in cmdline or needle in _read(f"/proc/{entry.name}/environ"):
            if local.is_alive(int(entry.name)):
                words = cmdline.replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{entry.name}: {words[:200]}")
    return found


def leftovers(data_dir: Path) -> dict[str, list]:
    """Everything the cluster in `data_dir` started that still exists."""
    out: dict[str, list] = {}
    state_file = data_dir / "cluster.json"
    if state_file.exists():
        state = json.loads(state_file.read_text())
        out["recorded pids"] = [p["pid"] for p in state["masters"] + state["workers"]
                                if local.is_ours(p["pid"], data_dir) and local.is_alive(p["pid"])]
    out["processes"] = pointing_into(data_dir)
    ledger = data_dir / local.NETNS_LEDGER
    out["network"] = MasterNet.leftovers(ledger.read_text().split()) if ledger.exists() else []
    return {k: v for k, v in out.items() if v}


def started(data_dir: Path, workers: int, tasks: int = 0) -> bool:
    """cluster.json lists every master and worker, all are running, and so are `tasks` tasks."""
    try:
        state = json.loads((data_dir / "cluster.json").read_text())
    except (OSError, ValueError):
        return False
    procs = state["masters"] + state["workers"]
    if len(state["workers"]) < workers or not all(local.is_alive(p["pid"]) for p in procs):
        return False
    return len(reaper.marked(data_dir)) >= len(procs) + 2 * tasks  # each task: its shim and itself


def wait_for(what: str, check, timeout: float, proc: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"exited ({proc.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {timeout} s:\n{log.read_text()[-3000:]}")


class Program:
    """An entry point started in its own session (so a signal to its group reaches only it)."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self.proc = subprocess.Popen([*AS_FROM_A_TERMINAL, *argv], cwd=ROOT, stdin=subprocess.DEVNULL,
                                     stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, **(env or {})})

    def signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def wait_exit(self, timeout: float = EXIT_WITHIN_S) -> tuple[int, float]:
        start = time.monotonic()
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            tail = self.log.read_text()[-3000:]
            raise AssertionError(f"still running {timeout} s after the signal:\n{tail}") from None
        return code, time.monotonic() - start

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def interrupted_cleanly(program: Program, data_dir: Path, sig: int) -> float:
    """Send `sig`, then assert the program exits within EXIT_WITHIN_S leaving nothing; returns seconds."""
    try:
        program.signal(sig)
        code, seconds = program.wait_exit()
    finally:
        program.kill()
    left = leftovers(data_dir)
    local.down(data_dir)  # not to burden the next test if this one fails
    assert not left, f"left behind after {signal.Signals(sig).name}: {left}\n{program.log.read_text()[-3000:]}"
    assert code != 0, program.log.read_text()[-3000:]
    return seconds


def running(out: Path) -> bool:
    """The chaos run's clients are at work (its history has operations): run() is in its try."""
    history = out / "history.jsonl"
    return history.exists() and '"type": "op"' in history.read_text()


def chaos_run(tmp_path: Path, *extra: str) -> tuple[Program, Path]:
    out = tmp_path / "chaos"
    argv = [sys.executable, "chaos/run.py", "--duration", "60", "--workers", "2", "--clients", "1", "--out", str(out),
            *extra]
    return Program(argv, tmp_path / "chaos.log"), out / "cluster"


# ---- the three entry points, each signal -------------------------------------------------------


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_chaos_run_stops_its_cluster_on_a_signal(tmp_path, sig):
    program, data_dir = chaos_run(tmp_path)
    wait_for("cluster", lambda: started(data_dir, workers=2) and running(data_dir.parent), 60, program.proc,
             program.log)
    seconds = interrupted_cleanly(program, data_dir, sig)
    assert "chaos run interrupted" in program.log.read_text()
    print(f"chaos/run.py exited {seconds:.1f} s after {sig.name}")


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_demo_stops_its_cluster_on_a_signal(tmp_path, sig):
    data_dir = tmp_path / "demo"
    program = Program([sys.executable, "-m", "synapse.local.main", "demo", "--data-dir", str(data_dir),
                       "--base-port", str(local.free_base_port(3))], tmp_path / "demo.log")
    wait_for("cluster", lambda: started(data_dir, workers=4), 60, program.proc, program.log)
    seconds = interrupted_cleanly(program, data_dir, sig)
    print(f"synapse-local demo exited {seconds:.1f} s after {sig.name}")


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_pytest_run_stops_its_clusters_on_a_signal(tmp_path, sig):
    """tests/conftest.py: SIGTERM and SIGHUP, like Ctrl-C, run the fixtures' finalizers."""
    told = tmp_path / "data-dir"
    program = Program([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                       f"--basetemp={tmp_path / 'run'}",
                       f"{Path(__file__).resolve().relative_to(ROOT)}::test_victim_cluster_test"],
                      tmp_path / "pytest.log", env={VICTIM: str(told)})
    data_dir = Path(wait_for("the victim's cluster", lambda: told.exists() and told.read_text(), 60,
                             program.proc, program.log))
    assert started(data_dir, workers=1, tasks=1)
    seconds = interrupted_cleanly(program, data_dir, sig)
    assert "KeyboardInterrupt" in program.log.read_text() or "Interrupted" in program.log.read_text()
    print(f"pytest exited {seconds:.1f} s after {sig.name}")


@pytest.mark.skipif(not os.environ.get(VICTIM), reason="a cluster test to interrupt: run by "
                    "test_a_pytest_run_stops_its_clusters_on_a_signal in a pytest of its own")
def test_victim_cluster_test(make_cluster):
    cluster = make_cluster(masters=3, workers=1, netns=NETNS)
    spec = JobSpec(name="long", tasks=1, command=("sleep", "600"), resources=Resources(500, 64 << 20, 1))
    job_id = cluster.client.submit(codec.job_spec_to_proto(spec))
    deadline = time.monotonic() + 30
    while cluster.client.get_job(job_id).status != "RUNNING" or not started(cluster.data_dir, 1, tasks=1):
        assert time.monotonic() < deadline, "the task did not start"
        time.sleep(0.1)
    Path(os.environ[VICTIM]).write_text(str(cluster.data_dir.resolve()))
    time.sleep(600)


# ---- the awkward moments ---------------------------------------------------------------------


def test_a_signal_during_start_up_leaves_nothing(tmp_path):
    """Before cluster.json lists everything: a master started, the others not yet."""
    program, data_dir = chaos_run(tmp_path)
    wait_for("the first process", lambda: reaper.marked(data_dir), 60, program.proc, program.log)
    interrupted_cleanly(program, data_dir, signal.SIGINT)


def test_a_second_ctrl_c_during_tear_down_does_not_cut_it_short(tmp_path):
    program, data_dir = chaos_run(tmp_path)
    wait_for("cluster", lambda: started(data_dir, workers=2), 60, program.proc, program.log)
    program.signal(signal.SIGINT)
    time.sleep(0.3)
    program.signal(signal.SIGINT)
    time.sleep(0.3)
    interrupted_cleanly(program, data_dir, signal.SIGHUP)  # and then the terminal closes


def test_a_signal_while_a_master_is_paused_by_sigstop(tmp_path):
    program, data_dir = chaos_run(tmp_path, "--faults", "pause-leader", "--interval", "1")
    wait_for("cluster", lambda: started(data_dir, workers=2), 60, program.proc, program.log)

    def paused() -> bool:
        state = json.loads((data_dir / "cluster.json").read_text())
        return any(Path(f"/proc/{m['pid']}/stat").exists() and
                   _read(f"/proc/{m['pid']}/stat").rsplit(b")", 1)[1].split()[0] == b"T" for m in state["masters"])

    wait_for("a paused master", paused, 30, program.proc, program.log)
    interrupted_cleanly(program, data_dir, signal.SIGTERM)
