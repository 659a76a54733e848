"""Several jobs in one request, without a cluster: synctl's copies and request ids, its reading of
several job files, the client's fall-back to one SubmitJob each on a master without SubmitJobs, and
the servicer's rule (all or none before the commit; what a commit that refuses one says) on a bare
state whose proposals apply at once (tests/cluster/test_submit_many.py runs it on a real cluster)."""

from __future__ import annotations

import grpc
import pytest
from click.testing import CliRunner

from synapse.client.cli.main import main
from synapse.client.cli.submit import numbered_copies, request_ids
from synapse.client.master_client import ClientError, MasterClient, job_request
from synapse.core.jobs.jobspec import MAX_NAME
from synapse.core.model import Role
from synapse.proto import api_pb2, types_pb2
from tests.support.helpers import spec

JOB = "name: {name}\nresources: {{cpu: 1, memory: 64Mi}}\ncommand: [\"true\"]\n"


def test_copies_are_numbered_from_one_and_keep_within_the_name_limit():
    assert [s.name for s in numbered_copies(spec(name="train"), 3)] == ["train-1", "train-2", "train-3"]
    assert numbered_copies(spec(name="train"), 1) == [spec(name="train")]  # one: the job as written
    long = numbered_copies(spec(name="x" * MAX_NAME), 10)
    assert all(len(s.name) <= MAX_NAME for s in long) and long[9].name.endswith("x-10")
    assert len({s.name for s in long}) == 10


def test_request_ids_of_several_jobs_derive_from_the_one_given():
    assert request_ids("r", 1) == ["r"]
    assert request_ids("r", 3) == ["r-1", "r-2", "r-3"]
    fresh = request_ids(None, 3)
    assert len(set(fresh)) == 3 and all(fresh)


def test_several_job_files_are_each_read_and_sent_together(tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.yaml").write_text(JOB.format(name=name))
    out = CliRunner().invoke(main, ["--masters", "127.0.0.1:1", "--timeout", "0.5", "submit",
                                    str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")])
    assert out.exit_code == 3 and "cluster unreachable" in out.output, out.output  # both read, one request sent
    (tmp_path / "c.yaml").write_text("name: c\nresources: {gpu: lots}\ncommand: [x]\n")
    out = CliRunner().invoke(main, ["--masters", "127.0.0.1:1", "submit", str(tmp_path / "a.yaml"),
                                    str(tmp_path / "c.yaml")])
    assert out.exit_code == 2 and f"invalid job file {tmp_path / 'c.yaml'}: resources.gpu:" in out.output, out.output


def test_wait_follows_one_job_only():
    out = CliRunner().invoke(main, ["--masters", "127.0.0.1:1", "submit", "--count", "2", "--wait", "--", "true"])
    assert out.exit_code == 2 and "--wait follows one job" in out.output, out.output
    out = CliRunner().invoke(main, ["--masters", "127.0.0.1:1", "submit", "--count", "0", "--", "true"])
    assert out.exit_code == 2 and "--count" in out.output, out.output


def test_a_master_without_submit_jobs_gets_one_submit_job_each():
    client = MasterClient(["127.0.0.1:1"], "token")
    calls: list[str] = []

    def call(method, request, **_kw):
        calls.append(method)
        if method == "SubmitJobs":
            raise ClientError(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        return api_pb2.SubmitJobReply(job_id=f"id-{request.request_id}")

    client.call = call  # type: ignore[method-assign]
    requests = [job_request(types_pb2.JobSpec(name=n), request_id=n) for n in ("a", "b")]
    try:
        assert [r.job_id for r in client.submit_jobs(requests)] == ["id-a", "id-b"]
        assert calls == ["SubmitJobs", "SubmitJob", "SubmitJob"]
        calls.clear()
        assert [r.job_id for r in client.submit_jobs(requests[:1])] == ["id-a"]
        assert calls == ["SubmitJob"]  # a lone job goes as it always went
    finally:
        client.close()


class Aborted(Exception):
    """What the fake context's abort raises, as grpc.aio's does."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code, self.message = code, message


class FakeContext:
    async def abort(self, code, message):
        raise Aborted(code, message)


def servicer(state, before_commit=lambda: None):
    """The servicer on a bare state, its proposals applied at once (`before_commit` runs first: what
    another request committed meanwhile); returns it and the list of proposals made."""
    import itertools
    import threading
    from types import SimpleNamespace

    from synapse.master.api.servicer import MasterServicer
    from synapse.master.config import ClusterConfig

    proposals = []
    ids = itertools.count(1)

    async def propose_all(cmds, timeout=5.0):
        proposals.append(list(cmds))
        before_commit()
        return [state.apply(cmd) for cmd in cmds]

    master = SimpleNamespace(
        config=ClusterConfig("c", (), "", raft_password="pw", min_free_disk=0), lock=threading.RLock(), state=state,
        stopping=False, now=lambda: 100.0, ready_leader_term=lambda: 1, disk_has_room=lambda: True,
        propose_all=propose_all, new_job_id=lambda name: f"{name}-{next(ids)}")
    return MasterServicer(master), proposals


def submit_many(svc, *requests):
    import asyncio

    from synapse.master.access import CALLER, Identity

    async def call():
        CALLER.set(Identity("alice", Role.USER))
        return await svc.SubmitJobs(api_pb2.SubmitJobsRequest(jobs=requests), FakeContext())

    return asyncio.run(call())


def limited_state():
    from synapse.core import commands as c
    from synapse.core.model import Queue
    from tests.support.helpers import cluster

    state = cluster()
    assert state.apply(c.ApplyQueuesWithLimits(at=1, queues=(Queue("capped", user_jobs=2),))).ok
    return state


def capped(name, request_id=""):
    from synapse.core import codec

    return job_request(codec.job_spec_to_proto(spec(name=name, queue="capped")), request_id or name)


def test_a_request_is_refused_whole_before_anything_is_proposed():
    state = limited_state()
    svc, proposals = servicer(state)
    with pytest.raises(Aborted) as refused:
        submit_many(svc, capped("a"), capped("b"), capped("c"))
    assert refused.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.value.message.startswith("job 3 of 3 (c): limit reached: queue capped: user alice has 0 pending")
    assert proposals == [] and not state.jobs
    ids = [r.job_id for r in submit_many(svc, capped("a"), capped("b")).jobs]
    assert [state.jobs[i].spec.name for i in ids] == ["a", "b"] and len(proposals) == 1  # both in one proposal
    assert [r.job_id for r in submit_many(svc, capped("a"), capped("b")).jobs] == ids  # a retry
    assert len(proposals) == 1  # nothing new to propose


def test_a_job_refused_at_commit_names_the_jobs_submitted_and_a_retry_completes_the_request():
    from synapse.core import commands as c

    state = limited_state()
    racing = [c.SubmitJob(at=99, by="alice", job_id="other", request_id="other", spec=spec(queue="capped"))]
    svc, proposals = servicer(state, before_commit=lambda: racing and state.apply(racing.pop()))
    with pytest.raises(Aborted) as refused:  # another of alice's jobs commits between the check and this commit
        submit_many(svc, capped("a"), capped("b"))
    assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.message.startswith("job 2 of 2 (b): job b: queue capped: user alice has 2 pending")
    assert refused.value.message.endswith("the others were submitted (a-1): a retry with the same request ids gets "
                                          "them and submits the rest")
    assert sorted(state.jobs) == ["a-1", "other"]
    assert state.apply(c.CancelJob(at=101, by="alice", job_id="other")).ok
    assert [r.job_id for r in submit_many(svc, capped("a"), capped("b")).jobs] == ["a-1", "b-3"]


def test_a_drawn_job_id_that_a_retained_job_holds_is_drawn_again():
    from synapse.core import commands as c

    state = limited_state()
    assert state.apply(c.SubmitJob(at=99, by="alice", job_id="a-1", request_id="", spec=spec(name="a"))).ok
    svc, _ = servicer(state)  # its first id drawn for "a" is a-1, which the job above holds
    [reply] = submit_many(svc, capped("a", "new")).jobs
    assert reply.job_id == "a-2" and state.jobs["a-2"].request_id == "new"
