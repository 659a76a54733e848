"""The one client of the master API: finds the leader, follows redirects, survives failovers.

Used by `synctl`, the worker and the tests. A call goes first to the replica last known to lead.
A redirect (FAILED_PRECONDITION with `synapse-leader` metadata) is followed at once. A replica that
is down, has no leader, or timed out sends the call to the next address, and after a full round of
failures the client backs off with jitter. All of this runs under one overall deadline. Retries
resend the same request, so a submission carries the same request id each time and creates exactly
one job, even if an earlier try was committed but its reply was lost. Authentication failures are
reported at once, never retried.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc

from synapse.common.auth import LEADER_METADATA_KEY, client_metadata
from synapse.common.tls import TLSFiles, channel_credentials
from synapse.proto import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

#: gRPC backs off reconnecting to an address that refused (1 s, then 1.6 x up to 2 min by default),
#: and fails calls at once meanwhile: after a restart of every master, clients kept failing for
#: seconds against replicas that were serving again. Masters restart; retry the link quickly.
RECONNECT = (("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
             ("grpc.max_reconnect_backoff_ms", 500))
#: A try's budget for the listings, which carry a whole cluster's jobs or nodes.
LISTING_TRY_S = 10.0

#: Codes after which another replica (or the same one later) may succeed. RESOURCE_EXHAUSTED (a
#: full disk or command queue) is the leader's own answer: every replica would send us back to it,
#: so it goes to the caller.
_RETRY_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}


class ClientError(Exception):
    """The cluster answered and said no (bad input, unknown id, …): retrying will not help."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class AuthError(ClientError):
    """The cluster refused our credentials."""


class PermissionDenied(ClientError):
    """The cluster knows who we are, and that is not allowed (not our job, or not an admin)."""


class TLSError(AuthError):
    """The TLS handshake failed (wrong CA, expired or missing certificate): retrying will not help."""


#: Substrings of gRPC's error details that mean a TLS problem, not a dead replica.
_TLS_FAILURE_HINTS = ("handshake", "certificate", "ssl_error", "tsi_", "ssl routines")


class ClusterUnavailable(Exception):
    """No replica answered usefully before the deadline."""


def new_request_id() -> str:
    return uuid.uuid4().hex


def parse_addresses(text: str | list[str]) -> list[str]:
    items = text if isinstance(text, list) else text.split(",")
    return [a.strip() for a in items if a.strip()]


def _leader_hint(error: grpc.RpcError) -> str:
    try:
        for key, value in error.trailing_metadata() or ():
            if key == LEADER_METADATA_KEY:
                return str(value)
    except Exception:  # noqa: BLE001 - some errors carry no metadata at all
        pass
    return ""


class MasterClient:
    """A failover-aware client for a list of master API addresses."""

    def __init__(self, addresses: str | list[str], token: str = "", *, deadline: float = 30.0,
                 try_timeout: float = 1.5, backoff: tuple[float, float] = (0.05, 0.25),
                 tls: TLSFiles | None = None) -> None:
        self.addresses = parse_addresses(addresses)
        if not self.addresses:
            raise ValueError("no master addresses given")
        self.metadata = client_metadata(token)  #: sent on every call (a worker adds its node credential)
        self.tls = tls if tls is not None and tls.enabled else None
        self.deadline = deadline  #: overall time budget of one call, retries included
        self.try_timeout = try_timeout  #: budget of one try
        self.backoff = backoff  #: (first, largest) pause after a full round of failures
        self.leader: str | None = None  #: the address that last answered as leader
        self._channels: dict[str, grpc.Channel] = {}

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def __enter__(self) -> MasterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stub(self, address: str) -> api_pb2_grpc.MasterStub:
        return api_pb2_grpc.MasterStub(self.channel(address))

    def channel(self, address: str) -> grpc.Channel:
        """The (cached) channel to one address: TLS when configured."""
        channel = self._channels.get(address)
        if channel is None:
            options = [("grpc.max_receive_message_length", 4 << 20), ("grpc.enable_retries", 0), *RECONNECT]
            if self.tls is not None:
                channel = grpc.secure_channel(address, channel_credentials(self.tls), options=options)
            else:
                channel = grpc.insecure_channel(address, options=options)
            self._channels[address] = channel
        return channel

    def _candidates(self) -> list[str]:
        ordered = ([self.leader] if self.leader else []) + [a for a in self.addresses if a != self.leader]
        return ordered

    def call(self, method: str, request: Any, *, deadline: float | None = None, to: str | None = None,
             try_timeout: float | None = None) -> Any:
        """Call `method` on the leader (or on `to` only, for per-replica reads), with failover.
        A try that gets no answer within `try_timeout` (a leader whose process stalls) moves on to
        the next replica: the short default bounds an outage; large listings pass a longer one."""
        end = time.monotonic() + (deadline if deadline is not None else self.deadline)
        per_try = try_timeout or self.try_timeout
        pause = self.backoff[0]
        last_error = "no replica tried"
        while True:
            failed: set[str] = set()  #: addresses that failed in this round: hints to them are stale
            redirects = 0
            order = [to] if to else self._candidates()
            while order:
                address = order.pop(0)
                remaining = end - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    reply = getattr(self.stub(address), method)(
                        request, timeout=min(per_try, remaining), metadata=self.metadata)
                    if not to:
                        self.leader = address
                    return reply
                except grpc.RpcError as exc:
                    code, details = exc.code(), exc.details() or ""
                    if code == grpc.StatusCode.UNAUTHENTICATED:
                        raise AuthError(code, f"{address}: {details}") from None
                    if code == grpc.StatusCode.PERMISSION_DENIED:
                        raise PermissionDenied(code, details) from None
                    if code == grpc.StatusCode.UNAVAILABLE and any(h in details.lower() for h in _TLS_FAILURE_HINTS):
                        raise TLSError(code, f"{address}: TLS failed: {details}") from None
                    hint = _leader_hint(exc)
                    if code == grpc.StatusCode.FAILED_PRECONDITION and hint and not to:
                        last_error = f"{address}: {details}"
                        failed.add(address)
                        if hint not in failed and redirects < 2 * len(self.addresses):
                            redirects += 1
                            if hint not in self.addresses:
                                self.addresses.append(hint)
                            self.leader = hint
                            order = [hint] + [a for a in order if a != hint]
                        continue
                    if code in _RETRY_CODES:
                        last_error = f"{address}: {code.name}: {details}"
                        failed.add(address)
                        if self.leader == address:
                            self.leader = None
                        continue
                    raise ClientError(code, details) from None
            if time.monotonic() >= end:
                hint = " (if the cluster uses TLS, pass its CA: --ca / SYNAPSE_CA)" \
                    if self.tls is None and "Socket closed" in last_error else ""
                raise ClusterUnavailable(f"no master answered within the deadline (last: {last_error}){hint}")
            time.sleep(min(pause * random.uniform(0.5, 1.5), max(0.0, end - time.monotonic())))
            pause = min(pause * 2, self.backoff[1])

    def stream(self, method: str, request: Any, *, timeout: float | None = None) -> tuple[str, Iterator[Any]]:
        """Open a server stream on the leader; returns (address, iterator). Redirects are followed
        by the caller: the iterator raises grpc.RpcError like any stream."""
        address = self.leader or self.addresses[0]
        return address, getattr(self.stub(address), method)(request, timeout=timeout, metadata=self.metadata)

    # ---- typed helpers -------------------------------------------------------------------------

    def submit(self, spec_proto: Any, request_id: str | None = None) -> str:
        request = api_pb2.SubmitJobRequest(request_id=request_id or new_request_id(), spec=spec_proto)
        return self.call("SubmitJob", request).job_id

    def get_job(self, job_id: str) -> api_pb2.JobInfo:
        return self.call("GetJob", api_pb2.GetJobRequest(job_id=job_id))

    def list_jobs(self, statuses: list[str] | None = None, page: int = 0, user: str = "") -> list[api_pb2.JobInfo]:
        """Every job (without events), oldest first, fetched a page at a time; `user`: only theirs."""
        out: list[api_pb2.JobInfo] = []
        after = ""
        while True:
            reply = self.call("ListJobs", api_pb2.ListJobsRequest(status=statuses or [], limit=page, after=after,
                                                                  user=user), try_timeout=LISTING_TRY_S)
            out += reply.jobs
            if not reply.next:
                return out
            after = reply.next

    def list_nodes(self) -> list[api_pb2.NodeInfo]:
        return list(self.call("ListNodes", api_pb2.ListNodesRequest(), try_timeout=LISTING_TRY_S).nodes)

    def cancel(self, job_id: str, reason: str = "") -> str:
        return self.call("CancelJob", api_pb2.CancelJobRequest(job_id=job_id, reason=reason)).status

    def replica_status(self, address: str, timeout: float = 2.0, digest: bool = False) -> api_pb2.ReplicaStatusReply:
        """One replica's own view; `digest` adds the state digest (a pass over the whole state)."""
        return self.call("ReplicaStatus", api_pb2.ReplicaStatusRequest(with_digest=digest), deadline=timeout,
                         to=address, try_timeout=timeout)
