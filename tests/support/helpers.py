"""Small builders shared by the pure-core tests."""

from __future__ import annotations

import time

from synapse.core import commands as c
from synapse.core.model import JobSpec, PackMode, Resources, TopologySpec
from synapse.core.state.fsm import ClusterState
from synapse.core.state.invariants import violations
from synapse.sim.engine import uniform_cluster

GI = 1 << 30
NODE = Resources(cpu=64_000, memory=512 * GI, gpu=8)


def spec(tasks: int = 1, gpu: int = 8, cpu: int = 1000, memory: int = GI, *, pack: str = "",
         required: bool = False, priority: int = 0, max_restarts: int = 0, time_limit: float = 0.0,
         name: str = "job", queue: str = "") -> JobSpec:
    return JobSpec(name=name, tasks=tasks, resources=Resources(cpu, memory, gpu), command=("true",),
                   topology=TopologySpec(pack, PackMode.REQUIRED if required else PackMode.PREFERRED),
                   priority=priority, max_restarts=max_restarts, time_limit=time_limit, queue=queue)


def cluster(racks: int = 2, nodes_per_rack: int = 4, blocks: int = 1, **kw) -> ClusterState:
    state = ClusterState()
    for cmd in uniform_cluster(blocks_per_zone=blocks, racks_per_block=racks // blocks,
                               nodes_per_rack=nodes_per_rack, **kw):
        assert state.apply(cmd).ok
    return state


def checked(state: ClusterState, cmd: c.Command) -> c.Result:
    """Apply and assert the invariants still hold."""
    result = state.apply(cmd)
    problems = violations(state)
    assert not problems, problems
    return result


def wait_for(predicate, timeout: float = 30.0, what: str = "condition", every: float = 0.05):
    """The first truthy value `predicate()` returns, polled every `every` s; fails after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def lone_leader(data_dir, **kw):
    """A one-replica RaftNode on a free port that ticks only when the test calls `node.sync._onTick`,
    ticked until it leads (it elects itself). The caller destroys it."""
    from synapse.local.cluster import free_base_port
    from synapse.master.raft import RaftNode, raft_config

    port = free_base_port(1)
    node = RaftNode(f"127.0.0.1:{port}", [], raft_config(bind_address=f"127.0.0.1:{port}", data_dir=str(data_dir),
                                                         password="pw", autoTick=False), **kw)
    for _ in range(200):
        node.sync._onTick(0.01)
        if node.is_leader():
            return node
    node.destroy()
    raise AssertionError("a lone replica did not elect itself")
