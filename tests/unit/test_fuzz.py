"""Fuzzing the entry points: no input crashes a parser or a master, and no refusal changes state."""

from __future__ import annotations

import grpc
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synapse.core.jobs.jobspec import JobFileError, check_spec, parse_job
from synapse.core.model import JobSpec

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                    st.text(max_size=30), st.sampled_from(["64Gi", "500m", "2h", "rack", "required", "-1", "1e9"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                      max_leaves=12)
fields = st.sampled_from(["name", "tasks", "resources", "command", "env", "topology", "priority", "max_restarts",
                          "time_limit", "image", "cpu", "memory", "gpu", "pack", "mode", "bogus"])
job_docs = st.dictionaries(fields, values, max_size=8) | st.fixed_dictionaries(
    {"name": st.text(max_size=70), "command": values, "tasks": values,
     "resources": st.dictionaries(st.sampled_from(["cpu", "memory", "gpu", "x"]), values, max_size=3),
     "topology": st.dictionaries(st.sampled_from(["pack", "mode"]), values, max_size=2)})


@settings(max_examples=400, deadline=None)
@given(job_docs)
def test_job_parser_accepts_or_names_the_field(doc):
    try:
        spec = parse_job(doc)
    except JobFileError as exc:
        assert exc.field and exc.why
        return
    assert isinstance(spec, JobSpec)
    check_spec(spec)  # whatever the parser accepts passes the server's own check


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_job_parser_on_raw_text(text):
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return
    try:
        parse_job(doc)
    except JobFileError:
        pass


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    from tests.support.cluster import LocalCluster

    cluster = LocalCluster(tmp_path_factory.mktemp("fuzz") / "c", masters=3, workers=0, racks=1, gpus=8)
    yield cluster
    cluster.stop()


resources = st.builds(lambda c, m, g: (c, m, g), st.integers(-5, 10**7), st.integers(-5, 1 << 41),
                      st.integers(-5, 2000))
submit_requests = st.fixed_dictionaries({
    "request_id": st.text(max_size=300), "name": st.text(max_size=80), "tasks": st.integers(-3, 200_000),
    "res": resources, "command": st.lists(st.text(max_size=50), max_size=5),
    "env": st.dictionaries(st.text(max_size=12), st.text(max_size=20), max_size=4),
    "pack": st.sampled_from(["", "rack", "zone", "node", "galaxy"]), "mode": st.sampled_from(["", "required", "x"]),
    "priority": st.integers(-2_000_000, 2_000_000), "max_restarts": st.integers(-2, 2000),
    "time_limit": st.floats(-10, 1e9) | st.sampled_from([float("nan"), float("inf")])})


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(submit_requests)
def test_submit_rpc_fuzz_never_crashes_and_refusals_change_nothing(shared_cluster, r):
    from synapse.proto import api_pb2, types_pb2

    cpu, mem, gpu = r["res"]
    spec = types_pb2.JobSpec(
        name=r["name"], tasks=r["tasks"], resources=types_pb2.Resources(cpu_millis=cpu, memory_bytes=mem, gpu=gpu),
        command=r["command"], env=r["env"], topology=types_pb2.TopologySpec(pack=r["pack"], mode=r["mode"]),
        priority=r["priority"], max_restarts=r["max_restarts"], time_limit_s=r["time_limit"])
    client = shared_cluster.client
    before = len(client.list_jobs())  # also learns the leader
    stub = client.stub(client.leader)
    try:
        reply = stub.SubmitJob(api_pb2.SubmitJobRequest(request_id=r["request_id"], spec=spec),
                               metadata=client.metadata, timeout=10)
    except grpc.RpcError as exc:
        assert exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION), \
            (exc.code(), exc.details())
        assert len(client.list_jobs()) == before
        return
    assert client.get_job(reply.job_id).spec.name == r["name"]


@pytest.mark.slow
def test_malformed_request_bytes_on_every_rpc(shared_cluster):
    import random

    from synapse.proto import api_pb2

    client = shared_cluster.client
    client.list_nodes()  # learn the leader
    channel = client.channel(client.leader)
    rng = random.Random(3)
    methods = [m.name for m in api_pb2.DESCRIPTOR.services_by_name["Master"].methods]
    for method in methods:
        for blob in (rng.randbytes(64), b"\xff" * 32, b"\x0a\xff\xff\xff\xff\x0f"):
            call = channel.unary_unary(f"/synapse.v1.Master/{method}", request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
            with pytest.raises(grpc.RpcError) as err:
                call(blob, metadata=client.metadata, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, err.value.details())
            assert err.value.details().startswith("malformed request")
    # Still serving, replicas still agree.
    assert client.list_nodes() is not None
    shared_cluster.converged_digest()


user_requests = st.fixed_dictionaries({
    "method": st.sampled_from(["AddUser", "RotateUserToken", "RemoveUser", "LogAccess"]),
    "name": st.text(max_size=40) | st.sampled_from(["admin", "ok-user", "a" * 33, ""]),
    "groups": st.lists(st.text(max_size=12), max_size=4), "role": st.sampled_from(["", "user", "admin", "root"]),
    "attempt": st.integers(-5, 5)})


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(user_requests)
def test_user_rpc_fuzz_never_crashes_and_refusals_change_nothing(shared_cluster, r):
    from synapse.proto import api_pb2

    client = shared_cluster.client
    before = list(client.call("ListUsers", api_pb2.ListUsersRequest()).users)
    request = {"AddUser": lambda: api_pb2.AddUserRequest(name=r["name"], groups=r["groups"], role=r["role"]),
               "RotateUserToken": lambda: api_pb2.RotateUserTokenRequest(name=r["name"]),
               "RemoveUser": lambda: api_pb2.RemoveUserRequest(name=r["name"]),
               "LogAccess": lambda: api_pb2.LogAccessRequest(job_id=r["name"], attempt=r["attempt"])}[r["method"]]()
    try:
        reply = getattr(client.stub(client.leader), r["method"])(request, metadata=client.metadata, timeout=10)
    except grpc.RpcError as exc:
        assert exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                              grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION), \
            (exc.code(), exc.details())
        assert list(client.call("ListUsers", api_pb2.ListUsersRequest()).users) == before
        return
    after = {u.name for u in client.call("ListUsers", api_pb2.ListUsersRequest()).users}
    if r["method"] == "AddUser":
        assert reply.user.name == r["name"] in after and reply.token.startswith("syn_")
    elif r["method"] == "RemoveUser":
        assert r["name"] not in after


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=80))  # what metadata may carry
def test_any_wrong_token_is_unauthenticated(shared_cluster, token):
    from synapse.proto import api_pb2

    client = shared_cluster.client
    client.list_nodes()
    with pytest.raises(grpc.RpcError) as err:
        client.stub(client.leader).ListNodes(api_pb2.ListNodesRequest(), timeout=10,
                                             metadata=(("authorization", f"Bearer {token}"),))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, err.value.details()
