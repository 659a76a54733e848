"""Several jobs in one request, the pure parts: synctl's copies and request ids, its reading of
several job files, and the client's fall-back to one SubmitJob each on a master without SubmitJobs."""

from __future__ import annotations

import grpc
from click.testing import CliRunner

from synapse.client.cli.main import main
from synapse.client.cli.submit import numbered_copies, request_ids
from synapse.client.master_client import ClientError, MasterClient, job_request
from synapse.core.jobs.jobspec import MAX_NAME
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
