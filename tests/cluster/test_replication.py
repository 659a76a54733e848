"""The state machine on pysyncobj with 3 replicas in separate processes on 127.0.0.1."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from synapse.core import codec
from synapse.core import commands as c
from synapse.core.model import Placement
from synapse.master.raft import raft_config
from synapse.sim.engine import uniform_cluster
from tests.support import paths
from tests.support.helpers import spec, wait_for

ROOT = str(paths.ROOT)
pytestmark = pytest.mark.slow


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Replica:
    def __init__(self, addr, partners, data_dir, password):
        self.addr = addr
        env = {**os.environ, "SYNAPSE_RAFT_PASSWORD": password, "PYTHONPATH": ROOT}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.replica_proc", addr, ",".join(partners),
                                      data_dir], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env, cwd=ROOT)

    def call(self, **req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def propose(self, cmd):
        return self.call(op="propose", cmd=codec.encode_command(cmd).hex())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def cluster3(tmp_path):
    """Starts (and restarts) 3 replicas over the same data dirs; stops them all at the end."""
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    password = "test-password"
    started: list[Replica] = []

    def start():
        replicas = [Replica(a, [b for b in addrs if b != a], str(tmp_path / f"m{i}"), password)
                    for i, a in enumerate(addrs)]
        started.extend(replicas)
        return replicas

    yield start
    for r in started:
        r.stop()


def leader_of(replicas):
    statuses = [r.call(op="status") for r in replicas]
    leaders = [r for r, s in zip(replicas, statuses, strict=True) if s["is_leader"]]
    return leaders[0] if len(leaders) == 1 else None


def converged(replicas, applied):
    statuses = [r.call(op="status") for r in replicas]
    if all(s["applied"] == applied for s in statuses) and len({s["digest"] for s in statuses}) == 1:
        return statuses[0]["digest"]
    return None


def snapshot_globals(dump: Path) -> set[str]:
    """The top-level modules of every global (class or function) a pysyncobj snapshot pickles."""
    import gzip
    import pickletools

    found = set()
    ops = list(pickletools.genops(gzip.decompress(dump.read_bytes())))
    for i, (op, arg, _) in enumerate(ops):
        if op.name == "GLOBAL":
            found.add(str(arg).split()[0].split(".")[0])
        elif op.name == "STACK_GLOBAL":
            module = [a for o, a, _ in ops[max(0, i - 4):i] if o.name in ("SHORT_BINUNICODE", "BINUNICODE")]
            found.add(str(module[-2]).split(".")[0] if len(module) >= 2 else "?")
    return found


def test_commands_replicate_and_survive_a_full_restart(cluster3, tmp_path):
    replicas = cluster3()
    leader = wait_for(lambda: leader_of(replicas), what="a leader")
    cmds = [*uniform_cluster(racks_per_block=1, nodes_per_rack=2, at=1.0),
            c.SubmitJob(at=2, job_id="j1", request_id="r1", spec=spec(tasks=2)),
            c.SubmitJob(at=3, job_id="j2", request_id="r1", spec=spec(tasks=2)),  # same request id
            c.CommitPlan(at=4, term=1, job_id="j1", attempt=1, placements=(
                Placement(0, "r0-n0", tuple(range(8)), 0), Placement(1, "r0-n1", tuple(range(8)), 1))),
            c.CommitPlan(at=5, term=1, job_id="j1", attempt=1, placements=())]  # rejected: stale
    results = [leader.propose(cmd) for cmd in cmds]
    assert [r.get("ok") for r in results] == [True, True, True, True, True, False]
    assert results[3]["value"] == "j1"  # the retried request id returned the first job
    digest = wait_for(lambda: converged(replicas, len(cmds)), what="equal digests on 3 replicas")

    # Snapshot one replica, then stop everything and restart from the data dirs.
    assert replicas[1].call(op="compact")["ok"]
    dump = tmp_path / "m1" / "raft.dump"
    wait_for(lambda: dump.exists() and dump.stat().st_size > 0, what="the snapshot file")
    assert "synapse" not in snapshot_globals(dump), \
        "the snapshot must be plain data: a pickled Synapse class would break on moving its module"
    for r in replicas:
        r.stop()
    replicas = cluster3()
    assert wait_for(lambda: converged(replicas, len(cmds)), what="recovery after restart") == digest
    leader = wait_for(lambda: leader_of(replicas), what="a new leader")
    assert leader.propose(c.CancelJob(at=6, job_id="j1"))["ok"]
    wait_for(lambda: converged(replicas, len(cmds) + 1), what="a write after recovery")


def test_raft_refuses_to_run_without_a_password(tmp_path):
    with pytest.raises(ValueError, match="password is required"):
        raft_config(bind_address="127.0.0.1:1", data_dir=str(tmp_path), password="")


def test_a_replica_that_stops_leading_fails_the_proposals_it_holds(tmp_path):
    """RaftNode.abandon: entries already handed to Raft answer 'leader changed' (maybe applied),
    proposals still queued behind them 'not leader' (surely not), and the pipeline empties."""
    import asyncio

    from synapse.master.raft import MAX_IN_FLIGHT, ProposeError
    from tests.support.helpers import lone_leader

    node = lone_leader(tmp_path)
    try:
        async def scenario():
            # Nothing ticks, so nothing commits: the first proposals fill the pipeline, the last waits.
            proposals = []
            for i in range(MAX_IN_FLIGHT + 1):
                proposals.append(asyncio.ensure_future(node.propose_async(c.Barrier(at=i), timeout=10)))
                await asyncio.sleep(0)
            assert node._in_flight == MAX_IN_FLIGHT and len(node._queued) == 1
            assert node.abandon() == MAX_IN_FLIGHT + 1
            outcomes = await asyncio.gather(*proposals, return_exceptions=True)
            return outcomes, node._in_flight, node._queued

        outcomes, in_flight, queued = asyncio.run(scenario())
        assert all(isinstance(o, ProposeError) for o in outcomes)
        assert [o.kind for o in outcomes] == ["LEADER_CHANGED"] * MAX_IN_FLIGHT + ["NOT_LEADER"]
        assert [o.maybe_applied for o in outcomes] == [True] * MAX_IN_FLIGHT + [False]
        assert in_flight == 0 and queued == []
    finally:
        node.destroy()
