"""The worker's threads that talk to the masters: registration, the heartbeat (which renews the
node's lease), the assignment watch, the task reports, the pull-progress and image-cache reports,
and the health and GPU-error checks whose changes the heartbeat carries. None of them changes the
worker's state: they read the main loop's published `view` and put events on its queue."""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path

from synapse.client.master_client import AuthError, ClientError, ClusterUnavailable, MasterClient, PermissionDenied
from synapse.common.auth import client_metadata, node_metadata
from synapse.core import codec
from synapse.core.brain.heartbeat import GpuErrorReport
from synapse.core.model import Resources
from synapse.images.store import ImageStore
from synapse.proto import api_pb2
from synapse.rpc import convert
from synapse.worker import state as ws
from synapse.worker.beats import DatagramBeats, DatagramReports
from synapse.worker.gpu_errors import GpuWatch
from synapse.worker.health import HealthCheck
from synapse.worker.lease import Lease, save_credential
from synapse.worker.observe import WorkerMetrics
from synapse.worker.progress import ProgressWatcher
from synapse.worker.pulls import Pulls

log = logging.getLogger(__name__)

#: Pauses before the assignment stream is opened again after it ended, or was refused. A watch that
#: is merely cut off (a replica down, a new leader) is reopened by the client on its own.
WATCH_REOPEN_S = 0.05
WATCH_REFUSED_S = 1.0
#: Seconds between two listings of the node's image store to the leader (`synctl get nodes -o wide`).
CACHE_REPORT_S = 10.0


class Uplink:
    """The agent's threads to the masters (a mixin of synapse.worker.agent.WorkerAgent, whose
    attributes these are; each loop runs on a thread of its own until `stopping` is set)."""

    node_id: str
    address: str
    topology: tuple[str, ...]
    capacity: Resources
    labels: dict[str, str]
    isolation: str
    token: str
    join_token: str
    node_credential: str
    data_dir: Path
    heartbeat_interval: float
    drain_on_failure: bool
    health: HealthCheck | None
    healthy: bool
    health_message: str
    gpu_watch: GpuWatch | None
    gpu_errors: tuple[GpuErrorReport, ...]
    heartbeat_ok: bool
    images: ImageStore | None
    pulls: Pulls
    lease: Lease
    view: ws.StateView
    progress: ProgressWatcher
    metrics: WorkerMetrics
    events: queue.Queue[object]  #: the main loop's queue of events
    stopping: threading.Event
    heartbeat_now: threading.Event
    shard_moved: threading.Event
    reports_ready: threading.Event
    datagrams: DatagramBeats | None
    report_datagrams: DatagramReports | None
    client: MasterClient
    watch_client: MasterClient
    report_client: MasterClient
    replica_order: list[str]

    def _use_credential(self) -> None:
        """Every call carries the node's id and credential (and the cluster token, if given one)."""
        metadata = client_metadata(self.token)
        if self.node_credential:
            metadata += node_metadata(self.node_id, self.node_credential)
        for client in (self.client, self.watch_client, self.report_client):
            client.metadata = metadata

    def _register(self) -> None:
        """Register (again) as this node: with its own credential once it has one, the first time
        with the join token (or the cluster token, where the operator still gives one)."""
        request = api_pb2.RegisterNodeRequest(node_id=self.node_id, address=self.address,
                                              topology=list(self.topology),
                                              capacity=codec.resources_to_proto(self.capacity),
                                              labels=self.labels, isolation=self.isolation)
        joining = not self.node_credential and not self.token and bool(self.join_token)
        if joining:  # only before the other threads start: a node with no credential yet has none running
            self.client.metadata = client_metadata(self.join_token)
        while not self.stopping.is_set():
            try:
                sent = time.monotonic()
                reply = self.client.call("RegisterNode", request, deadline=10.0)
                self.lease.renew(sent, reply)
                if reply.node_credential != self.node_credential:
                    save_credential(self.data_dir, self.node_id, reply.node_credential)
                    self.node_credential = reply.node_credential
                    self._use_credential()
                log.info("registered node=%s status=%s address=%s with=%s", self.node_id, reply.status, self.address,
                         "join-token" if joining else "credential" if not self.token else "cluster-token")
                return
            except (AuthError, PermissionDenied):
                raise
            except (ClientError, ClusterUnavailable) as exc:
                log.warning("registration failed node=%s error=%s; retrying", self.node_id, exc)
                self.stopping.wait(1.0)

    def replicas_in_order(self) -> list[str]:
        """Where this node's heartbeats and watch go: its shard, then the others in the order the
        masters gave (synapse.core.shards: the workers of a replica that died spread over the
        others, the leader last), then any replica that order does not name."""
        order = self.replica_order
        return order + [a for a in self.client.addresses if a not in order]

    def _watch_loop(self) -> None:
        """Hold the assignment stream from the node's shard (any replica serves it); the client moves
        it elsewhere when it breaks, and the loop moves it back when the shard changes."""
        def request() -> api_pb2.WatchAssignmentsRequest:
            term, version = self.view.known
            return api_pb2.WatchAssignmentsRequest(node_id=self.node_id, known_term=term, known_version=version)

        while not self.stopping.is_set():
            pause = WATCH_REOPEN_S
            self.shard_moved.clear()
            try:
                for message in self.watch_client.watch("WatchAssignments", request, stop=self.stopping,
                                                       order=self.replicas_in_order,
                                                       jitter=2 * self.heartbeat_interval):
                    self.events.put(ws.AssignmentsReceived(
                        message.term, message.version,
                        tuple(convert.assignment_from_proto(a) for a in message.tasks), message.node_status))
                    if self.stopping.is_set():
                        return
                    if self.shard_moved.is_set():
                        break  # reopen at the new shard (the next message, at the latest, says so)
            except AuthError as exc:
                log.error("watch refused: %s", exc.message)
                pause = WATCH_REFUSED_S
            except ClientError as exc:
                log.warning("watch failed node=%s error=%s; retrying", self.node_id, exc.message)
                pause = WATCH_REFUSED_S
            self.stopping.wait(pause)

    def _heartbeat_loop(self) -> None:
        """One heartbeat per interval to the node's shard (sooner as the lease nears its end), by
        datagram first (synapse.worker.beats), by call when that is not answered: each answer
        renews the lease; the reply's order of replicas moves the shard; an unknown node
        registers again."""
        answered = True
        while not self.stopping.is_set():
            self.heartbeat_now.wait(self.lease.next_heartbeat_in(answered, self.heartbeat_interval))
            self.heartbeat_now.clear()
            if self.stopping.is_set():
                return
            try:
                sent = time.monotonic()
                request = api_pb2.HeartbeatRequest(node_id=self.node_id, unhealthy=not self.healthy,
                                                   health_message=self.health_message,
                                                   drain_on_failure=self.drain_on_failure,
                                                   gpu_errors=convert.gpu_errors_to_proto(self.gpu_errors))
                shard = self.replica_order[0]
                reply = self.datagrams.beat(shard, request) if self.datagrams is not None else None
                if reply is not None:
                    self.client.answered = shard  # what a call's answer says: the shard answers
                else:
                    reply = self.client.call("Heartbeat", request, deadline=max(self.heartbeat_interval, 1.0),
                                             order=self.replicas_in_order)
                self.lease.renew(sent, reply)
                answered = True
                self.metrics.heartbeat.observe(time.monotonic() - sent)
                self.heartbeat_ok = True
                self._follow_shard(reply)
                if reply.node_status == "UNKNOWN":
                    self._register()
            except (ClientError, ClusterUnavailable) as exc:
                self.heartbeat_ok = answered = False
                log.warning("heartbeat failed node=%s error=%s", self.node_id, exc)

    def _follow_shard(self, reply: api_pb2.HeartbeatReply) -> None:
        """(heartbeat thread) Take the order of replicas a heartbeat's reply gives; the watch moves
        when the node's shard changes, or answers again."""
        if reply.order and list(reply.order) != self.replica_order:
            if reply.order[0] != self.replica_order[0]:
                log.info("link shard node=%s from=%s to=%s", self.node_id, self.replica_order[0], reply.order[0])
                self.shard_moved.set()
            self.client.addresses += [a for a in reply.order if a not in self.client.addresses]
            self.replica_order = list(reply.order)
        if self.client.answered == self.replica_order[0] != self.watch_client.answered:
            self.shard_moved.set()  # the shard answers again (restarted): the stream goes back to it

    def _health_loop(self) -> None:
        """Run the health check every interval; a change of result is heartbeated at once."""
        assert self.health is not None
        while not self.stopping.is_set():
            started = time.monotonic()
            result = self.health.run()
            if (result.healthy, result.message) != (self.healthy, self.health_message):
                if result.healthy:
                    log.info("health check passes node=%s", self.node_id)
                else:
                    log.warning("health check fails node=%s message=%s", self.node_id, result.message)
                self.healthy, self.health_message = result.healthy, result.message
                self.heartbeat_now.set()
            self.stopping.wait(max(0.0, self.health.interval - (time.monotonic() - started)))

    def _progress_loop(self) -> None:
        """Once a second while pulls run, tell the leader how far each is, and every CACHE_REPORT_S,
        or once a pull has ended, which images the node's store holds (lost reports do not matter:
        the next one replaces them)."""
        listed_at, listed_after = float("-inf"), 0  #: when the store was last listed, and after how many pulls' ends
        while not self.stopping.wait(1.0):
            pulls = [api_pb2.PullProgress(job_id=key[0], attempt=key[1], index=key[2],
                                          phase=p.phase if p else "queued", done_bytes=p.done_bytes if p else 0,
                                          total_bytes=p.total_bytes if p else 0)
                     for key, p in self.pulls.board]
            ended = self.pulls.ended
            listing = self.images is not None and (ended != listed_after
                                                   or time.monotonic() - listed_at >= CACHE_REPORT_S)
            if not pulls and not listing:
                continue
            request = api_pb2.ReportPullProgressRequest(node_id=self.node_id, pulls=pulls, cache_listed=listing)
            if listing and self.images is not None:
                request.cached.extend(sorted({r for image in self.images.cached() for r in image.references}))
            try:
                self.report_client.call("ReportPullProgress", request, deadline=5.0)
                if listing:
                    listed_at, listed_after = time.monotonic(), ended
            except (ClientError, ClusterUnavailable) as exc:
                log.debug("pull progress not reported node=%s error=%s", self.node_id, exc)

    def _gpu_loop(self) -> None:
        """Look for GPU errors every interval; a change is heartbeated at once (the leader stops the
        gangs on a failed GPU without waiting for the heartbeat timeout)."""
        assert self.gpu_watch is not None
        log.info("watching GPUs for errors node=%s source=%s every=%gs", self.node_id, self.gpu_watch.source,
                 self.gpu_watch.interval)
        while not self.stopping.is_set():
            started = time.monotonic()
            errors = self.gpu_watch.poll()
            if errors != self.gpu_errors:
                for e in errors:
                    log.warning("GPU error node=%s gpu=%s message=%s", self.node_id, e.gpu, e.message)
                if not errors:
                    log.info("no GPU error seen any more node=%s", self.node_id)
                self.gpu_errors = errors
                self.heartbeat_now.set()
            self.stopping.wait(max(0.0, self.gpu_watch.interval - (time.monotonic() - started)))

    def _report_loop(self) -> None:
        """Send the unacknowledged reports and the tasks' progress in batches, retrying until acknowledged."""
        outbox = ws.Outbox()
        while not self.stopping.is_set():
            self.reports_ready.wait(1.0)
            self.reports_ready.clear()
            batch = outbox.due(self.view.unreported)
            progress = self.progress.take()
            if not batch and not progress:
                continue
            request = api_pb2.ReportTaskEventsRequest(node_id=self.node_id, events=[
                api_pb2.TaskEvent(job_id=r.key[0], attempt=r.key[1], index=r.key[2], started=r.started,
                                  exit_code=r.exit_code, reason=r.reason, cause=r.cause, node_side=r.node_side,
                                  prepared=r.prepared)
                for r in batch] + progress)
            # By datagram once the replicas are known to answer them (a heartbeat datagram was
            # answered: a cluster with `heartbeat_datagrams: false` costs no wait per report).
            leader, datagrams = self.report_client.leader, self.report_datagrams
            if self.datagrams is None or not self.datagrams.answered:
                datagrams = None
            try:
                if datagrams is None or leader is None or datagrams.report(leader, request) is None:
                    self.report_client.call("ReportTaskEvents", request, deadline=10.0)
                outbox.acknowledged(batch)
                self.metrics.reports.inc(len(batch))
                self.events.put(ws.ReportsAcknowledged(tuple(batch)))
            except (ClientError, ClusterUnavailable) as exc:
                self.progress.put_back(progress)
                log.warning("report failed node=%s reports=%d error=%s; retrying", self.node_id, len(batch), exc)
                self.stopping.wait(0.5)
                self.reports_ready.set()
