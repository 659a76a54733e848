"""What every audience's RPCs share: who calls, whether this replica leads, one proposal per
request, and the mapping of a refusal to a status code.

Writes, and reads that must be current, are served by the leader only. A follower answers
FAILED_PRECONDITION with the trailing metadata `synapse-leader: <api address>`; a replica that
knows no leader waits up to LEADER_WAIT_S for one, then answers UNAVAILABLE (at once if it has
just stepped down: it is probably cut off from its peers). A leader answers a
current read only after committing a Barrier, which a deposed leader cannot do, so it never serves
state older than the last acknowledged write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from google.protobuf.message import Message
from prometheus_client import Counter

from synapse.common.auth import (
    LEADER_METADATA_KEY,
    METADATA_KEY,
    NODE_CREDENTIAL_KEY,
    NODE_ID_KEY,
    REPLICA_CREDENTIAL_KEY,
)
from synapse.common.tls import peer_common_name
from synapse.core import commands as c
from synapse.master.access import ACCESS, CALLER, Identity, denial, identify, token_key
from synapse.master.cipher import SecretSeal
from synapse.master.metrics import Metrics
from synapse.master.raft import ProposeError
from synapse.master.replica import LEADER_WAIT_S, Master
from synapse.proto import api_pb2

log = logging.getLogger(__name__)

#: The servicer context of every RPC (its type arguments, the messages a stream reads and writes,
#: are used by no handler: every request comes whole as an argument, every reply as a return or a yield).
Context = grpc.aio.ServicerContext[Message, Message]

#: After stepping down, a replica with no known leader sends clients away at once for this long.
DEPOSED_S = 3.0
MAX_ID_CHARS = 256
#: A watch stream re-sends the current state at least this often (a keepalive that also lets the
#: worker notice a silent leader change).
WATCH_REFRESH_S = 5.0


def host_port(value: str) -> bool:
    """Whether `value` reads as host:port (of a sane length)."""
    host, _, port = value.rpartition(":")
    return bool(host) and port.isdigit() and len(value) <= MAX_ID_CHARS


class ServicerBase:
    """The plumbing of the Master servicer; each audience's RPCs are a mixin of it (synapse.master.api)."""

    def __init__(self, master: Master, metrics: Metrics | None = None) -> None:
        self.m = master
        self.metrics = metrics
        self._token_key = token_key(master.config.raft_password)
        self._seal = SecretSeal(master.config.raft_password)  #: seals submissions' secrets; opens them for listings
        self._request_counters: dict[tuple[str, str], Counter] = {}  #: (method, code) -> its requests counter

    def count(self, method: str, context: Context, failed: bool) -> None:
        """Count a finished call by method and status code; a redirect to the leader apart."""
        if self.metrics is None:
            return
        code = context.code() if failed else grpc.StatusCode.OK
        name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
        counter = self._request_counters.get((method, name))
        if counter is None:  # a label lookup per call was a measurable part of a submission's CPU
            counter = self._request_counters[(method, name)] = self.metrics.requests.labels(method, name)
        counter.inc()
        if code == grpc.StatusCode.FAILED_PRECONDITION and any(
                k == LEADER_METADATA_KEY for k, _ in (context.trailing_metadata() or ())):
            self.metrics.redirects.labels(method).inc()

    def _known(self, token: str, common_name: str, node: tuple[str, str] = ("", ""),
               replica: str = "") -> Identity | None:
        return identify(self.m, self._token_key, token, common_name, *node, replica_credential=replica)

    async def authenticate(self, method: str, context: Context) -> Identity:
        """The caller, or abort: UNAUTHENTICATED for unknown credentials, PERMISSION_DENIED when
        the caller's role does not allow `method`.

        Only a ready leader says UNAUTHENTICATED to a token it does not know: a follower (or a new
        leader still catching up) may not have applied the user's creation yet, so it redirects to
        the leader or asks the client to retry, and a valid user is never turned away by a lag.
        """
        metadata = dict(context.invocation_metadata() or ())
        presented = str(metadata.get(METADATA_KEY, ""))
        token = presented[7:] if presented.startswith("Bearer ") else ""
        if presented and not token:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "authorization metadata must be 'Bearer <token>'")
        common_name = peer_common_name(context) if self.m.config.user_certs else ""
        node = (str(metadata.get(NODE_ID_KEY, "")), str(metadata.get(NODE_CREDENTIAL_KEY, "")))
        replica = str(metadata.get(REPLICA_CREDENTIAL_KEY, ""))
        caller = self._known(token, common_name, node, replica)
        if caller is None and (token or common_name) and not self.m.ready_leader_term():
            await self._leader(context)  # redirects, or returns once this replica leads
            caller = self._known(token, common_name, node, replica)
        if caller is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "unknown token" if token else
                                f"not a valid credential for node {node[0][:MAX_ID_CHARS]} in this cluster" if all(node)
                                else "missing credentials: give a token (--token or SYNAPSE_TOKEN)")
        why = denial(method, caller)
        if why:
            log.info("permission denied method=%s user=%s", method, caller.name)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"permission denied: {why}")
        return caller

    @staticmethod
    def caller() -> Identity:
        """The authenticated caller of the RPC being served."""
        return CALLER.get()

    async def _leader(self, context: Context) -> int:
        """This replica's term if it leads and is ready; otherwise abort with a redirect or UNAVAILABLE."""
        deadline = time.monotonic() + LEADER_WAIT_S
        while True:
            term = self.m.ready_leader_term()
            if term and not self.m.stopping:
                return term
            leader_api = self.m.leader_api_address()
            if leader_api and leader_api != self.m.replica.api:
                context.set_trailing_metadata(((LEADER_METADATA_KEY, leader_api),))
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                    f"replica {self.m.replica.id} is not the leader; the leader is at {leader_api}")
            if self.m.stopping:
                await self._abort_stopping(context)
            if time.monotonic() - self.m.deposed_at < DEPOSED_S:
                # It just stopped leading and knows no successor: most likely it is cut off from
                # its peers (a follower of a live leader would know it at once). Waiting is useless.
                await context.abort(grpc.StatusCode.UNAVAILABLE,
                                    f"replica {self.m.replica.id} stepped down and knows no leader; try another")
            if time.monotonic() > deadline:
                await context.abort(grpc.StatusCode.UNAVAILABLE,
                                    f"replica {self.m.replica.id}: no leader elected within {LEADER_WAIT_S:.1f}s")
            await asyncio.sleep(0.02)

    async def _propose(self, cmd: c.Command, context: Context) -> c.Result:
        return (await self._propose_all([cmd], context))[0]

    async def _propose_all(self, cmds: list[c.Command], context: Context) -> list[c.Result]:
        """Propose commands as one log entry (all commit or none does); if that fails, abort the call.
        A request makes at most one proposal (tests/unit/test_one_proposal.py), so a leader change can
        never leave it half done."""
        if not cmds:
            return []
        if not all(isinstance(cmd, c.Barrier) for cmd in cmds) and not self.m.disk_has_room():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"replica {self.m.replica.id}: less than {self.m.config.min_free_disk} bytes free "
                                "under its data dir; writes are refused until there is room")
        try:
            return await self.m.propose_all(cmds)
        except ProposeError as exc:
            await self._abort_proposal(exc, context)
            raise  # _abort_proposal always aborts

    async def _abort_proposal(self, exc: ProposeError, context: Context) -> None:
        if exc.maybe_applied:
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"outcome unknown ({exc.kind}) during a leader change; "
                                "retry with the same request id")
        if exc.kind == "QUEUE_FULL":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "the command queue is full; retry later")
        if exc.kind == "CLUSTER_VERSION":
            behind = ", ".join(f"{self._replica_of_raft(raft)} ({f'version {v}' if v else 'not heard from'})"
                               for raft, v in exc.behind)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"not proposed (CLUSTER_VERSION): this command needs command-set version {exc.needed} "
                                f"on every replica, and these are behind: {behind}; upgrade them (one at a time), "
                                "then retry")
        if exc.leader and exc.leader != self.m.replica.raft:  # never send a client back here
            leader_api = self.m.api_of_raft(exc.leader)
            if leader_api:
                context.set_trailing_metadata(((LEADER_METADATA_KEY, leader_api),))
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"not committed ({exc.kind}); retry")

    def _replica_of_raft(self, raft_address: str) -> str:
        """A replica's id from its Raft address (the address itself if no directory names it)."""
        known = {r.raft: r.id for r in self.m.config.replicas}
        with self.m.lock:
            known.update({raft: replica_id for replica_id, (raft, _api) in self.m.state.replicas.items()})
        return known.get(raft_address, raft_address)

    async def _abort_stopping(self, context: Context) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"replica {self.m.replica.id} is stopping; try another")

    async def _current_read(self, context: Context) -> None:
        term = await self._leader(context)
        await self._propose(c.Barrier(at=self.m.now(), term=term, reason="read"), context)

    @staticmethod
    async def _check_id(value: str, field: str, context: Context) -> None:
        if not value or len(value) > MAX_ID_CHARS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"{field}: required, at most {MAX_ID_CHARS} characters")

    async def _ok_or_abort(self, result: c.Result, context: Context,
                           code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION) -> c.Result:
        if not result.ok:
            if result.code is c.Rejection.NOT_FOUND:
                code = grpc.StatusCode.NOT_FOUND
            elif result.code is c.Rejection.CONFLICT:
                code = grpc.StatusCode.ALREADY_EXISTS
            await context.abort(code, result.error)
        return result


class Malformed:
    """A request whose bytes did not parse; the handler wrapper answers INVALID_ARGUMENT."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _lenient(parse: Callable[[bytes], Message]) -> Callable[[bytes], Message | Malformed]:
    def deserialize(data: bytes) -> Message | Malformed:
        try:
            return parse(data)
        except Exception as exc:  # noqa: BLE001 - DecodeError and friends: any garbage
            return Malformed(str(exc)[:200] or type(exc).__name__)
    return deserialize


async def _admit(servicer: ServicerBase, name: str, request: Message | Malformed, context: Context) -> Message:
    """Authenticate and authorize the call, and refuse a request that did not parse; the request."""
    CALLER.set(await servicer.authenticate(name, context))
    if isinstance(request, Malformed):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {request.reason}")
    return request


def _unary(servicer: ServicerBase, name: str, impl: Callable[[Message, Context], Awaitable[Message]],
           ) -> Callable[[Message | Malformed, Context], Awaitable[Message]]:
    async def handle(request: Message | Malformed, context: Context) -> Message:
        try:
            reply = await impl(await _admit(servicer, name, request, context), context)
        except BaseException:
            servicer.count(name, context, failed=True)
            raise
        servicer.count(name, context, failed=False)
        return reply
    return handle


def _stream(servicer: ServicerBase, name: str, impl: Callable[[Message, Context], AsyncIterator[Message]],
            ) -> Callable[[Message | Malformed, Context], AsyncIterator[Message]]:
    async def handle(request: Message | Malformed, context: Context) -> AsyncIterator[Message]:
        try:
            async for reply in impl(await _admit(servicer, name, request, context), context):
                yield reply
        except BaseException:
            servicer.count(name, context, failed=True)
            raise
        servicer.count(name, context, failed=False)
    return handle


def add_to_server(servicer: ServicerBase, server: grpc.aio.Server) -> None:
    """Register the servicer like the generated helper does, but authenticate and authorize every
    call first (synapse.master.access), and turn undecodable bytes into INVALID_ARGUMENT instead of
    gRPC's UNKNOWN."""
    service = api_pb2.DESCRIPTOR.services_by_name["Master"]
    unguarded = sorted(m.name for m in service.methods if m.name not in ACCESS)
    if unguarded:
        raise RuntimeError(f"RPCs without an access rule in synapse.master.access.ACCESS: {unguarded}")
    handlers = {}
    for method in service.methods:
        request_cls = getattr(api_pb2, method.input_type.name)
        reply_cls = getattr(api_pb2, method.output_type.name)
        impl = getattr(servicer, method.name)
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make((_stream if method.server_streaming else _unary)(servicer, method.name, impl),
                                     request_deserializer=_lenient(request_cls.FromString),
                                     response_serializer=reply_cls.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
