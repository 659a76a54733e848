"""The worker's log service: a task's log file streamed from an offset, followed while the task
runs, to a caller with a ticket for that very task or the cluster token."""

from __future__ import annotations

import hmac
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Protocol

import grpc

from synapse.common import tickets
from synapse.common.auth import METADATA_KEY
from synapse.common.tls import TLSFiles
from synapse.proto import api_pb2, api_pb2_grpc
from synapse.worker.runtime import ProcessRuntime
from synapse.worker.state import StateView


class Served(Protocol):
    """What the log service reads of the agent (synapse.worker.agent.WorkerAgent)."""

    node_id: str
    token: str  #: the cluster token ("" if none)
    open_cluster: bool  #: no credential of any kind: logs need no ticket
    node_credential: str  #: checks log tickets
    runtime: ProcessRuntime  #: where the logs are
    view: StateView  #: the main loop's copy of the state (read on the service's threads)


class LogService(api_pb2_grpc.WorkerServicer):
    """Streams a task's log file from an offset, following it while the task runs (the Worker
    service's ReadLog; synapse.worker.attach.AttachService serves the rest)."""

    CHUNK = 64 << 10

    def __init__(self, agent: Served) -> None:
        self.agent = agent

    def ReadLog(self, request: api_pb2.ReadLogRequest, context: grpc.ServicerContext) -> Iterator[api_pb2.LogChunk]:
        """A task's log, for a caller with a ticket for that very task (from the masters' LogAccess,
        which gives one to the job's owner and to admins) or with the cluster token."""
        authorize(self.agent, context, request.job_id, request.attempt, request.index, request.ticket, tickets.LOG)
        path = self.agent.runtime.log_path(request.job_id, request.attempt, request.index)
        if not path.exists():
            context.abort(grpc.StatusCode.NOT_FOUND, f"no log for task {request.index} of job {request.job_id} "
                                                     f"attempt {request.attempt} on {self.agent.node_id}")
        offset = max(0, request.offset)
        key = (request.job_id, request.attempt, request.index)
        with open(path, "rb") as f:
            while context.is_active():
                f.seek(offset)
                data = f.read(self.CHUNK)
                if data:
                    offset += len(data)
                    yield api_pb2.LogChunk(data=data, offset=offset)
                    continue
                if not request.follow or (key not in self.agent.view.tasks):
                    return
                time.sleep(0.2)


def authorize(agent: Served, context: grpc.ServicerContext, job_id: str, attempt: int, index: int, ticket: str,
              purpose: str) -> None:
    """Abort the call unless it may do `purpose` (synapse.common.tickets) on this task: a ticket the
    masters signed for it, or the cluster token; an open cluster (no credential at all) needs no
    ticket for a log, and checks one it is given."""
    if not job_id or "/" in job_id or job_id.startswith("."):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "job_id: invalid")
    presented = str(dict(context.invocation_metadata()).get(METADATA_KEY, ""))
    cluster = bool(agent.token) and hmac.compare_digest(presented.encode(), f"Bearer {agent.token}".encode())
    if cluster or (agent.open_cluster and not ticket):
        return
    if not ticket:
        what = "log" if purpose == tickets.LOG else purpose.partition("\x1f")[0]
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      f"a {what} ticket is needed (synctl asks the masters for one)")
    why = tickets.problem(agent.node_credential, ticket, job_id, attempt, index, time.time(), purpose)
    if why:
        context.abort(grpc.StatusCode.PERMISSION_DENIED, f"permission denied: {why}")


#: Threads serving the worker's streams: each followed log, attach or exec holds one while it lasts.
MAX_STREAMS = 32


def serve_logs(servicer: api_pb2_grpc.WorkerServicer, address: str, port: int,
               tls: TLSFiles | None) -> tuple[grpc.Server, int]:
    """The worker's service (synapse.worker.attach.AttachService: logs, attach, exec): over TLS with
    this worker's certificate when it has one (clients check that the certificate names this node),
    else in the clear as the rest of such a cluster is."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=MAX_STREAMS, thread_name_prefix="logs"))
    api_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    host = address.rpartition(":")[0] if ":" in address else address
    bind = f"{host or '127.0.0.1'}:{port}"
    ca, cert, key = tls.read() if tls is not None and tls.enabled else (b"", None, None)
    if cert is not None and key is not None:
        bound = server.add_secure_port(bind, grpc.ssl_server_credentials([(key, cert)], root_certificates=ca))
    else:
        bound = server.add_insecure_port(bind)
    server.start()
    return server, bound
