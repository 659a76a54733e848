"""Heartbeats by datagram over real sockets: the worker takes only the authentic answer to the
heartbeat it sent and falls back to calls; on a real cluster the workers' heartbeats go by datagram,
and each replica answers only authentic, fresh ones (the wire format alone: tests/unit/test_beats.py)."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from synapse.common import beats
from synapse.proto import api_pb2
from synapse.worker.beats import MISSES, DatagramBeats

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
