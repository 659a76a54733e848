"""Real pysyncobj nodes in this process, on free ports of 127.0.0.1, ticked by hand: started, elected,
cut off from each other by dropping messages at the sender."""

from __future__ import annotations

import time

from synapse.local.cluster import free_base_port
from synapse.master.raft import raft_config
from synapse.master.replicated import ReplicatedState


def start(tmp_path, cls, count=3):
    base = free_base_port(count)
    addrs = [f"127.0.0.1:{base + i}" for i in range(count)]
    nodes = [cls(a, [b for b in addrs if b != a], consumers=[ReplicatedState()],
                 conf=raft_config(bind_address=a, data_dir=str(tmp_path / f"{cls.__name__}{i}"), password="pw",
                                  autoTick=False))
             for i, a in enumerate(addrs)]
    return addrs, nodes


def cut_off(nodes, addrs, victim: int, cut: set) -> None:
    """Drop messages between `victim` and everyone while `cut` holds it (both ways, at the sender)."""
    drop_sends(nodes, addrs, lambda i, j: bool(cut) and (i in cut or j in cut))


def drop_sends(nodes, addrs, dropped) -> None:
    """Drop, at the sender, every message from node i to node j for which `dropped(i, j)`."""
    for i, node in enumerate(nodes):
        transport = node._SyncObj__transport
        send = transport.send

        def filtered(peer, message, send=send, i=i):
            j = addrs.index(peer.address) if peer.address in addrs else -1
            if dropped(i, j):
                return False
            return send(peer, message)

        transport.send = filtered


def tick(nodes, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for node in nodes:
            node._onTick(0.002)


def leader_index(nodes) -> int | None:
    leaders = [i for i, n in enumerate(nodes) if n._isLeader()]
    return leaders[0] if len(leaders) == 1 else None


def elect(nodes) -> int:
    """Tick until one leader is elected and every replica knows it; its index."""
    leader = None
    for _ in range(100):
        tick(nodes, 0.1)
        leader = leader_index(nodes)
        if leader is not None and all(n._getLeader() is not None for n in nodes):
            break
    assert leader is not None, "no leader elected"
    return leader
