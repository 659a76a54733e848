"""Property tests over random command sequences (hypothesis).

Every step draws a command — valid ones from the real scheduler, and arbitrary ones a buggy or
stale proposer could send — and after each one the DESIGN invariants must hold: no node
over-allocated, no GPU index given twice, a gang committed whole or not at all. Replaying the same
log into a fresh replica, or into one restored from a mid-way snapshot, gives the same digest.
"""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synapse.core import commands as c
from synapse.core.model import JobStatus, Placement, Resources
from synapse.core.schedule.scheduler import schedule_round
from synapse.core.state.fsm import ClusterState
from synapse.core.state.invariants import violations
from synapse.sim.engine import uniform_cluster
from tests.support.helpers import GI, spec

NODES = uniform_cluster(blocks_per_zone=2, racks_per_block=2, nodes_per_rack=2,
                        capacity=Resources(16_000, 64 * GI, 8))
NODE_IDS = [cmd.node_id for cmd in NODES]


def draw_command(data, state: ClusterState, stale: ClusterState, now: float) -> list[c.Command]:
    jobs = sorted(state.jobs)
    kind = data.draw(st.sampled_from(
        ["submit", "submit", "schedule", "schedule", "stale_schedule", "bogus_plan", "start", "start",
         "exit", "exit", "node_down", "node_up", "cordon", "cancel", "fail", "forget"]))
    term = data.draw(st.integers(0, 3))
    if kind == "submit":
        job_id = f"j{len(state.jobs)}-{data.draw(st.integers(0, 2))}"  # sometimes a duplicate id
        shape = spec(tasks=data.draw(st.integers(1, 5)), gpu=data.draw(st.sampled_from([0, 1, 2, 4, 8])),
                     cpu=data.draw(st.sampled_from([500, 4000, 16_000])),
                     pack=data.draw(st.sampled_from(["", "rack", "block", "node"])),
                     required=data.draw(st.booleans()), max_restarts=data.draw(st.integers(0, 2)),
                     priority=data.draw(st.integers(0, 2)))
        request = data.draw(st.sampled_from(["", job_id, "shared-request"]))
        return [c.SubmitJob(at=now, job_id=job_id, request_id=request, spec=shape)]
    if kind == "schedule":
        plans = schedule_round(state, now).plans
        return [c.CommitPlan(at=now, term=term, job_id=p.job_id, attempt=p.attempt, placements=p.placements)
                for p in plans]
    if kind == "stale_schedule":  # plans computed from an old snapshot, as a slow leader would
        return [c.CommitPlan(at=now, job_id=p.job_id, attempt=p.attempt, placements=p.placements)
                for p in schedule_round(stale, now).plans]
    if not jobs:
        return []
    job = state.jobs[data.draw(st.sampled_from(jobs))]
    attempt = job.attempt + data.draw(st.sampled_from([0, 0, 0, -1, 1]))
    if kind == "bogus_plan":
        n = job.spec.tasks + data.draw(st.sampled_from([0, 0, -1, 1]))
        placements = tuple(
            Placement(i, data.draw(st.sampled_from(NODE_IDS + ["ghost"])),
                      tuple(data.draw(st.permutations(range(8)))[:job.spec.resources.gpu]), i)
            for i in range(max(n, 0)))
        return [c.CommitPlan(at=now, term=term, job_id=job.id, attempt=attempt, placements=placements)]
    if kind in ("start", "exit"):
        if not job.tasks:
            return []
        task = job.tasks[data.draw(st.integers(0, len(job.tasks) - 1))]
        node_id = data.draw(st.sampled_from([task.node_id, task.node_id, NODE_IDS[0]]))
        if kind == "start":
            return [c.TaskStarted(at=now, job_id=job.id, attempt=attempt, index=task.index, node_id=node_id)]
        return [c.TaskExited(at=now, job_id=job.id, attempt=attempt, index=task.index, node_id=node_id,
                             exit_code=data.draw(st.sampled_from([0, 0, 1, -9])))]
    node_id = data.draw(st.sampled_from(NODE_IDS))
    if kind == "node_down":
        return [c.NodeDown(at=now, term=term, node_id=node_id)]
    if kind == "node_up":
        return [c.NodeUp(at=now, term=term, node_id=node_id)]
    if kind == "cordon":
        return [c.SetSchedulable(at=now, node_id=node_id, schedulable=data.draw(st.booleans()))]
    if kind == "cancel":
        return [c.CancelJob(at=now, job_id=job.id)]
    if kind == "forget":
        return [c.ForgetJobs(at=now, term=term, job_ids=tuple(data.draw(st.lists(st.sampled_from(jobs), max_size=3))))]
    return [c.FailAttempt(at=now, term=term, job_id=job.id, attempt=attempt, reason="test",
                          final=data.draw(st.booleans()))]


def gang_sizes(state: ClusterState) -> dict[str, tuple[str, int]]:
    return {j.id: (j.status.value, len(j.tasks)) for j in state.jobs.values()}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_command_sequences_keep_the_invariants(data):
    state = ClusterState()
    log: list[c.Command] = list(NODES)
    for cmd in NODES:
        state.apply(cmd)
    snapshot_at = data.draw(st.integers(len(NODES), len(NODES) + 40))
    snapshot = None
    stale = ClusterState.from_snapshot(state.to_snapshot())
    for step in range(data.draw(st.integers(10, 60))):
        if data.draw(st.integers(0, 4)) == 0:
            stale = ClusterState.from_snapshot(state.to_snapshot())
        for cmd in draw_command(data, state, stale, now=float(step)):
            before = gang_sizes(state)
            result = state.apply(cmd)
            log.append(cmd)
            problems = violations(state)
            assert not problems, (cmd, result, problems)
            if isinstance(cmd, c.CommitPlan):
                job = state.jobs.get(cmd.job_id)
                if result.ok:  # committed whole ...
                    assert job.status is JobStatus.SCHEDULED and len(job.tasks) == job.spec.tasks
                else:  # ... or not at all
                    assert gang_sizes(state) == before
            if len(log) == snapshot_at:
                snapshot = state.to_snapshot()
    # Replicas fed the same log agree, whether they replay it all or start from a snapshot.
    replica = ClusterState()
    for cmd in log:
        replica.apply(cmd)
    assert replica.digest() == state.digest()
    if snapshot is not None:
        restored = ClusterState.from_snapshot(snapshot)
        for cmd in log[snapshot_at:]:
            restored.apply(cmd)
        assert restored.digest() == state.digest()
        assert not violations(restored)
