"""The linearizability checker, proved on known histories before it is trusted on ours."""

import random

from chaos.linearizability import JOBS, REGISTER, Op, check


def op(i, f, inp, out, invoke, complete, status="ok", key="x"):
    return Op(i, f, key, inp, out, invoke, complete, status)


def test_sequential_register_history_is_linearizable():
    h = [op(0, "write", 1, None, 0, 1), op(1, "read", None, 1, 2, 3), op(2, "cas", (1, 2), True, 4, 5),
         op(3, "read", None, 2, 6, 7)]
    assert check(REGISTER, h) == "ok"


def test_stale_read_after_a_completed_write_is_a_violation():
    h = [op(0, "write", 1, None, 0, 1), op(1, "read", None, None, 2, 3)]
    assert check(REGISTER, h) == "violation"


def test_concurrent_operations_may_take_either_order():
    # The write overlaps both reads: one read sees the old value, the other the new one.
    h = [op(0, "write", 1, None, 0, 10), op(1, "read", None, None, 1, 2), op(2, "read", None, 1, 3, 4)]
    assert check(REGISTER, h) == "ok"


def test_reads_going_back_in_time_are_a_violation():
    # New value seen, then (strictly later) the old one again, while the write was still in flight.
    h = [op(0, "write", 1, None, 0, 10), op(1, "read", None, 1, 1, 2), op(2, "read", None, None, 3, 4)]
    assert check(REGISTER, h) == "violation"


def test_timed_out_write_may_or_may_not_have_happened():
    seen = [op(0, "write", 1, None, 0, None, "unknown"), op(1, "read", None, 1, 5, 6)]
    unseen = [op(0, "write", 1, None, 0, None, "unknown"), op(1, "read", None, None, 5, 6)]
    assert check(REGISTER, seen) == "ok" and check(REGISTER, unseen) == "ok"
    # ... but not before it was invoked.
    early = [op(0, "read", None, 1, 0, 1), op(1, "write", 1, None, 2, None, "unknown")]
    assert check(REGISTER, early) == "violation"


def test_failed_write_never_happened():
    h = [op(0, "write", 1, None, 0, 1, "fail"), op(1, "read", None, 1, 2, 3)]
    assert check(REGISTER, h) == "violation"


def test_cas_outcomes_must_match_the_state():
    h = [op(0, "write", 1, None, 0, 1), op(1, "cas", (2, 3), True, 2, 3)]
    assert check(REGISTER, h) == "violation"


def test_keys_are_independent():
    h = [op(0, "write", 1, None, 0, 1, key="a"), op(1, "read", None, None, 2, 3, key="b"),
         op(2, "read", None, 1, 2, 3, key="a")]
    assert check(REGISTER, h) == "ok"


def test_random_concurrent_histories_from_a_real_register_are_linearizable():
    """Histories produced by executing operations atomically at a random instant inside their
    windows are linearizable by construction; the checker must say so."""
    rng = random.Random(11)
    for _ in range(40):
        value, ops, events = None, [], []
        for i in range(12):
            invoke = rng.uniform(0, 10)
            complete = invoke + rng.uniform(0.1, 3)
            events.append((rng.uniform(invoke, complete), i, invoke, complete))
        for _at, i, invoke, complete in sorted(events):
            f = rng.choice(["read", "write", "cas"])
            if f == "read":
                ops.append(op(i, "read", None, value, invoke, complete))
            elif f == "write":
                v = rng.randint(0, 3)
                value = v
                ops.append(op(i, "write", v, None, invoke, complete))
            else:
                old, new = rng.randint(0, 3), rng.randint(0, 3)
                ok = value == old
                if ok:
                    value = new
                ops.append(op(i, "cas", (old, new), ok, invoke, complete, "ok" if rng.random() > 0.2 else "unknown"))
        assert check(REGISTER, ops) == "ok"


def test_budget_exhaustion_says_unknown_not_a_guess():
    rng = random.Random(5)
    ops = [op(i, "write", rng.randint(0, 50), None, 0, 100) for i in range(40)]
    ops.append(op(99, "read", None, 999, 101, 102))  # impossible value: forces the full search
    assert check(REGISTER, ops, budget_s=0.05) == "unknown"  # 40 concurrent writes: too many to settle
    few = ops[:12]
    assert check(REGISTER, few + [op(99, "read", None, few[5].input, 101, 102)], budget_s=10) == "ok"
    assert check(REGISTER, few + [op(99, "read", None, 999, 101, 102)], budget_s=10) == "violation"


def test_job_model_catches_a_lost_acknowledged_submission_and_a_duplicate():
    ok = [op(0, "submit", None, "job-1", 0, 1, key="r1"), op(1, "submit", None, "job-1", 2, 3, key="r1"),
          op(2, "get", "job-1", True, 4, 5, key="r1")]
    assert check(JOBS, ok) == "ok"
    lost = [op(0, "submit", None, "job-1", 0, 1, key="r1"), op(1, "get", "job-1", False, 2, 3, key="r1")]
    assert check(JOBS, lost) == "violation"
    twice = [op(0, "submit", None, "job-1", 0, 1, key="r1"), op(1, "submit", None, "job-2", 2, 3, key="r1")]
    assert check(JOBS, twice) == "violation"
    maybe = [op(0, "submit", None, None, 0, None, "unknown", key="r1"), op(1, "get", "job-1", False, 2, 3, key="r1")]
    assert check(JOBS, maybe) == "ok"
