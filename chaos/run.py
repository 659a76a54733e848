"""The chaos runner: a real local cluster, a workload, faults from a seed, and every checker.

    python chaos/run.py --duration 60 --seed 1                # a table
    python chaos/run.py --masters 5 --workers 6 --duration 600 --seed 7 --json

Starts a local cluster of real processes (heartbeat 0.5 s, DOWN after 5 s: a 4 s lease), runs several clients
submitting gangs of mixed sizes (some needing a whole rack) into two queues that preempt each
other's borrowed share, reading and cancelling them, with short real tasks. It injects faults on a
schedule derived from the seed, so a failing run can be replayed: master faults in one lane and
machine faults (workers) in another, concurrently. Then it heals the cluster, waits for the
replicas to converge, stops it, and checks the history (see chaos/history.py for the format, kept
in --out): no lost acknowledged job, no over-allocation in any replica's committed log, no partial
gang, no duplicate live task, no rank alive in two attempts at once, converged replicas,
linearizable client operations.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chaos import checkers  # noqa: E402
from chaos.history import History, read  # noqa: E402
from chaos.nemesis import (  # noqa: E402
    DATABASE_FAULTS,
    GANG_FAULTS,
    GANG_TASKS,
    MACHINE_FAULTS,
    MEMBERSHIP_FAULTS,
    NEEDS_NETNS,
    NEMESES,
    Target,
    unavailable,
)
from synapse.client.master_client import ClientError, ClusterUnavailable, MasterClient  # noqa: E402
from synapse.common.tls import TLSFiles
from synapse.core import codec
from synapse.core.brain.heartbeat import Lease  # noqa: E402
from synapse.core.model import JobSpec, PackMode, Queue, Resources, TopologySpec  # noqa: E402
from synapse.local import cluster as local  # noqa: E402
from synapse.local import interrupts  # noqa: E402
from synapse.local.netns import MasterNet  # noqa: E402
from synapse.local.postgres import PostgresServer  # noqa: E402
from synapse.proto import api_pb2  # noqa: E402
from synapse.worker.fence import TASK_JOURNAL  # noqa: E402

#: Nodes are DOWN after this long without a heartbeat (every 0.5 s): their lease is 4 s
#: (synapse.core.brain.heartbeat.Lease), above the masters' failover times (a paused or cut-off
#: leader's successor serves in 1-1.5 s), which a 3 s timeout's 2 s lease was not.
HEARTBEAT_TIMEOUT = 5.0
HEARTBEAT_S = 0.5  #: the workers' heartbeat interval
DIGEST_S = 0.25  #: a link shard's digest period at that interval (synapse.master.link_shard.ShardTimings)
STOP_GRACE = 3.0  # synapse-local's workers
#: After an interrupt and `down`, how long the runner waits for its fault and client threads.
INTERRUPTED_JOIN_S = 5.0
GPUS = 8
#: Two queues share the cluster, each guaranteed half of it: they borrow from each other and take it
#: back by preemption (reclaim), and higher priority evicts lower inside a queue.
QUEUES = ("a", "b")
#: With the gang faults (kill-worker-under-gang, kill-agent-under-gang), their gangs have a queue
#: of their own, guaranteed their whole nodes, and the two queues share the rest less one node:
#: within its guarantee a gang is never reclaimed, and it reclaims what the others borrowed, so it
#: starts, and restarts without the node it lost, while the workload keeps the cluster full.
GANG_QUEUE = "gang"


def workload(client_id: int, addresses: list[str], token: str, tls: TLSFiles, history: History,
             stop: threading.Event, seed: int, submitted: list[tuple[str, str]], lock: threading.Lock) -> None:
    rng = random.Random(seed * 1000 + client_id)
    client = MasterClient(addresses, token, deadline=10.0, tls=tls)
    while not stop.is_set():
        roll = rng.random()
        op_id, invoke = history.next_id(), time.time()
        if roll < 0.5 or not submitted:
            request_id = f"c{client_id}-{op_id}"
            tasks = rng.choice([1, 1, 2, 2, 3, 4])
            whole_rack = rng.random() < 0.2
            spec = JobSpec(name=f"chaos{client_id}", tasks=tasks, command=("sleep", f"{rng.uniform(0.3, 2.0):.2f}"),
                           resources=Resources(500, 64 << 20, GPUS if whole_rack else rng.choice([1, 2, 4, 8])),
                           topology=TopologySpec("rack", PackMode.REQUIRED if whole_rack else PackMode.PREFERRED),
                           max_restarts=2, queue=rng.choice(QUEUES), priority=rng.randint(0, 2), grace=1.0)
            try:
                job_id = client.submit(codec.job_spec_to_proto(spec), request_id=request_id)
                history.write("op", id=op_id, client=client_id, f="submit", key=request_id, input=None,
                              output=job_id, invoke=invoke, complete=time.time(), status="ok")
                with lock:
                    submitted.append((request_id, job_id))
            except ClientError as exc:
                history.write("op", id=op_id, client=client_id, f="submit", key=request_id, input=None, output=None,
                              invoke=invoke, complete=time.time(), status="fail", error=exc.message)
            except ClusterUnavailable as exc:
                history.write("op", id=op_id, client=client_id, f="submit", key=request_id, input=None, output=None,
                              invoke=invoke, complete=None, status="unknown", error=str(exc))
        elif roll < 0.9:
            with lock:
                request_id, job_id = rng.choice(submitted)
            try:
                client.get_job(job_id)
                found, status = True, "ok"
            except ClientError as exc:
                found, status = (False, "ok") if exc.code.name == "NOT_FOUND" else (None, "fail")
            except ClusterUnavailable:
                found, status = None, "unknown"
            history.write("op", id=op_id, client=client_id, f="get", key=request_id, input=job_id, output=found,
                          invoke=invoke, complete=time.time() if status != "unknown" else None, status=status)
        else:
            with lock:
                _, job_id = rng.choice(submitted)
            try:
                client.cancel(job_id, reason="chaos")
                status = "ok"
            except (ClientError, ClusterUnavailable):
                status = "unknown"
            history.write("op", id=op_id, client=client_id, f="cancel", key=job_id, input=job_id, output=None,
                          invoke=invoke, complete=time.time(), status=status)
        time.sleep(rng.uniform(0.02, 0.15))
    client.close()


def nemesis_loop(target: Target, kinds: list[str], history: History, stop: threading.Event, seed: int,
                 interval: float, counts: dict[str, int], lane: str = "") -> None:
    """Inject faults of `kinds`, one at a time, until `stop`; each lane has its own seeded schedule.
    Kinds come in seeded shuffled rounds (each kind once a round), so even a short run covers them all."""
    rng = random.Random(f"{seed}:{lane}" if lane else seed)
    bag: list[str] = []
    while not stop.wait(rng.uniform(interval * 0.5, interval * 1.5)):
        if not bag:
            bag = list(kinds)
            rng.shuffle(bag)
        kind = bag.pop()
        try:
            fault = NEMESES[kind](target, rng, history)
        except Exception as exc:
            if target.tearing_down.is_set():
                return  # the cluster is being stopped under this fault (interrupted): its processes are gone
            # A fault that could not be carried out is a finding (the run fails), not a dead lane:
            # record it, heal what it may have left, and go on injecting.
            history.write("fault", kind=kind, targets=[], start=time.time(), end=time.time(),
                          detail={"error": f"{type(exc).__name__}: {exc}"})
            with target.restart_lock:
                counts.setdefault("errors", 0)
                counts["errors"] += 1
            heal(target)
            continue
        if "skipped" not in fault["detail"]:
            with target.restart_lock:
                counts[kind] = counts.get(kind, 0) + 1


def _join(threads: list[threading.Thread]) -> None:
    """Wait for the fault under way to finish healing itself: healing the cluster (or stopping it)
    while a fault still restarts processes made two incarnations of one master or worker."""
    for t in threads:
        if t.ident is not None:
            t.join(timeout=600)
            if t.is_alive():
                raise RuntimeError(f"{t.name} did not finish within 600 s")


def heal(target: Target) -> None:
    """Every process back and every link up, then wait for a leader; and the members the run
    started with, if a membership fault that failed half-way changed them."""
    if target.state.get("netns"):
        MasterNet.from_dict(target.state["netns"]).heal()
    for m in target.state["masters"]:
        if not target.master_alive(m):
            target.restart_master(m)
    for w in target.state["workers"]:
        if not (local.is_ours(w["pid"], target.data_dir) and local.is_alive(w["pid"])):
            target.restart_worker(w, GPUS)
    target.wait_leader(30)
    if target.initial_masters and sorted(m["id"] for m in target.state["masters"]) != sorted(
            m["id"] for m in target.initial_masters):
        target.restore_members(target.initial_masters)


def settle(client: MasterClient, nodes: list[str], timeout: float) -> None:
    """Bring the cluster to rest (bounded): cordon every node, so the backlog of pending gangs
    stops being scheduled, and wait until no gang is scheduled, running or being stopped. Only a
    cluster at rest stops applying commands, and only then can the replicas' digests be compared."""
    deadline = time.monotonic() + timeout
    for node in nodes:
        while time.monotonic() < deadline:
            try:
                client.call("SetSchedulable", api_pb2.SetSchedulableRequest(node_id=node, schedulable=False))
                break
            except (ClientError, ClusterUnavailable):
                time.sleep(0.2)
    while time.monotonic() < deadline:
        try:
            if not client.list_jobs(["SCHEDULED", "RUNNING", "STOPPING"]):
                return
        except (ClientError, ClusterUnavailable):
            pass
        time.sleep(0.2)


def replica_records(target: Target, timeout: float = 60.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    records: list[dict] = []
    while time.monotonic() < deadline:
        records = []
        for m in target.state["masters"]:
            try:
                s = target.client.replica_status(m["api_address"], timeout=2, digest=True)
                records.append({"id": m["id"], "applied": s.commands_applied, "digest": s.digest,
                                "data_dir": m["data_dir"]})
            except Exception:  # noqa: BLE001 - still starting
                pass
        if len(records) == len(target.state["masters"]) and checkers.converged(records):
            return records
        time.sleep(0.2)
    return records


def worker_task_records(data_dir: Path, workers: list[dict]) -> list[dict]:
    """Task starts and exits as each worker's task journal recorded them."""
    out = []
    for w in workers:
        path = data_dir / "workers" / w["id"] / TASK_JOURNAL
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill -9 mid-write
            out.append({"type": "task", "node": w["id"], "job": r["job"], "attempt": r["attempt"],
                        "index": r["index"], "event": r["event"], "time": r["at"], "code": r.get("code"),
                        "reason": r.get("reason"), "fenced": bool(r.get("fenced"))})
    return out


def previous_run(out: Path) -> str:
    """What in `out` a run left (its history or its cluster's files), or '' if nothing."""
    left = [name for name in ("history.jsonl", "cluster") if (out / name).exists()]
    return " and ".join(left)


def run(masters: int, workers: int, duration: float, seed: int, kinds: list[str], out: Path,
        clients: int = 3, interval: float = 4.0) -> dict:
    if previous_run(out):
        raise ValueError(f"{out} holds a previous run ({previous_run(out)}); give an empty or new directory")
    out.mkdir(parents=True, exist_ok=True)
    history = History(out / "history.jsonl")
    history.write("meta", seed=seed, duration=duration, masters=masters, workers=workers, stop_grace=STOP_GRACE,
                  heartbeat_timeout=HEARTBEAT_TIMEOUT, faults=kinds)
    data_dir = out / "cluster"
    # Jobs are never forgotten during a run: the checkers compare every acknowledged job with the end.
    spare = 2 if MEMBERSHIP_FAULTS & set(kinds) and masters == 3 else 0  # room to grow 3 -> 5
    # With database faults, the history store is a PostgreSQL server of the run's own (else SQLite).
    # Masters in network namespaces have a loopback of their own: they reach it by its Unix socket.
    netns = bool(NEEDS_NETNS & set(kinds))
    database = PostgresServer() if DATABASE_FAULTS & set(kinds) else None
    store_url = ""
    if database is not None:
        store_url = database.create("history")
        store_url = database.socket_url("history") if netns else store_url
    try:
        state = local.up(data_dir, masters, workers, 2, GPUS, local.free_base_port(masters + spare),
                         heartbeat=HEARTBEAT_S, heartbeat_timeout=HEARTBEAT_TIMEOUT, job_retention="0",
                         netns=netns, spare_masters=spare, history=store_url)
    except BaseException:
        if database is not None:
            database.destroy()
        raise
    store_url = store_url or f"sqlite:///{data_dir.resolve() / 'history.sqlite'}"
    members = sorted(m["raft_address"] for m in state["masters"])
    addresses = [m["api_address"] for m in state["masters"]]
    target = Target(data_dir, state, MasterClient(addresses, state["token"], deadline=20, tls=local.client_tls(state)),
                    initial_masters=[dict(m) for m in state["masters"]], database=database, gang_queue=GANG_QUEUE)
    gangs = GANG_TASKS * GPUS if GANG_FAULTS & set(kinds) else 0  # one gang at a time: one machine lane
    half = Resources(0, 0, (workers * GPUS - gangs - (GPUS if gangs else 0)) // 2)
    target.client.call("ApplyQueues", api_pb2.ApplyQueuesRequest(queues=[
        codec.queue_to_proto(Queue(name, guaranteed=guaranteed, preemption_rules=("reclaim", "priority")))
        for name, guaranteed in [(q, half) for q in QUEUES] + ([(GANG_QUEUE, Resources(0, 0, gangs))] if gangs else [])
    ]))
    stop, lock, submitted, counts = threading.Event(), threading.Lock(), [], {}
    threads = [threading.Thread(target=workload, args=(i, addresses, state["token"], local.client_tls(state), history,
                                                       stop, seed, submitted, lock)) for i in range(clients)]
    lanes = {"masters": [k for k in kinds if k not in MACHINE_FAULTS | DATABASE_FAULTS],
             "machines": [k for k in kinds if k in MACHINE_FAULTS],
             "database": [k for k in kinds if k in DATABASE_FAULTS]}
    for lane, lane_kinds in lanes.items():
        if lane_kinds:
            threads.append(threading.Thread(target=nemesis_loop, name=f"nemesis-{lane}",
                                            args=(target, lane_kinds, history, stop, seed, interval, counts, lane)))
    started = time.time()
    try:
        for t in threads:
            t.start()
        time.sleep(duration)
        stop.set()
        workload_ended = time.time()
        _join(threads)
        heal(target)
        settle(target.client, [w["id"] for w in state["workers"]], timeout=HEARTBEAT_TIMEOUT + STOP_GRACE + 60)
        replicas = replica_records(target)
        final_members = target.members()
        archived = archive_caught_up(target, timeout=60)
        for r in replicas:
            history.write("replica", **r)
    finally:
        stop.set()  # no new fault; also when interrupted
        target.client.close()
        # `down` before waiting for the threads: once it has begun, a fault still under way can no
        # longer restart a process (local.restart refuses), so an interrupted run stops at once
        # instead of after the fault and the clients' deadlines. Normally the threads have ended.
        interrupted = isinstance(sys.exc_info()[1], KeyboardInterrupt)
        target.tearing_down.set()
        local.down(data_dir)
        if sys.exc_info()[1] is not None and database is not None:
            database.destroy()  # the run ends here: no store to check
        if interrupted:  # a fault under way may poll the stopped cluster until its own deadline
            for t in threads:
                t.join(timeout=INTERRUPTED_JOIN_S / len(threads))
        else:
            _join(threads)
    ended = time.time()
    try:
        stored, stored_runs = read_store(store_url)
    finally:
        if database is not None:
            database.destroy()
    for record in worker_task_records(data_dir, state["workers"]):
        history.write("task", **{k: v for k, v in record.items() if k != "type"})
    history.close()
    records = list(read(out / "history.jsonl"))
    overcommits, final_states = [], []
    for r in replicas:
        replayed, problems, _ = checkers.replay_replica(r["data_dir"])
        final_states.append(replayed)
        overcommits += [f"{r['id']}: {p}" for p in problems]
    # The final jobs come from the replicas' own logs (no single RPC could carry tens of thousands).
    final = final_states[0].jobs if final_states else {}
    placed = {(j.id, a): len(nodes) for j in final.values() for a, nodes in j.placements.items()}
    ops = [r for r in records if r["type"] == "op"]
    ok_times = sorted(r["complete"] for r in ops if r["status"] == "ok")
    faults = [r for r in records if r["type"] == "fault"]
    marks = [mark for path in sorted((data_dir / "logs").glob("*.log"))
             for mark in checkers.master_log_marks(path.read_text(errors="replace"))]
    timelines = checkers.outage_timelines(faults, ops, marks, [w["id"] for w in state["workers"]], workload_ended)
    (out / "timelines.json").write_text(json.dumps(timelines, indent=1))
    failover = []
    for f in faults:
        if f["kind"] in ("kill-leader", "pause-leader", "partition-leader", "restart-masters", "kill-minority"):
            after = [t for t in ok_times if t > f["start"]]
            if after:
                failover.append(round(after[0] - f["start"], 3))
    done = [f for f in faults if "skipped" not in f["detail"] and "error" not in f["detail"]]
    cuts = [f for f in done if f["kind"] == "partition-follower"]
    cut_changes = sum(1 for f in cuts if f["detail"].get("changed_during_cut") or f["detail"].get("no_leader_at_heal"))
    errors = counts.pop("errors", 0)
    report = {
        "faults": sum(counts.values()), "fault_kinds": counts, "ops": len(ops),
        # Faults that raised instead of completing (each also in the history with its error).
        "nemesis_errors": errors,
        "acked": sum(1 for r in ops if r["f"] == "submit" and r["status"] == "ok"),
        "lost": checkers.lost_acknowledged(records, set(final)),
        "overcommits": len(overcommits),
        "partial_gangs": checkers.partial_gangs(records, placed, ended,
                                                allowance=HEARTBEAT_TIMEOUT + STOP_GRACE + 3.0),
        "duplicate_tasks": checkers.duplicate_tasks(records, ended),
        "replicas_converged": checkers.converged(replicas),
        "log_conflicts": checkers.log_conflicts(m["data_dir"] for m in state["masters"]),
        "linearizable": checkers.linearizable(records),
        # The longest stretch, while the workload ran, with no client operation succeeding.
        "max_unavailable_s": round(max((b - a for a, b in zip([started, *ok_times], [*ok_times, workload_ended],
                                                               strict=True) if a <= workload_ended), default=0.0), 3),
        # Gangs stopped by a preemption plan, and plans committed (a gang may be preempted twice).
        "preemptions": sum(1 for j in final.values() for e in j.events if e.kind == "Preempted"),
        "failover_s": failover, "seconds": round(ended - started, 1), "history": str(out / "history.jsonl"),
        # Per fault kind, the longest stretch without a successful operation from its start.
        "outage_by_kind": checkers.outages_by_kind(ok_times, faults, workload_ended),
        # Per fault kind, where the outage's time went: seconds from the fault to a master serving
        # again, a leader elected, its barrier committed, a client's first write, every worker's
        # stream on the new leader (each fault's in timelines.json beside the history).
        "outage_timeline": checkers.timeline_summary(timelines),
        # Follower partitions (chaos.nemesis.judge_heal): leader changes caused by the heal (PreVote
        # keeps this at 0), judged where the leader held through the cut; the cuts where it did
        # not; and cut-off followers whose term went past the rest's (PreVote forbids it).
        "heal_leader_changes": sum(1 for f in cuts if f["detail"].get("leader_changed")),
        "heals_judged": len(cuts) - cut_changes,
        "cut_leader_changes": cut_changes,
        "cut_term_rises": sum(1 for f in cuts if f["detail"].get("victim_term_rose")),
        # The Raft members at the end are the ones the run started with (membership faults undo
        # themselves: grow and shrink back, replace with the same id).
        "members_ok": final_members == members,
        "overcommit_details": overcommits[:10],
        # Every job the cluster finished, in the history store exactly once with its true final state.
        "history_archived": archived, "history_jobs": len(stored),
        "history_problems": checkers.history_exactly_once(final, stored, stored_runs)[:10],
        # NodeDowns that no kill or restart of that node's worker explains (a master fault, a cut
        # shard replica, a failover's storm would show here).
        "false_node_downs": checkers.false_node_downs(faults, marks, HEARTBEAT_TIMEOUT),
        # Gangs a machine died under: restarted whole, never on the failed node; and how many of
        # them ran again within their fault (of how many).
        "gangs_under_fault": checkers.gangs_under_fault(faults, final),
        "gangs_restarted": checkers.gangs_restarted(faults),
        # Ranks with two attempts alive at once (from the workers' task journals), and the agent
        # kills that saw a process of the earlier attempt alive once the next attempt ran.
        "ranks_twice": checkers.ranks_twice(records, ended),
        "old_attempts_alive": checkers.old_attempts_alive(faults),
        # Tasks a node killed for its lease (its fence or its agent) with no kill or restart of that
        # node's worker to explain it (a master fault let the worker's lease run out).
        "false_fencings": checkers.false_fencings(records, faults, HEARTBEAT_TIMEOUT, checkers.blackouts(
            ok_times, faults, workload_ended, Lease.of(HEARTBEAT_TIMEOUT).seconds - HEARTBEAT_S - DIGEST_S)),
    }
    checks = {
        "lost": not report["lost"], "overcommits": not overcommits, "partial_gangs": not report["partial_gangs"],
        "duplicate_tasks": not report["duplicate_tasks"], "replicas_converged": report["replicas_converged"],
        "log_conflicts": not report["log_conflicts"], "linearizable": report["linearizable"] == "ok",
        "heal_leader_changes": report["heal_leader_changes"] == 0, "cut_term_rises": report["cut_term_rises"] == 0,
        # Most heals must be judged, or a cluster that loses its leader in every cut would pass (a
        # short run's one or two cuts say too little to judge the share).
        "heals_judged": len(cuts) < MIN_CUTS_FOR_SHARE or report["heals_judged"] * 2 >= len(cuts),
        "members_ok": report["members_ok"],
        "nemesis_errors": not report["nemesis_errors"],
        "history_exactly_once": archived and not report["history_problems"],
        "false_node_downs": not report["false_node_downs"],
        "gangs_under_fault": not report["gangs_under_fault"],
        "ranks_twice": not report["ranks_twice"], "old_attempts_alive": not report["old_attempts_alive"],
        "false_fencings": not report["false_fencings"],
    }
    report["failed_checks"] = [name for name, held in checks.items() if not held]
    report["ok"] = not report["failed_checks"]
    return report


#: Follower partitions a run needs before the share of judged heals is checked.
MIN_CUTS_FOR_SHARE = 4


def archive_caught_up(target: Target, timeout: float) -> bool:
    """Wait until the history exporter has archived every finished job (the leader's metric)."""
    import urllib.request

    from synapse.common.tls import http_base

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader = target.leader()
        if leader is not None and leader.get("http_address"):
            base, context = http_base(leader["http_address"], target.state.get("ca", ""))
            try:
                with urllib.request.urlopen(f"{base}/metrics", timeout=2, context=context) as reply:
                    if "synapse_history_unarchived_jobs 0.0" in reply.read().decode():
                        return True
            except OSError:
                pass
        time.sleep(0.5)
    return False


def read_store(url: str) -> tuple[list[tuple[str, str, int]], dict[str, int]]:
    """(job id, state, attempts) of every job in the history store, and its run rows per job."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = [tuple(r) for r in conn.execute(sa.text("select job_id, state, attempts from history_jobs"))]
            runs = dict(conn.execute(sa.text("select job_id, count(*) from history_runs group by job_id")).all())
    finally:
        engine.dispose()
    return rows, runs


def _tell(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:  # the terminal has gone (SIGHUP)
        pass


def main() -> None:
    """SIGINT, SIGTERM and SIGHUP stop the run and its cluster (see synapse.local.interrupts)."""
    with interrupts.handled("stopping the chaos run's cluster"):
        _main()


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--masters", type=int, default=3, choices=[3, 5])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", nargs="*", default=sorted(NEMESES), help=f"kinds: {', '.join(sorted(NEMESES))}")
    parser.add_argument("--interval", type=float, default=4.0, help="mean seconds between faults")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--out", type=Path, help="keep the history and the cluster's files here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    unknown = [k for k in args.faults if k not in NEMESES]
    if unknown:
        parser.error(f"unknown fault kinds: {unknown}; known: {', '.join(sorted(NEMESES))}")
    kinds = []
    for k in args.faults:
        why = unavailable(k)
        if not why and k in GANG_FAULTS and args.workers < GANG_TASKS + 2:
            # Its gang's nodes, the node a restart without the lost one needs, and one for the workload.
            why = f"its gang needs {GANG_TASKS + 2} workers or more (--workers {args.workers})"
        if why:
            print(f"skipping fault {k}: {why}", file=sys.stderr)
        else:
            kinds.append(k)
    if not kinds:
        parser.error("no fault kind can run here")
    if args.out is not None and previous_run(args.out):
        parser.error(f"--out {args.out} holds a previous run ({previous_run(args.out)}): its replicas' journals "
                     "would start the cluster with that run's members and its history would be checked with "
                     "this one's; give an empty or new directory")
    out = args.out or Path(tempfile.mkdtemp(prefix="synapse-chaos-"))
    try:
        report = run(args.masters, args.workers, args.duration, args.seed, kinds, out, args.clients, args.interval)
    except interrupts.Interrupted as exc:
        local.down(out / "cluster")  # also what an interrupt between `up` and run()'s try left
        _tell(f"chaos run interrupted by {exc}: its cluster is stopped; files in {out}")
        # Not sys.exit: a fault thread may still poll the stopped cluster until its own deadline
        # (up to a minute), and the interpreter would wait for it. Nothing is left to clean up.
        sys.stdout.flush()
        os._exit(exc.exit_code)
    if args.json:
        print(json.dumps(report))
    else:
        for key in ("faults", "fault_kinds", "ops", "acked", "preemptions", "lost", "overcommits", "partial_gangs",
                    "duplicate_tasks", "replicas_converged", "log_conflicts", "linearizable", "max_unavailable_s",
                    "heal_leader_changes", "heals_judged", "cut_leader_changes", "cut_term_rises", "members_ok",
                    "nemesis_errors", "history_archived", "history_jobs", "history_problems", "false_node_downs",
                    "gangs_under_fault", "gangs_restarted", "ranks_twice", "old_attempts_alive", "false_fencings",
                    "failed_checks", "outage_by_kind", "outage_timeline", "failover_s", "seconds", "history"):
            print(f"{key:<20} {report[key]}")
        print("RESULT", "PASS" if report["ok"] else "FAIL")
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
