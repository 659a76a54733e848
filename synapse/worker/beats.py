"""Heartbeats by datagram, the worker's side (the wire format and why: synapse.common.beats).

The heartbeat thread sends each heartbeat to its shard as one UDP datagram first and takes the
answer as it would a call's; with no good answer within `beats.WAIT_S` it makes the gRPC call,
which fails over as before. A replica that does not answer datagrams three times in a row (an
earlier release, a firewall that drops UDP, `heartbeat_datagrams: false`) is not sent any for
`QUIET_FIRST_S`; after that, one unanswered datagram (a probe) keeps it quiet twice as long again,
up to `QUIET_S`, until it answers: a replica that never answers costs the worker one wait per
`QUIET_S`, not one per heartbeat, and one that dropped a burst under load (a full receive buffer) or answered late
gets its datagrams back within seconds, not minutes (each heartbeat meanwhile costs it a call,
about twice the CPU).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

from google.protobuf.message import DecodeError

from synapse.common import beats
from synapse.proto import api_pb2

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Unanswered datagrams in a row after which a replica is sent none for a while: QUIET_FIRST_S the
#: first time; then, until it answers, each unanswered probe doubles it, QUIET_S at most.
MISSES = 3
QUIET_FIRST_S = 15.0
QUIET_S = 300.0
#: How long the report thread waits for the leader's answer to a task report (its commit, normally a
#: few milliseconds) before it makes the call instead.
REPORT_WAIT_S = 0.25


class DatagramBeats:
    """One node's heartbeat datagrams (the heartbeat thread only)."""

    def __init__(self, node_id: str, credential: Callable[[], str]) -> None:
        self.node_id = node_id
        self.credential = credential  #: the node's credential now (it changes when the node registers)
        self.seq = 0  #: the last seq sent: nanoseconds of this clock, strictly increasing
        self._sockets: dict[int, socket.socket] = {}  #: address family -> socket
        self._resolved: dict[str, tuple[int, tuple[Any, ...]]] = {}  #: "host:port" -> (family, socket address)
        self.misses: dict[str, int] = {}  #: address -> unanswered datagrams in a row
        self.quiet_until: dict[str, float] = {}  #: address -> monotonic time until which none are sent
        #: address -> how long it is sent none the next time it falls silent (reset by an answer)
        self.quiet_next: dict[str, float] = {}
        self.answered = 0  #: heartbeats answered by datagram (a metric)

    def beat(self, address: str, request: api_pb2.HeartbeatRequest) -> api_pb2.HeartbeatReply | None:
        """Send `request` to `address` by datagram; its reply if the replica took it, None if the
        caller should make the call instead (no answer in time, a refusal, a replica kept quiet)."""
        self.seq = max(self.seq + 1, time.time_ns())
        request.seq = self.seq
        key = beats.key_of(self.credential())

        def parse(body: bytes) -> api_pb2.HeartbeatReply | None:
            try:
                reply = api_pb2.HeartbeatReply.FromString(body)
            except DecodeError:
                return None
            return reply if reply.seq == self.seq else None  # else the late answer to an earlier heartbeat

        reply = self._exchange(address, beats.seal(key, beats.REQUEST, request.SerializeToString()), key,
                               beats.REPLY, beats.WAIT_S, parse, "heartbeat")
        if reply is None:
            return None
        if reply.refused:
            log.debug("heartbeat datagram refused address=%s: %s", address, reply.refused)
            return None
        self.answered += 1
        return reply

    def _exchange(self, address: str, datagram: bytes, key: bytes, domain: bytes, wait: float,
                  parse: Callable[[bytes], T | None], what: str) -> T | None:
        """Send `datagram` to `address` and wait up to `wait` s for the answer: one from the replica,
        sealed with `key` for `domain`, that `parse` takes (None: not the answer to this one). None
        when none came (a miss: after MISSES in a row the replica is sent none for a while) or the
        replica is kept quiet now."""
        now = time.monotonic()
        if now < self.quiet_until.get(address, 0.0):
            return None
        try:
            family, target = self._resolve(address)
            sock = self._socket(family)
            sock.sendto(datagram, target)
        except OSError as exc:
            log.debug("%s datagram not sent address=%s error=%s", what, address, exc)
            return None
        deadline = now + wait
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                data, source = sock.recvfrom(beats.MAX_BYTES)
            except (TimeoutError, OSError):
                break
            if source[:2] != target[:2] or not beats.authentic(key, domain, data):
                continue  # not the replica's, or not for this node
            answer = parse(beats.body_of(data))
            if answer is not None:
                self.misses[address] = 0
                self.quiet_next.pop(address, None)
                return answer
        self.misses[address] = misses = self.misses.get(address, 0) + 1
        if misses >= MISSES or address in self.quiet_next:  # a probe after a quiet time: one miss is enough
            self.misses[address] = 0
            quiet = self.quiet_next.get(address, QUIET_FIRST_S)
            self.quiet_next[address] = min(2 * quiet, QUIET_S)
            self.quiet_until[address] = time.monotonic() + quiet
            log.info("no %s datagram answered by %s %d times in a row: %ss to it by call for %.0fs",
                     what, address, MISSES, what, quiet)
        return None

    def _resolve(self, address: str) -> tuple[int, tuple[Any, ...]]:
        found = self._resolved.get(address)
        if found is None:
            host, _, port = address.rpartition(":")
            info = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_DGRAM)[0]
            found = self._resolved[address] = (info[0], info[4])
        return found

    def _socket(self, family: int) -> socket.socket:
        sock = self._sockets.get(family)
        if sock is None:
            sock = self._sockets[family] = socket.socket(family, socket.SOCK_DGRAM)
        return sock

    def close(self) -> None:
        for sock in self._sockets.values():
            sock.close()
        self._sockets.clear()


class DatagramReports(DatagramBeats):
    """One node's task reports by datagram to the leader (the report thread only): a task's start or
    end, one datagram answered once the leader committed it, instead of a ReportTaskEvents call
    (a call costs the worker and the leader each about a millisecond of CPU; in a gang's start,
    eight of them on the two cores of bench/gang.py). No answer within REPORT_WAIT_S, a refusal
    (not the leader, no commit), or a report too large for a datagram: the caller makes the call.
    A report the leader took whose answer was lost is sent again by call: its commands are
    idempotent (synapse.core.state.tasks)."""

    def report(self, address: str, request: api_pb2.ReportTaskEventsRequest) -> int | None:
        """Send `request` to the leader at `address`; how many events it took, or None if the caller
        should make the call instead."""
        self.seq = seq = max(self.seq + 1, time.time_ns())
        key = beats.key_of(self.credential())
        datagram = beats.seal(key, beats.REPORT, beats.report_body(seq, request.SerializeToString()))
        if len(datagram) > beats.MAX_BYTES:
            return None

        def parse(body: bytes) -> int | None:
            try:
                answered, accepted = beats.answer_of(body)
            except ValueError:
                return None
            return accepted if answered == seq else None  # else the late answer to an earlier report

        accepted = self._exchange(address, datagram, key, beats.REPORT_REPLY, REPORT_WAIT_S, parse, "task report")
        return None if accepted == beats.REFUSED else accepted
