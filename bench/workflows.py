"""Job arrays and dependencies: acknowledgement, scheduling rounds, memory, dependency chains.

    python bench/workflows.py             # a table
    python bench/workflows.py --json      # the same figures as JSON
    python bench/workflows.py --quick     # a few seconds, tiny sizes, the same code paths

(a) Acknowledgement: a 10,000-element array submitted to a 3-replica local cluster, from just
before the client's SubmitJob call to its answer (the array is one log entry, committed on a
majority and applied). (b) The leader's scheduling round, measured on the pure state (the brain's
`RoundDue`, as the leader runs it): with the 10,000-element array pending behind a full cluster,
and a round that places elements on a cluster with room. (c) Memory: what a pending element costs
the state machine (tracemalloc over the state, and the snapshot's bytes), beside a plain job. (d) A
chain of 1,000 jobs, each `after: {ok: [previous]}`, run on the pure state with the leader's brain:
how many rounds pass between a job's end and its dependent's plan (target: the next round), and how
long that round takes. A real leader runs a round at most SCHEDULE_MIN_INTERVAL_S (20 ms) after a
change, so the dependent's start follows its upstream's end by that plus one round.
Targets: (a) <= 1 s; (b) p99 < 50 ms; (d) every dependent planned in the first round, <= 0.1 s. Rounds
are timed on the wall clock and, since the machine is shared, in the round's own CPU time too.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from support.measure import percentile  # noqa: E402

from synapse.client.master_client import MasterClient  # noqa: E402
from synapse.core import codec  # noqa: E402
from synapse.core import commands as c  # noqa: E402
from synapse.core.brain.leader_state import LeaderState  # noqa: E402
from synapse.core.brain.stimuli import Propose, RoundDue  # noqa: E402
from synapse.core.model import JobSpec, Placement, Resources  # noqa: E402
from synapse.core.state.fsm import ClusterState  # noqa: E402
from synapse.local import cluster as local  # noqa: E402
from synapse.sim.engine import uniform_cluster  # noqa: E402

GI = 1 << 30


def job_spec(name: str, gpu: int = 8, **kw) -> JobSpec:
    return JobSpec(name=name, tasks=1, resources=Resources(1000, GI, gpu), command=("true",), **kw)


def new_state(racks: int, nodes_per_rack: int) -> ClusterState:
    state = ClusterState()
    for cmd in uniform_cluster(racks_per_block=racks, nodes_per_rack=nodes_per_rack):
        state.apply(cmd)
    return state


def ack_times(trials: int, elements: int) -> list[float]:
    """Seconds from submit to answer for an array of `elements`, on a 3-replica local cluster."""
    out = []
    with tempfile.TemporaryDirectory(prefix="synapse-bench-workflows-") as tmp:
        data_dir = Path(tmp) / "cluster"
        state = local.up(data_dir, 3, 0, 1, 8, local.free_base_port(3))
        try:
            client = MasterClient([m["api_address"] for m in state["masters"]], state["token"],
                                  tls=local.client_tls(state))
            client.list_nodes()
            for i in range(trials):
                proto = codec.job_spec_to_proto(job_spec(f"sweep{i}", array=f"0-{elements - 1}", array_throttle=8))
                started = time.perf_counter()
                client.submit(proto)
                out.append(time.perf_counter() - started)
            client.close()
        finally:
            local.down(data_dir)
    return out


def fill(state: ClusterState, at: float, limits: Sequence[float] = ()) -> None:
    """Every node busy with a one-node job: without a time limit, or with one of `limits` (drawn
    with a fixed seed)."""
    rng = random.Random(1)
    for i, node_id in enumerate(sorted(state.nodes)):
        spec = job_spec("fill", time_limit=rng.choice(limits)) if limits else job_spec("fill")
        state.apply(c.SubmitJob(at=at, job_id=f"fill{i}", request_id=f"fill{i}", spec=spec))
        assert state.apply(c.CommitPlan(at=at, job_id=f"fill{i}", attempt=1,
                                        placements=(Placement(0, node_id, tuple(range(8)), 0),))).ok


def round_times(state: ClusterState, rounds: int, at: float) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of each of `rounds` rounds (CPU time: the machine is shared)."""
    brain, wall, cpu = LeaderState(), [], []
    for i in range(rounds):
        started, cpu_started = time.perf_counter(), time.thread_time()
        brain.handle(state, RoundDue(at=at + i))
        wall.append(time.perf_counter() - started)
        cpu.append(time.thread_time() - cpu_started)
    return wall, cpu


def rounds_with_pending_elements(elements: int, rounds: int) -> dict[str, float]:
    state = new_state(16, 16)  # 256 nodes
    fill(state, 1.0)
    state.apply(c.SubmitWorkflowJob(at=2.0, job_id="A", request_id="A", spec=job_spec("sweep", gpu=1,
                                                                                      array=f"0-{elements - 1}")))
    blocked, blocked_cpu = round_times(state, rounds, 3.0)
    room = new_state(16, 16)
    room.apply(c.SubmitWorkflowJob(at=2.0, job_id="A", request_id="A", spec=job_spec("sweep", gpu=8,
                                                                                     array=f"0-{elements - 1}")))
    placing = []
    for _ in range(max(3, rounds // 10)):
        fresh = ClusterState.from_snapshot(room.to_snapshot())
        started = time.perf_counter()
        out = LeaderState().handle(fresh, RoundDue(at=3.0))
        placing.append(time.perf_counter() - started)
    planned = sum(1 for i in out if isinstance(i, Propose) and isinstance(i.cmd, c.CommitPlan))
    return {"round_blocked_p50_ms": round(statistics.median(blocked) * 1000, 3),
            "round_blocked_p99_ms": round(percentile(blocked, 0.99) * 1000, 3),
            "round_blocked_cpu_p99_ms": round(percentile(blocked_cpu, 0.99) * 1000, 3),
            "round_placing_p50_ms": round(statistics.median(placing) * 1000, 3),
            "round_placing_max_ms": round(max(placing) * 1000, 3), "round_placing_plans": planned}


def memory_per_element(elements: int) -> dict[str, float]:
    """Bytes the state holds per pending element of an array, and per plain pending job."""
    def measured(build) -> tuple[float, int]:
        state = new_state(1, 2)
        base_snapshot = len(json.dumps(state.to_snapshot()))
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        build(state)
        used = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        return used / elements, (len(json.dumps(state.to_snapshot())) - base_snapshot) / elements

    def array(state: ClusterState) -> None:
        state.apply(c.SubmitWorkflowJob(at=1.0, job_id="A", request_id="A", spec=job_spec("sweep",
                                                                                          array=f"0-{elements - 1}")))

    def jobs(state: ClusterState) -> None:
        for i in range(elements):
            state.apply(c.SubmitJob(at=1.0, job_id=f"j{i}", request_id=f"j{i}", spec=job_spec("sweep")))

    array_mem, array_snap = measured(array)
    jobs_mem, jobs_snap = measured(jobs)
    return {"pending_element_bytes": round(array_mem, 1), "pending_element_snapshot_bytes": round(array_snap, 1),
            "plain_pending_job_bytes": round(jobs_mem, 1), "plain_pending_job_snapshot_bytes": round(jobs_snap, 1)}


def dependency_chain(length: int) -> dict[str, float]:
    """Run a chain of `length` afterok jobs on the pure state; rounds and time from end to plan."""
    state = new_state(1, 2)
    state.apply(c.SubmitJob(at=1.0, job_id="j0", request_id="j0", spec=job_spec("chain")))
    for i in range(1, length):
        assert state.apply(c.SubmitWorkflowJob(at=1.0, job_id=f"j{i}", request_id=f"j{i}",
                                               spec=job_spec("chain", after=(("ok", f"j{i - 1}"),)))).ok
    brain, at, rounds_after_end, seconds, cpu = LeaderState(), 2.0, [], [], []
    waiting_rounds = 0
    for i in range(length):
        while True:
            started, cpu_started = time.perf_counter(), time.thread_time()
            out = brain.handle(state, RoundDue(at=at, full=False))
            elapsed, cpu_elapsed = time.perf_counter() - started, time.thread_time() - cpu_started
            at += 0.001
            waiting_rounds += 1
            plans = [p.cmd for p in out if isinstance(p, Propose) and isinstance(p.cmd, c.CommitPlan)]
            for p in out:
                if isinstance(p, Propose):
                    state.apply(p.cmd)
            if plans:
                assert [p.job_id for p in plans] == [f"j{i}"], plans
                rounds_after_end.append(waiting_rounds)
                seconds.append(elapsed)
                cpu.append(cpu_elapsed)
                waiting_rounds = 0
                break
            assert waiting_rounds < 5, f"job j{i} not planned"
        job = state.jobs[f"j{i}"]
        task = job.tasks[0]
        state.apply(c.TaskStarted(at=at, job_id=job.id, attempt=1, index=0, node_id=task.node_id))
        state.apply(c.TaskExited(at=at, job_id=job.id, attempt=1, index=0, node_id=task.node_id, exit_code=0))
    return {"chain_jobs": length, "chain_rounds_to_start_max": max(rounds_after_end),
            "chain_round_p50_ms": round(statistics.median(seconds) * 1000, 3),
            "chain_round_p99_ms": round(percentile(seconds, 0.99) * 1000, 3),
            "chain_round_cpu_p99_ms": round(percentile(cpu, 0.99) * 1000, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--chain", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a few seconds: 2 acks, 20 rounds, a chain of 50")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.rounds, args.chain = 2, 20, 50
    acks = ack_times(args.trials, args.elements)
    report: dict[str, float] = {"elements": args.elements, "ack_p50_s": round(statistics.median(acks), 4),
                                "ack_max_s": round(max(acks), 4)}
    report.update(rounds_with_pending_elements(args.elements, args.rounds))
    report.update(memory_per_element(args.elements))
    report.update(dependency_chain(args.chain))
    if args.json:
        print(json.dumps(report))
    else:
        width = max(map(len, report))
        for key, value in report.items():
            print(f"{key:<{width}}  {value}")
    if args.quick:
        print("(--quick: sizes too small to judge the chain and round targets)")


if __name__ == "__main__":
    main()
