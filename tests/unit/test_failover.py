"""The one leader-following policy, for calls and streams alike, against scripted replicas (no sockets)."""

from __future__ import annotations

import threading

import grpc
import pytest

from synapse.client.master_client import AuthError, ClientError, ClusterUnavailable, MasterClient
from synapse.common.auth import LEADER_METADATA_KEY

OK = grpc.StatusCode.OK
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED


class Refusal(grpc.RpcError):
    """A replica's error as the gRPC runtime raises it: a code, details, maybe a leader hint."""

    def __init__(self, code: grpc.StatusCode, details: str = "", leader: str = "") -> None:
        self._code, self._details = code, details
        self._trailing = ((LEADER_METADATA_KEY, leader),) if leader else ()

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self):
        return self._trailing


class Stream:
    """A server stream that yields its messages, then ends or breaks with `error` (a refused
    stream too fails only once read, as gRPC's do)."""

    def __init__(self, messages: list, error: Refusal | None) -> None:
        self.messages, self.error, self.cancelled = messages, error, False

    def __iter__(self):
        yield from self.messages
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        self.cancelled = True


class Replicas:
    """Scripted answers by address: each try takes the next; the last one repeats."""

    def __init__(self, script: dict[str, list]) -> None:
        self.script = script
        self.tries: list[tuple[str, object]] = []  #: (address, request) of every try, in order
        self.budgets: list[tuple[str, float]] = []  #: (address, timeout) of every try, in order

    def stub(self, address: str):
        replicas = self

        class Stub:
            def __getattr__(self, method):
                def invoke(request, timeout=None, metadata=()):
                    replicas.tries.append((address, request))
                    replicas.budgets.append((address, timeout))
                    answers = replicas.script[address]
                    answer = answers.pop(0) if len(answers) > 1 else answers[0]
                    if isinstance(answer, Refusal):
                        raise answer
                    return answer
                return invoke

        return Stub()


def client(script: dict[str, list], **kw) -> tuple[MasterClient, Replicas]:
    replicas = Replicas(script)
    c = MasterClient(list(script), deadline=kw.pop("deadline", 5.0), backoff=(0.001, 0.002), **kw)
    c.stub = replicas.stub  # type: ignore[method-assign]
    return c, replicas


def test_a_call_follows_the_redirect_then_goes_straight_to_the_leader():
    c, replicas = client({"a": [Refusal(FAILED_PRECONDITION, "not the leader", leader="c")], "b": ["b"],
                          "c": ["from c"]})
    assert c.call("GetJob", "req") == "from c" and c.leader == "c"
    assert c.call("GetJob", "req") == "from c"
    assert [a for a, _ in replicas.tries] == ["a", "c", "c"]


def test_a_redirect_to_an_unlisted_leader_adds_it():
    c, replicas = client({"a": [Refusal(FAILED_PRECONDITION, "not the leader", leader="d")], "d": ["from d"]})
    assert c.call("GetJob", "req") == "from d" and c.addresses == ["a", "d"] and c.leader == "d"


def test_down_replicas_pass_the_same_request_on_and_a_leader_that_failed_is_forgotten():
    c, replicas = client({"a": [Refusal(UNAVAILABLE, "down"), "late"], "b": [Refusal(UNAVAILABLE, "no leader")],
                          "c": ["from c"]})
    c.leader = "b"
    request = object()
    assert c.call("SubmitJob", request) == "from c" and c.leader == "c"
    assert replicas.tries == [("b", request), ("a", request), ("c", request)]  # one request id throughout


def test_what_retrying_cannot_mend_is_raised_at_once():
    c, replicas = client({"a": [Refusal(grpc.StatusCode.UNAUTHENTICATED, "unknown token")], "b": ["b"]})
    with pytest.raises(AuthError, match="a: unknown token"):
        c.call("GetJob", "req")
    c, replicas = client({"a": [Refusal(FAILED_PRECONDITION, "job already ended")], "b": ["b"]})
    with pytest.raises(ClientError) as err:
        c.call("CancelJob", "req")
    assert err.value.code == FAILED_PRECONDITION and [a for a, _ in replicas.tries] == ["a"]


def test_a_per_replica_read_stays_on_its_replica_and_follows_no_redirect():
    c, replicas = client({"a": ["a"], "b": [Refusal(FAILED_PRECONDITION, "not the leader", leader="a")]})
    with pytest.raises(ClientError):
        c.call("ReplicaStatus", "req", to="b")
    assert [a for a, _ in replicas.tries] == ["b"] and c.leader is None


def test_no_answer_within_the_deadline_names_the_last_error():
    c, replicas = client({"a": [Refusal(UNAVAILABLE, "down")], "b": [Refusal(UNAVAILABLE, "no leader")]},
                         deadline=0.05)
    with pytest.raises(ClusterUnavailable, match="last: b: UNAVAILABLE: no leader"):
        c.call("GetJob", "req")
    assert len(replicas.tries) > 2  # rounds after a pause, not a single pass


def test_a_stream_reconnects_across_a_leader_change_and_resumes():
    c, replicas = client({
        "a": [Stream(["m1", "m2"], Refusal(UNAVAILABLE, "a stopped")), Stream([], Refusal(UNAVAILABLE, "down"))],
        "b": [Stream([], Refusal(FAILED_PRECONDITION, "not the leader", leader="c"))],
        "c": [Stream(["m3"], Refusal(FAILED_PRECONDITION, "c stopped leading")), Stream(["m4"], None)]})
    requests = iter(range(100))
    assert list(c.watch("WatchAssignments", lambda: next(requests))) == ["m1", "m2", "m3", "m4"]
    # After c stopped leading the others are tried: a is down, and b's hint naming c again is stale
    # in that round (c just failed); after a pause the next round follows it. Every (re)connection
    # builds its request afresh.
    assert replicas.tries == [("a", 0), ("b", 1), ("c", 2), ("a", 3), ("b", 4), ("a", 5), ("b", 6), ("c", 7)]
    assert c.leader == "c"


def test_a_stream_any_replica_serves_leaves_the_leader_alone():
    c, replicas = client({"a": [Stream([], Refusal(UNAVAILABLE, "down"))], "b": [Stream(["e1"], None)],
                          "c": [Stream(["never"], None)]})
    c.leader = "c"
    assert list(c.watch("WatchEvents", lambda: "req", leader=False)) == ["e1"]
    assert [a for a, _ in replicas.tries] == ["a", "b"] and c.leader == "c"


def test_a_stream_is_refused_like_a_call_or_gives_up_at_its_deadline_or_stop():
    c, _ = client({"a": [Stream([], Refusal(grpc.StatusCode.OUT_OF_RANGE, "cursor too old"))]})
    with pytest.raises(ClientError) as err:
        list(c.watch("WatchEvents", lambda: "req", leader=False))
    assert err.value.code == grpc.StatusCode.OUT_OF_RANGE
    c, _ = client({"a": [Stream([], Refusal(UNAVAILABLE, "down"))]})
    with pytest.raises(ClusterUnavailable):
        list(c.watch("WatchEvents", lambda: "req", deadline=0.05))
    stop = threading.Event()
    stop.set()
    assert list(c.watch("WatchAssignments", lambda: "req", stop=stop)) == []


def test_leaving_a_stream_cancels_it():
    stream = Stream(["m1", "m2"], None)
    c, _ = client({"a": [stream]})
    for _message in c.watch("WatchAssignments", lambda: "req"):
        break
    assert stream.cancelled


def test_a_call_in_a_given_order_goes_to_the_first_that_answers_and_leaves_the_leader_alone():
    c, replicas = client({"a": ["from a"], "b": [Refusal(UNAVAILABLE, "down"), "from b"], "c": ["from c"]})
    c.leader = "a"
    order = ["b", "c", "a"]  # a worker's link shard first (synapse.core.shards), the leader last
    assert c.call("Heartbeat", "req", order=lambda: order) == "from c"
    assert c.call("Heartbeat", "req", order=lambda: order) == "from b"
    assert [a for a, _ in replicas.tries] == ["b", "c", "b"] and c.leader == "a" and c.answered == "b"


def test_a_call_in_a_given_order_follows_a_redirect_from_an_older_replica():
    c, replicas = client({"a": ["from the leader"], "b": [Refusal(FAILED_PRECONDITION, "not the leader", leader="a")]})
    assert c.call("Heartbeat", "req", order=lambda: ["b", "a"]) == "from the leader"
    assert [a for a, _ in replicas.tries] == ["b", "a"]


def test_a_stream_that_delivered_reopens_after_a_jittered_pause(monkeypatch):
    pauses: list[float] = []
    monkeypatch.setattr("synapse.client.master_client.random.uniform", lambda low, high: high / 2)
    stop = threading.Event()
    stop.wait = lambda timeout=None: pauses.append(timeout) or False  # type: ignore[method-assign]
    c, replicas = client({"a": [Stream(["m1"], Refusal(UNAVAILABLE, "a died")),
                                Stream([], Refusal(UNAVAILABLE, "down"))],
                          "b": [Stream([], Refusal(UNAVAILABLE, "b not yet")), Stream(["m2"], None)]})
    messages = list(c.watch("WatchAssignments", lambda: "req", stop=stop, order=lambda: ["a", "b"], jitter=4.0))
    assert messages == ["m1", "m2"]
    # a pause (half the jitter here) before reopening after the break; then only the short pause
    # after a whole round failed
    assert pauses[0] == 2.0 and pauses[1] < 0.01 and len(pauses) == 2
    assert [a for a, _ in replicas.tries] == ["a", "b", "a", "b"]


def test_a_replica_that_let_a_try_run_out_is_tried_last_and_briefly_until_it_answers():
    """Chaos pause-leader: every round began with the paused leader and spent a whole try on it."""
    c, replicas = client({"a": [Refusal(DEADLINE_EXCEEDED, "stalled")], "b": [Refusal(UNAVAILABLE, "no leader"), "b"],
                          "c": [Refusal(UNAVAILABLE, "no leader")]})
    c.leader = "a"
    assert c.call("SubmitJob", "req") == "b"
    # The stalled leader's first try had the full budget; in the next round it came last, briefly.
    assert replicas.budgets == [("a", 1.0), ("b", 1.0), ("c", 1.0), ("b", 1.0)]
    assert c.suspected() == {"a"}
    replicas.script["b"] = [Refusal(UNAVAILABLE, "no leader")]
    replicas.budgets.clear()
    with pytest.raises(ClusterUnavailable):
        c.call("SubmitJob", "req", deadline=2.5)
    # Within one call the suspect's budget doubles (a live but slow leader still gets its full try).
    budgets = [t for a, t in replicas.budgets if a == "a"]
    assert [a for a, _ in replicas.budgets[:3]] == ["b", "c", "a"]
    assert budgets[:3] == [0.25, 0.5, 1.0] and all(t <= 1.0 for t in budgets), replicas.budgets
    replicas.script["a"] = ["a"]
    assert c.call("GetJob", "req") == "a" and c.suspected() == set()


def test_a_listing_keeps_its_long_try_on_a_suspect():
    c, replicas = client({"a": ["a"], "b": ["b"]})
    c.suspects["a"] = float("inf")
    assert c.call("ListJobs", "req", try_timeout=10.0, to="a", deadline=20.0) == "a"
    assert replicas.budgets == [("a", 10.0)]
