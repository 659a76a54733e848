"""MASTER_PORT: the rule that picks it, and a node's ephemeral range (the worker's probe and a real
cluster: tests/cluster/test_rendezvous.py)."""

from __future__ import annotations

from synapse.core.rendezvous import MASTER_PORTS, RESERVED, ephemeral_overlap, master_port
from synapse.worker.runtime import ephemeral_ports

LINUX_EPHEMERAL = range(32768, 61000)  #: Linux's default net.ipv4.ip_local_port_range


def test_ports_come_from_below_the_ephemeral_range_and_miss_the_reserved_ones():
    ports = [master_port(f"train-{i:08x}", attempt) for i in range(3000) for attempt in (1, 2)]
    assert all(p in MASTER_PORTS and p not in RESERVED and p not in LINUX_EPHEMERAL for p in ports)
    assert MASTER_PORTS.stop <= 30000  # below Kubernetes' NodePort range too
    assert len(set(ports)) > 4000  # spread over the range: two gangs rarely draw the same


def test_the_port_is_a_function_of_job_and_attempt_only():
    # Pinned: every replica, and every release a gang may straddle, must compute the same port.
    assert [master_port("train-1a2b3c4d", attempt) for attempt in (1, 2, 3)] == [28573, 27707, 29955]


def test_a_nodes_ephemeral_range_overlaps_the_master_ports_or_not():
    assert not ephemeral_overlap(32768, 60999)
    assert ephemeral_overlap(25000, 40000) == range(25000, 30000)
    assert ephemeral_overlap(1024, 65535) == MASTER_PORTS


def test_the_ephemeral_range_is_read_from_proc_or_is_unknown(tmp_path):
    (tmp_path / "range").write_text("32768\t60999\n")
    assert ephemeral_ports(tmp_path / "range") == (32768, 60999)
    assert ephemeral_ports(tmp_path / "missing") is None


