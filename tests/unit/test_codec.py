import dataclasses

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from synapse.core import codec, versions
from synapse.core import commands as c
from synapse.core.model import Placement, Queue, Resources, Role
from synapse.proto import commands_pb2
from tests.support.core import _submit, started_state
from tests.support.helpers import spec

ALL_COMMANDS = [
    c.RegisterNode(at=1.5, node_id="n1", address="h:1", topology=("z", "b", "r"),
                   capacity=Resources(64000, 1 << 30, 8)),
    c.NodeDown(at=2, term=3, node_id="n1", reason="silent 10s"),
    c.NodeUp(at=2, term=3, node_id="n1"),
    c.SetSchedulable(at=2, node_id="n1", schedulable=False),
    c.SubmitJob(at=3, by="alice", job_id="j1", request_id="r1", spec=spec(tasks=4, pack="rack", required=True,
                                                                          priority=5, time_limit=60)),
    c.CommitPlan(at=4, term=2, job_id="j1", attempt=1,
                 placements=(Placement(0, "n1", (0, 1), 0), Placement(1, "n2", (), 1))),
    c.TaskStarted(at=5, job_id="j1", attempt=1, index=0, node_id="n1"),
    c.TaskExited(at=6, job_id="j1", attempt=1, index=0, node_id="n1", exit_code=-9, reason="killed"),
    c.CancelJob(at=7, job_id="j1", reason="user"),
    c.FailAttempt(at=8, term=4, job_id="j1", attempt=2, reason="time limit", final=True),
    c.Barrier(at=9, term=4, reason="read"),
    c.ForgetJobs(at=10, term=4, job_ids=("j1", "j2")),
    c.ArchiveJobs(at=10, term=4, job_ids=("j1", "A")),
    c.AddUser(at=11, by="admin", name="alice", role=Role.ADMIN, groups=("team-a", "ml"), token_hash="ab" * 32),
    c.SetUserToken(at=12, by="alice", name="alice", token_hash="cd" * 32),
    c.RemoveUser(at=13, by="admin", name="alice"),
    c.ApplyQueues(at=14, by="admin", queues=(
        Queue("research"), Queue("a", parent="research", weight=2.5, guaranteed=Resources(64000, 1 << 30, 16),
                                 max=Resources(-1, -1, 32), users=("alice",), groups=("team-a",),
                                 preemption_rules=("reclaim",), min_runtime=600, max_grace=30))),
    c.DeleteQueue(at=15, by="admin", name="a"),
    c.PendingReasons(at=17, term=3, entries=(c.PendingReason("j1", 2, "QueueAtMax", "queue a is at its max"),)),
    c.Preempt(at=18, term=3, job_id="j1", attempt=1, rule="reclaim", nodes=("n1",), explanation="why",
              victims=(c.Victim("j2", 1, 30.0),)),
    c.SubmitJob(at=16, job_id="j2", request_id="r2", spec=spec(queue="a")),
    c.GpuFault(at=19, term=3, node_id="n1", gpus=(0, 3), message="GPU 0: Xid 79; GPU 3: ECC"),
    c.RecordExec(at=20, by="alice", job_id="j1", attempt=1, index=0, command=("sh", "-c", "ls")),
]


@pytest.mark.parametrize("cmd", ALL_COMMANDS, ids=lambda cmd: type(cmd).__name__)
def test_every_command_round_trips(cmd):
    assert codec.decode_command(codec.encode_command(cmd)) == cmd


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_submission_decodes_to_what_its_endpoint_encoded_type_for_type(data):
    """A leader applies the submissions it encoded instead of decoding its own entry (raft.RaftNode
    ._flush, OWN_KINDS): decoding must give back exactly what SubmitJob built, the spec decoded from
    the request, for every kind a submission travels as (the apply property test's specs)."""
    drawn = _submit(data, started_state(), 1.0, "j0", None, 1, "", 0, st.sampled_from(["", "alice", "x/y"]))[0]
    try:
        request_spec = codec.job_spec_to_proto(drawn.spec)
    except ValueError:  # a negative count no request can carry
        assume(False)
    spec = codec.job_spec_from_proto(request_spec, default_queue="default")
    cmd = c.submit_kind(spec)(at=data.draw(st.floats(0, 2e9)), by=drawn.by, job_id=drawn.job_id,
                              request_id=drawn.request_id, spec=spec)
    assert codec.identical(codec.decode_command(codec.encode_command(cmd)), cmd), cmd
    assert codec.identical(codec.decode_entry(codec.encode_batch([cmd, cmd])), [cmd, cmd])


def test_identical_tells_types_apart_where_equality_does_not():
    submit = ALL_COMMANDS[4]
    assert codec.identical(submit, dataclasses.replace(submit))
    as_float = dataclasses.replace(submit, at=3.0)
    assert submit == as_float and not codec.identical(submit, as_float)
    listed = dataclasses.replace(submit, spec=dataclasses.replace(submit.spec, command=list(submit.spec.command)))
    assert not codec.identical(submit, listed)
    assert not codec.identical(ALL_COMMANDS[:2], tuple(ALL_COMMANDS[:2]))
    assert codec.identical(ALL_COMMANDS, list(ALL_COMMANDS))


def test_env_is_kept_sorted():
    s = dataclasses.replace(spec(), env=(("B", "2"), ("A", "1")))
    decoded = codec.decode_command(codec.encode_command(c.SubmitJob(at=0, job_id="j", request_id="", spec=s)))
    assert decoded.spec.env == (("A", "1"), ("B", "2"))


@pytest.mark.parametrize("data", [b"\xff\xff\xff", b"\x0a\x05abc", b"garbage-not-protobuf\x00"])
def test_malformed_bytes_raise_codec_error(data):
    with pytest.raises(codec.CodecError):
        codec.decode_command(data)


def test_unknown_version_and_empty_body_are_refused():
    env = codec.command_to_proto(ALL_COMMANDS[0])
    env.version = versions.COMMAND_VERSION + 1
    with pytest.raises(codec.CodecError, match="version"):
        codec.decode_command(env.SerializeToString())
    with pytest.raises(codec.CodecError, match="no known body"):
        codec.decode_command(commands_pb2.Command(version=1, at=1).SerializeToString())


def test_a_spec_decodes_alike_whether_its_empty_parts_are_absent_or_sent_empty():
    """job_spec_from_proto shares constants for an absent topology, checkpoint, env, dependencies
    and mounts; a message that carries them empty (another client's encoder) decodes to the same
    spec, and one that sets them is read in full. `default_queue` fills only an empty queue."""
    from synapse.core.model import CheckpointSpec, PackMode, TopologySpec
    from synapse.proto import types_pb2

    plain = spec()
    sparse = codec.job_spec_to_proto(plain)
    assert not sparse.HasField("checkpoint")
    explicit = types_pb2.JobSpec()
    explicit.CopyFrom(sparse)
    explicit.topology.SetInParent()
    explicit.checkpoint.SetInParent()
    assert codec.job_spec_from_proto(sparse) == codec.job_spec_from_proto(explicit) == plain
    full = dataclasses.replace(plain, env=(("A", "1"),), after=(("afterok", "j0"),),
                               topology=TopologySpec("rack", PackMode.REQUIRED),
                               checkpoint=CheckpointSpec("USR1", 30.0), mounts=(("/data", "/data", True),))
    assert codec.job_spec_from_proto(codec.job_spec_to_proto(full)) == full
    assert codec.job_spec_from_proto(sparse, default_queue="default").queue == "default"
    assert codec.job_spec_from_proto(codec.job_spec_to_proto(spec(queue="a")), default_queue="default").queue == "a"
    with pytest.raises(codec.CodecError):
        codec.job_spec_from_proto(types_pb2.JobSpec(topology=types_pb2.TopologySpec(mode="sideways")))


def _pinned_commands() -> list[c.Command]:
    from synapse.core.model import CheckpointSpec, PackMode, TopologySpec

    return [
        c.SubmitJob(at=3, by="alice", job_id="j1", request_id="r1",
                    spec=spec(tasks=4, pack="rack", required=True, priority=5, time_limit=60)),
        c.SubmitJob(at=16, job_id="j2", request_id="", spec=spec(queue="a")),
        c.SubmitWorkflowJob(at=20, by="bob", job_id="j3", request_id="r3",
                            spec=dataclasses.replace(spec(tasks=2), env=(("A", "1"),), array="0-9", array_throttle=2,
                                                     after=(("ok", "j1"),), tasks_min=1, resize_interval=30.0)),
        c.SubmitCheckpointJob(at=21, by="bob", job_id="j4", request_id="r4",
                              spec=dataclasses.replace(spec(), checkpoint=CheckpointSpec("SIGUSR1", 60.0),
                                                       time_limit=3600.0,
                                                       topology=TopologySpec("", PackMode.REQUIRED))),
        c.SubmitImageJob(at=22, by="bob", job_id="j5", request_id="r5",
                         spec=dataclasses.replace(spec(), image="registry.local/team/train:1", command=(),
                                                  mounts=(("/data", "/data", True),), image_pull_timeout=600.0)),
        c.PendingReasons(at=17, term=3, entries=(c.PendingReason("j1", 2, "QueueAtMax", "queue a is at its max"),)),
        c.PendingReasons(at=23, term=3, entries=()),
    ]


def test_the_bytes_of_what_a_submission_proposes_are_pinned():
    """Submissions and pending reasons are written into their envelope in place (a batch's too), not
    built apart and copied in: the log entry's bytes must stay those of the copying encoder (SHA-256
    prefixes taken from it), which older replicas and journals already hold. Presence matters: a
    spec's resources and topology are always sent, a checkpoint only when asked for, and an entry
    with no pending reasons still carries its (empty) body."""
    import hashlib

    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()[:16]

    cmds = _pinned_commands()
    assert [digest(codec.encode_command(cmd)) for cmd in cmds] == [
        "e2436c9cd9e5ca7d", "bf39ad64fc151687", "751f0d6c3a8c130b", "1498a5cb5dc5cb59", "5c395fbaf095a5a2",
        "1dc82be88dc5c83a", "8a43a473ff08f89f"]
    assert digest(codec.encode_batch(cmds)) == "8f1650a340d558a7"
    assert digest(codec.job_spec_to_proto(cmds[2].spec).SerializeToString()) == "092e35e415964a9d"
    assert codec.decode_entry(codec.encode_batch(cmds)) == cmds
