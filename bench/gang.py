"""Gang start latency and heartbeat load on a local cluster (3 masters, 8 workers with 8 fake GPUs).

    python bench/gang.py                  # a table
    python bench/gang.py --handovers 12   # hand-overs only, 12 of each kind (more samples a run)
    python bench/gang.py --json           # {"gang_start_p50_s", "gang_start_p99_s", "unblock_p50_s",
                                          #  "unblock_teardown_p50_s", "unblock_cancel_p50_s",
                                          #  "watch_lists_per_gang", "heartbeat_workers", "leader_cpu_share"}

(a) Submit-to-all-tasks-running for an 8-task x 8-GPU gang on an idle cluster: from just before
the client's SubmitJob call to the moment the job became RUNNING, which the state machine stamps
when it applies the last task's start report. (b) Unblock: one node is busy with a blocker whose
task prints its own exit time and leaves at once (os._exit); the gang needs all 8 nodes; the delay
is from that exit to the gang running. (Until 2026-12 the blocker left through its interpreter's
teardown, 6-7 ms after its print, inside the figure: that variant is timed too, as
unblock_teardown_p50_s.) Each is split into steps, each step's median printed: the blocker's exit to its worker
noticing it (the worker's task journal), to the waiting gang's placement (its Scheduled event: the
report, its commit and the round), to its first task's process, to its last. The same hand-over
when the blocker (a `sleep 60`) is cancelled instead: from just before the CancelJob call, the
first step being the task's end as its worker noticed it. Over (a), the assignment lists the
masters' watches built per gang, start to end, from their /metrics (synapse_watch_lists): sent,
and unchanged (a wake-up for nothing). (c) 1,000 simulated
workers (registration, then one heartbeat each every 5 s, phases spread) against the same leader;
the leader's CPU share comes from /proc over the window.
Targets: gang start p50 <= 0.1 s, p99 <= 0.3 s; 1,000 workers with the leader under half a core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc  # noqa: E402
from support.elections import Elections  # noqa: E402
from support.measure import counter_by, cpu_seconds, percentile  # noqa: E402

from synapse.client.master_client import MasterClient
from synapse.common.auth import NODE_CREDENTIAL_KEY, client_metadata  # noqa: E402
from synapse.common.tls import TLSFiles, channel_credentials, issue_worker  # noqa: E402
from synapse.core import codec  # noqa: E402
from synapse.core.model import JobSpec, Resources  # noqa: E402
from synapse.local import cluster as local  # noqa: E402
from synapse.proto import api_pb2, api_pb2_grpc, types_pb2  # noqa: E402

WORKERS = 8


def spec(name: str, tasks: int, command: list[str]) -> api_pb2.JobSpec:
    return codec.job_spec_to_proto(JobSpec(name=name, tasks=tasks, resources=Resources(1000, 1 << 30, 8),
                                           command=tuple(command)))


def wait(client: MasterClient, job_id: str, statuses: set[str], timeout: float = 60.0,
         first: float = 0.0) -> api_pb2.JobInfo:
    """Poll the job every 20 ms until it reaches one of `statuses`, the first poll `first` s from now.
    The figures are the state machine's own stamps, not when a poll saw them: the measured waits
    skip their polls while the gang starts (each is a TLS call to the leader, on the same two cores)."""
    time.sleep(first)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = client.get_job(job_id)
        if info.status in statuses:
            return info
        time.sleep(0.02)
    raise SystemExit(f"job {job_id} did not reach {statuses}")


def journal(data_dir: Path, job_id: str, event: str) -> list[float]:
    """When each of a job's tasks had `event` ("start" or "exit"), by the workers' task journals
    (DATA_DIR/workers/*/task-events.jsonl: each worker's own clock, the machine's here)."""
    out = []
    for path in (data_dir / "workers").glob("*/task-events.jsonl"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("job") == job_id and entry.get("event") == event:
                out.append(entry["at"])
    return out


def placed_at(info: api_pb2.JobInfo) -> float:
    """When the leader proposed the gang's placement (its last Scheduled event)."""
    return max(e.at for e in info.events if e.kind == "Scheduled")


def start_steps(data_dir: Path, info: api_pb2.JobInfo, since: float) -> dict[str, float]:
    """A gang's start, step by step: from `since` to its placement (the round and its proposal),
    to the first task's process, to the last task's (the gang RUNNING; its started_at is that
    last task's report)."""
    placed, starts = placed_at(info), journal(data_dir, info.id, "start")
    return {"to_placement": placed - since, "placement_to_first_task": min(starts) - placed,
            "first_to_last_task": max(starts) - min(starts)}


def gang_starts(client: MasterClient, data_dir: Path, trials: int) -> tuple[list[float], list[dict[str, float]]]:
    out, steps = [], []
    for i in range(trials):
        t0 = time.time()
        job_id = client.submit(spec(f"gang{i}", WORKERS, ["sleep", "0.2"]))
        info = wait(client, job_id, {"SUCCEEDED", "FAILED"}, first=0.25)
        out.append(info.started_at - t0)
        steps.append(start_steps(data_dir, info, t0))
    return out, steps


#: The blocker: prints the time and leaves at once (os._exit), so the hand-over is timed from its end.
BLOCKER = "import os, time; time.sleep(0.5); print(time.time(), flush=True); os._exit(0)"
#: The blocker up to 2026-12 (the issue's 0.134 s): its interpreter's teardown after the print,
#: 6-7 ms on the development machine against 0.8 ms with os._exit, is in that figure (unblock_teardown_p50_s).
BLOCKER_TEARDOWN = "import time; time.sleep(0.5); print(time.time())"


def unblocks(client: MasterClient, data_dir: Path, trials: int,
             blocker_code: str = BLOCKER) -> tuple[list[float], list[dict[str, float]]]:
    out, steps = [], []
    for i in range(trials):
        blocker = client.submit(spec(f"blocker{i}", 1, ["python3", "-c", blocker_code]))
        wait(client, blocker, {"RUNNING"})
        gang = client.submit(spec(f"waiter{i}", WORKERS, ["sleep", "0.2"]))
        info = wait(client, gang, {"SUCCEEDED", "FAILED"}, first=0.75)  # the blocker's 0.5 s, the gang's 0.2
        node = client.get_job(blocker).tasks[0].node_id
        exited = float((data_dir / "workers" / node / "logs" / blocker / "attempt-1" / "task-0.log").read_text())
        out.append(info.started_at - exited)
        noticed = journal(data_dir, blocker, "exit")[0]
        steps.append({"exit_noticed": noticed - exited, **start_steps(data_dir, info, noticed)})
    return out, steps


def cancel_unblocks(client: MasterClient, data_dir: Path, trials: int) -> tuple[list[float], list[dict[str, float]]]:
    """The hand-over when the blocker is cancelled rather than ending: from just before the client's
    CancelJob call to the waiting gang running (the blocker's task is stopped by SIGTERM first)."""
    out, steps = [], []
    for i in range(trials):
        blocker = client.submit(spec(f"cancelled{i}", 1, ["sleep", "60"]))
        wait(client, blocker, {"RUNNING"})
        gang = client.submit(spec(f"after-cancel{i}", WORKERS, ["sleep", "0.2"]))
        time.sleep(0.1)  # the gang has had its round, and waits
        t0 = time.time()
        client.cancel(blocker)
        info = wait(client, gang, {"SUCCEEDED", "FAILED"}, first=0.25)
        out.append(info.started_at - t0)
        noticed = journal(data_dir, blocker, "exit")[0]
        steps.append({"exit_noticed": noticed - t0, **start_steps(data_dir, info, noticed)})
    return out, steps


def watch_lists(state: dict) -> dict[str, float]:
    """The assignment lists every master's watches built so far, by outcome (synapse_watch_lists)."""
    scraped = [counter_by(m["http_address"], "synapse_watch_lists", "outcome", state.get("ca", ""))
               for m in state["masters"]]
    return {outcome: sum(s.get(outcome, 0.0) for s in scraped) for outcome in ("sent", "unchanged")}


def step_medians(steps: list[dict[str, float]]) -> dict[str, float]:
    return {name: round(statistics.median(s[name] for s in steps), 4) for name in steps[0]}


def sim_certs(tls_dir: Path, count: int) -> None:
    """A certificate for each simulated worker, signed by the cluster's CA (before any measurement)."""
    for i in range(count):
        issue_worker(tls_dir, f"sim-{i:04d}")


async def simulated_workers(leader: str, token: str, count: int, interval: float, duration: float,
                            tls_dir: Path | None = None) -> int:
    """Register `count` nodes, then heartbeat each every `interval` s for `duration` s; returns beats sent.

    Each simulated worker acts as a real one does: it keeps the node credential RegisterNode returns
    and presents it with every heartbeat (the master refuses a heartbeat without it), and on a TLS
    cluster (`tls_dir`: its CA, where `sim_certs` signed one for each) it has a certificate of its own
    and its own connection."""
    names = [f"sim-{i:04d}" for i in range(count)]
    if tls_dir is None:
        channels = [grpc.aio.insecure_channel(leader)] * count
    else:
        channels = []
        for name in names:
            files = TLSFiles(str(tls_dir / "ca.pem"), str(tls_dir / f"worker-{name}.pem"),
                             str(tls_dir / f"worker-{name}-key.pem"))
            channels.append(grpc.aio.secure_channel(leader, channel_credentials(files)))
    stubs = [api_pb2_grpc.MasterStub(ch) for ch in channels]
    md = client_metadata(token)
    cap = types_pb2.Resources(cpu_millis=64000, memory_bytes=512 << 30, gpu=8)
    node_md: list[tuple[tuple[str, str], ...]] = []
    for start in range(0, count, 100):
        replies = await asyncio.gather(*(stubs[i].RegisterNode(api_pb2.RegisterNodeRequest(
            node_id=f"sim-{i:04d}", address=f"sim-{i:04d}.invalid:1", topology=[f"simrack{i // 32}"],
            capacity=cap), metadata=md) for i in range(start, min(count, start + 100))))
        node_md.extend(md + ((NODE_CREDENTIAL_KEY, reply.node_credential),) for reply in replies)
    beats = 0

    async def beat(i: int) -> None:
        nonlocal beats
        await asyncio.sleep(random.uniform(0, interval))
        end = time.monotonic() + duration
        while time.monotonic() < end:
            await stubs[i].Heartbeat(api_pb2.HeartbeatRequest(node_id=names[i]), metadata=node_md[i])
            beats += 1
            await asyncio.sleep(interval)

    await asyncio.gather(*(beat(i) for i in range(count)))
    for channel in set(channels):
        await channel.close()
    return beats


def handovers(client: MasterClient, data_dir: Path, n: int, elections: Elections, as_json: bool) -> None:
    """--handovers N: N hand-overs when the blocker exits, then N when it is cancelled."""
    with elections.phase("unblocks"):
        unblock, unblock_parts = unblocks(client, data_dir, n)
    with elections.phase("unblocks by cancel"):
        cancelled, cancel_parts = cancel_unblocks(client, data_dir, n)
    elections.close()
    report = {"unblock_p50_s": round(statistics.median(unblock), 4),
              "unblock_cancel_p50_s": round(statistics.median(cancelled), 4),
              "unblock_steps": step_medians(unblock_parts), "unblock_cancel_steps": step_medians(cancel_parts),
              "fault_free_elections": elections.fault_free()}
    if as_json:
        print(json.dumps(report))
    else:
        print(f"unblock ({n} runs): p50 {report['unblock_p50_s']} s; by cancel ({n} runs): p50 "
              f"{report['unblock_cancel_p50_s']} s")
        elections.report()
    if report["fault_free_elections"]:
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--sim-workers", type=int, default=1000)
    parser.add_argument("--sim-seconds", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--handovers", type=int, default=0, metavar="N",
                        help="hand-overs only: N when the blocker exits, then N by cancel (no gang starts before "
                             "them, no simulated workers): more samples a run than --trials gives")
    parser.add_argument("--quick", action="store_true",
                        help="a few seconds, same code path: 3 gang starts, 2 unblocks, 50 simulated workers for 3 s")
    args = parser.parse_args()
    unblock_trials = max(5, args.trials // 2)
    if args.quick:
        args.trials, unblock_trials, args.sim_workers, args.sim_seconds = 3, 2, 50, 3.0
    with tempfile.TemporaryDirectory(prefix="synapse-bench-gang-") as tmp:
        data_dir = Path(tmp) / "cluster"
        # Heartbeat every 5 s (timeout 15 s): the interval the simulated workers use.
        state = local.up(data_dir, 3, WORKERS, 2, 8, local.free_base_port(3), heartbeat=5.0)
        try:
            addresses = [m["api_address"] for m in state["masters"]]
            client = MasterClient(addresses, state["token"], tls=local.client_tls(state))
            client.list_nodes()
            elections = Elections(state)
            if args.handovers:
                handovers(client, data_dir, args.handovers, elections, args.json)
                return
            lists_before = watch_lists(state)
            with elections.phase("gang starts"):
                starts, start_parts = gang_starts(client, data_dir, args.trials)
            lists = {k: round((v - lists_before[k]) / args.trials, 1) for k, v in watch_lists(state).items()}
            with elections.phase("unblocks"):
                unblock, unblock_parts = unblocks(client, data_dir, unblock_trials)
            with elections.phase("unblocks, the blocker's teardown timed"):
                teardown, _ = unblocks(client, data_dir, unblock_trials, BLOCKER_TEARDOWN)
            with elections.phase("unblocks by cancel"):
                cancelled, cancel_parts = cancel_unblocks(client, data_dir, unblock_trials)
            leader = next(m for m in state["masters"] if m["api_address"] == client.leader)
            # The 1,000 simulated workers never run tasks; their nodes stay out of the way by being
            # heartbeat-only. The window starts after registration.
            sim_certs(Path(state["ca"]).parent, args.sim_workers)
            before_cpu, before = cpu_seconds(leader["pid"]), time.monotonic()
            with elections.phase("simulated workers"):
                beats = asyncio.run(simulated_workers(leader["api_address"], state["token"], args.sim_workers, 5.0,
                                                      args.sim_seconds, Path(state["ca"]).parent))
            elections.close()
            share = (cpu_seconds(leader["pid"]) - before_cpu) / (time.monotonic() - before)
            down_nodes = sum(1 for n in client.list_nodes() if n.status == "DOWN" and n.id.startswith("sim-"))
            client.close()
        finally:
            local.down(data_dir)
    report = {"gang_start_p50_s": round(statistics.median(starts), 4),
              "gang_start_p99_s": round(percentile(starts, 0.99), 4),
              "unblock_p50_s": round(statistics.median(unblock), 4), "unblock_max_s": round(max(unblock), 4),
              "unblock_teardown_p50_s": round(statistics.median(teardown), 4),
              "unblock_cancel_p50_s": round(statistics.median(cancelled), 4),
              "unblock_cancel_max_s": round(max(cancelled), 4),
              # each step's median (seconds), whose sum is near the p50 above
              "gang_start_steps": step_medians(start_parts), "unblock_steps": step_medians(unblock_parts),
              # the assignment lists the masters' watches built per gang (its start and its end), by
              # outcome: sent, or unchanged (a wake-up that changed nothing of the node's list)
              "watch_lists_per_gang": lists,
              "unblock_cancel_steps": step_medians(cancel_parts),
              "heartbeat_workers": args.sim_workers, "heartbeats": beats,
              "leader_cpu_share": round(share, 3), "simulated_nodes_down": down_nodes,
              "fault_free_elections": elections.fault_free()}
    if args.json:
        print(json.dumps(report))
        sys.exit(1 if report["fault_free_elections"] else 0)
    print(f"gang start (8 tasks x 8 GPUs, idle cluster, {len(starts)} runs): p50 {report['gang_start_p50_s']} s, "
          f"p99 {report['gang_start_p99_s']} s")
    print(f"unblock (blocker exits -> gang running, {len(unblock)} runs): p50 {report['unblock_p50_s']} s, "
          f"max {report['unblock_max_s']} s")
    print(f"unblock, timed from the blocker's print before its interpreter's teardown (the earlier figure): p50 "
          f"{report['unblock_teardown_p50_s']} s")
    print(f"unblock by cancel (CancelJob of the blocker -> gang running, {len(cancelled)} runs): p50 "
          f"{report['unblock_cancel_p50_s']} s, max {report['unblock_cancel_max_s']} s")
    for name, parts in (("gang start", report["gang_start_steps"]), ("unblock", report["unblock_steps"]),
                        ("unblock by cancel", report["unblock_cancel_steps"])):
        print(f"  {name}, each step's median: " + ", ".join(f"{k} {1000 * v:.1f} ms" for k, v in parts.items()))
    print(f"  assignment lists the masters built per gang, start to end: {lists['sent']} sent, "
          f"{lists['unchanged']} unchanged")
    print(f"{args.sim_workers} simulated workers at a 5 s heartbeat for {args.sim_seconds:.0f} s: {beats} heartbeats, "
          f"leader CPU {share:.2f} cores, {down_nodes} wrongly declared DOWN")
    elections.report()
    ok = report["gang_start_p50_s"] <= 0.1 and report["gang_start_p99_s"] <= 0.3 and share < 0.5 and not down_nodes
    if args.quick:
        print("(--quick: sizes too small to judge the targets)")
        return
    print("targets (start p50 <= 0.1 s, p99 <= 0.3 s; 1,000 workers under half a core):", "met" if ok else "NOT met")


if __name__ == "__main__":
    main()
