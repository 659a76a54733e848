"""A worker's own metrics and liveness, served over HTTP when `--http` gives it an address.

    GET /metrics   tasks by phase, task start latency, exits by outcome, heartbeat round trip
    GET /livez     200 while the agent runs

No label carries a job, task or node id (Prometheus adds the instance). GET only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from synapse.worker.beats import DatagramBeats
from synapse.worker.state import StateView

PHASES = ("starting", "running", "stopping")


class Observed(Protocol):
    """What the metrics read of the agent (synapse.worker.agent.WorkerAgent, which imports this)."""

    view: StateView  #: the main loop's copy of the state (the metrics are read on the HTTP server's threads)
    heartbeat_ok: bool
    datagrams: DatagramBeats | None  #: None when the worker sends none


class _Tasks(Collector):
    def __init__(self, agent: Observed) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("synapse_worker_tasks", "tasks on this worker by phase", labels=["phase"])
        counts = dict.fromkeys(PHASES, 0)
        for phase in self.agent.view.phases:
            counts[phase] = counts.get(phase, 0) + 1
        for phase in PHASES:
            family.add_metric([phase], counts[phase])
        yield family
        connected = GaugeMetricFamily("synapse_worker_master_connected", "1 if the last heartbeat was answered")
        connected.add_metric([], 1 if self.agent.heartbeat_ok else 0)
        yield connected
        if self.agent.datagrams is not None:
            yield CounterMetricFamily("synapse_worker_heartbeat_datagrams_answered",
                                      "heartbeats answered by datagram (the rest went by call)",
                                      value=self.agent.datagrams.answered)


class WorkerMetrics:
    """The registry a worker serves and what its agent loop updates."""

    def __init__(self, agent: Observed) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_Tasks(agent))
        self.task_start = Histogram("synapse_worker_task_start_seconds", "assignment seen to process started",
                                    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
                                    registry=self.registry)
        self.exits = Counter("synapse_worker_task_exits", "task ends by outcome: succeeded, failed, oom_killed, "
                             "killed, start_failed", ["outcome"], registry=self.registry)
        self.reports = Counter("synapse_worker_task_reports", "task starts and ends the master acknowledged "
                               "(each once, unless an acknowledgement was lost)", registry=self.registry)
        self.heartbeat = Histogram("synapse_worker_heartbeat_seconds", "heartbeat round trip to the leader",
                                   buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
                                   registry=self.registry)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        if self.path == "/metrics":
            body, kind, code = generate_latest(self.server.metrics.registry), CONTENT_TYPE_LATEST, 200
        elif self.path == "/livez":
            body, kind, code = b"ok\n", "text/plain", 200
        else:
            body, kind, code = b"not found\n", "text/plain", 404
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _refuse(self) -> None:
        self.send_response(405)
        self.send_header("Allow", "GET")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], metrics: WorkerMetrics) -> None:
        super().__init__(address, _Handler)
        self.metrics = metrics


def serve(address: str, metrics: WorkerMetrics) -> tuple[_Server, str]:
    """Start the HTTP server on `address` (port 0: any free one); returns it and where it listens."""
    host, _, port = address.rpartition(":")
    server = _Server((host or "127.0.0.1", int(port or 0)), metrics)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server, f"{host or '127.0.0.1'}:{server.server_address[1]}"
