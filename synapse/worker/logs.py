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
    """Streams a task's log file from an offset, following it while the task runs."""

    CHUNK = 64 << 10

    def __init__(self, agent: Served) -> None:
        self.agent = agent

    def ReadLog(self, request: api_pb2.ReadLogRequest, context: grpc.ServicerContext) -> Iterator[api_pb2.LogChunk]:
        """A task's log, for a caller with a ticket for that very task (from the masters' LogAccess,
        which gives one to the job's owner and to admins) or with the cluster token."""
        if not request.job_id or "/" in request.job_id or request.job_id.startswith("."):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "job_id: invalid")
        presented = str(dict(context.invocation_metadata()).get(METADATA_KEY, ""))
        cluster = bool(self.agent.token) and hmac.compare_digest(presented.encode(),
                                                                 f"Bearer {self.agent.token}".encode())
        if not cluster and (not self.agent.open_cluster or request.ticket):
            if not request.ticket:
                context.abort(grpc.StatusCode.UNAUTHENTICATED,
                              "a log ticket is needed (synctl logs asks the masters for one)")
            why = tickets.problem(self.agent.node_credential, request.ticket, request.job_id, request.attempt,
                                  request.index, time.time())
            if why:
                context.abort(grpc.StatusCode.PERMISSION_DENIED, f"permission denied: {why}")
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


def serve_logs(agent: Served, address: str, port: int, tls: TLSFiles | None) -> tuple[grpc.Server, int]:
    """The log service: over TLS with this worker's certificate when it has one (clients check
    that the certificate names this node), else in the clear as the rest of such a cluster is."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="logs"))
    api_pb2_grpc.add_WorkerServicer_to_server(LogService(agent), server)
    host = address.rpartition(":")[0] if ":" in address else address
    bind = f"{host or '127.0.0.1'}:{port}"
    ca, cert, key = tls.read() if tls is not None and tls.enabled else (b"", None, None)
    if cert is not None and key is not None:
        bound = server.add_secure_port(bind, grpc.ssl_server_credentials([(key, cert)], root_certificates=ca))
    else:
        bound = server.add_insecure_port(bind)
    server.start()
    return server, bound
