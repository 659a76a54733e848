"""One proposal per request on a real Raft node: a group of commands travels in one log entry, and the
legacy drain is one proposal (the walk over the endpoints is in tests/unit/test_one_proposal.py)."""

from __future__ import annotations

import asyncio

from synapse.core import commands as c


def test_a_group_of_commands_travels_in_one_log_entry_never_split(tmp_path):
    """RaftNode.propose_all_async: the commands of one call share a log entry and come back with a
    result each, in order; a group that would overflow MAX_BATCH waits for the next entry whole."""
    from synapse.master.raft import MAX_BATCH
    from tests.support.helpers import lone_leader

    node = lone_leader(tmp_path, durable=False)
    try:
        async def scenario():
            async def tick_until(*futures):
                while not all(f.done() for f in futures):
                    node.sync._onTick(0.001)
                    await asyncio.sleep(0)

            group = asyncio.ensure_future(node.propose_all_async([c.Barrier(at=i) for i in range(3)]))
            await tick_until(group)
            assert [r.ok for r in group.result()] == [True, True, True]
            assert (node.entries_proposed, node.commands_proposed) == (1, 3)
            # One command, then a group that does not fit beside it: two entries, neither split.
            lone = asyncio.ensure_future(node.propose_async(c.Barrier(at=10)))
            big = asyncio.ensure_future(node.propose_all_async([c.Barrier(at=11 + i) for i in range(MAX_BATCH)]))
            await tick_until(lone, big)
            assert lone.result().ok and len(big.result()) == MAX_BATCH
            assert (node.entries_proposed, node.commands_proposed) == (3, 4 + MAX_BATCH)
            assert await node.propose_all_async([]) == []

        asyncio.run(scenario())
        assert node.replicated.state.applied == 4 + MAX_BATCH
    finally:
        node.destroy()


def test_the_legacy_drain_is_one_proposal_that_cordons_and_stops_every_gang():
    """DrainNode on a cluster below command-set version 3 (no DrainNode command yet): the cordon
    and a stop per gang on the node go out as one proposal, applied in that order."""
    import threading
    from types import SimpleNamespace

    from synapse.core.model import JobStatus, Placement
    from synapse.master.access import BOOTSTRAP, CALLER
    from synapse.master.api.servicer import MasterServicer
    from synapse.proto import api_pb2
    from tests.support.helpers import checked, cluster, spec

    state = cluster()
    for job_id, nodes in (("a", ("r0-n0", "r0-n1")), ("b", ("r0-n1",)), ("elsewhere", ("r0-n2",))):
        checked(state, c.SubmitJob(at=10, job_id=job_id, request_id=job_id, spec=spec(tasks=len(nodes), gpu=4)))
        checked(state, c.CommitPlan(at=20, job_id=job_id, attempt=1, placements=tuple(
            Placement(i, n, (0, 1, 2, 3) if job_id != "b" else (4, 5, 6, 7), i) for i, n in enumerate(nodes))))
    proposals = []

    async def propose_all(cmds, timeout=5.0):
        proposals.append(list(cmds))
        return [checked(state, cmd) for cmd in cmds]

    master = SimpleNamespace(
        config=SimpleNamespace(raft_password="pw", min_free_disk=0), lock=threading.RLock(), state=state,
        stopping=False, now=lambda: 100.0, ready_leader_term=lambda: 1, disk_has_room=lambda: True,
        raft=SimpleNamespace(cluster_version=lambda: 2), propose_all=propose_all)

    async def drain():
        CALLER.set(BOOTSTRAP)
        return await MasterServicer(master).DrainNode(api_pb2.DrainNodeRequest(node_id="r0-n1"), context=None)

    reply = asyncio.run(drain())
    assert list(reply.jobs_stopped) == ["a", "b"]
    assert [[type(cmd).__name__ for cmd in cmds] for cmds in proposals] == [
        ["SetSchedulable", "FailAttempt", "FailAttempt"]]
    assert not state.nodes["r0-n1"].schedulable
    assert [state.jobs[j].status for j in ("a", "b", "elsewhere")] == [JobStatus.STOPPING, JobStatus.STOPPING,
                                                                       JobStatus.SCHEDULED]
