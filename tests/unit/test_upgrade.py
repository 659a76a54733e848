"""Rolling upgrades: a replica stops at a command it does not know, and a leader never proposes one.

A log entry this replica's code cannot apply (a command kind or version from a newer release, an
undecodable body) must not be skipped as a rejection: the replicas that apply it would part from
this one. It stops instead, its state as before that entry. So a leader proposes a kind introduced
by command-set version V only once every member has told it it knows V (etcd's cluster version).

The cluster tests (tests/cluster/test_upgrade.py) run one code base as two releases through the test-only seams of
synapse.master.main: every replica counts AddUser as introduced by the next version, and one
replica, started with SYNAPSE_TEST_COMMAND_VERSION set to this release's version, is the older
release that does not know it.
"""

from __future__ import annotations

import dataclasses

import pytest

from synapse.core import codec, versions
from synapse.core import commands as c
from synapse.core.state.fsm import ClusterState
from synapse.master.durability import seal
from synapse.master.main import TEST_COMMAND_VERSION_ENV, TEST_NEW_KIND_ENV, command_set
from synapse.master.replicated import ReplicatedState
from synapse.proto import commands_pb2
from tests.support.helpers import spec
from tests.support.upgrade import ADD_USER, NEWER, OLDER, REGISTER, N, V

#: A command body from a release with a oneof case this code lacks (field 99): parsed, not known.
UNKNOWN_BODY = commands_pb2.Command(version=1, at=3).SerializeToString() + b"\x9a\x06\x00"


def test_every_command_kind_has_the_version_that_introduced_it():
    kinds = {k for k in vars(c).values() if isinstance(k, type) and issubclass(k, c.Command) and k is not c.Command}
    assert set(versions.KIND_VERSIONS) == kinds
    known = {*versions.KIND_VERSIONS.values(), *versions.CAUSE_VERSIONS.values(), versions.SEALED_TRANSPORT_VERSION}
    assert versions.BASE_VERSION in known and max(known) == versions.COMMAND_VERSION
    assert known == set(range(versions.BASE_VERSION, versions.COMMAND_VERSION + 1))  # no version skipped


def test_a_log_entry_carries_the_version_of_its_kind():
    def version(data: bytes) -> int:
        return commands_pb2.Command.FromString(data).version

    assert version(codec.encode_command(ADD_USER, NEWER)) == N
    assert version(codec.encode_command(REGISTER, NEWER)) == 1  # an older replica still applies it
    assert version(codec.encode_batch([REGISTER, ADD_USER], NEWER)) == N
    assert version(codec.encode_batch([REGISTER, REGISTER], NEWER)) == 1
    assert codec.encode_command(ADD_USER) == codec.encode_command(ADD_USER, codec.CURRENT)  # today: version 1


def test_an_older_release_refuses_a_newer_kind_however_it_is_labelled():
    assert codec.decode_command(codec.encode_command(REGISTER, NEWER), OLDER) == REGISTER
    with pytest.raises(codec.CodecError, match=f"version {N} is not supported"):
        codec.decode_command(codec.encode_command(ADD_USER, NEWER), OLDER)
    mislabelled = codec.command_to_proto(ADD_USER, NEWER)
    mislabelled.version = 1
    with pytest.raises(codec.CodecError, match=f"AddUser commands need command-set version {N}"):
        codec.decode_command(mislabelled.SerializeToString(), OLDER)


def test_a_version_1_forget_jobs_applies_as_older_releases_do():
    """It keeps no final state and leaves arrays alone; ArchiveJobs (version 2) keeps them."""
    state = ClusterState()
    state.apply(REGISTER)
    for job_id in ("j", "k"):
        state.apply(c.SubmitJob(at=2, job_id=job_id, request_id="r" + job_id, spec=spec(name=job_id)))
        state.apply(c.CancelJob(at=3, job_id=job_id))
    array = dataclasses.replace(spec(name="a"), array="0-1")
    state.apply(c.SubmitWorkflowJob(at=2, job_id="A", request_id="rA", spec=array))
    state.apply(c.CancelJob(at=3, job_id="A"))
    assert state.apply(c.ForgetJobs(at=4, job_ids=("j", "A", "nope"))).value == "1"
    assert "j" not in state.jobs and "rj" not in state.job_by_request and "A" in state.arrays
    assert state.finished == {}
    assert versions.KIND_VERSIONS[c.ForgetJobs] == versions.BASE_VERSION
    assert versions.KIND_VERSIONS[c.ArchiveJobs] == 2
    assert state.apply(c.ArchiveJobs(at=5, job_ids=("k", "A"))).value == "2"
    assert state.finished == {"k": "CANCELLED", "A": "CANCELLED"}


def _batch_with_one_unknown() -> bytes:
    env = commands_pb2.Command(version=1)
    env.batch.commands.extend([codec.command_to_proto(REGISTER), commands_pb2.Command.FromString(UNKNOWN_BODY)])
    return env.SerializeToString()


@pytest.mark.parametrize(("data", "why"), [
    (UNKNOWN_BODY, "no known body"),
    (codec.encode_command(ADD_USER, NEWER), f"version {N} is not supported"),
    (b"\xff\xff\xff", "malformed command"),
    (_batch_with_one_unknown(), "batch command 1: command has no known body"),
], ids=["unknown-kind", "newer-version", "undecodable", "batch-with-an-unknown-command"])
def test_the_state_machine_changes_nothing_at_an_entry_it_does_not_know(data, why):
    state = ClusterState()
    state.apply_entry(codec.encode_command(c.NodeUp(at=1, term=3, node_id="n0")))  # a rejection, and term 3 seen
    before = (state.digest(), state.applied, state.max_term)
    with pytest.raises(codec.CodecError, match=why):
        state.apply_entry(data, OLDER)
    assert (state.digest(), state.applied, state.max_term) == before and not state.nodes


def test_a_replica_stops_at_an_unknown_entry_and_applies_nothing_after_it():
    replicated = ReplicatedState(commands=OLDER)
    stale = c.NodeUp(at=1, term=1, node_id="n1")
    assert replicated.apply(seal(codec.encode_command(c.Barrier(at=1, term=2))), _doApply=True) == [c.Result(True)]
    [result] = replicated.apply(seal(codec.encode_command(stale)), _doApply=True)
    assert result.code is c.Rejection.STALE and replicated.stop_reason() == ""  # a rejection, as ever
    applied = replicated.applied()

    assert replicated.apply(seal(codec.encode_command(ADD_USER, NEWER)), _doApply=True) is None
    assert "cannot apply" in replicated.unknown_entry and f"version {N} is not supported" in replicated.unknown_entry
    assert replicated.stop_reason() == replicated.unknown_entry
    assert replicated.apply(seal(codec.encode_command(REGISTER)), _doApply=True) is None  # nor anything after
    assert replicated.applied() == applied and not replicated.state.nodes and not replicated.state.users


def test_the_test_seam_builds_the_two_releases():
    assert command_set({}) is codec.CURRENT
    assert command_set({TEST_NEW_KIND_ENV: "AddUser"}) == NEWER
    assert command_set({TEST_NEW_KIND_ENV: "AddUser", TEST_COMMAND_VERSION_ENV: str(V)}) == OLDER


