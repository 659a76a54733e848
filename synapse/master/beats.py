"""Heartbeats by datagram, the replica's side (the wire format: synapse.common.beats).

One UDP socket on the replica's API address (same host, same port number), read on the event loop
the gRPC server runs on: a datagram is checked (its MAC by the node's credential, its seq fresh),
taken in by the link shard exactly as a Heartbeat call is (`LinkShard.answer`), and answered with
one datagram. Anything that does not check out is dropped without an answer (the worker then makes
the call, which says why); a refusal (stopping, no leader in reach, no lease to grant) is answered,
so the worker moves on at once.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError

from synapse.common import beats
from synapse.master.raft import ProposeError
from synapse.master.reports import MAX_REPORTED, take_reports
from synapse.proto import api_pb2

if TYPE_CHECKING:
    from synapse.master.replica import Master

log = logging.getLogger(__name__)

#: Nodes whose last seq a replica remembers (fresh nodes beyond it evict the oldest entries).
MAX_REMEMBERED = 200_000
#: The receive buffer a replica asks for its heartbeat socket. The kernel's default (208 KiB on
#: most machines) holds about a thousand datagrams: a replica serving thousands of nodes drops a
#: burst that arrives while its event loop is busy, and every dropped heartbeat comes again by
#: call, which costs the replica twice the CPU (bench/scale.py). The kernel caps it at
#: net.core.rmem_max (docs/operating/workers.md says how to raise that).
RCVBUF_BYTES = 4 << 20


class BeatEndpoint(asyncio.DatagramProtocol):
    """The replica's heartbeat datagrams: checked, absorbed, answered."""

    def __init__(self, master: Master) -> None:
        self.m = master
        self.transport: Any = None  #: the loop's datagram transport (uvloop's is no asyncio.DatagramTransport)
        self.last_seq: dict[str, int] = {}  #: node id -> the seq of its last heartbeat taken here
        self._keys: dict[str, bytes] = {}  #: node id -> its datagrams' key (an HMAC each to derive)
        self.answered = 0  #: heartbeats taken and answered
        self.refused = 0  #: answered with a refusal
        self.dropped = 0  #: not authentic, not fresh, or not a heartbeat: no answer
        self.last_report_seq: dict[str, int] = {}  #: node id -> the seq of its last task report taken here
        self._reports: set[asyncio.Future[None]] = set()  #: the reports being committed
        self.reports_taken = 0  #: task reports committed and answered
        self.reports_refused = 0  #: task reports answered with a refusal

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def _key(self, node_id: str) -> bytes:
        key = self._keys.get(node_id)
        if key is None:
            key = beats.key_of(self.m.node_credential(node_id))
            if len(self._keys) >= MAX_REMEMBERED:
                self._keys.clear()
            self._keys[node_id] = key
        return key

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if beats.is_report(beats.body_of(data)):
            self._report_received(data, addr)
            return
        try:
            request = api_pb2.HeartbeatRequest.FromString(beats.body_of(data))
        except DecodeError:
            self.dropped += 1
            return
        node_id = request.node_id
        key = self._key(node_id)
        if not node_id or not beats.authentic(key, beats.REQUEST, data) or \
                not beats.fresh(request.seq, self.last_seq.get(node_id, 0), time.time()):
            self.dropped += 1
            return
        if len(self.last_seq) >= MAX_REMEMBERED and node_id not in self.last_seq:
            self.last_seq.pop(next(iter(self.last_seq)))
        self.last_seq[node_id] = request.seq
        assert self.m.shard is not None  # made before the endpoint (main)
        reply, refused = self.m.shard.answer(request)
        if reply is None:
            self.refused += 1
            reply = api_pb2.HeartbeatReply(refused=refused)
        else:
            self.answered += 1
        reply.seq = request.seq
        assert self.transport is not None
        self.transport.sendto(beats.seal(key, beats.REPLY, reply.SerializeToString()), addr)

    def _report_received(self, data: bytes, addr: tuple[str, int]) -> None:
        """A node's task report (synapse.common.beats): checked as a heartbeat is, with its own seq;
        taken by the leader alone, as the ReportTaskEvents call would take it, and answered once its
        entry committed (or refused: the worker then makes the call)."""
        try:
            seq, body = beats.report_of(beats.body_of(data))
            request = api_pb2.ReportTaskEventsRequest.FromString(body)
        except (ValueError, DecodeError):
            self.dropped += 1
            return
        node_id = request.node_id
        key = self._key(node_id)
        if not node_id or len(request.events) > MAX_REPORTED or not beats.authentic(key, beats.REPORT, data) or \
                not beats.fresh(seq, self.last_report_seq.get(node_id, 0), time.time()):
            self.dropped += 1
            return
        if len(self.last_report_seq) >= MAX_REMEMBERED and node_id not in self.last_report_seq:
            self.last_report_seq.pop(next(iter(self.last_report_seq)))
        self.last_report_seq[node_id] = seq
        task = asyncio.ensure_future(self._take_report(request, seq, key, addr))
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def _take_report(self, request: api_pb2.ReportTaskEventsRequest, seq: int, key: bytes,
                           addr: tuple[str, int]) -> None:
        accepted = beats.REFUSED
        if self.m.ready_leader_term() and not self.m.stopping and self.m.disk_has_room():
            cmds, progress = take_reports(self.m, request)
            try:
                results = await self.m.propose_all(cmds) if cmds else []
            except ProposeError as exc:
                log.debug("task report by datagram not committed node=%s error=%s", request.node_id, exc)
            else:
                accepted = progress + sum(1 for r in results if r.ok)
        if accepted == beats.REFUSED:
            self.reports_refused += 1
        else:
            self.reports_taken += 1
        assert self.transport is not None
        self.transport.sendto(beats.seal(key, beats.REPORT_REPLY, beats.answer_body(seq, accepted)), addr)

    def error_received(self, exc: Exception) -> None:
        log.debug("heartbeat datagram error: %s", exc)


async def serve_beats(master: Master, api_address: str) -> BeatEndpoint | None:
    """Open the replica's heartbeat socket on its API address; None (logged) if it cannot be bound:
    workers then heartbeat by call, as before."""
    host, _, port = api_address.rpartition(":")
    host = host.strip("[]")
    loop = asyncio.get_running_loop()
    try:
        sock = beat_socket(host, int(port))
        _, endpoint = await loop.create_datagram_endpoint(lambda: BeatEndpoint(master), sock=sock)
    except OSError as exc:
        log.warning("heartbeat datagrams off replica=%s address=%s error=%s: workers heartbeat by call",
                    master.replica.id, api_address, exc)
        return None
    got = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2  # Linux reports twice what it keeps for data
    if got < RCVBUF_BYTES:
        log.info("heartbeat socket's receive buffer %d KiB, not the %d KiB asked: net.core.rmem_max caps it "
                 "(a replica of thousands of nodes drops bursts with less)", got >> 10, RCVBUF_BYTES >> 10)
    return endpoint


def beat_socket(host: str, port: int) -> socket.socket:
    """A non-blocking UDP socket bound to (host, port) (the first of its addresses that binds), its
    receive buffer asked to be RCVBUF_BYTES."""
    error: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
            sock.bind(address)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        return sock
    raise error or OSError(f"no address to bind for {host}:{port}")
