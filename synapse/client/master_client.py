"""The one client of the master API: finds the leader, follows redirects, survives failovers.

Used by `synctl`, the worker and the tests. A call goes first to the replica last known to lead.
A redirect (FAILED_PRECONDITION with `synapse-leader` metadata) is followed at once. A replica that
is down, has no leader, or timed out sends the call to the next address, and after a full round of
failures the client backs off with jitter. All of this runs under one overall deadline, which a
client may cut short for a cluster that is not there at all (`absent_s`: see `Failover`). Retries
resend the same request, so a submission carries the same request id each time and creates exactly
one job, even if an earlier try was committed but its reply was lost. Authentication failures are
reported at once, never retried. Server streams (a worker's assignments, synctl's events) follow
the same policy (`Failover`) each time they break, and resume where they were.
"""

from __future__ import annotations

import logging
import math
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import grpc
from google.protobuf.message import Message

from synapse.common.auth import LEADER_METADATA_KEY, client_metadata
from synapse.common.tls import TLSFiles, channel_credentials
from synapse.proto import api_pb2, api_pb2_grpc, types_pb2

log = logging.getLogger(__name__)

#: gRPC backs off reconnecting to an address that refused (1 s, then 1.6 x up to 2 min by default),
#: and fails calls at once meanwhile: after a restart of every master, clients kept failing for
#: seconds against replicas that were serving again. Masters restart; retry the link quickly.
RECONNECT = (("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
             ("grpc.max_reconnect_backoff_ms", 500))
#: A try's budget: a replica that has not answered by then (a stalled leader) is left for the
#: next one. The others elect a leader within about 1 s of a stall; at 1.5 s, clients were the
#: last to learn of it (chaos `pause-leader`: the first write came 0.6 s after the new leader was ready).
TRY_S = 1.0
#: A try's budget for the listings, which carry a whole cluster's jobs or nodes.
LISTING_TRY_S = 10.0
#: A replica that let a try run out is a suspect for this long (longer than an election): it is
#: tried last in each round, and with a short budget, since it is likely stalled (SIGSTOP, a
#: machine swapping). Chaos `pause-leader` showed why: every round began again with the paused
#: leader and spent a whole try on it, a second after the others had a leader. An answer clears it.
SUSPECT_S = 3.0
#: A short call's first budget on a suspect: enough for a live leader's commit, little to lose on a
#: stalled one. It doubles at each try on it within one call, up to the full budget, so a slow but
#: live leader wrongly suspected still answers.
SUSPECT_TRY_S = 0.25

#: Codes after which another replica (or the same one later) may succeed. RESOURCE_EXHAUSTED (a
#: full disk or command queue) is the leader's own answer: every replica would send us back to it,
#: so it goes to the caller.
_RETRY_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                          grpc.StatusCode.CANCELLED})
#: A stream also ends FAILED_PRECONDITION, without naming a leader, when its replica stops leading
#: (endpoints' WatchAssignments): the new leader is elsewhere. For a call that code is the domain's no.
_STREAM_RETRY_CODES = _RETRY_CODES | {grpc.StatusCode.FAILED_PRECONDITION}


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
#: ... unless the handshake was cut short, not refused: the try's deadline passed or the replica's
#: end closed mid-handshake (a loaded machine: "Handshake read failed (Shutting down endpoint)",
#: "(Endpoint closing)", "tcp handshaker shutdown"; a replica killed or restarting meanwhile:
#: "(recvmsg:Connection reset by peer (104))"). Those are retried like any unavailable replica.
_HANDSHAKE_CUT_HINTS = ("shutting down endpoint", "endpoint closing", "handshaker shutdown", "connection reset by peer")


class ClusterUnavailable(Exception):
    """No replica answered usefully before the deadline."""


class NoMaster(ClusterUnavailable):
    """No master address has a listener or a host that resolves, for the client's `absent_s`."""


class UnknownHosts(NoMaster):
    """No master address names a host that resolves: most likely a typing error, not an outage."""


#: gRPC's words (in an UNAVAILABLE error's details, its only sign of either) for an address where
#: nothing listens, and for one whose host does not resolve. Matched here alone (`_absence`).
_REFUSED_HINTS = ("connection refused",)
_UNRESOLVED_HINTS = ("errors resolving", "dns resolution failed")


def _absence(code: grpc.StatusCode, details: str) -> str:
    """'refused' or 'unresolved' when a failed try found no master at its address at all, else ''."""
    if code != grpc.StatusCode.UNAVAILABLE:
        return ""
    text = details.lower()
    if any(h in text for h in _UNRESOLVED_HINTS):
        return "unresolved"
    return "refused" if any(h in text for h in _REFUSED_HINTS) else ""


def new_request_id() -> str:
    return uuid.uuid4().hex


def job_request(spec_proto: types_pb2.JobSpec, request_id: str | None = None, secrets: Mapping[str, str] | None = None,
                hold: bool = False) -> api_pb2.SubmitJobRequest:
    """One job's submission (`MasterClient.submit_job`, one of `submit_jobs`): a new request id unless given."""
    return api_pb2.SubmitJobRequest(request_id=request_id or new_request_id(), spec=spec_proto, secrets=secrets or {},
                                    hold=hold)


def parse_addresses(text: str | list[str]) -> list[str]:
    items = text if isinstance(text, list) else text.split(",")
    return [a.strip() for a in items if a.strip()]


_HOST_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+(%[\w.-]+)?\]|[A-Za-z0-9_.-]+)$")


def address_problem(address: str) -> str:
    """Why `address` cannot be a master's API address (host:port, [IPv6]:port), or ''."""
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        return f"{address!r}: expected host:port"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"{address!r}: the port must be a number from 1 to 65535"
    if not _HOST_RE.match(host):
        return f"{address!r}: {host!r} is not a host name or IP address"
    return ""


def leader_hint(error: grpc.RpcError) -> str:
    """The leader's API address a replica named in the error's trailing metadata, or ""."""
    try:
        # (key, value) pairs at run time; typeshed's _Metadatum names only their attributes
        pairs = cast("tuple[tuple[str, str | bytes], ...]", error.trailing_metadata() or ())
        for key, value in pairs:
            if key == LEADER_METADATA_KEY:
                return str(value)
    except Exception:  # noqa: BLE001 - some errors carry no metadata at all
        pass
    return ""


class Failover:
    """One call's way through the replicas (or one stream's, reconnection after reconnection).

    Which replica a try goes to is the whole leader-following policy, kept here once for calls and
    streams alike: the leader last seen first, then the other addresses in order; a redirect
    (FAILED_PRECONDITION naming the leader, endpoints' answer from a follower) puts the named
    leader next at once; a replica that is down, has no leader or timed out passes the try to the
    next one; after a full round of failures a jittered pause, doubling up to the client's largest;
    all under one deadline (None: until `stop` is set). What retrying cannot mend is raised.

    A cluster that is not there is given up on before the deadline when the client asks so
    (`MasterClient.absent_s`): once every address the call may use has refused the connection or
    named a host that does not resolve, and no try found anything else, for `absent_s` seconds,
    and no master has ever answered this client. A master restarting refuses for a moment, so a
    client that has heard from the cluster keeps trying to the deadline, and so does a call that
    reaches any master at all (one without a leader, mid-election, answers UNAVAILABLE but accepts
    the connection). Raises UnknownHosts when no address resolved, else NoMaster.
    """

    def __init__(self, client: MasterClient, deadline: float | None, *, to: str | None = None,
                 leader: bool = True, stop: threading.Event | None = None,
                 retry: frozenset[grpc.StatusCode] = _RETRY_CODES,
                 order: Callable[[], list[str]] | None = None) -> None:
        self.client = client  #: whose addresses, leader, backoff and credentials the tries use
        self.to = to  #: the one replica a per-replica read goes to, or None
        #: the replicas to try in this order, asked afresh each round (a worker's link shard first), or None
        self.preferred = order
        #: an answer comes from the leader, and a redirect is followed
        self.follows_leader = leader and not to and order is None
        self.budget = deadline  #: seconds to keep trying (after a stream's last message), or None
        self.end = None if deadline is None else time.monotonic() + deadline
        self.stop = stop  #: when set, no further try starts and pauses end
        self.retry = retry  #: codes after which another replica (or this one later) may succeed
        self.pause = client.backoff[0]  #: the next pause after a failed round
        self.served: str | None = None  #: the replica that last served a stream any replica may serve
        self.last_error = "no replica tried"
        self.order: list[str] = []  #: this round's addresses still to try
        self.failed: set[str] = set()  #: addresses that failed in this round: hints to them are stale
        self.redirects = 0  #: redirects followed in this round (bounded: hints may be stale)
        self.suspect_budget: dict[str, float] = {}  #: a suspect's next try budget in this call
        #: address -> how its latest try found no master there ('refused', 'unresolved'), for every
        #: address tried since `absent_since` (when tries began to find nothing, and only nothing)
        self.absent: dict[str, str] = {}
        self.absent_since: float | None = None
        self._new_round()

    def _new_round(self) -> None:
        first = self.client.leader if self.follows_leader else self.served
        if self.preferred is not None:
            self.order = list(self.preferred())
        else:
            self.order = [self.to] if self.to else ([first] if first else []) + [
                a for a in self.client.addresses if a != first]
        suspects = self.client.suspected()
        self.order.sort(key=lambda a: a in suspects)  # stable: the rest keep their order
        self.failed = set()
        self.redirects = 0

    def budget_for(self, address: str, per_try: float) -> float:
        """One try's budget on `address`: short on a suspect (SUSPECT_TRY_S, doubling at each try on
        it), unless the call needs long tries (listings); never beyond the call's deadline."""
        budget = per_try
        if per_try <= TRY_S and address in self.client.suspected():
            budget = self.suspect_budget.get(address, SUSPECT_TRY_S)
            self.suspect_budget[address] = min(2 * budget, per_try)
        return min(budget, per_try, self.remaining())

    def remaining(self) -> float:
        return math.inf if self.end is None else self.end - time.monotonic()

    def _stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def next(self) -> str | None:
        """The address to try next, after a pause if a whole round failed; None once the deadline
        has passed or `stop` is set."""
        while not self._stopped():
            if self.remaining() <= 0:
                return None
            if self.order:
                return self.order.pop(0)
            pause = min(self.pause * random.uniform(0.5, 1.5), max(0.0, self.remaining()))
            if self.stop is not None:
                self.stop.wait(pause)
            else:
                time.sleep(pause)
            self.pause = min(self.pause * 2, self.client.backoff[1])
            self._new_round()
        return None

    def succeeded(self, address: str) -> None:
        """`address` answered: it is the leader, unless any replica may answer."""
        self.client.answered = address
        self.client.suspects.pop(address, None)
        if self.to:
            return
        if self.follows_leader:
            self.client.leader = address
        else:
            self.served = address

    def held(self, address: str) -> None:
        """A stream from `address` worked (it delivered, or stayed open past a try's budget): when it
        breaks, the deadline and the pause start afresh, and the next try goes on to the others."""
        if self.budget is not None:
            self.end = time.monotonic() + self.budget
        self.pause = self.client.backoff[0]
        self._found(address, "")
        self._new_round()
        self.order = [a for a in self.order if a != address]

    def failed_try(self, address: str, error: grpc.RpcError) -> None:
        """Judge a failed try: raise what retrying cannot mend, else choose where the next try goes."""
        code, details = error.code(), error.details() or ""
        if code == grpc.StatusCode.UNAUTHENTICATED:
            raise AuthError(code, f"{address}: {details}") from None
        if code == grpc.StatusCode.PERMISSION_DENIED:
            raise PermissionDenied(code, details) from None
        if code == grpc.StatusCode.UNAVAILABLE and any(h in details.lower() for h in _TLS_FAILURE_HINTS) \
                and not any(h in details.lower() for h in _HANDSHAKE_CUT_HINTS):
            raise TLSError(code, f"{address}: TLS failed: {details}") from None
        self._found(address, _absence(code, details))
        hint = leader_hint(error)
        # A call in a given order follows a redirect too: a replica of an older release sends a
        # worker's heartbeat to the leader (masters are upgraded before their workers, or not).
        if code == grpc.StatusCode.FAILED_PRECONDITION and hint and (self.follows_leader or self.preferred):
            self.last_error = f"{address}: {details}"
            self.failed.add(address)
            if hint not in self.failed and self.redirects < 2 * len(self.client.addresses):
                self.redirects += 1
                if hint not in self.client.addresses:
                    self.client.addresses.append(hint)
                self.client.leader = hint
                self.order = [hint] + [a for a in self.order if a != hint]
            return
        if code in self.retry:
            self.last_error = f"{address}: {code.name}: {details}"
            self.failed.add(address)
            if self.client.leader == address:
                self.client.leader = None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and self.remaining() > 0:
                self.client.suspects[address] = time.monotonic() + SUSPECT_S  # its try ran out, not the call
            return
        raise ClientError(code, details) from None

    def _found(self, address: str, absence: str) -> None:
        """Note what a try found at `address` ('': something answered); give up on a cluster that
        is not there (the class docstring has the rule)."""
        if not absence:
            self.absent, self.absent_since = {}, None
            return
        now = time.monotonic()
        self.absent_since = now if self.absent_since is None else self.absent_since
        self.absent[address] = absence
        usable = {self.to} if self.to else set(self.client.addresses)
        limit = self.client.absent_s
        if limit is None or self.client.answered is not None or not usable <= set(self.absent) \
                or now - self.absent_since < limit:
            return
        found = ", ".join(f"{a} {self.absent[a]}" for a in sorted(usable))
        if all(self.absent[a] == "unresolved" for a in usable):
            raise UnknownHosts(f"no master address names a host that resolves ({found})") from None
        raise NoMaster(f"no master accepts connections: for {now - self.absent_since:.1f} s every address "
                       f"refused or did not resolve ({found}); is the cluster up, and are these its API "
                       "addresses?") from None

    def unavailable(self) -> ClusterUnavailable:
        """The error for a deadline that passed without an answer."""
        hint = " (if the cluster uses TLS, pass its CA: --ca / SYNAPSE_CA)" \
            if self.client.tls is None and "Socket closed" in self.last_error else ""
        return ClusterUnavailable(f"no master answered within the deadline (last: {self.last_error}){hint}")


class MasterClient:
    """A failover-aware client for a list of master API addresses."""

    def __init__(self, addresses: str | list[str], token: str = "", *, deadline: float = 30.0,
                 try_timeout: float = TRY_S, backoff: tuple[float, float] = (0.05, 0.25),
                 tls: TLSFiles | None = None, absent_s: float | None = None) -> None:
        self.addresses = parse_addresses(addresses)  #: a redirect to a leader not listed adds it
        if not self.addresses:
            raise ValueError("no master addresses given")
        self.metadata = client_metadata(token)  #: sent on every call (a worker adds its node credential)
        self.tls = tls if tls is not None and tls.enabled else None
        self.deadline = deadline  #: overall time budget of one call, retries included
        self.try_timeout = try_timeout  #: budget of one try
        self.backoff = backoff  #: (first, largest) pause after a full round of failures
        #: give up on a cluster that is not there after this long (Failover), or None: never (a
        #: worker or a test waits for masters that are still starting)
        self.absent_s = absent_s
        self.leader: str | None = None  #: the address that last answered as leader
        self.answered: str | None = None  #: the address that last answered a call or a stream
        #: address -> monotonic time until which it is a suspect (a try to it ran out; SUSPECT_S)
        self.suspects: dict[str, float] = {}
        self._channels: dict[str, grpc.Channel] = {}

    def suspected(self) -> set[str]:
        """The addresses that are suspects now (SUSPECT_S)."""
        now = time.monotonic()
        return {a for a, until in list(self.suspects.items()) if until > now}  # other threads add to it

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

    def call(self, method: str, request: Message, *, deadline: float | None = None, to: str | None = None,
             try_timeout: float | None = None, order: Callable[[], list[str]] | None = None) -> Any:
        """Call `method` on the leader (or on `to` only, for per-replica reads; or on the first of
        `order()` that answers, for calls any replica serves), with failover; its reply, which the
        caller types (the RPC is named by a string: the typed helpers below name their replies).
        A try that gets no answer within `try_timeout` (a leader whose process stalls) moves on to
        the next replica: the short default bounds an outage; large listings pass a longer one."""
        tries = Failover(self, deadline if deadline is not None else self.deadline, to=to, order=order)
        per_try = try_timeout or self.try_timeout
        while (address := tries.next()) is not None:
            try:
                reply = getattr(self.stub(address), method)(
                    request, timeout=tries.budget_for(address, per_try), metadata=self.metadata)
            except grpc.RpcError as exc:
                tries.failed_try(address, exc)
                continue
            tries.succeeded(address)
            return reply
        raise tries.unavailable()

    def watch(self, method: str, request: Callable[[], Message], *, leader: bool = True,
              deadline: float | None = None, try_timeout: float | None = None,
              stop: threading.Event | None = None, order: Callable[[], list[str]] | None = None,
              jitter: float = 0.0) -> Iterator[Any]:
        """Hold a server stream open across failovers and yield its messages; ends when the stream does.

        `request()` builds the request for each (re)connection, so a caller resumes where it was.
        `leader`: only the leader serves the stream (else any replica; `order()`: which first).
        `deadline`: how long to try without a message (None: until `stop` is set); `try_timeout`: a
        bound on one stream. `jitter`: a stream that broke after delivering is reopened after a
        random pause of up to that many seconds, so thousands of workers whose replica died do not
        all come back in the same instant."""
        tries = Failover(self, deadline, leader=leader, stop=stop, retry=_STREAM_RETRY_CODES, order=order)
        delivered = False
        while (address := tries.next()) is not None:
            if delivered and jitter > 0:
                delivered = False
                pause = random.uniform(0, jitter)
                if stop is not None:
                    stop.wait(pause)
                else:
                    time.sleep(pause)
            timeout = None if try_timeout is None else min(try_timeout, tries.remaining())
            stream = getattr(self.stub(address), method)(request(), timeout=timeout, metadata=self.metadata)
            opened = time.monotonic()
            try:
                for message in stream:
                    tries.succeeded(address)
                    tries.held(address)
                    delivered = True
                    yield message
                return
            except grpc.RpcError as exc:
                # A stream without a time limit may stay quiet for long (no events to send): one
                # that stayed open past a try's budget was held, and its break must not find the
                # deadline long spent. (A bounded stream counts as held by its messages only.)
                if try_timeout is None and time.monotonic() - opened > self.try_timeout:
                    tries.held(address)
                tries.failed_try(address, exc)
            finally:
                stream.cancel()
        if not (stop is not None and stop.is_set()):
            raise tries.unavailable()

    # ---- typed helpers -------------------------------------------------------------------------

    def submit(self, spec_proto: types_pb2.JobSpec, request_id: str | None = None) -> str:
        return self.submit_job(spec_proto, request_id).job_id

    def submit_job(self, spec_proto: types_pb2.JobSpec, request_id: str | None = None,
                   secrets: Mapping[str, str] | None = None, hold: bool = False) -> api_pb2.SubmitJobReply:
        """Submit (with the job's `secrets` by name, which the masters seal; `hold`: queued but held
        until released); the reply has the job id and what the job was accepted with but not as asked."""
        reply: api_pb2.SubmitJobReply = self.call("SubmitJob", job_request(spec_proto, request_id, secrets, hold))
        return reply

    def submit_jobs(self, requests: Sequence[api_pb2.SubmitJobRequest]) -> list[api_pb2.SubmitJobReply]:
        """Submit several jobs (each built by `job_request`, with its own request id) in one request
        and one log entry: every one, or none if the master refuses one (ClientError naming it: "job
        K of N (name): ..."). One reply per job, in order. A master of a release without SubmitJobs
        gets one SubmitJob each (by their request ids, so a retry after a failure is safe); so does a
        lone job, whose refusal then reads as `submit_job`'s."""
        if len(requests) == 1:
            return [self.call("SubmitJob", requests[0])]
        try:
            reply: api_pb2.SubmitJobsReply = self.call("SubmitJobs", api_pb2.SubmitJobsRequest(jobs=requests))
        except ClientError as exc:
            if exc.code != grpc.StatusCode.UNIMPLEMENTED:
                raise
            return [self.call("SubmitJob", request) for request in requests]
        return list(reply.jobs)

    def start_step(self, alloc_id: str, spec_proto: Any, request_id: str | None = None) -> str:
        """Start a step in a running allocation (synapse.client.steps); its job id (`<alloc_id>.<k>`)."""
        request = api_pb2.StartStepRequest(alloc_id=alloc_id, spec=spec_proto,
                                           request_id=request_id or new_request_id())
        return str(self.call("StartStep", request).step_id)

    def get_job(self, job_id: str, applied: bool = False) -> api_pb2.JobInfo:
        """The job as the leader knows it: after a barrier (a linearizable read), or with `applied`
        from what it has applied (for what does not change: one Raft write less)."""
        job: api_pb2.JobInfo = self.call("GetJob", api_pb2.GetJobRequest(job_id=job_id, applied=applied))
        return job

    def list_jobs(self, statuses: list[str] | None = None, page: int = 0, user: str = "",
                  alloc_id: str = "") -> list[api_pb2.JobInfo]:
        """Every job (without events), oldest first, fetched a page at a time; `user`: only theirs;
        `alloc_id`: only that allocation's steps."""
        out: list[api_pb2.JobInfo] = []
        after = ""
        while True:
            reply = self.call("ListJobs", api_pb2.ListJobsRequest(status=statuses or [], limit=page, after=after,
                                                                  user=user, alloc_id=alloc_id),
                              try_timeout=LISTING_TRY_S)
            out += reply.jobs
            if not reply.next:
                return out
            after = reply.next

    def list_nodes(self) -> list[api_pb2.NodeInfo]:
        return list(self.call("ListNodes", api_pb2.ListNodesRequest(), try_timeout=LISTING_TRY_S).nodes)

    def cancel(self, job_id: str, reason: str = "") -> str:
        reply: api_pb2.CancelJobReply = self.call("CancelJob", api_pb2.CancelJobRequest(job_id=job_id, reason=reason))
        return reply.status

    def replica_status(self, address: str, timeout: float = 2.0, digest: bool = False) -> api_pb2.ReplicaStatusReply:
        """One replica's own view; `digest` adds the state digest (a pass over the whole state)."""
        reply: api_pb2.ReplicaStatusReply = self.call("ReplicaStatus", api_pb2.ReplicaStatusRequest(with_digest=digest),
                                                      deadline=timeout, to=address, try_timeout=timeout)
        return reply
