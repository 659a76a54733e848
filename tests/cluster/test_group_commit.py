"""Group commit's delay (synapse.master.raft, GROUP_COMMIT_DELAY_S): under load, the next log entry
waits a little for more proposals to share it; an idle replica's proposal never waits, and enough
waiting proposals go at once. A lone leader ticked by hand, so the test sees every entry."""

from __future__ import annotations

import asyncio
import time

import pytest

from synapse.core import commands as c
from synapse.master import raft
from synapse.master.config import ConfigError, parse_cluster_config
from tests.support.helpers import lone_leader

#: long against the few ticks an entry takes even on a loaded machine, so what waits for it is told
#: apart from what does not (only one test waits it out)
DELAY = 1.0


async def _tick_until(node, *futures) -> None:
    while not all(f.done() for f in futures):
        node.sync._onTick(0.001)
        await asyncio.sleep(0)


@pytest.fixture
def node(tmp_path):
    node = lone_leader(tmp_path, durable=False, group_commit_delay=DELAY)
    yield node
    node.destroy()


def test_an_idle_replicas_proposal_goes_at_once(node):
    async def scenario():
        started = time.monotonic()
        first = asyncio.ensure_future(node.propose_async(c.Barrier(at=1.0)))
        await _tick_until(node, first)
        return time.monotonic() - started

    assert asyncio.run(scenario()) < DELAY / 2
    assert node.entries_proposed == 1


def test_proposals_made_while_an_entry_travels_wait_for_more_then_share_one_entry(node):
    async def scenario():
        first = asyncio.ensure_future(node.propose_async(c.Barrier(at=1.0)))
        await asyncio.sleep(0)  # the first entry is proposed: the next ones queue behind it
        second = [asyncio.ensure_future(node.propose_async(c.Barrier(at=2.0 + i))) for i in range(3)]
        await _tick_until(node, first)
        resolved = time.monotonic()
        await asyncio.sleep(0)
        late = asyncio.ensure_future(node.propose_async(c.Barrier(at=9.0)))  # joins them during the delay
        await _tick_until(node, *second, late)
        return time.monotonic() - resolved

    waited = asyncio.run(scenario())
    assert waited >= DELAY * 0.9
    assert (node.entries_proposed, node.commands_proposed) == (2, 5)  # the four waiting shared the second


def test_enough_waiting_proposals_go_without_waiting_out_the_delay(node):
    async def scenario():
        first = asyncio.ensure_future(node.propose_async(c.Barrier(at=1.0)))
        await asyncio.sleep(0)
        await _tick_until(node, first)
        await asyncio.sleep(0)
        resolved = time.monotonic()
        # One proposal queues behind nothing in flight: goes at once. Then, while its entry travels,
        # a crowd queues; when it resolves, the crowd is already full and goes without delay.
        lone = asyncio.ensure_future(node.propose_async(c.Barrier(at=2.0)))
        await asyncio.sleep(0)
        crowd = [asyncio.ensure_future(node.propose_async(c.Barrier(at=3.0 + i)))
                 for i in range(raft.GROUP_COMMIT_FULL)]
        await _tick_until(node, lone, *crowd)
        return time.monotonic() - resolved

    assert asyncio.run(scenario()) < DELAY / 2
    assert (node.entries_proposed, node.commands_proposed) == (3, 2 + raft.GROUP_COMMIT_FULL)


def test_a_crowd_arriving_during_the_delay_cuts_it_short(node):
    async def scenario():
        first = asyncio.ensure_future(node.propose_async(c.Barrier(at=1.0)))
        await asyncio.sleep(0)
        one = asyncio.ensure_future(node.propose_async(c.Barrier(at=2.0)))
        await _tick_until(node, first)
        await asyncio.sleep(0)  # `one` now waits out the delay
        resolved = time.monotonic()
        crowd = [asyncio.ensure_future(node.propose_async(c.Barrier(at=3.0 + i)))
                 for i in range(raft.GROUP_COMMIT_FULL)]
        await _tick_until(node, one, *crowd)
        return time.monotonic() - resolved

    assert asyncio.run(scenario()) < DELAY / 2
    assert node.entries_proposed == 2 and node.commands_proposed == 2 + raft.GROUP_COMMIT_FULL


def test_the_cluster_file_sets_the_delay_within_bounds():
    doc = {"raft_password": "pw", "replicas": [{"id": "m1", "raft": "h:1", "api": "h:2"}]}
    assert parse_cluster_config(doc).group_commit_delay == 0.003
    assert parse_cluster_config({**doc, "group_commit_delay": "0"}).group_commit_delay == 0
    assert parse_cluster_config({**doc, "group_commit_delay": "10ms"}).group_commit_delay == 0.01
    with pytest.raises(ConfigError, match="group_commit_delay: from 0 to 50ms"):
        parse_cluster_config({**doc, "group_commit_delay": "1s"})
