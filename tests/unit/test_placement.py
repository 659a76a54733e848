"""Exact plans from the pure placement engine."""

from synapse.core import commands as c
from synapse.core.model import Placement, Plan, Resources
from synapse.core.schedule.placement import ClusterView, place
from tests.support.helpers import checked, cluster, spec


def view(state):
    return ClusterView(state.nodes, state.index, state.levels)


def occupy(state, node_id, gpus, job_id=None):
    """Commit a one-task job holding `gpus` GPUs on a node."""
    job_id = job_id or f"fill-{node_id}-{len(state.jobs)}"
    checked(state, c.SubmitJob(at=0, job_id=job_id, request_id=job_id, spec=spec(gpu=gpus, cpu=1000)))
    free = state.nodes[node_id].free_gpu_indices()[:gpus]
    assert checked(state, c.CommitPlan(at=0, job_id=job_id, attempt=1,
                                       placements=(Placement(0, node_id, tuple(free), 0),))).ok


def nodes_of(result):
    return [p.node_id for p in result.plan.placements]


def test_gang_fits_one_rack_exactly():
    state = cluster(racks=2, nodes_per_rack=4)
    result = place(view(state), "j", 1, spec(tasks=4))
    assert result.level == "rack"
    assert result.plan == Plan("j", 1, tuple(Placement(i, f"r0-n{i}", tuple(range(8)), i) for i in range(4)))


def test_tightest_rack_keeps_the_emptier_rack_whole():
    state = cluster(racks=2, nodes_per_rack=4)
    occupy(state, "r1-n0", 8)
    result = place(view(state), "j", 1, spec(tasks=3))
    assert nodes_of(result) == ["r1-n1", "r1-n2", "r1-n3"]  # r1 has exactly 3 whole nodes left


def test_a_one_node_job_fills_the_fullest_rack_among_equally_tight_nodes():
    """Every free node is as tight as the others (8 GPUs free); r1 already has a busy node, so the
    job goes there (r0-n0 comes first by name) and r0 stays whole for a 4-node gang."""
    state = cluster(racks=2, nodes_per_rack=4)
    occupy(state, "r1-n0", 8)
    assert nodes_of(place(view(state), "j", 1, spec(tasks=1))) == ["r1-n1"]
    # The tightest node still comes first, whatever its rack: 2 GPUs free on r0-n3.
    occupy(state, "r0-n3", 6)
    assert nodes_of(place(view(state), "k", 1, spec(tasks=1, gpu=2))) == ["r0-n3"]


def test_small_tasks_share_one_node_when_it_holds_them():
    state = cluster(racks=2, nodes_per_rack=4)
    occupy(state, "r0-n2", 5)  # 3 GPUs left on r0-n2: the tightest node for 3 one-GPU tasks
    result = place(view(state), "j", 1, spec(tasks=3, gpu=1))
    assert result.level == "node"
    assert [(p.node_id, p.gpus) for p in result.plan.placements] == [
        ("r0-n2", (5,)), ("r0-n2", (6,)), ("r0-n2", (7,))]


def test_preferred_spills_to_fewest_racks_in_one_block():
    state = cluster(racks=4, blocks=2, nodes_per_rack=4)  # b0 = r0, r1; b1 = r2, r3
    occupy(state, "r0-n0", 8)
    occupy(state, "r2-n0", 8)
    occupy(state, "r2-n1", 8)
    result = place(view(state), "j", 1, spec(tasks=6))
    assert result.level == "block"
    # b0 has 7 whole nodes (tighter than b1's 6? no: b1 has 6, exactly 6) -> b1, all of r3 then r2's two.
    assert sorted(nodes_of(result)) == ["r2-n2", "r2-n3", "r3-n0", "r3-n1", "r3-n2", "r3-n3"]


def test_preferred_uses_largest_rack_first():
    state = cluster(racks=2, nodes_per_rack=4)
    occupy(state, "r0-n0", 8)
    occupy(state, "r0-n1", 8)
    occupy(state, "r1-n0", 8)
    result = place(view(state), "j", 1, spec(tasks=5))
    assert result.level == "block"
    assert nodes_of(result) == ["r0-n2", "r0-n3", "r1-n1", "r1-n2", "r1-n3"]  # ranks in topology order


def test_required_rack_waits_with_shortfalls():
    state = cluster(racks=2, nodes_per_rack=4)
    occupy(state, "r0-n0", 8)
    occupy(state, "r1-n0", 1)
    result = place(view(state), "j", 1, spec(tasks=4, pack="rack", required=True))
    assert result.plan is None
    assert [str(s) for s in result.shortfalls] == [
        "cluster: room for 6 task(s), but not packed as the job requires",
        "z0/b0/r0: 3/4 tasks fit (short of gpu)",
        "z0/b0/r1: 3/4 tasks fit (short of gpu)",  # 31 free GPUs, 32 needed
    ]


def test_required_node_packs_on_one_node_or_waits():
    state = cluster(racks=1, nodes_per_rack=2)
    assert nodes_of(place(view(state), "j", 1, spec(tasks=2, gpu=4, pack="node", required=True))) == \
        ["r0-n0", "r0-n0"]
    assert place(view(state), "j", 1, spec(tasks=3, gpu=4, pack="node", required=True)).plan is None


def test_cordoned_and_down_nodes_are_not_used():
    state = cluster(racks=1, nodes_per_rack=3)
    checked(state, c.SetSchedulable(at=1, node_id="r0-n0", schedulable=False))
    checked(state, c.NodeDown(at=1, node_id="r0-n1"))
    assert nodes_of(place(view(state), "j", 1, spec(tasks=1))) == ["r0-n2"]
    assert place(view(state), "j", 1, spec(tasks=2)).plan is None


def test_cpu_bound_gangs_check_every_dimension():
    state = cluster(racks=1, nodes_per_rack=2)
    result = place(view(state), "j", 1, spec(tasks=3, gpu=0, cpu=40_000))
    assert result.plan is None
    assert str(result.shortfalls[1]) == \
        "z0/b0/r0: 2/3 tasks fit (short of whole nodes (free capacity is fragmented))"
    four = place(view(state), "j", 1, spec(tasks=4, gpu=0, cpu=40_000))
    assert "cpu" in four.shortfalls[1].short
    two = place(view(state), "j", 1, spec(tasks=2, gpu=0, cpu=40_000))
    assert sorted(nodes_of(two)) == ["r0-n0", "r0-n1"]


def test_claims_within_a_round_are_respected():
    state = cluster(racks=1, nodes_per_rack=2)
    v = view(state)
    first = place(v, "a", 1, spec(tasks=1, gpu=6))
    v.claim(first.plan, Resources(1000, 1 << 30, 6))
    second = place(v, "b", 1, spec(tasks=1, gpu=6))
    assert nodes_of(first) != nodes_of(second)
    third = place(v, "c", 1, spec(tasks=1, gpu=2))  # tightest: the 2 GPUs left on a claimed node
    assert third.plan.placements[0].gpus == (6, 7)
    v.set_blocked(frozenset(state.nodes))
    assert place(v, "d", 1, spec(tasks=1, gpu=1)).plan is None


def test_plan_always_commits():
    """Whatever placement returns must pass apply's re-validation."""
    state = cluster(racks=4, blocks=2, nodes_per_rack=4)
    occupy(state, "r0-n1", 3)
    occupy(state, "r3-n2", 7)
    shapes = [spec(tasks=5, gpu=2), spec(tasks=9), spec(tasks=2, gpu=3), spec(tasks=1, gpu=1)]
    for i, shape in enumerate(shapes):
        job_id = f"j{i}"
        checked(state, c.SubmitJob(at=1, job_id=job_id, request_id=job_id, spec=shape))
        result = place(view(state), job_id, 1, shape)
        assert checked(state, c.CommitPlan(at=2, job_id=job_id, attempt=1,
                                           placements=result.plan.placements)).ok
