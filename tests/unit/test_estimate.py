"""Estimated starts: the last round's plan walked forward (synapse.core.schedule.estimate), in the
pure core, through the leader's brain as the simulator drives it."""

import dataclasses

from synapse.core import commands as c
from synapse.core.model import Placement, Plan
from synapse.core.schedule.estimate import DEPTH, estimate_starts
from synapse.sim.engine import Simulator, uniform_cluster
from tests.support.helpers import spec


def sim(racks=1, nodes_per_rack=4):
    s = Simulator()
    s.now = 1000.0  # a task's start of 0 would read as "not started"
    for cmd in uniform_cluster(racks_per_block=racks, nodes_per_rack=nodes_per_rack):
        assert s.apply(cmd).ok
    return s


def run_on(s, nodes, *, time_limit=0.0, duration=1e6, name="job", user=""):
    """Submit a one-task-per-node, whole-node gang and start it on `nodes` now."""
    job_id = f"{name}-{len(s.state.jobs)}"
    assert s.apply(c.SubmitJob(at=s.now, job_id=job_id, request_id=job_id, by=user,
                               spec=spec(tasks=len(nodes), time_limit=time_limit, name=name))).ok
    s._runtime[job_id] = (duration, 0)
    s.commit(Plan(job_id, 1, tuple(Placement(i, n, tuple(range(8)), i) for i, n in enumerate(nodes))))
    return job_id


def estimates(s):
    return s.leader.estimates(s.state, s.now)


def test_a_blocked_gang_behind_a_running_job_gets_its_predicted_end():
    s = sim()
    running = run_on(s, ["r0-n0", "r0-n1", "r0-n2"], time_limit=3600)
    s.now = 1100.0
    gang = s.submit(spec(tasks=2, time_limit=1800, name="gang"), duration=60)
    s.schedule()
    est = estimates(s)[gang]
    assert est.basis == "reservation" and est.at == 4600.0  # the running job's end by its limit (no runs known)
    assert est.ahead == ((running, 4600.0),)
    assert "holds a reservation of 2 node(s)" in est.detail and running in est.detail


def test_the_predictor_sets_the_end_and_jobs_behind_wait_for_those_ahead():
    s = sim()
    # alice's `train` ran 600 s once: the next one is predicted to run 600 s, not its 4 h limit
    first = run_on(s, ["r0-n0", "r0-n1", "r0-n2", "r0-n3"], time_limit=14_400, duration=600, name="train",
                   user="alice")
    s.advance(1600.0)
    assert s.state.jobs[first].status.terminal
    running = run_on(s, ["r0-n0", "r0-n1", "r0-n2", "r0-n3"], time_limit=14_400, duration=600, name="train",
                     user="alice")
    s.now = 1700.0
    head = s.submit(spec(tasks=4, time_limit=3600, name="head"), duration=60)   # a reservation: at 2200
    second = s.submit(spec(tasks=4, time_limit=3600, name="second"), duration=60)  # the second reservation
    third = s.submit(spec(tasks=2, time_limit=3600, name="third"), duration=60)  # behind both
    s.schedule()
    est = estimates(s)
    assert est[head].at == 2200.0 and est[head].ahead == ((running, 2200.0),)
    # no runs of head's kind: it is expected to hold its nodes until its limit, 2200 + 3600
    assert est[second].basis == "reservation" and est[second].at == 5800.0
    assert est[second].ahead == ((head, 5800.0), (running, 2200.0))  # the nodes head takes, and then gives back
    assert est[third].basis == "queue" and est[third].at == 5800.0 + 3600.0
    assert est[third].ahead[0] == (second, 9400.0)
    assert list(est) == [head, second, third]


def test_a_job_that_can_never_fit_is_unknown_with_the_reason():
    s = sim()
    huge = s.submit(spec(tasks=5, name="huge"), duration=60)  # 5 whole nodes on a 4-node cluster
    s.schedule()
    est = estimates(s)[huge]
    assert est.at is None and est.basis == "unknown" and est.why == "can never fit"
    assert "can never fit" in est.detail


def test_a_dependency_not_met_is_unknown_and_the_walk_goes_on_behind_it():
    s = sim()
    upstream = run_on(s, ["r0-n0", "r0-n1", "r0-n2", "r0-n3"], time_limit=600)
    after = dataclasses.replace(spec(tasks=1, name="after"), after=(("ok", upstream),))
    assert s.apply(c.submit_kind(after)(at=s.now, job_id="after", request_id="after", spec=after)).ok
    s._runtime["after"] = (60, 0)
    behind = s.submit(spec(tasks=1, time_limit=60, name="behind"), duration=60)
    s.schedule()
    est = estimates(s)
    assert est["after"].at is None and est["after"].why == "dependency not met"
    assert est[behind].at == 1600.0


def test_jobs_of_unknown_length_ahead_leave_it_unknown():
    s = sim()
    run_on(s, ["r0-n0", "r0-n1", "r0-n2", "r0-n3"])  # no time limit, no user: no predicted end
    head = s.submit(spec(tasks=1, name="head"), duration=60)
    s.schedule()
    est = estimates(s)[head]
    assert est.at is None and est.why == "no predicted end on its nodes"


def test_the_walk_stops_at_its_depth_and_at_the_job_asked_for():
    s = sim()
    run_on(s, ["r0-n0", "r0-n1", "r0-n2", "r0-n3"], time_limit=600)
    jobs = [s.submit(spec(tasks=1, time_limit=60, name=f"j{i}"), duration=60) for i in range(5)]
    s.schedule()
    waiting = s.leader.waiting()
    found = estimate_starts(s.state, s.now, waiting, s.leader.reservations(), depth=3)
    assert [found[j].at is not None for j in jobs] == [True, True, True, False, False]
    assert found[jobs[3]].why == "beyond the first 3 waiting"
    assert list(estimate_starts(s.state, s.now, waiting, s.leader.reservations(), until={jobs[1], jobs[0]})) == jobs[:2]
    assert DEPTH >= 100


def test_estimates_are_worked_out_once_a_round():
    s = sim()
    run_on(s, ["r0-n0", "r0-n1", "r0-n2", "r0-n3"], time_limit=600)
    job = s.submit(spec(tasks=1, time_limit=60), duration=60)
    s.schedule()
    first = estimates(s)
    assert estimates(s) is first
    s.schedule()
    assert estimates(s) is not first and estimates(s)[job] == first[job]


class _Forgetful(dict):
    """A scans table that keeps nothing: every job's scan starts afresh."""

    def __setitem__(self, key, value):
        pass


def test_a_scan_that_goes_on_from_the_last_of_its_shape_finds_what_a_fresh_one_does(monkeypatch):
    import random

    from synapse.core.schedule import estimate

    rng = random.Random(7)
    s = sim(racks=4, nodes_per_rack=4)
    nodes = sorted(s.state.nodes)
    for i in range(0, 16, 2):  # pairs of nodes busy until various times
        run_on(s, nodes[i:i + 2], time_limit=rng.choice([600, 1200, 3600, 7200]), name=f"fill{i}")
    s.now = 1100.0
    for i in range(30):
        s.submit(spec(tasks=rng.choice([1, 2, 4]), gpu=rng.choice([4, 8]), time_limit=rng.choice([300, 900, 1800]),
                      name=f"w{i}", pack=rng.choice(["", "rack"]), required=rng.random() < 0.3), duration=60)
    s.schedule()
    args = (s.state, s.now, s.leader.waiting(), s.leader.reservations())
    kept = estimate_starts(*args)
    original = estimate._Walk.__init__

    def forgetful(self, *a, **kw):
        original(self, *a, **kw)
        self.scans = _Forgetful()

    monkeypatch.setattr(estimate._Walk, "__init__", forgetful)
    assert estimate_starts(*args) == kept
    assert sum(1 for e in kept.values() if e.at is not None) >= 20


def test_the_domain_a_scan_picks_does_not_follow_the_order_its_nodes_were_counted_in() -> None:
    """The nodes are counted in the order of sets of node ids, which string hashing changes from one
    process to the next: a replay's estimates differed with PYTHONHASHSEED until the pick was by name."""
    from synapse.core.schedule.estimate import _Scan

    def scan(order: list[tuple[str, ...]]) -> _Scan:
        s = _Scan(need=(1, 1, 1), n=2, run=60.0, domain_of={}, base={}, claims={}, at=0.0, seen=0)
        for d in order:
            s.room[d] = 2
        return s

    domains = [("z", "r2"), ("z", "r1"), ("z", "r3")]
    assert {scan(order).fits_in(list(scan(order).room)) for order in (domains, domains[::-1])} == {("z", "r1")}
    assert scan(domains).fits_in([("z", "r9")]) is None
