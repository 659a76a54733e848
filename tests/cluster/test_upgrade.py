"""Rolling upgrades on real replicas: a leader proposes a new kind only once every member knows it, and a
mixed-version cluster never proposes what an older replica cannot apply (the codec's and the state
machine's part is in tests/unit/test_upgrade.py)."""

from __future__ import annotations

import re
import time

import grpc
import pytest

from synapse.client.master_client import ClientError, ClusterUnavailable
from synapse.core import codec
from synapse.local.cluster import free_base_port
from synapse.master.main import TEST_COMMAND_VERSION_ENV, TEST_NEW_KIND_ENV
from synapse.master.raft import ProposeError, RaftNode, raft_config
from synapse.proto import api_pb2
from tests.support.cluster import synctl, wait_exit
from tests.support.helpers import spec
from tests.support.upgrade import ADD_USER, NEWER, OLDER, REGISTER, N, V


def test_a_leader_proposes_a_new_kind_only_once_every_member_has_told_it_knows_it(tmp_path):
    """Unit level, one replica and a member that never answers (not heard from: not upgraded)."""
    nodes = []
    try:
        for i, commands in enumerate((OLDER, NEWER)):
            port = free_base_port(2)
            me, silent = f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"
            conf = raft_config(bind_address=me, data_dir=str(tmp_path / str(i)), password="pw")
            node = RaftNode(me, [silent], conf, durable=False, commands=commands)
            nodes.append(node)
            assert node.member_versions() == {me: commands.known, silent: 0} and node.cluster_version() == 1
            node.check_cluster_version(REGISTER)  # every release applies it: never held back
            with pytest.raises(ProposeError) as refused:
                node.check_cluster_version(ADD_USER)
            assert refused.value.kind == "CLUSTER_VERSION" and not refused.value.maybe_applied
            assert refused.value.needed == N
            assert dict(refused.value.behind) == ({me: V, silent: 0} if commands is OLDER else {silent: 0})
    finally:
        for node in nodes:
            node.destroy()


def _wait(what: str, check, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except (ClientError, ClusterUnavailable):  # a replica still starting
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _versions(cluster) -> dict[str, tuple[int, int]]:
    """Replica id -> (its command version, the cluster version it reports)."""
    out = {}
    for m in cluster.state["masters"]:
        s = cluster.client.replica_status(m["api_address"])
        out[s.id] = (s.command_version, s.cluster_version)
    return out


def _start_older(cluster, replica_id: str, monkeypatch) -> None:
    cluster.kill_master(replica_id)
    with monkeypatch.context() as env:
        env.setenv(TEST_COMMAND_VERSION_ENV, str(OLDER.known))
        cluster.restart_master(replica_id)


@pytest.mark.slow
def test_a_mixed_version_cluster_never_proposes_what_an_older_replica_cannot_apply(make_cluster, monkeypatch):
    monkeypatch.setenv(TEST_NEW_KIND_ENV, "AddUser")  # every replica runs the next release...
    cluster = make_cluster()
    leader = cluster.wait_leader()
    old = next(m for m in ("m1", "m2", "m3") if m != leader)
    _start_older(cluster, old, monkeypatch)  # ...but one, back to the release before
    _wait("the older replica", lambda: _versions(cluster)[old] == (V, 0))

    def refused_naming_the_older_replica() -> bool:
        with pytest.raises(ClientError) as refused:  # never proposed, whether or not it is heard yet
            cluster.client.call("AddUser", api_pb2.AddUserRequest(name="alice"))
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION, refused.value.message
        assert "CLUSTER_VERSION" in refused.value.message and f"needs command-set version {N}" in refused.value.message
        return f"{old} (version {V})" in refused.value.message

    _wait("the leader to hear the older replica's version", refused_naming_the_older_replica)
    assert _versions(cluster)[cluster.wait_leader()] == (N, V)
    assert cluster.client.submit(codec.job_spec_to_proto(spec(name="meanwhile")))  # what every release knows
    table = synctl(cluster, "cluster", "status").output
    assert f"cluster version: {V}" in table and "VERSION" in table
    cluster.converged_digest()  # the older replica applied everything and is still up

    cluster.kill_master(old)
    cluster.restart_master(old)  # upgraded
    _wait(f"the cluster version to reach {N}", lambda: _versions(cluster)[cluster.wait_leader()] == (N, N))
    cluster.client.call("AddUser", api_pb2.AddUserRequest(name="alice"))
    cluster.converged_digest()
    assert "alice" in {u.name for u in cluster.client.call("ListUsers", api_pb2.ListUsersRequest()).users}

    # Started as the older release again, the replica meets AddUser in its journal: it stops there.
    _start_older(cluster, old, monkeypatch)
    assert wait_exit(cluster.master(old)["pid"]) == 3
    log = (cluster.data_dir / "logs" / f"{old}.log").read_text()
    stopped = (rf"replica {old} stops: log entry \d+ holds a command this replica's code cannot apply: "
               rf"command version {N} is not supported \(this replica knows 1\.\.{V}; body add_user\)")
    assert re.search(stopped, log), log[-3000:]
    assert "release its peers run" in log
    cluster.restart_master(old)  # upgraded again, it applies the entry it stopped at
    cluster.converged_digest(timeout=30)
