"""The submission rules of synapse.core.submission, on a bare state: the first rule broken, in order."""

from __future__ import annotations

import dataclasses

from synapse.core import commands as c
from synapse.core.model import DEFAULT_QUEUE, Queue
from synapse.core.submission import Refusal, Refused, Submitter, queue_denial, refusal
from tests.support.helpers import checked, cluster, spec

ALICE = Submitter("alice", ("ml",))


def test_a_job_that_fits_a_known_queue_is_not_refused():
    state = cluster()
    assert refusal(state, spec(queue=DEFAULT_QUEUE), ALICE) is None


def test_each_rule_names_its_field():
    state = cluster()
    assert refusal(state, spec(queue="nope"), ALICE) == Refusal(Refused.INVALID, "queue: unknown queue nope")
    big = refusal(state, spec(gpu=64, queue=DEFAULT_QUEUE), ALICE)
    assert big is not None and big.kind is Refused.INVALID and big.reason.startswith("resources: no node can hold")
    after = dataclasses.replace(spec(queue=DEFAULT_QUEUE), after=(("ok", "ghost"),))
    assert refusal(state, after, ALICE) == Refusal(
        Refused.INVALID, "after: unknown job ghost (not submitted, or forgotten too long ago)")


def test_a_queue_with_users_or_groups_takes_only_them_and_admins():
    state = cluster()
    checked(state, c.ApplyQueues(at=1, queues=(Queue("team", users=("bob",), groups=("ml",)),)))
    assert refusal(state, spec(queue="team"), ALICE) is None  # by its group
    carol = Submitter("carol")
    assert refusal(state, spec(queue="team"), carol) == Refusal(
        Refused.DENIED, "user carol may not submit to queue team: it takes users bob and groups ml")
    assert queue_denial(Queue("team", users=("bob",)), Submitter("root", is_admin=True)) == ""
    assert queue_denial(Queue("open"), carol) == ""


def test_a_requests_earlier_jobs_count_against_the_per_user_limit():
    state = cluster()
    checked(state, c.ApplyQueuesWithLimits(at=1, queues=(Queue("small", user_jobs=3),)))
    checked(state, c.SubmitJob(at=2, by="alice", job_id="j1", request_id="r1", spec=spec(queue="small")))
    assert refusal(state, spec(queue="small"), ALICE, earlier=1) is None  # 1 there + 1 ahead + this = 3
    refused = refusal(state, spec(queue="small"), ALICE, earlier=2)
    assert refused == Refusal(Refused.LIMIT, "queue small: user alice has 1 pending or running job(s) there, this "
                                             "request adds 2 before this one, and its max_per_user.jobs is 3: wait "
                                             "for some to end, or cancel some")
    array = dataclasses.replace(spec(queue="small"), array="0-1")  # an array counts its elements
    assert refusal(state, array, ALICE, earlier=0) is None
    assert refusal(state, array, ALICE, earlier=1) is not None
    assert refusal(state, spec(queue=DEFAULT_QUEUE), ALICE, earlier=500) is None  # no limit: nothing counts
