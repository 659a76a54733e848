"""The dashboard's parts that need no server: sign-in sessions on an injected clock, and the heatmap's
gang colours (the pages over HTTPS are in tests/cluster/test_dashboard.py)."""

from __future__ import annotations

from synapse.master.dashboard import PALETTE, NodeMark, gang_classes, heatmap
from synapse.master.dashboard_sessions import Sessions
from tests.support.dashboard import Clock, Page


def test_a_session_holds_its_token_until_it_expires_or_is_closed():
    clock = Clock()
    sessions = Sessions(ttl_s=60, clock=clock)
    first, second = sessions.open("tok-a"), sessions.open("tok-b")
    assert first != second and len(first) >= 43 and "tok" not in first
    assert sessions.token(first) == "tok-a" and sessions.token(second) == "tok-b"
    assert sessions.token("") == sessions.token("made-up") == ""
    clock.now += 59.9
    assert sessions.token(first) == "tok-a"
    sessions.close(second)
    assert sessions.token(second) == ""
    clock.now += 0.1  # exactly its expiry: refused, and forgotten
    assert sessions.token(first) == "" and len(sessions) == 0


def test_sessions_past_the_limit_drop_the_expired_then_the_oldest():
    clock = Clock()
    sessions = Sessions(ttl_s=10, clock=clock, limit=3)
    old = sessions.open("old")
    clock.now += 10
    a, b, c = (sessions.open(t) for t in "abc")  # `old` expired: dropped first
    assert len(sessions) == 3 and sessions.token(old) == ""
    d = sessions.open("d")
    assert [sessions.token(x) for x in (a, b, c, d)] == ["", "b", "c", "d"]


def test_the_heatmap_colours_gangs_marks_kept_nodes_and_escapes_ids():
    """Job ids cannot hold '<' through the API (names are checked), but the page must not trust that."""
    evil, waiting = "<script>alert(1)</script>-1", 'big"><img src=x onerror=alert(1)>'
    nodes = [{"id": "w1", "rack": "r0", "status": "READY", "schedulable": True, "gpus": 4, "used": 3,
              "owner": {0: (evil, 0), 1: (evil, 1), 2: ("other-2", 0)}, "address": ""},
             {"id": "w2", "rack": "r1", "status": "READY", "schedulable": True, "gpus": 2, "used": 0, "owner": {},
              "address": ""}]
    colours = gang_classes([evil, "other-2"])
    html = heatmap(nodes, colours, {"w2": [NodeMark(waiting, "reserved by the scheduler")]}, "a follower's note")
    assert "<script>" not in html and "<img" not in html
    page = Page(html)
    assert page.scripts == 0
    by_gpu = {(c["data-node"], c["data-gpu"]): c for c in page.gpu_cells}
    assert by_gpu["w1", "0"]["title"] == f"w1 GPU 0: job {evil} task 0"  # unescaped by the parser: exact
    assert by_gpu["w1", "1"]["class"].split() == ["gpu", "used", colours[evil]]
    assert by_gpu["w1", "2"]["class"].split() == ["gpu", "used", colours["other-2"]] != ["gpu", "used", colours[evil]]
    assert by_gpu["w1", "3"]["class"].split() == ["gpu", "free"]
    assert by_gpu["w2", "0"]["class"].split() == ["gpu", "free", "reserved"]
    assert by_gpu["w2", "0"]["title"] == f"w2 GPU 0: free; kept for job {waiting}: reserved by the scheduler"
    kept = [r for r in page.rows if "reserved" in r["class"].split()]
    assert [r["cells"][0] for r in kept] == ["w2"] and kept[0]["cells"][-1] == f"for {waiting}"
    assert "a follower&#x27;s note" in html
    assert f'<span class="swatch {colours[evil]}"' in html  # the legend


def test_gang_colours_are_stable_and_distinct_while_the_palette_lasts():
    ids = [f"job-{i}" for i in range(3 * len(PALETTE))]
    own = {j: gang_classes([j])[j] for j in ids}  # a gang alone: its hash slot, on every replica and load
    assert own == {j: gang_classes([j])[j] for j in ids} and set(own.values()) == {f"g{i}" for i in range(len(PALETTE))}
    assert len(set(gang_classes(ids[:len(PALETTE)]).values())) == len(PALETTE)  # no two alike
    assert set(gang_classes(ids).values()) == set(own.values())  # past the palette, colours repeat
    older, younger = next((a, b) for a in ids for b in ids if a != b and own[a] == own[b])
    both = gang_classes([older, younger])
    assert both[older] == own[older] and both[younger] != own[younger]  # the younger gives way
