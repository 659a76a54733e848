"""The nemesis' judgements that need no cluster: a steady leader over a window, a heal, and the refusal to
isolate on a loopback cluster (each fault on a real cluster is in tests/cluster/test_nemesis.py)."""

from __future__ import annotations

import time

import pytest

from chaos.nemesis import Target, judge_heal


def test_wait_steady_leader_wants_one_leader_and_term_for_the_whole_window():
    t = Target.__new__(Target)  # only leader() and term() are used
    polls = {"n": 0}

    def leader():
        polls["n"] += 1
        return {"id": "m1" if polls["n"] % 2 else "m2"} if polls["n"] < 6 else {"id": "m3"}

    t.leader, t.term = leader, lambda m: 7
    started = time.monotonic()
    assert t.wait_steady_leader(0.4, timeout=5)
    assert polls["n"] >= 9 and time.monotonic() - started >= 0.4 + 0.5  # flapping, then 0.4 s of m3
    t.leader = lambda: None  # no leader at all: never steady
    assert not t.wait_steady_leader(0.2, timeout=0.6)
    t.leader, t.term = (lambda: {"id": "m1"}), (lambda m: polls.__setitem__("n", polls["n"] + 1) or polls["n"])
    assert not t.wait_steady_leader(0.2, timeout=0.6)  # one replica, but a new term at every poll


@pytest.mark.parametrize("at_cut, at_heal, at_end, victim_term, expected", [
    # a steady leader the heal leaves alone, and one it deposes (another replica, or a new term)
    (("m1", 5), ("m1", 5), ("m1", 5), 5, {}),
    (("m1", 5), ("m1", 5), ("m2", 6), 5, {"leader_changed": True}),
    (("m1", 5), ("m1", 5), ("m1", 7), 5, {"leader_changed": True}),
    (("m1", 5), ("m1", 5), None, 5, {"leader_changed": True}),
    # the leader did not hold through the cut: the heal is not judged
    (("m1", 5), ("m2", 6), ("m3", 7), 6, {"changed_during_cut": True}),
    (("m1", 5), ("m1", 6), ("m2", 7), 6, {"changed_during_cut": True}),
    (("m1", 5), None, ("m2", 7), 5, {"no_leader_at_heal": True}),
    # a term that could not be read (-1) is no evidence of a change
    (("m1", -1), ("m1", 5), ("m1", -1), 5, {}),
    # cut off, the follower ran elections of its own: PreVote failed, whatever the leader did
    (("m1", 5), ("m1", 5), ("m1", 5), 8, {"victim_term_rose": True}),
    (("m1", 5), ("m2", 6), ("m2", 6), 9, {"victim_term_rose": True, "changed_during_cut": True}),
    (("m1", -1), None, None, 9, {"no_leader_at_heal": True}),
])
def test_judge_heal(at_cut, at_heal, at_end, victim_term, expected):
    base = {"victim_term_rose": False, "changed_during_cut": False, "no_leader_at_heal": False,
            "leader_changed": False}
    assert judge_heal(at_cut, at_heal, at_end, victim_term) == {**base, **expected}


def test_isolate_on_a_loopback_cluster_says_how_to_get_one_it_can_cut(tmp_path):
    import json

    from click.testing import CliRunner

    from synapse.local.main import main as synapse_local

    (tmp_path / "cluster.json").write_text(json.dumps({"masters": [], "workers": [], "token": "t"}))
    result = CliRunner().invoke(synapse_local, ["isolate", "--data-dir", str(tmp_path), "m1"])
    assert result.exit_code != 0 and "up --netns" in result.output
