"""Heartbeats by datagram over real sockets: the worker takes only the authentic answer to the
heartbeat it sent and falls back to calls; on a real cluster the workers' heartbeats go by datagram,
and each replica answers only authentic, fresh ones (the wire format alone: tests/unit/test_beats.py)."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from synapse.common import beats
from synapse.master.beats import RCVBUF_BYTES, beat_socket
from synapse.proto import api_pb2
from synapse.worker.beats import MISSES, QUIET_FIRST_S, QUIET_S, DatagramBeats, DatagramReports
from tests.support.cluster import submit, wait_job
from tests.support.helpers import wait_for
from tests.support.http import scrape, value

KEY = beats.key_of("credential-of-n1")


class _Replica:
    """A UDP socket that answers heartbeat datagrams as `answer(request)` says (None: silence)."""

    def __init__(self, answer) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.answer = answer
        self.received = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                data, source = self.sock.recvfrom(beats.MAX_BYTES)
            except TimeoutError:
                continue
            assert beats.authentic(KEY, beats.REQUEST, data)
            self.received += 1
            request = api_pb2.HeartbeatRequest.FromString(beats.body_of(data))
            for reply in self.answer(request):
                self.sock.sendto(reply, source)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


def _reply(seq: int, key: bytes = KEY, **fields) -> bytes:
    return beats.seal(key, beats.REPLY, api_pb2.HeartbeatReply(seq=seq, **fields).SerializeToString())


def test_the_worker_takes_only_the_authentic_answer_to_this_heartbeat() -> None:
    replica = _Replica(lambda r: [_reply(r.seq - 1, node_status="READY"),  # an earlier heartbeat's
                                  _reply(r.seq, key=b"forged", node_status="READY", lease_ms=99_000),
                                  _reply(r.seq, node_status="READY", lease_ms=8000)])
    sender = DatagramBeats("n1", lambda: "credential-of-n1")
    try:
        first = sender.beat(replica.address, api_pb2.HeartbeatRequest(node_id="n1"))
        second = sender.beat(replica.address, api_pb2.HeartbeatRequest(node_id="n1"))
    finally:
        replica.close()
        sender.close()
    assert first is not None and first.lease_ms == 8000 and first.node_status == "READY"
    assert second is not None and second.seq > first.seq
    assert sender.answered == 2


def test_a_refusal_or_silence_sends_the_worker_to_its_call_and_silence_quiets_the_replica() -> None:
    refusing = _Replica(lambda r: [_reply(r.seq, refused="replica m2 is stopping; try another")])
    silent = _Replica(lambda r: [])
    sender = DatagramBeats("n1", lambda: "credential-of-n1")
    try:
        assert sender.beat(refusing.address, api_pb2.HeartbeatRequest(node_id="n1")) is None
        assert sender.misses[refusing.address] == 0  # it answered: not a miss
        started = time.monotonic()
        for _ in range(MISSES):
            assert sender.beat(silent.address, api_pb2.HeartbeatRequest(node_id="n1")) is None
        assert time.monotonic() - started >= MISSES * beats.WAIT_S * 0.9
        assert silent.received == MISSES
        started = time.monotonic()
        assert sender.beat(silent.address, api_pb2.HeartbeatRequest(node_id="n1")) is None
        assert time.monotonic() - started < beats.WAIT_S / 2  # quiet: not even sent
        time.sleep(0.1)
        assert silent.received == MISSES
    finally:
        refusing.close()
        silent.close()
        sender.close()


def test_a_replica_silent_again_is_kept_quiet_twice_as_long_and_an_answer_resets_the_backoff() -> None:
    speaking = threading.Event()
    replica = _Replica(lambda r: [_reply(r.seq, node_status="READY")] if speaking.is_set() else [])
    sender = DatagramBeats("n1", lambda: "credential-of-n1")

    def fall_silent(expected: int) -> tuple[float, int]:
        """Three heartbeats unanswered; how long the replica is then kept quiet (its quiet time is
        then ended at once, as if that long went by), and how many datagrams reached it (once the
        replica's thread has counted the `expected` ones; each was sent a wait before the last
        beat returned, so any more would be counted by then too)."""
        sent = replica.received
        for _ in range(MISSES):
            assert sender.beat(replica.address, api_pb2.HeartbeatRequest(node_id="n1")) is None
        quiet = sender.quiet_until[replica.address] - time.monotonic()
        sender.quiet_until[replica.address] = 0.0
        wait_for(lambda: replica.received - sent >= expected, timeout=5, what=f"{expected} datagram(s) received")
        return quiet, replica.received - sent

    try:
        silences = [fall_silent(MISSES if n == 0 else 1) for n in range(7)]
        speaking.set()
        assert sender.beat(replica.address, api_pb2.HeartbeatRequest(node_id="n1")) is not None
        speaking.clear()
        again = fall_silent(MISSES)
    finally:
        replica.close()
        sender.close()
    assert QUIET_FIRST_S == 15 and QUIET_S == 300
    assert [round(q) for q, _ in silences] == [15, 30, 60, 120, 240, 300, 300]
    assert [n for _, n in silences] == [MISSES, 1, 1, 1, 1, 1, 1]  # after a quiet time, one probe
    assert (round(again[0]), again[1]) == (15, MISSES)  # one answer: the next silence starts afresh


def test_a_task_report_takes_only_the_leaders_authentic_answer_and_a_refusal_sends_it_to_the_call() -> None:
    answers = iter([lambda seq: [beats.seal(KEY, beats.REPORT_REPLY, beats.answer_body(seq - 1, 1)),  # older
                                 beats.seal(b"forged", beats.REPORT_REPLY, beats.answer_body(seq, 7)),
                                 beats.seal(KEY, beats.REPORT_REPLY, beats.answer_body(seq, 2))],
                    lambda seq: [beats.seal(KEY, beats.REPORT_REPLY, beats.answer_body(seq, beats.REFUSED))]])
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5.0)
    address = f"127.0.0.1:{sock.getsockname()[1]}"
    received: list[api_pb2.ReportTaskEventsRequest] = []

    def leader() -> None:
        for answer in answers:
            data, source = sock.recvfrom(beats.MAX_BYTES)
            assert beats.authentic(KEY, beats.REPORT, data)
            seq, body = beats.report_of(beats.body_of(data))
            received.append(api_pb2.ReportTaskEventsRequest.FromString(body))
            for reply in answer(seq):
                sock.sendto(reply, source)

    thread = threading.Thread(target=leader, daemon=True)
    thread.start()
    sender = DatagramReports("n1", lambda: "credential-of-n1")
    request = api_pb2.ReportTaskEventsRequest(node_id="n1", events=[
        api_pb2.TaskEvent(job_id="j", attempt=1, index=0, started=True), api_pb2.TaskEvent(job_id="j", index=1)])
    try:
        assert sender.report(address, request) == 2
        assert sender.report(address, request) is None  # refused: the caller makes the call
        huge = api_pb2.ReportTaskEventsRequest(node_id="n1", events=[
            api_pb2.TaskEvent(job_id="j" * 200, attempt=1, index=i, reason="r" * 200) for i in range(40)])
        assert sender.report(address, huge) is None  # too large for a datagram: not sent
    finally:
        thread.join(5)
        sock.close()
        sender.close()
    assert [len(r.events) for r in received] == [2, 2] and received[0] == request


@pytest.mark.slow
def test_on_a_cluster_heartbeats_go_by_datagram_and_only_authentic_fresh_ones_are_answered(make_cluster) -> None:
    cluster = make_cluster(masters=3, workers=1, racks=1)
    worker = cluster.state["workers"][0]
    data_dir = cluster.worker_dir(worker["id"])
    credential = cluster.saved_credential(worker["id"])["credential"]
    key = beats.key_of(credential)
    # The worker's own heartbeats are answered by datagram (its metrics say how many).
    http = (data_dir / "http-address").read_text().strip()
    deadline = time.monotonic() + 20
    answered = 0.0
    while time.monotonic() < deadline and answered < 2:
        text = urllib.request.urlopen(f"http://{http}/metrics", timeout=5).read().decode()
        answered = next(float(line.split()[-1]) for line in text.splitlines()
                        if line.startswith("synapse_worker_heartbeat_datagrams_answered"))
        time.sleep(0.5)
    assert answered >= 2, "the worker's heartbeats were not answered by datagram"

    # Each replica answers a datagram sealed with the node's credential once: a replay, a forgery
    # and a stale one get no answer at all.
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(1.0)

    def ask(address: str, datagram: bytes) -> api_pb2.HeartbeatReply | None:
        host, _, port = address.rpartition(":")
        sock.sendto(datagram, (host, int(port)))
        try:
            data, _ = sock.recvfrom(beats.MAX_BYTES)
        except TimeoutError:
            return None
        assert beats.authentic(key, beats.REPLY, data)
        return api_pb2.HeartbeatReply.FromString(beats.body_of(data))

    try:
        for master in cluster.state["masters"]:
            address = master["api_address"]
            request = api_pb2.HeartbeatRequest(node_id=worker["id"], seq=time.time_ns())
            datagram = beats.seal(key, beats.REQUEST, request.SerializeToString())
            reply = ask(address, datagram)
            assert reply is not None and reply.seq == request.seq
            assert reply.node_status == "READY" and not reply.refused, reply
            assert reply.order and reply.lease_ms > 0
            assert ask(address, datagram) is None  # the same datagram again: a replay
            request.seq = time.time_ns()
            assert ask(address, beats.seal(b"not-the-credential", beats.REQUEST, request.SerializeToString())) is None
            request.seq = time.time_ns() - int((beats.FRESH_S + 5) * 1e9)
            assert ask(address, beats.seal(key, beats.REQUEST, request.SerializeToString())) is None
    finally:
        sock.close()


@pytest.mark.slow
def test_on_a_cluster_task_reports_go_to_the_leader_by_datagram_and_only_it_takes_them(make_cluster) -> None:
    """A gang's start and end reports reach the leader by datagram (its count of those it took
    rises); a follower refuses one (the worker then calls), and a replay or a forgery gets no answer."""
    cluster = make_cluster(masters=3, workers=2, racks=1)
    leader = cluster.master(cluster.wait_leader())
    ca = cluster.state["ca"]

    def taken() -> float:
        return value(scrape(leader["http_address"], ca=ca), "synapse_report_datagrams", outcome="taken")

    for worker in ("w1", "w2"):  # reports go by datagram once a heartbeat datagram was answered
        wait_for(lambda w=worker: _answered(cluster, w) >= 1, 20, f"{worker}'s first heartbeat datagram")
    before = taken()
    for k in range(2):
        job = submit(cluster, f"reported{k}", 2, ["true"], gpu=8)
        wait_job(cluster, job, {"SUCCEEDED"})
    # Two jobs, each two starts and two ends (a start and an end may share a report); the first
    # report of each worker may go by call (it learns the leader's address from a call's answer).
    assert taken() - before >= 4
    credential = cluster.saved_credential("w1")["credential"]
    key = beats.key_of(credential)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(2.0)

    def report(address: str, seq: int, key: bytes = key) -> int | None:
        request = api_pb2.ReportTaskEventsRequest(node_id="w1", events=[
            api_pb2.TaskEvent(job_id="no-such-job", attempt=1, index=0, started=True)])
        host, _, port = address.rpartition(":")
        sock.sendto(beats.seal(key, beats.REPORT, beats.report_body(seq, request.SerializeToString())),
                    (host, int(port)))
        try:
            data, _ = sock.recvfrom(beats.MAX_BYTES)
        except TimeoutError:
            return None
        assert beats.authentic(key, beats.REPORT_REPLY, data)
        answered_seq, accepted = beats.answer_of(beats.body_of(data))
        assert answered_seq == seq
        return accepted

    try:
        seq = time.time_ns()
        assert report(leader["api_address"], seq) == 0  # taken, its one command refused: no such job
        assert report(leader["api_address"], seq) is None  # the same seq again: a replay
        assert report(leader["api_address"], time.time_ns(), key=b"not-the-credential") is None
        follower = next(m for m in cluster.state["masters"] if m["id"] != leader["id"])
        assert report(follower["api_address"], time.time_ns()) == beats.REFUSED
    finally:
        sock.close()


def _answered(cluster, worker: str) -> float:
    http = (cluster.worker_dir(worker) / "http-address").read_text().strip()
    return value(scrape(http), "synapse_worker_heartbeat_datagrams_answered")


def test_a_replica_s_heartbeat_socket_asks_for_a_large_receive_buffer() -> None:
    """A replica of thousands of nodes must not drop a burst of heartbeats while its loop is busy
    (each dropped one comes again by call): its socket keeps what the kernel allows of
    RCVBUF_BYTES (net.core.rmem_max caps it), more than the default wherever the cap allows."""
    cap = int(Path("/proc/sys/net/core/rmem_max").read_text())
    default = int(Path("/proc/sys/net/core/rmem_default").read_text())
    sock = beat_socket("127.0.0.1", 0)
    try:
        kept = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2
        assert kept == min(RCVBUF_BYTES, cap)
        assert cap <= default or kept > default
        assert sock.getsockname()[0] == "127.0.0.1" and not sock.getblocking()
    finally:
        sock.close()
