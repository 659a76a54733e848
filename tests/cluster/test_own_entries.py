"""A replica applies the submissions it proposed as it encoded them, without decoding its own entry
(synapse.master.replicated.ReplicatedState.proposing, OWN_KINDS), and only those: what applies is still
what the log holds, checked in tests by decoding anyway (CHECK_OWN_ENTRIES_ENV)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from synapse.core import codec
from synapse.core import commands as c
from synapse.master import raft, replicated
from tests.support.helpers import lone_leader, spec


def _run(node, *groups):
    """Propose each group of commands in turn on a lone leader ticked by hand; their results."""
    async def scenario():
        out = []
        for group in groups:
            future = asyncio.ensure_future(node.propose_all_async(list(group)))
            while not future.done():
                node.sync._onTick(0.001)
                await asyncio.sleep(0)
            out.append(future.result())
        return out
    return asyncio.run(scenario())


def _submit(job_id: str) -> c.SubmitJob:
    """A submission as MasterServicer.SubmitJob builds it: the spec decoded from a request."""
    request_spec = codec.job_spec_to_proto(spec(name=job_id, tasks=2, gpu=1))
    return c.SubmitJob(at=1700000000.25, by="alice", job_id=job_id, request_id=job_id,
                       spec=codec.job_spec_from_proto(request_spec, default_queue="default"))


def test_a_leader_decodes_no_submission_it_proposed_and_every_other_kind(tmp_path, monkeypatch):
    decoded: list[list[c.Command]] = []
    real = codec.decode_entry

    def counting(data, commands=codec.CURRENT):
        cmds = real(data, commands)
        decoded.append(cmds)
        return cmds

    monkeypatch.setattr(codec, "decode_entry", counting)
    node = lone_leader(tmp_path, durable=False)
    try:
        node.replicated.check_own = False
        [[a], [b, barrier]] = _run(node, [_submit("a")], [_submit("b"), c.Barrier(at=2.0)])
        assert a.ok and b.ok and barrier.ok
        assert sorted(node.replicated.state.jobs) == ["a", "b"]
        # The lone submission was not decoded; the entry holding a Barrier too was, whole.
        assert [[type(cmd) for cmd in cmds] for cmds in decoded] == [[c.SubmitJob, c.Barrier]]
        assert node.replicated.state.jobs["a"].spec == _submit("a").spec
        assert not node.replicated._own  # nothing kept once applied
    finally:
        node.destroy()


def test_an_own_entry_that_would_decode_otherwise_stops_the_replica_under_the_check(tmp_path):
    node = lone_leader(tmp_path, durable=False)
    try:
        assert node.replicated.check_own  # tests/conftest.py sets CHECK_OWN_ENTRIES_ENV for every test
        real = node.replicated.proposing

        def misremembered(data, cmds):  # as if decoding gave back something else than was encoded
            real(data, [dataclasses.replace(cmds[0], at=int(cmds[0].at))])

        node.replicated.proposing = misremembered
        with pytest.raises(raft.ProposeError, match="HALTED"):  # committed, not applied here
            _run(node, [_submit("a")])
        assert "does not decode to the commands encoded into it" in node.replicated.stop_reason()
        assert not node.replicated.state.jobs  # stopped before it: nothing applied
    finally:
        node.destroy()


def test_entries_that_never_apply_are_not_kept_for_ever():
    door = replicated.ReplicatedState()
    for i in range(replicated.OWN_KEPT * 3):
        door.proposing(b"entry %d" % i, [_submit(f"j{i}")])
    assert len(door._own) <= replicated.OWN_KEPT
