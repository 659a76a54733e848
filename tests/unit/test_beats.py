"""Heartbeats by datagram, the wire format (synapse.common.beats): a datagram is authentic only for
its key and direction, and fresh once (sockets and clusters: tests/cluster/test_beats.py)."""

from __future__ import annotations

from synapse.common import beats
from synapse.proto import api_pb2

KEY = beats.key_of("credential-of-n1")


def test_a_sealed_datagram_is_authentic_only_for_its_key_and_direction() -> None:
    body = api_pb2.HeartbeatRequest(node_id="n1", seq=5).SerializeToString()
    datagram = beats.seal(KEY, beats.REQUEST, body)
    assert beats.authentic(KEY, beats.REQUEST, datagram)
    assert beats.body_of(datagram) == body
    assert not beats.authentic(beats.key_of("another"), beats.REQUEST, datagram)
    assert not beats.authentic(KEY, beats.REPLY, datagram)  # a request cannot pass for a reply
    assert not beats.authentic(KEY, beats.REQUEST, datagram[:-1])
    assert not beats.authentic(KEY, beats.REQUEST, datagram[:10])
    tampered = datagram[:-1] + bytes([datagram[-1] ^ 1])
    assert not beats.authentic(KEY, beats.REQUEST, tampered)


def test_a_heartbeat_is_fresh_once_and_only_near_the_replicas_clock() -> None:
    now = 1_800_000_000.0
    seq = int(now * 1e9)
    assert beats.fresh(seq, 0, now)
    assert not beats.fresh(seq, seq, now)  # the same one again: a replay
    assert not beats.fresh(seq - 1, seq, now)
    assert not beats.fresh(int((now - beats.FRESH_S - 1) * 1e9), 0, now)  # an old one, to a replica that forgot
    assert not beats.fresh(int((now + beats.FRESH_S + 1) * 1e9), 0, now)
