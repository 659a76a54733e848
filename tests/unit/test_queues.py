"""Queues: the queue file's rules and the state machine's (synctl on a real cluster:
tests/cluster/test_queues.py)."""

from __future__ import annotations

import pytest

from synapse.core import commands as c
from synapse.core.jobs.jobspec import JobFileError, parse_job
from synapse.core.model import UNLIMITED, Queue, Resources
from synapse.core.queues import QueueFileError, parse_queue_file
from tests.support.helpers import checked, cluster, spec
from tests.support.queues import FILE


def test_a_queue_file_parses_with_its_units_and_unlimited_defaults():
    import yaml

    research, a, b = parse_queue_file(yaml.safe_load(FILE))
    assert a.parent == "research" and a.weight == 2 and a.users == ("alice",)
    assert a.guaranteed == Resources(cpu=64000, memory=256 << 30, gpu=16)
    assert a.max == Resources(cpu=UNLIMITED, memory=UNLIMITED, gpu=32)
    assert a.preemption_rules == ("reclaim", "priority") and a.min_runtime == 600 and a.max_grace == 30
    assert b.lending_limit == Resources(UNLIMITED, UNLIMITED, UNLIMITED) and research.parent == ""


@pytest.mark.parametrize("queue, field, reason", [
    ({"name": "q", "colour": "red"}, "queues[0].colour", "unknown field"),
    ({"name": "q", "guaranteed": {"gpu": -1}}, "queue q.guaranteed.gpu", "must not be negative"),
    ({"name": "q", "guaranteed": {"gpu": "lots"}}, "queue q.guaranteed.gpu", "whole number"),
    ({"name": "q", "guaranteed": {"cpu": "x1"}}, "queue q.guaranteed.cpu", ""),
    ({"name": "q", "guaranteed": {"tpu": 1}}, "queue q.guaranteed.tpu", "unknown resource"),
    ({"name": "q", "guaranteed": {"gpu": 8}, "max": {"gpu": 4}}, "queue q", "max.gpu: below guaranteed.gpu"),
    ({"name": "q", "parent": "q"}, "queue q", "own parent"),
    ({"name": "Q"}, "queue Q", "queue name"),
    ({"name": "q", "weight": 0}, "queue q", "weight"),
    ({"name": "q", "preemption": {"rules": ["steal"]}}, "queue q", "unknown rule"),
])
def test_bad_queues_name_the_field_and_the_reason(queue, field, reason):
    with pytest.raises(QueueFileError) as err:
        parse_queue_file({"queues": [queue]})
    assert err.value.field == field and reason in err.value.reason


def test_parents_form_a_two_level_tree_without_cycles():
    cycle = {"queues": [{"name": "x", "parent": "y"}, {"name": "y", "parent": "x"}]}
    with pytest.raises(QueueFileError, match="two levels"):
        parse_queue_file(cycle)
    with pytest.raises(QueueFileError, match="listed twice"):
        parse_queue_file({"queues": [{"name": "x"}, {"name": "x"}]})


def test_a_job_file_names_its_queue():
    job = {"name": "j", "tasks": 1, "resources": {"gpu": 1}, "command": ["true"]}
    assert parse_job({**job, "queue": "a"}).queue == "a"
    assert parse_job(job).queue == ""
    with pytest.raises(JobFileError, match="queue"):
        parse_job({**job, "queue": "Not A Queue"})


def test_apply_is_all_or_nothing_and_delete_waits_for_the_jobs():
    state = cluster(racks=1, nodes_per_rack=1)
    good, orphan = Queue("a"), Queue("t", parent="missing")
    result = state.apply(c.ApplyQueues(at=1, queues=(good, orphan)))
    assert not result.ok and "unknown queue missing" in result.error and state.queues == {}
    checked(state, c.ApplyQueues(at=1, queues=(good,)))
    unknown = state.apply(c.SubmitJob(at=2, job_id="j0", request_id="r0", spec=spec(queue="nope")))
    assert not unknown.ok and "unknown queue nope" in unknown.error
    checked(state, c.SubmitJob(at=2, job_id="j1", request_id="r1", spec=spec(queue="a")))
    refused = state.apply(c.DeleteQueue(at=3, name="a"))
    assert not refused.ok and "1 unfinished job" in refused.error
    checked(state, c.CancelJob(at=4, job_id="j1"))
    checked(state, c.DeleteQueue(at=5, name="a"))
    assert state.queues == {}


# ---- a real cluster -----------------------------------------------------------------------------


# ---- preemption on a real cluster ---------------------------------------------------------------


