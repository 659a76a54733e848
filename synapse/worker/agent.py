"""The worker agent: the I/O around `WorkerState`. Registers, heartbeats, watches assignments,
starts and stops task processes, reports their starts and exits.

The main loop alone changes the worker's state (`WorkerState.handle`, synapse.worker.state); the
other threads feed events into one queue that it drains in order, and read only the copy of the
state it publishes after every event (`view`):
* watch: holds a WatchAssignments stream to the node's link shard (the replica that serves it, any
  replica in a pinch), which the client reopens elsewhere, after a jittered pause, whenever it
  breaks, so a replica's death never stops the worker or its tasks nor brings all workers back at once;
* heartbeat: one RPC per interval to the node's link shard (synapse.core.shards; the reply names
  it, and the worker follows); re-registers when the masters do not know the node; each answer
  renews the node's lease (synapse.worker.fence), which the main loop and the node's fence
  process enforce: no task runs on once the lease has ended;
* reporter: sends unacknowledged reports in batches, retrying until acknowledged;
* health (with --health-check): runs the check every interval and, when its result changes,
  wakes the heartbeat thread so the leader hears of it at once;
* gate (one per created task, until its sandbox's set-up is done): sends TaskSetUp then, so the
  task is reported prepared only with its sandbox waiting at its gate;
* pulls (a pool of PULL_THREADS): a task in an image waits, starting, while the node's image store
  gets its image (one pull per image however many tasks ask); its progress and its result come
  back as events, and the task starts then, or ends ImagePullFailed without having run;
* progress: while pulls run, once a second, how far each is (ReportPullProgress: the leader keeps
  it in memory for `synctl describe job`), from the board of pulls the main loop publishes;
* gpu-errors (with GPUs to watch, synapse.worker.gpu_errors): the same for the GPU errors it sees;
* the main loop also polls its task processes (every 0.1 s) and writes the state file after every
  change, so a restarted worker re-adopts tasks that kept running and reports those that ended.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import os
import queue
import signal
import threading
import time
from concurrent import futures
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc

from synapse.client.master_client import AuthError, ClientError, ClusterUnavailable, MasterClient, PermissionDenied
from synapse.common import tickets
from synapse.common.auth import METADATA_KEY, client_metadata, node_metadata
from synapse.common.tls import TLSFiles
from synapse.core import codec
from synapse.core.brain.heartbeat import GpuErrorReport
from synapse.core.model import Assignment, EndReason, Resources
from synapse.core.rendezvous import MASTER_PORTS, ephemeral_overlap
from synapse.core.shards import ranked
from synapse.proto import api_pb2, api_pb2_grpc
from synapse.worker import fence, observe
from synapse.worker import state as ws
from synapse.worker.container import ContainerRefused
from synapse.worker.fence import TASK_JOURNAL, boot_id
from synapse.worker.gpu_errors import GpuWatch
from synapse.worker.health import HealthCheck
from synapse.worker.isolation import DEFAULT_PIDS_MAX, Cgroups
from synapse.worker.observe import WorkerMetrics
from synapse.worker.progress import ProgressWatcher, progress_file
from synapse.worker.runtime import Handle, ProcessRuntime, alive, ephemeral_ports, port_in_use, task_id

log = logging.getLogger(__name__)

POLL_S = 0.1
#: Pauses before the assignment stream is opened again after it ended, or was refused. A watch that
#: is merely cut off (a replica down, a new leader) is reopened by the client on its own.
WATCH_REOPEN_S = 0.05
WATCH_REFUSED_S = 1.0
STATE_FILE = "worker-state.json"
# TASK_JOURNAL (synapse.worker.fence): every task process this worker started and saw end, and every
# task its fence killed, one JSON object a line, appended (the record an operator or the chaos
# checkers read; the log's wording is for people).
#: After a heartbeat that was not answered, the next goes this soon while the lease still holds
#: (never later than the interval): the lease must not end for one lost call.
HEARTBEAT_RETRY_S = 0.25
#: The node's own credential, as RegisterNode returned it ({"node_id", "credential"}, mode 0600): with
#: it the worker needs neither the cluster token nor its join token again.
CREDENTIAL_FILE = "node-credential.json"
#: Images pulled at once (the store pulls each image once, however many tasks wait for it).
PULL_THREADS = 4
#: Seconds between two listings of the node's image store to the leader (`synctl get nodes -o wide`).
CACHE_REPORT_S = 10.0
#: Test hook: seconds each pull of this worker waits before it asks the store (a slow node in a gang).
PULL_DELAY_HOOK = "SYNAPSE_TEST_PULL_DELAY_S"


@dataclass(frozen=True, slots=True)
class PullProgressed:
    """How far a task's image pull is, for the progress thread's reports (I/O bookkeeping, not the
    worker's state: the main loop keeps it on the board of pulls)."""

    key: ws.Key
    progress: Any  #: the store's PullProgress; None: the pull began, nothing fetched yet


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def load_credential(data_dir: Path, node_id: str) -> str:
    """The credential this data dir keeps for `node_id` ("" if none, or one for another node)."""
    try:
        saved = json.loads((data_dir / CREDENTIAL_FILE).read_text())
    except (OSError, ValueError):
        return ""
    return str(saved.get("credential", "")) if isinstance(saved, dict) and saved.get("node_id") == node_id else ""


def save_credential(data_dir: Path, node_id: str, credential: str) -> None:
    """Keep the node's credential, readable by this user only (written whole, then renamed)."""
    tmp = data_dir / (CREDENTIAL_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"node_id": node_id, "credential": credential}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, data_dir / CREDENTIAL_FILE)


class WorkerAgent:
    def __init__(self, *, node_id: str, address: str, topology: tuple[str, ...], capacity: Resources,
                 masters: list[str], token: str, data_dir: Path, heartbeat_interval: float = 5.0, join_token: str = "",
                 stop_grace: float = 10.0, runtime_template: str = "", log_port: int = 0,
                 tls: TLSFiles | None = None, http: str = "", cgroups: Cgroups | None = None,
                 isolation: str = "", pids_max: int = DEFAULT_PIDS_MAX, labels: dict[str, str] | None = None,
                 health: HealthCheck | None = None, drain_on_failure: bool = False, images: Any = None,
                 allow_mounts: tuple[str, ...] = (), cdi_dirs: tuple[str, ...] | None = None,
                 gpu_watch: GpuWatch | None = None, rendezvous_ports: range = MASTER_PORTS) -> None:
        self.node_id = node_id
        self.rendezvous_ports = rendezvous_ports  #: the masters' rendezvous_ports, as --rendezvous-ports says
        self.topology = topology
        self.capacity = capacity
        self.token = token  #: the cluster token, only if the operator gave one (a join token replaces it)
        self.join_token = join_token  #: registers this node the first time, if it has no credential yet
        self.data_dir = data_dir
        self.heartbeat_interval = heartbeat_interval
        self.runtime = ProcessRuntime(data_dir, runtime_template, cgroups, pids_max, allow_mounts,
                                      *((cdi_dirs,) if cdi_dirs is not None else ()))
        #: the node's image store (synapse.images.store.ImageStore); None: tasks in images cannot run here
        self.images = images
        self.pulls = futures.ThreadPoolExecutor(max_workers=PULL_THREADS, thread_name_prefix="pull")
        #: the pulls under way: task key -> the store's latest PullProgress (None before its first);
        #: main loop only (the pull threads send PullProgressed, ImageReady and ImageFailed)
        self.pull_progress: dict[ws.Key, Any] = {}
        #: a copy of `pull_progress` for the progress thread, replaced whole by the main loop
        self.pull_board: tuple[tuple[ws.Key, Any], ...] = ()
        #: how many pulls have ended (main loop only): the store changed, the next report lists it
        self.pulls_ended = 0
        self.isolation = isolation  #: how tasks are confined, as registered (describe node shows it)
        self.labels = dict(labels or {})  #: registered node labels (gpu_model, …)
        self.health = health  #: the health check, if the operator gave one
        self.drain_on_failure = drain_on_failure
        #: the health check's last result: ("" = passing); written by the health thread only
        self.health_message = ""
        self.healthy = True
        self.gpu_watch = gpu_watch  #: what looks for GPU errors, if anything does
        #: the GPU errors seen last; written by the gpu-errors thread only
        self.gpu_errors: tuple[GpuErrorReport, ...] = ()
        self.heartbeat_now = threading.Event()  #: wakes the heartbeat thread (health changed)
        #: when the node's lease ends (time.monotonic()); None while the masters grant none (an
        #: earlier release) or before the first grant. Written by the registering and heartbeat
        #: threads (a float, replaced whole), read by the main loop
        self.lease_until: float | None = None
        self.lease_seconds = 0.0  #: the length of the last lease granted (heartbeat thread)
        self.fence_lock = threading.Lock()  #: held while looking for the node's fence and starting it
        #: the running tasks the main loop killed because the lease ended (main loop only)
        self.fenced: set[ws.Key] = set()
        #: changed by the main loop alone, through `_handle` (synapse.worker.state's docstring)
        self.state = ws.WorkerState(stop_grace=stop_grace)
        #: what the other threads read of the state: replaced whole by the main loop after every event
        self.view = self.state.view()
        self.progress = ProgressWatcher()  #: the running tasks' progress files, forwarded with the reports
        self.events: queue.Queue = queue.Queue()
        self.stopping = threading.Event()
        self.client = MasterClient(masters, token, deadline=10.0, tls=tls)
        #: the assignment stream's client: it pauses up to 1 s between rounds of failed reconnections
        self.watch_client = MasterClient(masters, token, deadline=10.0, tls=tls, backoff=(0.05, 1.0))
        self.report_client = MasterClient(masters, token, deadline=10.0, tls=tls)
        #: the replicas this node's heartbeats and watch go to, in order, its link shard first: its
        #: own order over the master list until a heartbeat's reply gives the cluster's; replaced
        #: whole by the heartbeat thread only
        self.replica_order = ranked(node_id, self.client.addresses)
        self.shard_moved = threading.Event()  #: the shard changed since the watch stream was opened
        self.reports_ready = threading.Event()
        #: what RegisterNode returned (kept in CREDENTIAL_FILE): it proves calls come from this node,
        #: and checks log tickets
        self.node_credential = load_credential(data_dir, node_id)
        #: no credential of any kind: a cluster without authentication (then logs need no ticket)
        self.open_cluster = not (token or join_token or self.node_credential)
        self._use_credential()
        self.log_server, self.log_port = self._serve_logs(address, log_port, tls)
        self.metrics = WorkerMetrics(self)
        self.heartbeat_ok = False  #: the last heartbeat was answered (a metric)
        #: the HTTP server (metrics, liveness) and where it listens, if `http` asked for one; the
        #: address is also written to DATA_DIR/http-address
        self.http_server, self.http_address = (None, "")
        if http:
            self.http_server, self.http_address = observe.serve(http, self.metrics)
            (data_dir / "http-address").write_text(self.http_address + "\n")
        host = address.rpartition(":")[0] if ":" in address else address
        self.address = f"{host}:{self.log_port}"  #: registered: its host is MASTER_ADDR for rank 0

    # ---- lifecycle -----------------------------------------------------------------------------

    def run(self) -> None:
        """Run until `stop()`; tasks keep running after the agent stops (they are re-adopted by the
        next agent if it renews the lease in time; the node's fence kills them otherwise)."""
        self._ensure_fence()
        self._load_state()
        stale = self.runtime.sweep({t.handle.cgroup for t in self.state.tasks.values() if t.handle})
        if stale:
            log.info("removed task cgroups of no known task count=%d names=%s", len(stale), ",".join(stale[:10]))
        self._unpin_forgotten()
        ephemeral = ephemeral_ports()
        overlap = ephemeral_overlap(*ephemeral, self.rendezvous_ports) if ephemeral else range(0)
        if overlap:
            log.warning("ephemeral ports overlap rendezvous ports node=%s ephemeral=%d-%d overlap=%d-%d: an outgoing "
                        "connection may take a gang's MASTER_PORT; start net.ipv4.ip_local_port_range at %d or above",
                        self.node_id, *ephemeral, overlap.start, overlap.stop - 1, self.rendezvous_ports.stop)
        self._register()
        loops = [(self._watch_loop, "watch"), (self._heartbeat_loop, "heartbeat"), (self._report_loop, "report"),
                 (self._progress_loop, "progress")]
        if self.health is not None:
            loops.append((self._health_loop, "health"))
        if self.gpu_watch is not None:
            loops.append((self._gpu_loop, "gpu-errors"))
        threads = [threading.Thread(target=f, name=n, daemon=True) for f, n in loops]
        for t in threads:
            t.start()
        try:
            self._main_loop()
        finally:
            self.log_server.stop(grace=0.5)
            if self.http_server is not None:
                self.http_server.shutdown()
            self._save_state()

    def stop(self) -> None:
        self.stopping.set()

    # ---- the lease (synapse.worker.fence) ------------------------------------------------------

    def _ensure_fence(self) -> None:
        """(any thread) Start the node's fence unless it runs (it exits when it has nothing left to guard)."""
        cgroups = self.runtime.cgroups
        with self.fence_lock:  # the main loop and the heartbeat thread both ask: one fence
            pid = fence.start_fence(self.data_dir, list(cgroups.parents.values()) if cgroups is not None else [])
        if pid:
            log.info("fence started node=%s pid=%d", self.node_id, pid)

    def _renew(self, sent: float, reply: Any) -> None:
        """(registering or heartbeat thread) Take the lease an answer grants, counted from when its
        request was sent: an answer from an earlier release grants none (nothing is fenced then)."""
        if not reply.HasField("lease_ms"):
            if self.lease_until is not None or fence.lease_state(self.data_dir, sent) != fence.UNFENCED:
                log.warning("the masters grant no lease (an earlier release): tasks are not fenced node=%s",
                            self.node_id)
                fence.write_lease(self.data_dir, None)
            self.lease_until = None
            return
        if reply.lease_ms == 0:
            return  # this replica vouches for none: the lease runs on from the last grant
        until = sent + reply.lease_ms / 1000
        if self.lease_until is not None and until <= self.lease_until:
            return
        self.lease_until, self.lease_seconds = until, reply.lease_ms / 1000
        fence.write_lease(self.data_dir, until)
        self._ensure_fence()

    def _next_heartbeat_in(self, answered: bool) -> float:
        """How long the heartbeat thread waits: the interval, shortened so that a lease never ends
        for want of asking (a quarter of the lease before its end), and after a call that was not
        answered, HEARTBEAT_RETRY_S while the lease still holds."""
        until = self.lease_until
        if until is None:
            return self.heartbeat_interval
        left = until - time.monotonic()
        if left <= 0:
            return self.heartbeat_interval
        if not answered:
            return min(self.heartbeat_interval, HEARTBEAT_RETRY_S)
        return min(self.heartbeat_interval, max(HEARTBEAT_RETRY_S, left - self.lease_seconds / 4))

    def _fence_if_lease_ended(self) -> bool:
        """(main loop) Kill every running task once the lease has ended: the masters may be about to
        declare this node DOWN and start its gangs elsewhere. Their ends report NodeLost."""
        until = self.lease_until
        if until is None or time.monotonic() <= until:
            return False
        victims = [t for t in self.state.running() if t.assignment.key not in self.fenced]
        for task in victims:
            assert task.handle is not None
            log.warning("lease ended: killing task=%s pid=%d node=%s (no master answered for %.1fs)",
                        task.assignment.key, task.handle.pid, self.node_id,
                        time.monotonic() - until + self.lease_seconds)
            self.runtime.signal(task.handle, signal.SIGKILL)
            self.fenced.add(task.assignment.key)
        return bool(victims)
        self.reports_ready.set()
        self.heartbeat_now.set()

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
                self._renew(sent, reply)
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

    # ---- main loop: events -> state -> instructions ----------------------------------------------

    def _main_loop(self) -> None:
        next_poll = 0.0
        while not self.stopping.is_set():
            try:
                event = self.events.get(timeout=POLL_S)
            except queue.Empty:
                event = None
            changed = False
            if isinstance(event, PullProgressed):
                self.pull_progress[event.key] = event.progress
                self.pull_board = tuple(self.pull_progress.items())
            elif isinstance(event, ws.ImageReady | ws.ImageFailed):
                self._pulled(event)
                changed = True
            elif event is not None:
                self._handle(event)
                changed = True
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + POLL_S
                self._fence_if_lease_ended()
                changed |= self._poll_processes()
                self._handle(ws.Tick())
                if self.progress.due(time.monotonic()) and self.progress.poll(
                        [(t.assignment.key, progress_file(self.runtime.task_files(t.assignment)[0]))
                         for t in self.state.running()], time.monotonic(), time.time()):
                    self.reports_ready.set()
            if changed:
                self._save_state()
                if self.state.unreported:
                    self.reports_ready.set()

    def _handle(self, event: object) -> None:
        """(main loop) The one door to the state: apply the event, publish the new view, carry out
        what the state asks."""
        instructions = self.state.handle(event, time.monotonic())
        self.view = self.state.view()
        self._carry_out(instructions)

    def _carry_out(self, instructions: list[ws.Instruction]) -> None:
        for ins in instructions:
            if isinstance(ins, ws.Start) and ins.image is None and self.runtime.contained(ins.assignment):
                self._save_state()
                self.pulls.submit(self._pull, ins.assignment)
                self._handle(ws.PullStarted(ins.assignment.key))
            elif isinstance(ins, ws.Start) and ins.created is not None:
                self._open(ins.assignment, ins.created)
            elif isinstance(ins, ws.Start):
                self._start(ins.assignment, ins.image)
            elif isinstance(ins, ws.Create):
                self._start(ins.assignment, ins.image, gated=True)
            elif isinstance(ins, ws.Signal):
                log.info("signal task=%s sig=%s", ins.key, _signal_name(ins.signal))
                self.runtime.signal(ins.handle, ins.signal)
            elif isinstance(ins, ws.Unpin):
                if self.images is not None:
                    self.images.release("{}.{}.{}".format(*ins.key))  # task_id's spelling
            elif isinstance(ins, ws.Discard):
                if ins.handle is not None:
                    log.info("discarding created task=%s pid=%d", ins.assignment.key, ins.handle.pid)
                    self.runtime.discard(ins.assignment, ins.handle)
                self._end_container(ins.assignment)

    def _pull(self, a: Assignment) -> None:
        """(pull thread) Get the task's image from the store, pinned for the task; the outcome goes
        to the main loop as an event."""
        if self.images is None:
            self.events.put(ws.ImageFailed(a.key, f"node {self.node_id} has no image store", True))
            return
        self.events.put(PullProgressed(a.key, None))
        try:
            delay = float(os.environ.get(PULL_DELAY_HOOK, "") or 0)
            if delay > 0:
                time.sleep(delay)
            image = self.images.ensure(a.image, holder=task_id(a),
                                       progress=lambda p: self.events.put(PullProgressed(a.key, p)))
        except Exception as exc:  # the store's PullError, or anything else it raised: the task must end
            cause = getattr(exc, "cause", "")
            node_side = bool(getattr(exc, "node_side", True))
            log.warning("image pull failed task=%s image=%s cause=%s node_side=%s error=%s", a.key, a.image,
                        cause or type(exc).__name__, node_side, exc)
            self.events.put(ws.ImageFailed(a.key, f"node {self.node_id}: image {a.image}: "
                                                  f"{cause or type(exc).__name__}: {getattr(exc, 'message', exc)}",
                                           node_side))
            return
        self.events.put(ws.ImageReady(a.key, image))

    def _pulled(self, event: ws.ImageReady | ws.ImageFailed) -> None:
        """(main loop) A pull ended: off the board of pulls, and the store changed (the next report
        lists it); the state starts the task, holds it for its gang, ends it, or unpins the image."""
        self.pull_progress.pop(event.key, None)
        self.pull_board = tuple(self.pull_progress.items())
        self.pulls_ended += 1
        if isinstance(event, ws.ImageFailed) and self.state.waits_for_image(event.key):
            self.metrics.exits.labels("start_failed").inc()
        self._handle(event)
        if event.key in self.state.prepared:  # the gang waits for the image on its other nodes
            a = self.state.tasks[event.key].assignment
            log.info("image ready, task held for its gang task=%s image=%s", a.key, a.image)

    def _start(self, a: Assignment, image: Any = None, gated: bool = False) -> None:
        """Start a task, or (`gated`: a held task, its image here) create it: its sandbox set up now,
        its command waiting at its gate until the gang's release (`_open`), so the set-up's CPU is
        spent while the other nodes still pull, not after the release."""
        # Record the intent first: a crash between the fork and the next save must not leave a
        # task this worker forgets and would start a second time (see _load_state).
        seen = time.monotonic()
        self._save_state()
        self._ensure_fence()  # it exits once it has nothing to guard: a task never starts unguarded
        clash = "" if gated else self._master_port_clash(a)  # a created task is checked as its gate opens
        if clash:
            self._start_failed(a, clash, EndReason.MASTER_PORT_IN_USE)
            return
        try:
            handle = self.runtime.start(a, image, gated=gated)
        except (OSError, ContainerRefused) as exc:
            self._start_failed(a, f"{exc}", getattr(exc, "cause", EndReason.ERROR))
            return
        self.metrics.task_start.observe(time.monotonic() - seen)
        if gated:
            log.info("task created, held for its gang task=%s pid=%d", a.key, handle.pid)
            gate = self.runtime.gates[task_id(a)]
            threading.Thread(target=self._watch_gate, args=(a.key, gate), name="gate", daemon=True).start()
            self._handle(ws.TaskCreated(a.key, handle))
        else:
            self._started(a, handle)

    def _watch_gate(self, key: ws.Key, gate: Any) -> None:
        """(gate thread) Wait until a created task's sandbox is at its gate, or ended or discarded."""
        self.runtime.wait_set_up(gate)
        self.events.put(ws.TaskSetUp(key))

    def _open(self, a: Assignment, handle: Handle) -> None:
        """Start a created task: open its gate (its command runs now; the journal's start is this moment)."""
        clash = self._master_port_clash(a)
        if clash:
            self._start_failed(a, clash, EndReason.MASTER_PORT_IN_USE, handle)
            return
        try:
            self.runtime.open_gate(a)
        except OSError as exc:
            self._start_failed(a, f"gate not opened: {exc}", created=handle)
            return
        self._started(a, handle, " (gate opened)")

    def _started(self, a: Assignment, handle: Handle, how: str = "") -> None:
        log.info("task started job=%s attempt=%d index=%d rank=%d pid=%d%s", a.job_id, a.attempt, a.index,
                 a.rank, handle.pid, how)
        self._journal("start", a, pid=handle.pid)
        self._handle(ws.TaskStarted(a.key, handle))

    def _start_failed(self, a: Assignment, reason: str, cause: str = EndReason.ERROR,
                      created: Handle | None = None) -> None:
        """A task that could not start ends so, its created process (if any) and container gone."""
        self.metrics.exits.labels("start_failed").inc()
        log.warning("task not started task=%s reason=%s", a.key, reason)
        if created is not None:
            self.runtime.discard(a, created)
        self._end_container(a)
        self._handle(ws.TaskStartFailed(a.key, reason, cause))

    def _unpin_forgotten(self) -> None:
        """Unpin the images of tasks this worker no longer knows (pulled or held, never started, when
        it stopped: a task the masters still want is pulled, and pinned, again)."""
        if self.images is None:
            return
        known = {task_id(t.assignment) for t in self.state.tasks.values()}
        forgotten = sorted({h for image in self.images.cached() for h in image.holders} - known)
        for holder in forgotten:
            self.images.release(holder)
        if forgotten:
            log.info("unpinned images of no known task count=%d holders=%s", len(forgotten), ",".join(forgotten[:10]))

    def _end_container(self, a: Assignment) -> None:
        """An ended task in an image: drop its writable layer, unpin its image."""
        if self.runtime.contained(a):
            self.runtime.dispose(a)
            if self.images is not None:
                self.images.release(task_id(a))

    def _master_port_clash(self, a: Assignment) -> str:
        """Why rank 0 must not start here ("" if it may): its MASTER_PORT is taken on this node, by a
        rank 0 of another attempt that this worker started or by any other process."""
        if a.rank != 0 or not a.master_port:
            return ""
        holder = self.state.master_port_holder(a)
        if holder is None and not port_in_use(a.master_port):
            return ""
        by = f" (by task {holder[0]}.{holder[1]}.{holder[2]})" if holder else ""
        return f"MASTER_PORT {a.master_port} in use on node {self.node_id}{by}"

    def _journal(self, event: str, a: Assignment, **fields: object) -> None:
        """Append a task's start or end to the task journal (TASK_JOURNAL)."""
        record = {"at": time.time(), "event": event, "job": a.job_id, "attempt": a.attempt, "index": a.index,
                  **fields}
        try:
            with open(self.data_dir / TASK_JOURNAL, "a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as exc:  # the task runs whether or not its record could be written
            log.warning("task journal not written task=%s error=%s", a.key, exc)

    def _poll_processes(self) -> bool:
        self.runtime.reap()
        changed = False
        for task in self.state.running():
            assert task.handle is not None
            if not alive(task.handle):
                self.runtime.reap()
                a = task.assignment
                end = self.runtime.outcome(task.handle, a)
                fenced = a.key in self.fenced
                if fenced:
                    self.fenced.discard(a.key)
                    end = dataclasses.replace(end, cause=EndReason.NODE_LOST,
                                              detail="killed: the node's lease ended (no master answered)")
                code = end.exit_code
                log.info("task exited job=%s attempt=%d index=%d code=%s reason=%s detail=%s", a.job_id, a.attempt,
                         a.index, code, end.cause, end.detail or "-")
                self._journal("exit", a, pid=task.handle.pid, code=code, reason=str(end.cause),
                              **({"fenced": True} if fenced else {}))
                outcome = ("succeeded" if code == 0 else "oom_killed" if end.cause == "OOMKilled"
                           else "killed" if code is None or task.phase == "stopping" else "failed")
                self.metrics.exits.labels(outcome).inc()
                # The cgroup goes once its OOM count has been read: the task's end is now known.
                self.runtime.release(task.handle.cgroup)
                self._end_container(a)
                self._handle(ws.TaskExited(a.key, code if code is not None else -9, end.detail, end.cause))
                changed = True
        return changed

    # ---- threads talking to the master ---------------------------------------------------------

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
                        tuple(codec.assignment_from_proto(a) for a in message.tasks), message.node_status))
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
        answered = True
        while not self.stopping.is_set():
            self.heartbeat_now.wait(self._next_heartbeat_in(answered))
            self.heartbeat_now.clear()
            if self.stopping.is_set():
                return
            try:
                sent = time.monotonic()
                request = api_pb2.HeartbeatRequest(node_id=self.node_id, unhealthy=not self.healthy,
                                                   health_message=self.health_message,
                                                   drain_on_failure=self.drain_on_failure,
                                                   gpu_errors=codec.gpu_errors_to_proto(self.gpu_errors))
                reply = self.client.call("Heartbeat", request, deadline=max(self.heartbeat_interval, 1.0),
                                         order=self.replicas_in_order)
                self._renew(sent, reply)
                answered = True
                self.metrics.heartbeat.observe(time.monotonic() - sent)
                self.heartbeat_ok = True
                if reply.order and list(reply.order) != self.replica_order:
                    if reply.order[0] != self.replica_order[0]:
                        log.info("link shard node=%s from=%s to=%s", self.node_id, self.replica_order[0],
                                 reply.order[0])
                        self.shard_moved.set()
                    self.client.addresses += [a for a in reply.order if a not in self.client.addresses]
                    self.replica_order = list(reply.order)
                if self.client.answered == self.replica_order[0] != self.watch_client.answered:
                    self.shard_moved.set()  # the shard answers again (restarted): the stream goes back to it
                if reply.node_status == "UNKNOWN":
                    self._register()
            except (ClientError, ClusterUnavailable) as exc:
                self.heartbeat_ok = answered = False
                log.warning("heartbeat failed node=%s error=%s", self.node_id, exc)

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
                     for key, p in self.pull_board]
            ended = self.pulls_ended
            listing = self.images is not None and (ended != listed_after
                                                   or time.monotonic() - listed_at >= CACHE_REPORT_S)
            if not pulls and not listing:
                continue
            request = api_pb2.ReportPullProgressRequest(node_id=self.node_id, pulls=pulls, cache_listed=listing)
            if listing:
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
        while not self.stopping.is_set():
            self.reports_ready.wait(1.0)
            self.reports_ready.clear()
            batch = self.view.unreported
            progress = self.progress.take()
            if not batch and not progress:
                continue
            request = api_pb2.ReportTaskEventsRequest(node_id=self.node_id, events=[
                api_pb2.TaskEvent(job_id=r.key[0], attempt=r.key[1], index=r.key[2], started=r.started,
                                  exit_code=r.exit_code, reason=r.reason, cause=r.cause, node_side=r.node_side,
                                  prepared=r.prepared)
                for r in batch] + progress)
            try:
                self.report_client.call("ReportTaskEvents", request, deadline=10.0)
                self.events.put(ws.ReportsAcknowledged(batch))
            except (ClientError, ClusterUnavailable) as exc:
                self.progress.put_back(progress)
                log.warning("report failed node=%s reports=%d error=%s; retrying", self.node_id, len(batch), exc)
                self.stopping.wait(0.5)
                self.reports_ready.set()

    # ---- state file: re-adopting tasks after a restart ------------------------------------------

    def _save_state(self) -> None:
        data = {"boot_id": boot_id(), "known": list(self.state.known),
                "done": [list(k) for k in sorted(self.state.done)],
                "unreported": [asdict(r) | {"key": list(r.key)} for r in self.state.unreported],
                "tasks": [{"assignment": asdict(t.assignment), "phase": t.phase,
                           "handle": asdict(t.handle) if t.handle else None, "noticed": t.noticed_at is not None}
                          for t in self.state.tasks.values()]}
        path = self.data_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)

    def _load_state(self) -> None:
        """(before the threads start) Go on from the state file, if there is one: its tasks that have
        a process are re-adopted (the rules: WorkerState.restore)."""
        path = self.data_dir / STATE_FILE
        if not path.exists():
            return
        data = json.loads(path.read_text())
        saved = []
        for t in data["tasks"]:
            a = t["assignment"]
            assignment = Assignment(**{**a, "gpus": tuple(a["gpus"]), "command": tuple(a["command"]),
                                       "env": tuple(tuple(kv) for kv in a["env"]),
                                       "mounts": tuple(tuple(m) for m in a.get("mounts", ())),
                                       "resources": Resources(**a.get("resources", {}))})
            # A task recorded as starting may have been forked just before a crash: its shim's
            # pid file says so. Never started (no pid file): forgotten; the master lists it again.
            handle = Handle(**t["handle"]) if t["handle"] else self.runtime.find(assignment)
            saved.append(ws.SavedTask(assignment, t["phase"], handle, bool(t.get("noticed"))))
        self.state = ws.WorkerState.restore(
            stop_grace=self.state.stop_grace, known=tuple(data["known"]), done=(tuple(k) for k in data["done"]),
            unreported=[ws.Report(tuple(r["key"]), r["started"], r["exit_code"], r["reason"], r.get("cause", ""),
                                  r.get("node_side", False), r.get("prepared", False)) for r in data["unreported"]],
            tasks=saved, now=time.monotonic(), rebooted=data.get("boot_id", boot_id()) != boot_id())
        # (a state file without a boot id is an older worker's: its machine is taken as not restarted)
        self.view = self.state.view()
        for task in self.state.tasks.values():
            assert task.handle is not None
            log.info("re-adopting task=%s pid=%d alive=%s cgroup=%s", task.assignment.key, task.handle.pid,
                     alive(task.handle), task.handle.cgroup or "-")

    # ---- log service ---------------------------------------------------------------------------

    def _serve_logs(self, address: str, port: int, tls: TLSFiles | None) -> tuple[grpc.Server, int]:
        """The log service: over TLS with this worker's certificate when it has one (clients check
        that the certificate names this node), else in the clear as the rest of such a cluster is."""
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="logs"))
        api_pb2_grpc.add_WorkerServicer_to_server(LogService(self), server)
        host = address.rpartition(":")[0] if ":" in address else address
        bind = f"{host or '127.0.0.1'}:{port}"
        if tls is not None and tls.enabled and tls.cert and tls.key:
            ca, cert, key = tls.read()
            bound = server.add_secure_port(bind, grpc.ssl_server_credentials([(key, cert)], root_certificates=ca))
        else:
            bound = server.add_insecure_port(bind)
        server.start()
        return server, bound


class LogService(api_pb2_grpc.WorkerServicer):
    """Streams a task's log file from an offset, following it while the task runs."""

    CHUNK = 64 << 10

    def __init__(self, agent: WorkerAgent) -> None:
        self.agent = agent

    def ReadLog(self, request, context):
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
