"""Checkers over a chaos history and the replicas' stored logs. Each returns findings; none guesses.

* `lost_acknowledged` — every submission acknowledged to a client exists at the end.
* `replay_replica` — replays one replica's snapshot and journal through a fresh state machine
  and checks the state invariants (no over-allocation, no GPU index twice, whole gangs…) after
  every committed command: the committed state is checked, not only the final one.
* `partial_gangs` — as the workers ran them: no attempt where a task ended abnormally (or never
  started) while another task of it ran on for longer than the allowance (detection + stop grace).
* `duplicate_tasks` — at most one live instance of each task (job, attempt, index) at any time.
* `ranks_twice` — no two attempts of one rank (job, index) alive at once: an earlier attempt's
  task must be gone (exited, lost with its machine, or fenced) before the next attempt's starts.
* `old_attempts_alive` — the `kill-agent-under-gang` faults that saw a process of the earlier
  attempt alive once the next attempt ran.
* `false_fencings` — tasks a node killed for its lease (its fence, or its agent) with no machine
  fault on that node to explain it: a master fault must never let a worker's lease run out.
* `converged` — replicas that applied the same number of commands have the same digest.
* `log_conflicts` — the replicas' journals hold the same entry (term and command) at every index
  they all still keep: a replica that applied an entry the others replaced shows up here, even
  when the cluster never fell quiet long enough for `converged` to compare digests.
* `gangs_under_fault` — every gang a machine or agent fault hit under it exists at the end, and every
  attempt after the loss was whole and never on the failed node (no GPU given twice is
  `replay_replica`'s); `gangs_restarted` counts those seen running again within the fault.
* linearizability of the client operations: `chaos.linearizability.check` with the JOBS model.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from chaos.linearizability import JOBS, Op, check
from synapse.core import commands as c
from synapse.core.codec import CodecError
from synapse.core.state.fsm import ApplyFailed, ClusterState
from synapse.core.state.invariants import node_violations, violations
from synapse.master.durability import CorruptionError, entry_payload, journal_records

#: Task journal events that end an instance: the agent saw it exit, a nemesis took its machine
#: down (`lost`), or the node's fence killed it when the worker's lease ran out (`fenced`).
TASK_ENDS = ("exit", "lost", "fenced")

#: The full invariant scan (every job and node) runs this often during a replay; the per-node
#: checks run after every command.
FULL_SCAN_EVERY = 1000


def client_ops(records: Iterable[dict[str, Any]]) -> list[Op]:
    """The submit and get operations of a history, as the linearizability checker takes them."""
    out = []
    for r in records:
        if r.get("type") == "op" and r["f"] in ("submit", "get"):
            out.append(Op(r["id"], r["f"], r["key"], r.get("input"), r.get("output"), r["invoke"],
                          r.get("complete"), r["status"]))
    return out


def linearizable(records: list[dict[str, Any]], budget_s: float = 30.0) -> str:
    return check(JOBS, client_ops(records), budget_s)


def lost_acknowledged(records: Iterable[dict[str, Any]], final_job_ids: set[str]) -> list[str]:
    """Job ids acknowledged to a client that the final state does not hold."""
    acked = {r["output"] for r in records if r.get("type") == "op" and r["f"] == "submit" and r["status"] == "ok"}
    return sorted(acked - final_job_ids)


def replay_replica(data_dir: str | Path, levels: tuple[str, ...] | None = None) -> tuple[ClusterState, list[str], int]:
    """(final state, invariant violations with the raft index where each appeared, commands replayed)."""
    data_dir = Path(data_dir)
    state, start_index = _load_snapshot(data_dir / "raft.dump")
    if state is None:
        state = ClusterState(levels) if levels else ClusterState()
    problems: list[str] = []
    replayed = 0
    journal = data_dir / "raft.journal"
    if journal.exists():
        try:
            for idx, _term, command in journal_records(journal):
                if idx <= start_index:
                    continue
                payload = entry_payload(command)
                if payload is None:
                    continue
                for cmd, result in state.apply_entry(payload):
                    replayed += 1
                    if result.ok and cmd is not None:
                        for v in node_violations(state, _touched_nodes(state, cmd)):
                            problems.append(f"raft index {idx}: {v}")
                    if replayed % FULL_SCAN_EVERY == 0:
                        problems += [f"raft index {idx}: {v}" for v in violations(state)]
        except CorruptionError as exc:
            problems.append(f"journal unreadable: {exc}")
        except CodecError as exc:  # the replica stops there too: nothing after it is replayed
            problems.append(f"raft index {idx}: a command this code cannot apply: {exc}")
        except ApplyFailed as exc:  # a handler failed midway: the replica stops there (synapse.core.state.fsm)
            problems.append(f"raft index {idx}: applying it failed midway: {exc}")
    problems += [f"final state: {v}" for v in violations(state)]
    return state, sorted(set(problems), key=problems.index), replayed


def _touched_nodes(state: ClusterState, cmd: c.Command) -> set[str]:
    """Nodes whose allocation a command may have changed."""
    nodes = {p.node_id for p in cmd.placements} if isinstance(cmd, c.CommitPlan) else set()
    if isinstance(cmd, c.StartStep):  # a step's tasks go onto its allocation's nodes
        alloc = state.jobs.get(cmd.alloc_id)
        if alloc is not None:
            nodes.update(t.node_id for t in alloc.tasks)
    if hasattr(cmd, "node_id"):
        nodes.add(cmd.node_id)  # type: ignore[attr-defined]
    if hasattr(cmd, "job_id"):
        job = state.jobs.get(cmd.job_id)  # type: ignore[attr-defined]
        if job is not None:
            nodes.update(t.node_id for t in job.tasks)
    return nodes


def _load_snapshot(path: Path) -> tuple[ClusterState | None, int]:
    if not path.exists() or path.stat().st_size == 0:
        return None, 0
    from pysyncobj.serializer import Serializer

    data = Serializer(str(path), 0, False, None, None, None).deserialize()
    consumer = data[0][1] if isinstance(data[0], list) else data[0]
    return ClusterState.from_snapshot(consumer["state"]), data[1][1]


def duplicate_tasks(records: Iterable[dict[str, Any]], end: float) -> list[str]:
    """Task keys with two live instances at once (an adopted instance is the same one)."""
    intervals = _task_intervals(records, end)
    out = []
    for key, spans in intervals.items():
        spans.sort()
        for (s1, e1, n1), (s2, e2, n2) in zip(spans, spans[1:], strict=False):
            if s2 < e1:
                out.append(f"task {key} live twice: on {n1} {s1:.3f}-{e1:.3f} and on {n2} {s2:.3f}-{e2:.3f}")
    return out


def ranks_twice(records: Iterable[dict[str, Any]], end: float) -> list[str]:
    """Ranks (job, index) with instances of two attempts alive at once; a start with no end is
    alive until `end`. (Two instances of one attempt are `duplicate_tasks`'.)"""
    by_rank: dict[tuple[str, int], list[tuple[float, float, int, str]]] = defaultdict(list)
    for (job, attempt, index), spans in _task_intervals(records, end).items():
        by_rank[(job, index)] += [(s, e, attempt, node) for s, e, node in spans]
    out = []
    for (job, index), spans in sorted(by_rank.items()):
        spans.sort()
        for i, (s1, e1, a1, n1) in enumerate(spans):
            for s2, e2, a2, n2 in spans[i + 1:]:
                if s2 >= e1:
                    break  # sorted by start: no later span begins before this one ends
                if a2 != a1:
                    out.append(f"rank {job}[{index}] alive twice: attempt {a1} on {n1} {s1:.3f}-{e1:.3f} and "
                               f"attempt {a2} on {n2} {s2:.3f}-{e2:.3f}")
    return out


def old_attempts_alive(faults: list[dict]) -> list[str]:
    """The `kill-agent-under-gang` faults that saw a process of the attempt their agent died under
    alive once the gang's next attempt ran (`old_alive`: what was seen)."""
    return [f"{f['detail']['job']} attempt {f['detail']['attempt']} (agent of {f['detail']['node']} killed): "
            f"{', '.join(f['detail']['old_alive'])}"
            for f in faults if f["kind"] == "kill-agent-under-gang" and f["detail"].get("old_alive")]


def partial_gangs(records: list[dict[str, Any]], placed: dict[tuple[str, int], int], end: float,
                  allowance: float) -> list[str]:
    """Attempts that ran as a partial gang for longer than `allowance` seconds.

    `placed` maps (job, attempt) to its gang size. An abnormal end (non-zero exit, killed, lost)
    of one task must be followed by the end of every other task of the attempt within the
    allowance; a task that never started must not leave the others running beyond it.
    """
    intervals = _task_intervals(records, end)
    ends: dict[tuple[str, int, int], tuple[float, int | None]] = {}
    for r in records:
        if r.get("type") == "task" and r["event"] in TASK_ENDS:
            ends[(r["job"], r["attempt"], r["index"])] = (r["time"], r.get("code"))
    out = []
    for (job, attempt), size in placed.items():
        spans = {i: intervals.get((job, attempt, i), []) for i in range(size)}
        started = {i for i, s in spans.items() if s}
        if not started:
            continue
        first_start = min(s[0][0] for s in spans.values() if s)
        last_end = max(s[-1][1] for s in spans.values() if s)
        missing = sorted(set(range(size)) - started)
        if missing and last_end - first_start > allowance:
            out.append(f"job {job} attempt {attempt}: tasks {missing} never started while others ran "
                       f"{last_end - first_start:.1f}s")
            continue
        abnormal = [(t, i) for i, (t, code) in ((i, ends[(job, attempt, i)]) for i in started
                                                if (job, attempt, i) in ends) if code != 0]
        if abnormal:
            t0, first = min(abnormal)
            late = [i for i in started if spans[i][-1][1] > t0 + allowance]
            if late:
                out.append(f"job {job} attempt {attempt}: task {first} ended abnormally at {t0:.3f}; tasks {late} "
                           f"still ran {max(spans[i][-1][1] for i in late) - t0:.1f}s later")
    return out


def _task_intervals(records: Iterable[dict[str, Any]], end: float) -> dict[tuple[str, int, int], list]:
    """key -> [(start, end, node)] per instance; adoption continues an instance, not a new one."""
    open_: dict[tuple[tuple[str, int, int], str], float] = {}
    out: dict[tuple[str, int, int], list] = defaultdict(list)
    for r in sorted((r for r in records if r.get("type") == "task"), key=lambda r: r["time"]):
        key = (r["job"], r["attempt"], r["index"])
        slot = (key, r["node"])
        if r["event"] == "start":
            if slot in open_:  # a second instance on the same node while the first still runs
                out[key].append((open_[slot], r["time"] + 1e-6, r["node"]))
            open_[slot] = r["time"]
        elif r["event"] in TASK_ENDS and slot in open_:
            out[key].append((open_.pop(slot), r["time"], r["node"]))
    for (key, node), start in open_.items():
        out[key].append((start, end, node))
    return out


def log_conflicts(data_dirs: Iterable[str | Path]) -> list[str]:
    """Indices where the replicas' journals disagree, over the range every one of them keeps."""
    logs: dict[str, dict[int, tuple[int, bytes]]] = {}
    for d in data_dirs:
        journal = Path(d) / "raft.journal"
        try:
            logs[str(d)] = {idx: (term, cmd) for idx, term, cmd in journal_records(journal)} \
                if journal.exists() else {}
        except CorruptionError as exc:
            return [f"{d}: journal unreadable: {exc}"]
    if len(logs) < 2:
        return []
    common = set.intersection(*(set(entries) for entries in logs.values()))
    variants = {i: len({entries[i] for entries in logs.values()}) for i in sorted(common)}
    return [f"raft index {i}: the replicas hold {n} different entries" for i, n in variants.items() if n > 1]


def history_exactly_once(final: dict[str, Any], rows: list[tuple[str, str, int]],
                         runs: dict[str, int]) -> list[str]:
    """Every job the cluster finished is in the history store once, with its true final state and
    one row per run; the store holds no other job. `rows`: (job id, state, attempts) of its jobs
    table; `runs`: job id -> rows in its runs table."""
    problems = []
    seen: dict[str, int] = {}
    for job_id, _state, _attempts in rows:
        seen[job_id] = seen.get(job_id, 0) + 1
    stored = {job_id: (state, attempts) for job_id, state, attempts in rows}
    for job_id, job in sorted(final.items()):
        if not job.status.terminal:
            if job_id in stored:
                problems.append(f"{job_id}: in the store but {job.status.value} in the cluster")
            continue
        if job_id not in stored:
            problems.append(f"{job_id}: finished {job.status.value}, missing from the store")
        elif seen[job_id] != 1:
            problems.append(f"{job_id}: {seen[job_id]} rows")
        elif stored[job_id] != (job.status.value, job.attempt):
            problems.append(f"{job_id}: stored as {stored[job_id]}, the cluster says ({job.status.value}, "
                            f"{job.attempt})")
        elif runs.get(job_id, 0) != len(job.runs):
            problems.append(f"{job_id}: {runs.get(job_id, 0)} run rows, the cluster kept {len(job.runs)} runs")
    problems += [f"{job_id}: in the store, unknown to the cluster" for job_id in sorted(set(stored) - set(final))]
    return problems


def gangs_under_fault(faults: list[dict], final: dict[str, Any]) -> list[str]:
    """What the gangs of the gang faults (`kill-worker-under-gang`, `kill-agent-under-gang`) show
    against the final state (the jobs of a replica's replayed log): each exists at the end, and
    every attempt placed after the loss is whole and avoids the failed node. (Whether a gang ran
    again within its fault is `gangs_restarted`'s: under concurrent faults a restart may wait for
    room.)"""
    problems = []
    for f in _gang_faults(faults):
        d = f["detail"]
        job_id, node, attempt = d["job"], d["node"], d["attempt"]
        job = final.get(job_id)
        if job is None:
            problems.append(f"{job_id}: gone from the final state")
            continue
        for later, nodes in sorted(job.placements.items()):
            if later <= attempt:
                continue
            if len(nodes) != d["tasks"]:
                problems.append(f"{job_id}: attempt {later} placed {len(nodes)} of {d['tasks']} tasks")
            if node in nodes:
                problems.append(f"{job_id}: attempt {later} placed on {node}, which failed attempt {attempt}")
    return problems


def gangs_restarted(faults: list[dict]) -> tuple[int, int]:
    """(gangs seen running again within their fault, gangs a machine or an agent died under)."""
    hit = _gang_faults(faults)
    return sum(1 for f in hit if f["detail"].get("restarted")), len(hit)


def _gang_faults(faults: list[dict]) -> list[dict]:
    """The faults that killed a machine or its agent under a running gang."""
    from chaos.nemesis import GANG_FAULTS

    return [f for f in faults if f["kind"] in GANG_FAULTS and "node" in f["detail"]]


def converged(replicas: list[dict[str, Any]]) -> bool:
    """Replicas with the same applied count have the same digest (and all reached the top count)."""
    if not replicas or any(not r.get("digest") for r in replicas):
        return False  # no digest, no evidence
    top = max(r["applied"] for r in replicas)
    digests = {r["digest"] for r in replicas if r["applied"] == top}
    return len(digests) == 1 and all(r["applied"] == top for r in replicas)


#: After a fault ends, how long its outage may still run (a restarted master's first commit).
OUTAGE_TAIL_S = 10.0


def outage(ok_times: list[float], start: float, end: float, workload_ended: float) -> float:
    """The longest stretch without a successful client operation from a fault's start until the
    first success after it ended (bounded by OUTAGE_TAIL_S and the end of the workload)."""
    import bisect

    limit = min(end + OUTAGE_TAIL_S, workload_ended)
    previous, worst = start, 0.0
    for t in ok_times[bisect.bisect_right(ok_times, start):]:
        worst = max(worst, t - previous)
        previous = t
        if t >= end or t >= limit:
            return round(worst, 3)
    return round(max(worst, limit - previous), 3)


def outages_by_kind(ok_times: list[float], faults: list[dict], workload_ended: float) -> dict[str, dict]:
    """Per fault kind: how many, and the median, p99 and max of their outages (seconds)."""
    by_kind: dict[str, list[float]] = defaultdict(list)
    for f in faults:
        if "skipped" in f["detail"] or "error" in f["detail"] or f["start"] >= workload_ended:
            continue
        by_kind[f["kind"]].append(outage(ok_times, f["start"], f["end"], workload_ended))
    out = {}
    for kind, values in sorted(by_kind.items()):
        values.sort()
        out[kind] = {"n": len(values), "median_s": values[len(values) // 2],
                     "p99_s": values[min(len(values) - 1, int(0.99 * len(values)))], "max_s": values[-1]}
    return out


# ---- where an outage's time goes -----------------------------------------------------------------

#: Master log lines a fault's timeline reads, by what their message starts with.
_MARKS = {"master serving": "serving", "leadership gained": "leader", "leader ready": "ready",
          "assignments watched": "watch", "node declared down": "down"}


def master_log_marks(text: str) -> list[tuple[float, str, dict[str, str]]]:
    """(time, mark, key=value fields) of the lines of one master's log that a timeline needs:
    `serving` (started, journal replayed), `leader` (won an election), `ready` (its barrier
    committed), `watch` (a worker's assignment stream opened on it) and `down` (a NodeDown it
    committed as leader)."""
    from datetime import datetime

    out = []
    for line in text.splitlines():
        stamp, _, rest = line.partition(" ")
        message = rest.split(": ", 1)[1] if ": " in rest else ""
        mark = next((m for prefix, m in _MARKS.items() if message.startswith(prefix)), None)
        if mark is None:
            continue
        try:
            at = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f").timestamp()  # the log's local time
        except ValueError:
            continue
        fields = dict(word.split("=", 1) for word in message.split() if "=" in word)
        out.append((at, mark, fields))
    return out


#: A worker a machine fault stopped is counted out of a timeline's `workers` until this long after it.
WORKER_BACK_S = 5.0


def outage_timelines(faults: list[dict], ops: list[dict], marks: list[tuple[float, str, dict[str, str]]],
                     nodes: Iterable[str], workload_ended: float) -> list[dict]:
    """Per fault, seconds from its injection to each step of the recovery that follows it (None
    when the step did not happen within the outage's bound): `serving`, the first master that
    started serving (restarted, journal replayed); `leader`, the first election won; `ready`, that
    leader's barrier committed; `write`, a client's first acknowledged submission after that (or
    after the fault, with no leader change); `workers`, every worker's assignment stream open on
    that leader (but those a machine fault had down meanwhile); and `outage`, as `outage` measures
    it. A step counts up to the next fault of the same lane (the master faults', the machine
    faults' or the database's)."""
    ok_times = sorted(r["complete"] for r in ops if r["status"] == "ok")
    writes = sorted(r["complete"] for r in ops if r["status"] == "ok" and r["f"] == "submit")
    marks = sorted(marks, key=lambda m: m[0])
    nodes = set(nodes)
    from chaos.nemesis import DATABASE_FAULTS, MACHINE_FAULTS

    def lane(kind: str) -> str:
        return "machines" if kind in MACHINE_FAULTS else "database" if kind in DATABASE_FAULTS else "masters"

    out = []
    for f in faults:
        if "skipped" in f["detail"] or "error" in f["detail"] or f["start"] >= workload_ended:
            continue
        start = f["start"]
        # Until the next fault of its lane (master, machine or database faults): what follows is that one's.
        following = [g["start"] for g in faults if g["start"] > start and lane(g["kind"]) == lane(f["kind"])]
        limit = min(f["end"] + OUTAGE_TAIL_S, workload_ended, *following)
        serving, leader = _first(marks, "serving", start, limit), _first(marks, "leader", start, limit)
        ready = _first(marks, "ready", leader[0], limit, leader[1].get("term")) if leader else None
        since = ready[0] if ready else start
        write = next((t for t in writes if since < t <= limit), None)
        workers = None
        if ready:
            opened: dict[str, float] = {}
            for t, m, fields in marks:
                if m == "watch" and ready[0] <= t <= limit and fields.get("term") == ready[1].get("term"):
                    opened.setdefault(fields.get("node", ""), t)
            # Workers a machine fault had down or restarting meanwhile re-attach on their own schedule.
            hit = {w for g in faults if g["kind"] in MACHINE_FAULTS and g["start"] <= limit
                   and g["end"] + WORKER_BACK_S >= start for w in g.get("targets", ())}
            expected = nodes - hit
            if expected and expected <= set(opened):
                workers = max(opened[n] for n in expected)
        steps = {"serving": serving[0] if serving else None, "leader": leader[0] if leader else None,
                 "ready": ready[0] if ready else None, "write": write, "workers": workers}
        out.append({"kind": f["kind"], "start": start,
                     **{k: None if t is None else round(t - start, 3) for k, t in steps.items()},
                     "outage": outage(ok_times, start, f["end"], workload_ended)})
    return out


def false_node_downs(faults: list[dict], marks: list[tuple[float, str, dict[str, str]]],
                     timeout: float) -> list[str]:
    """NodeDowns no machine fault explains: a node declared DOWN outside [start, end + timeout +
    WORKER_BACK_S] of every kill or restart of its worker. A master fault (a leader killed, a shard's
    replica cut off, every master restarted) must never cost a live node its tasks."""
    explained = _machine_fault_windows(faults, timeout)
    return [f"{fields.get('node', '?')} at {t:.3f} (term {fields.get('term', '?')})" for t, m, fields in marks
            if m == "down" and not explained(fields.get("node", ""), t)]


def false_fencings(records: Iterable[dict[str, Any]], faults: list[dict], timeout: float,
                   blackouts: Iterable[tuple[float, float]] = ()) -> list[str]:
    """Tasks their node killed for its lease that no machine fault explains, by the same windows as
    `false_node_downs`: the fence's (`fenced`) and the agent's own (an `exit` its journal marks
    `fenced`). A master fault must never let a worker's lease run out, with one exception, the
    `blackouts`: (start, end) of every master down at once for longer than a lease, which a worker
    cannot tell from being cut off from all of them (synapse.worker.fence); a fencing from such a
    window's start to a timeout after its end is explained."""
    explained = _machine_fault_windows(faults, timeout)
    dark = [(a, b + timeout) for a, b in blackouts]
    return [f"{r['job']}.{r['attempt']}.{r['index']} on {r['node']} at {r['time']:.3f} ({r['event']})"
            for r in sorted(records, key=lambda r: r.get("time", 0.0))
            if r.get("type") == "task" and (r["event"] == "fenced" or r["event"] == "exit" and r.get("fenced"))
            and not explained(r["node"], r["time"]) and not any(a <= r["time"] <= b for a, b in dark)]


def blackouts(ok_times: list[float], faults: list[dict], workload_ended: float,
              lease: float) -> list[tuple[float, float]]:
    """The faults that stopped every master at once (`restart-masters`) for longer than a worker's
    lease can outlast, as (start, start + outage): `lease`, less what it may have run down before
    the fault and still must after it (a heartbeat interval before, a digest period for the first
    replica to vouch again), both given in `lease`'s place by the caller."""
    out = []
    for f in faults:
        if f["kind"] == "restart-masters":
            down = outage(ok_times, f["start"], f["end"], workload_ended)
            if down > lease:
                out.append((f["start"], f["start"] + down))
    return out


def _machine_fault_windows(faults: list[dict], timeout: float) -> Callable[[str, float], bool]:
    """Whether a node's loss at a time is explained: within [start, end + timeout + WORKER_BACK_S]
    of a machine fault (a kill or restart of its worker or agent) on that node."""
    from chaos.nemesis import MACHINE_FAULTS

    hits: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for f in faults:
        if f["kind"] in MACHINE_FAULTS:
            for node in f.get("targets", ()):
                hits[node].append((f["start"], f["end"] + timeout + WORKER_BACK_S))
    return lambda node, t: any(a <= t <= b for a, b in hits.get(node, ()))


def _first(marks: list[tuple[float, str, dict[str, str]]], mark: str, after: float, limit: float,
           term: str | None = None) -> tuple[float, dict[str, str]] | None:
    """The first `mark` in [after, limit] (of that term, if given)."""
    return next(((t, fields) for t, m, fields in marks
                 if m == mark and after <= t <= limit and (term is None or fields.get("term") == term)), None)


def timeline_summary(timelines: list[dict]) -> dict[str, dict[str, dict]]:
    """Per fault kind and step: how many faults reached it, and the median and p99 of its time."""
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for t in timelines:
        by_kind[t["kind"]].append(t)
    out: dict[str, dict[str, dict]] = {}
    for kind, rows in sorted(by_kind.items()):
        out[kind] = {}
        for step in ("serving", "leader", "ready", "write", "workers", "outage"):
            values = sorted(r[step] for r in rows if r[step] is not None)
            if values:
                out[kind][step] = {"n": len(values), "median_s": values[len(values) // 2],
                                   "p99_s": values[min(len(values) - 1, int(0.99 * len(values)))]}
    return out
