"""The link-shard map (synapse.core.shards): stable, balanced, and moving only what must move."""

from __future__ import annotations

from collections import Counter

from synapse.core.shards import ShardMap, hosts, order_of, ranked, shard_of

MEMBERS = ["m1:7001", "m2:7002", "m3:7003", "m4:7004", "m5:7005"]
NODES = [f"node-{i:05d}" for i in range(5000)]


def test_same_answer_whatever_the_order_of_members():
    for node in NODES[:200]:
        assert shard_of(node, MEMBERS) == shard_of(node, list(reversed(MEMBERS))) == shard_of(node, MEMBERS + MEMBERS)


def test_balanced_over_the_members():
    counts = Counter(shard_of(n, MEMBERS) for n in NODES)
    assert set(counts) == set(MEMBERS)
    assert max(counts.values()) < 1.15 * len(NODES) / len(MEMBERS)
    assert min(counts.values()) > 0.85 * len(NODES) / len(MEMBERS)


def test_removing_a_member_moves_only_its_nodes_and_spreads_them():
    before = {n: shard_of(n, MEMBERS) for n in NODES}
    after = {n: shard_of(n, [m for m in MEMBERS if m != "m3:7003"]) for n in NODES}
    moved = [n for n in NODES if before[n] != after[n]]
    assert moved == [n for n in NODES if before[n] == "m3:7003"]
    # they go to the next replica in their own order, so the others share them
    assert {after[n] for n in moved} == {"m1:7001", "m2:7002", "m4:7004", "m5:7005"}
    assert all(after[n] == ranked(n, MEMBERS)[1] for n in moved)


def test_adding_a_member_moves_only_nodes_to_it():
    grown = MEMBERS + ["m6:7006"]
    moved = [n for n in NODES if shard_of(n, MEMBERS) != shard_of(n, grown)]
    assert moved and all(shard_of(n, grown) == "m6:7006" for n in moved)
    assert 0.1 < len(moved) / len(NODES) < 0.25


def test_the_leader_hosts_no_shard_unless_alone():
    assert hosts(MEMBERS, leader="m2:7002") == ["m1:7001", "m3:7003", "m4:7004", "m5:7005"]
    assert hosts(["m1:7001"], leader="m1:7001") == ["m1:7001"]
    assert hosts([], leader="") == []
    assert shard_of("x", []) == ""
    # a leader change moves the nodes of the new leader only
    old = {n: shard_of(n, MEMBERS, leader="m1:7001") for n in NODES}
    new = {n: shard_of(n, MEMBERS, leader="m2:7002") for n in NODES}
    moved = [n for n in NODES if old[n] != new[n]]
    assert moved == [n for n in NODES if old[n] == "m2:7002" or new[n] == "m1:7001"]
    # with the old leader gone (killed), only the new leader's nodes move
    gone = [m for m in MEMBERS if m != "m1:7001"]
    assert [n for n in NODES if old[n] != shard_of(n, gone, leader="m2:7002")] == \
        [n for n in NODES if old[n] == "m2:7002"]


def test_shard_map_memoizes_the_same_answer():
    smap = ShardMap(MEMBERS, leader="m5:7005")
    assert smap.key() == (tuple(MEMBERS), "m5:7005")
    for n in NODES[:300]:
        assert smap.shard_of(n) == smap.shard_of(n) == shard_of(n, MEMBERS, "m5:7005") != "m5:7005"
        assert smap.order_of(n) == tuple(order_of(n, MEMBERS, "m5:7005"))


def test_the_order_puts_the_leader_last_and_spreads_a_dead_shards_nodes():
    three = MEMBERS[:3]
    for n in NODES[:300]:
        order = order_of(n, three, leader="m1:7001")
        assert sorted(order) == sorted(three) and order[-1] == "m1:7001" and order[0] == shard_of(n, three, "m1:7001")
    # with m2 dead, its nodes' next choices are the other hosts (in their own order), never the leader first
    seconds = Counter(order_of(n, MEMBERS, "m1:7001")[1] for n in NODES if shard_of(n, MEMBERS, "m1:7001") == "m2:7002")
    assert set(seconds) == {"m3:7003", "m4:7004", "m5:7005"}
