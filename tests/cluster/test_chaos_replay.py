"""The chaos checkers' replay of a real replica's Raft log: a one-replica RaftNode on a free port writes it."""

from __future__ import annotations

from chaos import checkers
from synapse.core import commands as c
from synapse.core.model import Placement
from synapse.local.cluster import free_base_port
from synapse.master.raft import RaftNode, raft_config
from synapse.sim.engine import uniform_cluster
from tests.support.helpers import spec


def _single_replica_log(tmp_path):
    """A one-replica Raft log holding a cluster, two jobs and two conflicting plans for one node."""
    addr = f"127.0.0.1:{free_base_port(1)}"
    node = RaftNode(addr, [], raft_config(bind_address=addr, data_dir=str(tmp_path), password="pw"))
    try:
        import time
        deadline = time.monotonic() + 10
        while not node.is_leader() and time.monotonic() < deadline:
            time.sleep(0.05)
        for cmd in uniform_cluster(racks_per_block=1, nodes_per_rack=1):
            node.propose(cmd)
        for job in ("a", "b"):
            node.propose(c.SubmitJob(at=1, job_id=job, request_id=job, spec=spec()))
            node.propose(c.CommitPlan(at=2, job_id=job, attempt=1,
                                      placements=(Placement(0, "r0-n0", tuple(range(8)), 0),)))
        return node.replicated.digest()
    finally:
        node.destroy()


def test_replay_checks_every_committed_state_and_matches_the_digest(tmp_path, monkeypatch):
    applied, digest = _single_replica_log(tmp_path)
    state, problems, replayed = checkers.replay_replica(tmp_path)
    assert problems == [] and replayed == applied and state.digest() == digest
    assert state.jobs["a"].status.value == "SCHEDULED" and state.jobs["b"].status.value == "PENDING"
    # The checker must be able to fail: with the plan re-check broken, the second plan would
    # double-book the node's GPUs, and the replay reports it at the raft index where it happens.
    from synapse.core.state import gangs
    monkeypatch.setattr(gangs, "plan_problem", lambda state, job, cmd: "")
    _, problems, _ = checkers.replay_replica(tmp_path)
    assert any("over-allocated" in p or "GPU index twice" in p or "failed midway" in p for p in problems), problems
