"""The rendezvous port range as a setting of the cluster file and of dispatch, and the example cluster
files naming it (synapse-local's `up` and `down` are in tests/cluster/test_local_up.py)."""

from __future__ import annotations

import pytest

from synapse.core.rendezvous import MASTER_PORTS, RESERVED, ephemeral_overlap, master_port, parse_ports
from synapse.master.config import ConfigError, parse_cluster_config
from synapse.master.dispatch import assignments_for_node
from tests.support import paths
from tests.support.helpers import cluster as sim_cluster
from tests.support.helpers import spec


def test_the_rendezvous_ports_are_a_setting_of_the_cluster_file():
    base = {"replicas": [{"id": "m1", "raft": "h:1", "api": "h:2"}]}
    assert parse_cluster_config(base, need_secrets=False).rendezvous_ports == MASTER_PORTS == range(20000, 30000)
    set_ = parse_cluster_config({**base, "rendezvous_ports": "12000-12999"}, need_secrets=False)
    assert set_.rendezvous_ports == range(12000, 13000)
    for bad, why in (("12000", "must be LOW-HIGH"), ("80-2000", "from 1024 to 65535"),
                     ("12000-12010", "at least 100 ports"), ("60000-70000", "from 1024 to 65535")):
        with pytest.raises(ConfigError, match=f"rendezvous_ports: .*{why}"):
            parse_cluster_config({**base, "rendezvous_ports": bad}, need_secrets=False)


def test_dispatch_gives_every_rank_a_port_from_the_configured_range():
    from synapse.core import commands as c
    from synapse.core.model import Placement
    from tests.support.helpers import checked
    state = sim_cluster(racks=1, nodes_per_rack=2)
    checked(state, c.SubmitJob(at=1.0, job_id="j", request_id="r", spec=spec(tasks=2, gpu=8)))
    checked(state, c.CommitPlan(at=2.0, job_id="j", attempt=1, placements=(
        Placement(0, "r0-n0", tuple(range(8)), 0), Placement(1, "r0-n1", tuple(range(8)), 1))))
    ports = range(12000, 13000)
    given = {a.master_port for n in ("r0-n0", "r0-n1") for a in assignments_for_node(state, n, ports=ports)}
    assert given == {master_port("j", 1, ports)} and master_port("j", 1, ports) in ports
    # unset, the port is the one every earlier release gave: an upgrade straddling it changes nothing
    assert {a.master_port for a in assignments_for_node(state, "r0-n0")} == {master_port("j", 1)}
    assert master_port("train-1a2b3c4d", 1) == 28573


def test_the_port_range_spreads_and_skips_the_reserved_ports():
    ports = parse_ports("29000-29999")
    drawn = {master_port(f"job-{i}", 1, ports) for i in range(3000)}
    assert drawn <= set(ports) - RESERVED and len(drawn) > 900
    assert ephemeral_overlap(29500, 40000, ports) == range(29500, 30000)


def test_the_example_cluster_files_name_the_rendezvous_ports():
    root = paths.ROOT
    for name in ("three.yaml", "five.yaml"):
        text = (root / "cluster-configs" / name).read_text()
        assert "rendezvous_ports:" in text, name
    assert "SYNAPSE_RENDEZVOUS_PORTS" in (root / "cluster-configs" / "worker.env").read_text()
