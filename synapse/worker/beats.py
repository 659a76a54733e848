"""Heartbeats by datagram, the worker's side (the wire format and why: synapse.common.beats).

The heartbeat thread sends each heartbeat to its shard as one UDP datagram first and takes the
answer as it would a call's; with no good answer within `beats.WAIT_S` it makes the gRPC call,
which fails over as before. A replica that does not answer datagrams three times in a row (an
earlier release, a firewall that drops UDP, `heartbeat_datagrams: false`) is not sent any for
`QUIET_S`: the worker then pays one wait per `QUIET_S`, not one per heartbeat.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError

from synapse.common import beats
from synapse.proto import api_pb2

log = logging.getLogger(__name__)

#: Unanswered datagrams in a row after which a replica is sent none for QUIET_S.
MISSES = 3
QUIET_S = 300.0


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
        self.answered = 0  #: heartbeats answered by datagram (a metric)

    def beat(self, address: str, request: api_pb2.HeartbeatRequest) -> api_pb2.HeartbeatReply | None:
        """Send `request` to `address` by datagram; its reply if the replica took it, None if the
        caller should make the call instead (no answer in time, a refusal, a replica kept quiet)."""
        now = time.monotonic()
        if now < self.quiet_until.get(address, 0.0):
            return None
        try:
            family, target = self._resolve(address)
            sock = self._socket(family)
        except OSError as exc:
            log.debug("heartbeat datagram not sent address=%s error=%s", address, exc)
            return None
        self.seq = max(self.seq + 1, time.time_ns())
        request.seq = self.seq
        key = beats.key_of(self.credential())
        try:
            sock.sendto(beats.seal(key, beats.REQUEST, request.SerializeToString()), target)
        except OSError as exc:
            log.debug("heartbeat datagram not sent address=%s error=%s", address, exc)
            return None
        deadline = now + beats.WAIT_S
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                data, source = sock.recvfrom(beats.MAX_BYTES)
            except (TimeoutError, OSError):
                break
            if source[:2] != target[:2] or not beats.authentic(key, beats.REPLY, data):
                continue  # not the replica's, or not for this node
            try:
                reply = api_pb2.HeartbeatReply.FromString(beats.body_of(data))
            except DecodeError:
                continue
            if reply.seq != self.seq:
                continue  # the late answer to an earlier heartbeat
            self.misses[address] = 0
            if reply.refused:
                log.debug("heartbeat datagram refused address=%s: %s", address, reply.refused)
                return None
            self.answered += 1
            return reply
        self.misses[address] = misses = self.misses.get(address, 0) + 1
        if misses >= MISSES:
            self.misses[address] = 0
            self.quiet_until[address] = time.monotonic() + QUIET_S
            log.info("no heartbeat datagram answered by %s %d times in a row: heartbeats to it by call for %.0fs",
                     address, MISSES, QUIET_S)
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
