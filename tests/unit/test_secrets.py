"""Job secrets, the pure parts: sealing, the command that carries them, apply, snapshots, the job file,
the listing that opens them and what the API shows. (A real cluster: tests/cluster/test_secrets_cluster.py.)"""

import dataclasses

import pytest

from synapse.client.jobfile import load_secrets
from synapse.core import codec, versions
from synapse.core import commands as c
from synapse.core.jobs.jobspec import JobFileError, check_spec, parse_job, secret_refs
from synapse.core.model import Placement
from synapse.core.state.fsm import ClusterState
from synapse.master.cipher import SecretError, SecretSeal
from synapse.master.dispatch import assignments_for_node
from synapse.rpc import convert
from tests.support.helpers import checked, cluster, spec

VALUE = "sk-live-0123456789abcdef"
SEAL = SecretSeal("the cluster's raft password")


def with_secret(value: str = VALUE, seal: SecretSeal = SEAL, **kw):
    return dataclasses.replace(spec(**kw), secrets=(seal.seal("API_KEY", value),))


def test_a_sealed_secret_opens_under_its_key_alone_and_hides_its_value():
    secret = SEAL.seal("API_KEY", VALUE)
    assert SEAL.open(secret) == VALUE
    assert VALUE.encode() not in secret.sealed + secret.fingerprint
    assert VALUE.encode().hex() not in secret.sealed.hex()
    with pytest.raises(SecretError):
        SecretSeal("another cluster's password").open(secret)
    with pytest.raises(SecretError):  # the name is bound in: a sealed value cannot move to another name
        SEAL.open(dataclasses.replace(secret, name="OTHER"))
    with pytest.raises(SecretError):
        SEAL.open(dataclasses.replace(secret, sealed=secret.sealed[:-1] + bytes([secret.sealed[-1] ^ 1])))
    again = SEAL.seal("API_KEY", VALUE)
    assert again.sealed != secret.sealed  # a fresh nonce each time...
    assert again == secret  # ...yet the same secret: a retried submission is the same job
    assert SEAL.seal("API_KEY", VALUE + "x") != secret


def test_secrets_travel_as_their_own_kind_that_an_older_replica_refuses():
    s = with_secret()
    assert c.submit_kind(s) is c.SubmitSecretJob
    cmd = c.SubmitSecretJob(at=1.0, job_id="j1", request_id="r1", spec=s)
    decoded = codec.decode_command(codec.encode_command(cmd))
    assert codec.identical(decoded, cmd)
    assert decoded.spec.secrets[0].sealed == s.secrets[0].sealed
    for kind in (c.SubmitJob, c.SubmitWorkflowJob, c.SubmitCheckpointJob, c.SubmitImageJob):
        with pytest.raises(codec.CodecError, match="travels as SubmitSecretJob"):
            codec.encode_command(kind(at=1.0, job_id="j1", request_id="r1", spec=s))
    older = codec.CommandSet(versions.KIND_VERSIONS, versions.KIND_VERSIONS[c.SubmitSecretJob] - 1)
    with pytest.raises(codec.CodecError):
        codec.decode_command(codec.encode_command(cmd), older)


def test_apply_keeps_them_sealed_takes_a_retry_and_refuses_another_value_or_the_wrong_kind():
    state = cluster()
    assert not checked(state, c.SubmitImageJob(at=1, job_id="j0", request_id="r0", spec=with_secret())).ok
    assert checked(state, c.SubmitSecretJob(at=1, job_id="j1", request_id="r1", spec=with_secret())).value == "j1"
    assert SEAL.open(state.jobs["j1"].spec.secrets[0]) == VALUE
    retry = checked(state, c.SubmitSecretJob(at=2, job_id="j2", request_id="r1", spec=with_secret()))
    assert retry.value == "j1" and "j2" not in state.jobs
    other = checked(state, c.SubmitSecretJob(at=2, job_id="j3", request_id="r1", spec=with_secret(VALUE + "2")))
    assert other.code is c.Rejection.CONFLICT
    restored = ClusterState.from_snapshot(state.to_snapshot())
    assert restored.jobs["j1"].spec.secrets[0].sealed == state.jobs["j1"].spec.secrets[0].sealed
    assert restored.digest() == state.digest()
    assert state.to_snapshot()["version"] == 5
    assert VALUE not in repr(state.to_snapshot())


def test_the_listing_opens_them_for_the_tasks_and_the_api_shows_names_alone():
    state = cluster()
    s = dataclasses.replace(with_secret(), env=(("MODE", "fast"),))
    checked(state, c.SubmitSecretJob(at=1, job_id="j1", request_id="r1", spec=s))
    node = sorted(state.nodes)[0]
    checked(state, c.CommitPlan(at=2, job_id="j1", attempt=1, placements=(Placement(0, node, tuple(range(8)), 0),)))
    [listed] = assignments_for_node(state, node, SEAL.open)
    assert dict(listed.env)["API_KEY"] == VALUE and dict(listed.env)["MODE"] == "fast"
    assert "API_KEY" not in dict(assignments_for_node(state, node)[0].env)
    # sealed under another key (the Raft password changed): left out, the rest still listed
    [other] = assignments_for_node(state, node, SecretSeal("another").open)
    assert "API_KEY" not in dict(other.env) and dict(other.env)["MODE"] == "fast"
    owner = convert.job_to_info(state.jobs["j1"], env_shown=True)
    stranger = convert.job_to_info(state.jobs["j1"])
    for info in (owner, stranger):
        assert [(x.name, x.sealed, x.fingerprint) for x in info.spec.secrets] == [("API_KEY", b"", b"")]
        assert VALUE.encode() not in info.SerializeToString()
    assert dict(owner.spec.env) == {"MODE": "fast"}
    assert dict(stranger.spec.env) == {"MODE": convert.HIDDEN_VALUE}


def test_a_job_file_names_its_secrets_by_file_or_variable(tmp_path):
    (tmp_path / "key").write_text(VALUE + "\n")
    (tmp_path / "cert.pem").write_text("line1\nline2\n\n")
    job = tmp_path / "job.yaml"
    job.write_text("name: j\ncommand: [env]\nenv: {MODE: fast}\n"
                   f"secrets: {{API_KEY: file:key, CERT: ./cert.pem, TOKEN: env:MY_TOKEN, ABS: {tmp_path / 'key'}}}\n")
    assert load_secrets(job, {"MY_TOKEN": "t0k"}) == {"API_KEY": VALUE, "CERT": "line1\nline2\n", "TOKEN": "t0k",
                                                     "ABS": VALUE}
    assert not parse_job({"name": "j", "command": ["env"], "secrets": {"A": "env:A"}}).secrets  # names only here
    with pytest.raises(JobFileError, match="secrets.TOKEN: environment variable MY_TOKEN is not set"):
        load_secrets(job, {})
    (tmp_path / "key").unlink()
    with pytest.raises(JobFileError, match="secrets.ABS: cannot read .*key: No such file"):
        load_secrets(job, {"MY_TOKEN": "x"})
    for doc, error in [({"secrets": {"1BAD": "env:X"}}, "not a valid variable name"),
                       ({"secrets": {"MODE": "env:X"}, "env": {"MODE": "1"}}, "also in env"),
                       ({"secrets": ["A"]}, "must be a mapping"),
                       ({"secrets": {"A": 3}}, "must be file:PATH or env:VARIABLE")]:
        with pytest.raises(JobFileError, match=error):
            secret_refs(doc)
    with pytest.raises(JobFileError, match="also in env"):
        check_spec(dataclasses.replace(with_secret(), env=(("API_KEY", "x"),)))
