"""The chaos checkers on small hand-made histories, good and bad."""

from pathlib import Path

from chaos import checkers
from chaos.history import History, read


def task(node, job, attempt, index, event, time, code=None):
    return {"type": "task", "node": node, "job": job, "attempt": attempt, "index": index, "event": event,
            "time": time, "code": code}


def test_history_round_trips(tmp_path):
    h = History(tmp_path / "h.jsonl")
    h.write("op", id=h.next_id(), f="submit", key="r1", output="j1", invoke=1.0, complete=2.0, status="ok")
    h.write("fault", kind="kill-leader", targets=["m1"], start=3.0, end=3.1)
    h.close()
    assert [r["type"] for r in read(tmp_path / "h.jsonl")] == ["op", "fault"]


def test_lost_acknowledged_submissions():
    ops = [{"type": "op", "f": "submit", "status": s, "output": j} for s, j in
           (("ok", "j1"), ("ok", "j2"), ("unknown", "j3"), ("fail", None))]
    assert checkers.lost_acknowledged(ops, {"j1", "j3"}) == ["j2"]
    assert checkers.lost_acknowledged(ops, {"j1", "j2"}) == []


def test_duplicate_live_instances():
    seq = [task("a", "j", 1, 0, "start", 1), task("a", "j", 1, 0, "exit", 5, 0), task("b", "j", 1, 0, "start", 6)]
    assert checkers.duplicate_tasks(seq, end=10) == []
    dup = [task("a", "j", 1, 0, "start", 1), task("b", "j", 1, 0, "start", 3), task("a", "j", 1, 0, "exit", 5, 0)]
    assert len(checkers.duplicate_tasks(dup, end=10)) == 1
    same_node = [task("a", "j", 1, 0, "start", 1), task("a", "j", 1, 0, "start", 3)]  # two agents, one node
    assert len(checkers.duplicate_tasks(same_node, end=10)) == 1


def test_partial_gangs():
    base = [task("a", "j", 1, 0, "start", 0), task("b", "j", 1, 1, "start", 0)]
    prompt = base + [task("a", "j", 1, 0, "exit", 10, 1), task("b", "j", 1, 1, "exit", 12, -15)]
    assert checkers.partial_gangs(prompt, {("j", 1): 2}, end=100, allowance=5) == []
    slow = base + [task("a", "j", 1, 0, "exit", 10, 1), task("b", "j", 1, 1, "exit", 30, -15)]
    assert len(checkers.partial_gangs(slow, {("j", 1): 2}, end=100, allowance=5)) == 1
    success_at_different_times = base + [task("a", "j", 1, 0, "exit", 10, 0), task("b", "j", 1, 1, "exit", 30, 0)]
    assert checkers.partial_gangs(success_at_different_times, {("j", 1): 2}, end=100, allowance=5) == []
    never = [task("a", "j", 1, 0, "start", 0), task("a", "j", 1, 0, "exit", 20, 0)]
    assert len(checkers.partial_gangs(never, {("j", 1): 2}, end=100, allowance=5)) == 1


def test_converged():
    assert checkers.converged([{"applied": 5, "digest": "x"}, {"applied": 5, "digest": "x"}])
    assert not checkers.converged([{"applied": 5, "digest": "x"}, {"applied": 5, "digest": "y"}])
    assert not checkers.converged([{"applied": 5, "digest": "x"}, {"applied": 4, "digest": "x"}])
    assert not checkers.converged([{"applied": 5, "digest": ""}, {"applied": 5, "digest": ""}])


def test_log_conflicts_compares_the_range_every_journal_keeps(tmp_path):
    from pysyncobj.journal import createJournal

    def journal(name: str, entries: list[tuple[int, int, bytes]]) -> Path:
        d = tmp_path / name
        d.mkdir()
        j = createJournal(str(d / "raft.journal"))
        for idx, term, cmd in entries:
            j.add(cmd, idx, term)
        j._destroy()
        return d

    base = [(i, 1, b"\x00cmd%d" % i) for i in range(1, 6)]
    a = journal("a", base)
    b = journal("b", base[:4])  # shorter: a lagging replica, not a conflict
    c = journal("c", base[2:])  # compacted: keeps only 3..5
    assert checkers.log_conflicts([a, b, c]) == []
    d = journal("d", base[:3] + [(4, 2, b"\x00other")])  # a different entry at index 4
    assert checkers.log_conflicts([a, d]) == ["raft index 4: the replicas hold 2 different entries"]


def test_history_exactly_once_finds_missing_doubled_wrong_and_unknown_jobs():
    from tests.support.core import scenario

    final = scenario().jobs  # ok SUCCEEDED (1 run), bad FAILED (2 attempts, 2 runs), never CANCELLED (no run)
    good = [("ok", "SUCCEEDED", 1), ("bad", "FAILED", 2), ("never", "CANCELLED", 1)]
    runs = {"ok": 1, "bad": 2}
    assert checkers.history_exactly_once(final, good, runs) == []
    assert checkers.history_exactly_once(final, good[:2], runs) == ["never: finished CANCELLED, missing from the store"]
    assert checkers.history_exactly_once(final, good + [good[0]], runs) == ["ok: 2 rows"]
    assert checkers.history_exactly_once(final, [("ok", "FAILED", 1), *good[1:]], runs) == [
        "ok: stored as ('FAILED', 1), the cluster says (SUCCEEDED, 1)"]
    assert checkers.history_exactly_once(final, good, {"ok": 1, "bad": 1}) == [
        "bad: 1 run rows, the cluster kept 2 runs"]
    assert checkers.history_exactly_once(final, good + [("ghost", "FAILED", 1)], runs) == [
        "ghost: in the store, unknown to the cluster"]


def test_outage_timeline_from_the_masters_logs():
    from datetime import datetime

    def line(at, replica, logger, message):
        stamp = datetime.fromtimestamp(at).strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(at * 1000) % 1000:03d}"
        return f"{stamp} INFO synapse-master[{replica}] {logger}: {message}"

    t0 = 1_800_000_000.0
    log = "\n".join([
        line(t0 + 0.9, "m2", "synapse.master.replica", "leadership gained term=4 replica=m2"),
        line(t0 + 0.95, "m2", "synapse.master.leader", "leader ready term=4 nodes=2"),
        line(t0 + 1.2, "m2", "synapse.master.api.workers", "assignments watched node=w1 term=4"),
        line(t0 + 1.5, "m2", "synapse.master.api.workers", "assignments watched node=w2 term=4"),
        line(t0 + 1.7, "m2", "synapse.master.api.jobs", "job submitted job=x request=r tasks=1 user=u"),
        line(t0 + 3.0, "m1", "synapse.master.main", "master serving replica=m1 api=a raft=r http=- partners=p"),
        line(t0 + 9.0, "m1", "synapse.master.replica", "leadership gained term=5 replica=m1"),  # the next fault's
    ])
    marks = checkers.master_log_marks(log)
    assert [m for _, m, _ in marks] == ["leader", "ready", "watch", "watch", "serving", "leader"]
    ops = [{"f": "get", "status": "ok", "complete": t0 - 0.1}, {"f": "get", "status": "ok", "complete": t0 + 1.0},
           {"f": "submit", "status": "ok", "complete": t0 + 1.1}, {"f": "submit", "status": "ok", "complete": t0 + 1.3},
           {"f": "get", "status": "ok", "complete": t0 + 1.6}]
    faults = [{"kind": "kill-leader", "start": t0, "end": t0 + 1.5, "detail": {}},
              {"kind": "pause-leader", "start": t0 + 8.0, "end": t0 + 10.0, "detail": {}},
              {"kind": "kill-worker", "targets": ["w3"], "start": t0 + 0.5, "end": t0 + 2.0, "detail": {}},
              # the database's own lane: it does not end the master fault's window
              {"kind": "restart-database", "targets": ["postgresql"], "start": t0 + 0.2, "end": t0 + 4.0,
               "detail": {}}]
    [first, _, _, _] = checkers.outage_timelines(faults, ops, marks, ["w1", "w2", "w3"], workload_ended=t0 + 20)
    # The first election after the fault, its barrier, the first write after that, the workers'
    # streams on that leader (w3, down meanwhile, left out); the restarted master's start; not the
    # next fault's election.
    assert first == {"kind": "kill-leader", "start": t0, "serving": 3.0, "leader": 0.9, "ready": 0.95, "write": 1.1,
                     "workers": 1.5, "outage": 1.0}
    summary = checkers.timeline_summary([first])
    assert summary["kill-leader"]["ready"] == {"n": 1, "median_s": 0.95, "p99_s": 0.95}


def test_false_node_downs_are_those_no_worker_fault_explains():
    from datetime import datetime

    t0 = 1_800_000_000.0

    def down(at, node):
        stamp = datetime.fromtimestamp(at).strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(at * 1000) % 1000:03d}"
        return (f"{stamp} WARNING synapse-master[m1] synapse.master.leader: "
                f"node declared down node={node} term=3 reason=no heartbeat for 3.1s")

    faults = [{"kind": "kill-worker", "targets": ["w1"], "start": t0, "end": t0 + 1.5, "detail": {}},
              {"kind": "kill-leader", "targets": ["m2"], "start": t0 + 20, "end": t0 + 21, "detail": {}}]
    marks = checkers.master_log_marks("\n".join([
        down(t0 + 3.2, "w1"),   # its worker was killed: explained
        down(t0 + 22.0, "w2"),  # a leader's death took a live node down: false
        down(t0 + 30.0, "w1"),  # long after its worker came back: false
    ]))
    assert [m for _, m, _ in marks] == ["down"] * 3
    found = checkers.false_node_downs(faults, marks, timeout=3.0)
    assert len(found) == 2 and found[0].startswith("w2 at") and found[1].startswith("w1 at"), found
    assert checkers.false_node_downs(faults, marks[:1], timeout=3.0) == []


def test_gangs_under_fault_find_a_gang_not_restarted_partial_or_back_on_its_failed_node():
    from types import SimpleNamespace

    def fault(job, **detail):
        return {"kind": "kill-worker-under-gang", "targets": ["w1"], "start": 0, "end": 1,
                "detail": {"job": job, "node": "w1", "attempt": 1, "tasks": 2, "restarted": True, **detail}}

    final = {"ok": SimpleNamespace(placements={1: ("w1", "w2"), 2: ("w2", "w3")}),
             "back": SimpleNamespace(placements={1: ("w1", "w2"), 2: ("w2", "w3"), 3: ("w1", "w3")}),
             "half": SimpleNamespace(placements={1: ("w1", "w2"), 2: ("w3",)}),
             "slow": SimpleNamespace(placements={1: ("w1", "w2")})}
    faults = [fault("ok"), fault("back"), fault("half"), fault("slow", restarted=False), fault("gone"),
              {"kind": "kill-worker-under-gang", "targets": [], "start": 0, "end": 1,
               "detail": {"skipped": "the gang did not start"}},
              {"kind": "kill-worker", "targets": ["w1"], "start": 0, "end": 1, "detail": {}}]
    assert checkers.gangs_under_fault(faults, final) == [
        "back: attempt 3 placed on w1, which failed attempt 1", "half: attempt 2 placed 1 of 2 tasks",
        "gone: gone from the final state"]
    assert checkers.gangs_restarted(faults) == (4, 5)


def test_ranks_twice_finds_two_attempts_of_a_rank_alive_at_once():
    # The agent of w1 died at 2; its task of attempt 1 ran on until its restart at 9 killed it,
    # while attempt 2 ran the same rank on w3 from 6.
    overlap = [task("w1", "j", 1, 0, "start", 1), task("w3", "j", 2, 0, "start", 6),
               task("w1", "j", 1, 0, "exit", 9, -9)]
    assert checkers.ranks_twice(overlap, end=20) == [
        "rank j[0] alive twice: attempt 1 on w1 1.000-9.000 and attempt 2 on w3 6.000-20.000"]
    never_ended = [task("w1", "j", 1, 1, "start", 1), task("w3", "j", 2, 1, "start", 6),
                   task("w3", "j", 2, 1, "exit", 8, 0)]
    assert len(checkers.ranks_twice(never_ended, end=20)) == 1  # no end: alive until the run's end


def test_ranks_twice_passes_a_hand_over_and_counts_fenced_and_lost_as_ends():
    handed_over = [task("w1", "j", 1, 0, "start", 1), task("w1", "j", 1, 0, "exit", 5, 1),
                   task("w2", "j", 2, 0, "start", 6), task("w2", "j", 2, 0, "exit", 8, 0)]
    assert checkers.ranks_twice(handed_over, end=20) == []
    fenced = [task("w1", "j", 1, 0, "start", 1), task("w1", "j", 1, 0, "fenced", 4),
              task("w3", "j", 2, 0, "start", 6), task("w1", "j", 1, 0, "exit", 9, -9)]  # the agent, back late
    assert checkers.ranks_twice(fenced, end=20) == []
    assert checkers.duplicate_tasks(fenced, end=20) == []
    lost = [task("w1", "j", 1, 0, "start", 1), task("w1", "j", 1, 0, "lost", 2), task("w3", "j", 2, 0, "start", 6)]
    assert checkers.ranks_twice(lost, end=20) == []
    other_ranks = [task("w1", "j", 1, 0, "start", 1), task("w2", "j", 2, 1, "start", 2),
                   task("w3", "k", 2, 0, "start", 3)]
    assert checkers.ranks_twice(other_ranks, end=20) == []  # other indexes, other jobs
    one_attempt = [task("w1", "j", 1, 0, "start", 1), task("w2", "j", 1, 0, "start", 3)]
    assert checkers.ranks_twice(one_attempt, end=20) == []  # one attempt twice is duplicate_tasks'


def test_a_fenced_task_is_an_abnormal_end_of_its_gang():
    base = [task("a", "j", 1, 0, "start", 0), task("b", "j", 1, 1, "start", 0), task("a", "j", 1, 0, "fenced", 10)]
    assert checkers.partial_gangs(base + [task("b", "j", 1, 1, "exit", 13, -15)], {("j", 1): 2}, 100, 5) == []
    assert len(checkers.partial_gangs(base + [task("b", "j", 1, 1, "exit", 30, -15)], {("j", 1): 2}, 100, 5)) == 1


def test_old_attempts_alive_lists_the_agent_kills_that_saw_the_old_attempt():
    def fault(kind, **detail):
        return {"kind": kind, "targets": ["w1"], "start": 0, "end": 1,
                "detail": {"job": "j", "node": "w1", "attempt": 1, "tasks": 2, **detail}}

    faults = [fault("kill-agent-under-gang", old_alive=["j.1.0 on w1 (pid 7)"]),
              fault("kill-agent-under-gang", old_alive=[]),
              fault("kill-worker-under-gang"),
              {"kind": "kill-agent-under-gang", "targets": [], "start": 0, "end": 1,
               "detail": {"skipped": "the gang did not start"}}]
    assert checkers.old_attempts_alive(faults) == ["j attempt 1 (agent of w1 killed): j.1.0 on w1 (pid 7)"]
    assert checkers.gangs_restarted(faults) == (0, 3)  # both gang faults count


def test_false_fencings_are_fenced_tasks_no_machine_fault_on_their_node_explains():
    faults = [{"kind": "kill-agent-under-gang", "targets": ["w1"], "start": 10, "end": 30, "detail": {}},
              {"kind": "partition-leader", "targets": ["m1"], "start": 50, "end": 53, "detail": {}}]
    records = [task("w1", "g", 1, 0, "fenced", 12),  # its agent was killed: the fence did its job
               task("w1", "j", 1, 0, "fenced", 51),  # a master fault let the lease run out
               task("w2", "k", 1, 0, "fenced", 12),  # another node's, during w1's fault
               task("w2", "k", 1, 1, "exit", 13, -9),  # its sibling, stopped
               {**task("w2", "m", 1, 0, "exit", 52), "reason": "NodeLost", "fenced": True},  # its agent, for its lease
               {**task("w2", "n", 1, 0, "exit", 52), "reason": "NodeLost"},  # its machine restarted: not the lease
               {**task("w2", "m", 2, 0, "exit", 60, 1), "reason": "Error"}]
    assert checkers.false_fencings(records, faults, timeout=3.0) == [
        "k.1.0 on w2 at 12.000 (fenced)", "j.1.0 on w1 at 51.000 (fenced)", "m.1.0 on w2 at 52.000 (exit)"]
    assert checkers.false_fencings(records[:1], faults, timeout=3.0) == []
