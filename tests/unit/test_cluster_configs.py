"""Every example in cluster-configs/ loads, naming what is wrong in a bad one (the systemd units:
tests/cluster/test_cluster_configs.py)."""


import pytest

from synapse.master.config import ConfigError, load_cluster_config, parse_cluster_config
from tests.support.paths import ROOT

EXAMPLES = sorted((ROOT / "cluster-configs").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_cluster_files_load(path, monkeypatch):
    monkeypatch.setenv("SYNAPSE_RAFT_PASSWORD", "pw")
    monkeypatch.setenv("SYNAPSE_TOKEN", "tok")
    config = load_cluster_config(path)
    assert len(config.replicas) in (3, 5) and config.raft_password == "pw" and config.token == "tok"
    assert config.heartbeat_timeout > config.heartbeat_interval
    assert config.tls.enabled and config.require_worker_certs  # what a site runs: TLS, mTLS for workers


def test_there_are_three_and_five_replica_examples():
    sizes = sorted(len(load_cluster_config(p, need_secrets=False).replicas) for p in EXAMPLES)
    assert sizes == [3, 5]


@pytest.mark.parametrize("doc,error", [
    ({"replicas": []}, "replicas"),
    ({"replicas": [{"id": "a", "raft": "h:1", "api": "h"}]}, "replicas[0].api"),
    ({"replicas": [{"id": "a", "raft": "h:1", "api": "h:2"}, {"id": "a", "raft": "h:3", "api": "h:4"}]},
     "duplicate id"),
    ({"replicas": [{"id": "a", "raft": "h:1", "api": "h:2"}], "raft_password": ""}, "raft_password: required"),
    ({"replicas": [{"id": "a", "raft": "h:1", "api": "h:2"}], "raft_password": {"env": "NOPE_NOT_SET"}},
     "NOPE_NOT_SET is not set"),
    ({"replicas": [{"id": "a", "raft": "h:1", "api": "h:2"}], "raft_password": "x", "colour": 1}, "colour"),
    ({"replicas": [{"id": "a", "raft": "h:1", "api": "h:2"}], "raft_password": "x", "heartbeat_interval": "10s",
      "heartbeat_timeout": "5s"}, "heartbeat_timeout"),
])
def test_bad_cluster_files_name_the_field(doc, error):
    with pytest.raises(ConfigError, match=error.replace("[", r"\[").replace("]", r"\]")):
        parse_cluster_config(doc)


