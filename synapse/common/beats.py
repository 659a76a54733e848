"""Heartbeats by datagram: the wire format a worker and a replica share.

A gRPC call costs a replica about 0.3-0.7 ms of CPU whatever it carries (HTTP/2 framing, headers,
a task per call: bench/scale.py), and at 20,000 nodes heartbeating every 5 s a follower spent more
than a core on them. A heartbeat needs none of that: it is one small request answered by one small
reply. So a worker first sends each heartbeat as one UDP datagram to its shard's API port (the same
number as the gRPC port; UDP and TCP ports are apart), and only when no good answer comes within
`WAIT_S` does it make the gRPC call, which fails over as before. Every datagram is authenticated:

    datagram = HMAC-SHA256(key, DOMAIN + body) || body

where body is a serialized HeartbeatRequest (worker to replica) or HeartbeatReply (back), DOMAIN
tells the two directions apart, and key is the node's credential (what RegisterNode returned; an
HMAC of the node id only masters can make), so a datagram proves what the credential proves on a
call. The request's `seq` (nanoseconds of the worker's clock, strictly increasing) makes each one
fresh: a replica takes a node's heartbeat only with a larger seq than the last it took, and only
within `FRESH_S` of its own clock; the reply echoes the seq, so a worker takes no old answer as a
renewal of its lease. Datagrams are not encrypted: what they carry (the node's health line, its GPU
errors, its status and shard) is no secret; the credential never crosses. A datagram carries no
certificate: with `tls.require_worker_certs`, a call proves the node's certificate and its
credential, a datagram the credential alone (both sit in the node's data dir; a site that wants
both on every heartbeat sets `heartbeat_datagrams: false` in the cluster file). Either way a
datagram renews only what a call would: the lease the node's own answers grant it.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

#: How long a worker waits for the answer to a datagram before it makes the gRPC call instead.
WAIT_S = 0.25
#: A heartbeat's seq must be within this many seconds of the replica's clock (a replayed datagram
#: is refused after this long even by a replica that restarted and forgot the node's last seq).
FRESH_S = 30.0
#: No datagram of either kind is larger (a request's GPU errors and health line are bounded well
#: below: synapse.master.api.workers).
MAX_BYTES = 8192
MAC_BYTES = 32

REQUEST = b"synapse-heartbeat-request\0"
REPLY = b"synapse-heartbeat-reply\0"

#: Task reports (a task's start or end) by datagram, to the leader: the same seal, their own domains.
REPORT = b"synapse-task-report\0"
REPORT_REPLY = b"synapse-task-report-reply\0"
#: A report's body: REPORT_MARK, its seq (8 bytes, little-endian), a serialized
#: ReportTaskEventsRequest. A HeartbeatRequest never starts with a zero byte (no field has number 0).
REPORT_MARK = b"\0"
_SEQ = struct.Struct("<Q")
#: A report's answer: its seq and how many events the leader took, or REFUSED (not the leader, or it
#: could not commit them: the worker makes the call, which says why).
_ANSWER = struct.Struct("<QI")
REFUSED = 0xFFFFFFFF


def seal(key: bytes, domain: bytes, body: bytes) -> bytes:
    """The datagram that carries `body`, authenticated by `key` for `domain`."""
    return hmac.new(key, domain + body, hashlib.sha256).digest() + body


def body_of(datagram: bytes) -> bytes:
    """The body of a datagram, not yet authenticated (to read whose key checks it)."""
    return datagram[MAC_BYTES:]


def authentic(key: bytes, domain: bytes, datagram: bytes) -> bool:
    """True if `datagram` was sealed with `key` for `domain`."""
    if len(datagram) < MAC_BYTES or len(datagram) > MAX_BYTES:
        return False
    expected = hmac.new(key, domain + datagram[MAC_BYTES:], hashlib.sha256).digest()
    return hmac.compare_digest(expected, datagram[:MAC_BYTES])


def key_of(credential: str) -> bytes:
    """The key a node's datagrams are sealed with: its credential ('' in a cluster without any)."""
    return credential.encode()


def fresh(seq: int, last: int, now: float) -> bool:
    """A heartbeat's (or task report's) seq is new (above the node's last one of its kind taken
    here) and near this clock."""
    return seq > last and abs(seq / 1e9 - now) <= FRESH_S


def report_body(seq: int, request: bytes) -> bytes:
    """The body of a task report datagram: `request` a serialized ReportTaskEventsRequest."""
    return REPORT_MARK + _SEQ.pack(seq) + request


def is_report(body: bytes) -> bool:
    return body[:1] == REPORT_MARK


def report_of(body: bytes) -> tuple[int, bytes]:
    """(seq, the serialized ReportTaskEventsRequest) of a report's body; ValueError if it is too short."""
    if len(body) < 1 + _SEQ.size:
        raise ValueError("a task report too short")
    return _SEQ.unpack_from(body, 1)[0], body[1 + _SEQ.size:]


def answer_body(seq: int, accepted: int) -> bytes:
    return _ANSWER.pack(seq, accepted)


def answer_of(body: bytes) -> tuple[int, int]:
    """(seq, accepted or REFUSED) of a report's answer; ValueError if it is not one."""
    if len(body) != _ANSWER.size:
        raise ValueError("not a task report's answer")
    seq, accepted = _ANSWER.unpack(body)
    return seq, accepted
