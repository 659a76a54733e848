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
import time
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError

from synapse.common import beats
from synapse.proto import api_pb2

if TYPE_CHECKING:
    from synapse.master.replica import Master

log = logging.getLogger(__name__)

#: Nodes whose last seq a replica remembers (fresh nodes beyond it evict the oldest entries).
MAX_REMEMBERED = 200_000


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

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            request = api_pb2.HeartbeatRequest.FromString(beats.body_of(data))
        except DecodeError:
            self.dropped += 1
            return
        node_id = request.node_id
        key = self._keys.get(node_id)
        if key is None:
            key = beats.key_of(self.m.node_credential(node_id))
            if len(self._keys) >= MAX_REMEMBERED:
                self._keys.clear()
            self._keys[node_id] = key
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

    def error_received(self, exc: Exception) -> None:
        log.debug("heartbeat datagram error: %s", exc)


async def serve_beats(master: Master, api_address: str) -> BeatEndpoint | None:
    """Open the replica's heartbeat socket on its API address; None (logged) if it cannot be bound:
    workers then heartbeat by call, as before."""
    host, _, port = api_address.rpartition(":")
    host = host.strip("[]")
    loop = asyncio.get_running_loop()
    try:
        _, endpoint = await loop.create_datagram_endpoint(lambda: BeatEndpoint(master), local_addr=(host, int(port)))
    except OSError as exc:
        log.warning("heartbeat datagrams off replica=%s address=%s error=%s: workers heartbeat by call",
                    master.replica.id, api_address, exc)
        return None
    return endpoint
