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
* exits (synapse.worker.exits): waits on the task shims' pidfds and tells the main loop the moment
  one ends, so a task's end is reported at once;
* the main loop also polls its task processes (every 0.1 s, and at once when one ended) and writes
  the state file after every change, so a restarted worker re-adopts tasks that kept running and
  reports those that ended.

Where the parts live: the task lifecycle on the main loop in synapse.worker.tasks, the threads to
the masters in synapse.worker.uplink, the lease and the node's credential in synapse.worker.lease,
the pulls in synapse.worker.pulls, the state file in synapse.worker.statefile, the log service in
synapse.worker.logs; this module holds the agent's state and its main loop.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from pathlib import Path

from synapse.client.master_client import MasterClient
from synapse.common.tls import TLSFiles
from synapse.core.brain.heartbeat import GpuErrorReport
from synapse.core.model import Resources
from synapse.core.rendezvous import MASTER_PORTS, ephemeral_overlap
from synapse.core.shards import ranked
from synapse.images.store import ImageStore
from synapse.worker import observe, statefile
from synapse.worker import state as ws
from synapse.worker.attach import AttachService
from synapse.worker.beats import DatagramBeats, DatagramReports
from synapse.worker.exits import ExitWatcher, ProcessEnded
from synapse.worker.gpu_errors import GpuWatch
from synapse.worker.health import HealthCheck
from synapse.worker.isolation import DEFAULT_PIDS_MAX, Cgroups
from synapse.worker.lease import Lease, load_credential
from synapse.worker.logs import serve_logs
from synapse.worker.observe import WorkerMetrics
from synapse.worker.progress import ProgressWatcher, progress_file
from synapse.worker.pulls import PullProgressed, Pulls
from synapse.worker.runtime import ProcessRuntime, alive, ephemeral_ports
from synapse.worker.tasks import TaskLifecycle
from synapse.worker.uplink import Uplink

log = logging.getLogger(__name__)

#: How often the main loop polls its task processes (and the longest it waits for an event).
POLL_S = 0.1


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


class WorkerAgent(TaskLifecycle, Uplink):
    """The worker agent: its state, the main loop that alone changes it, and the threads around it
    (the task lifecycle: synapse.worker.tasks; the threads to the masters: synapse.worker.uplink)."""

    def __init__(self, *, node_id: str, address: str, topology: tuple[str, ...], capacity: Resources,
                 masters: list[str], token: str, data_dir: Path, heartbeat_interval: float = 5.0, join_token: str = "",
                 stop_grace: float = 10.0, runtime_template: str = "", log_port: int = 0,
                 tls: TLSFiles | None = None, http: str = "", cgroups: Cgroups | None = None,
                 isolation: str = "", pids_max: int = DEFAULT_PIDS_MAX, labels: dict[str, str] | None = None,
                 health: HealthCheck | None = None, drain_on_failure: bool = False, images: ImageStore | None = None,
                 allow_mounts: tuple[str, ...] = (), cdi_dirs: tuple[str, ...] | None = None,
                 gpu_watch: GpuWatch | None = None, rendezvous_ports: range = MASTER_PORTS,
                 heartbeat_datagrams: bool = True) -> None:
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
        #: the node's image store; None: tasks in images cannot run here
        self.images = images
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
        cgroups = self.runtime.cgroups
        #: the node's lease, and the fence that enforces it
        self.lease = Lease(node_id, data_dir, list(cgroups.parents.values()) if cgroups is not None else [])
        #: the running tasks the main loop killed because the lease ended (main loop only)
        self.fenced: set[ws.Key] = set()
        self.releases: list[tuple[float, str]] = []
        self.last_start = 0.0
        #: changed by the main loop alone, through `_handle` (synapse.worker.state's docstring)
        self.state = ws.WorkerState(stop_grace=stop_grace)
        #: what the other threads read of the state: replaced whole by the main loop after every event
        self.view = self.state.view()
        self.progress = ProgressWatcher()  #: the running tasks' progress files, forwarded with the reports
        #: the state's events (synapse.worker.state) and PullProgressed, for the main loop
        self.events: queue.Queue[object] = queue.Queue()
        #: the task shims' ends, put on `events` as they happen (synapse.worker.exits)
        self.exits = ExitWatcher(self.events)
        #: the image pulls under way (their threads put events on `events`)
        self.pulls = Pulls(node_id, images, self.events)
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
        #: heartbeats by datagram first (synapse.worker.beats), unless the operator said no
        self.datagrams = DatagramBeats(node_id, lambda: self.node_credential) if heartbeat_datagrams else None
        #: the task reports by datagram to the leader first (the report thread's own socket), likewise
        self.report_datagrams = DatagramReports(node_id, lambda: self.node_credential) if heartbeat_datagrams else None
        self.log_server, self.log_port = serve_logs(AttachService(self), address, log_port, tls)
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
        self.lease.ensure_fence()
        self._load_state()
        stale = self.runtime.sweep({t.handle.cgroup for t in self.state.tasks.values() if t.handle})
        if stale:
            log.info("removed task cgroups of no known task count=%d names=%s", len(stale), ",".join(stale[:10]))
        self._unpin_forgotten()
        ephemeral = ephemeral_ports()
        overlap = ephemeral_overlap(*ephemeral, self.rendezvous_ports) if ephemeral else range(0)
        if ephemeral and overlap:
            log.warning("ephemeral ports overlap rendezvous ports node=%s ephemeral=%d-%d overlap=%d-%d: an outgoing "
                        "connection may take a gang's MASTER_PORT; start net.ipv4.ip_local_port_range at %d or above",
                        self.node_id, *ephemeral, overlap.start, overlap.stop - 1, self.rendezvous_ports.stop)
        self._register()
        self.exits.start()
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
            self._release_due(0.0, every=True)  # ended tasks' cgroups: empty, nothing waits for them now
            self.log_server.stop(grace=0.5)
            if self.http_server is not None:
                self.http_server.shutdown()
            self._save_state()

    def stop(self) -> None:
        """Stop the agent (its tasks run on)."""
        self.stopping.set()

    # ---- main loop: events -> state -> instructions ----------------------------------------------

    def _main_loop(self) -> None:
        """Drain the events in order, poll the task processes every POLL_S, save the state after every change."""
        next_poll = 0.0
        save_owed = False  #: acknowledgements taken in and not yet saved
        while not self.stopping.is_set():
            try:
                event = self.events.get(timeout=POLL_S)
            except queue.Empty:
                event = None
            changed = False
            if isinstance(event, ProcessEnded):
                next_poll = 0.0  # a task's end: journal and report it now, not at the next poll
            elif isinstance(event, PullProgressed):
                self.pulls.progressed(event)
            elif isinstance(event, ws.ImageReady | ws.ImageFailed):
                self._pulled(event)
                changed = True
            elif isinstance(event, ws.ReportsAcknowledged):
                # Saved with the next change or at the next poll: an agent lost before that sends
                # those reports again, as after a lost acknowledgement (a save is a file written
                # and renamed, and two acknowledgements come in every task's life).
                self._handle(event)
                save_owed = True
            elif event is not None:
                self._handle(event)
                changed = True
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + POLL_S
                changed |= save_owed
                self._fence_if_lease_ended()
                changed |= self._poll_processes()
                self._release_due(time.monotonic())
                self._handle(ws.Tick())
                if self.progress.due(time.monotonic()) and self.progress.poll(
                        [(t.assignment.key, progress_file(self.runtime.task_files(t.assignment)[0]))
                         for t in self.state.running()], time.monotonic(), time.time()):
                    self.reports_ready.set()
            if changed:
                # The reports go before the save: a start or an end reported, then lost with the
                # agent before its save, is reported again by the next agent (the state file's task
                # is re-adopted: WorkerState.restore), as one whose acknowledgement was lost is.
                if self.state.unreported:
                    self.reports_ready.set()
                self.exits.track({(t.handle.pid, t.handle.start_ticks) for t in self.state.running()
                                  if t.handle is not None})
                self._save_state()
                save_owed = False

    def _handle(self, event: object) -> None:
        """(main loop) The one door to the state: apply the event, publish the new view, carry out
        what the state asks."""
        reports = len(self.state.unreported)
        instructions = self.state.handle(event, time.monotonic())
        self.view = self.state.view()
        if len(self.state.unreported) > reports:
            self.reports_ready.set()  # a start or an end goes at once, not after the rest of the loop's work
        self._carry_out(instructions)

    def _carry_out(self, instructions: list[ws.Instruction]) -> None:
        """(main loop) Do what the state asks: start, create, open, signal, unpin, discard."""
        for ins in instructions:
            if isinstance(ins, ws.Start) and ins.image is None and self.runtime.contained(ins.assignment):
                self._save_state()
                self.pulls.submit(ins.assignment)
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

    def _pulled(self, event: ws.ImageReady | ws.ImageFailed) -> None:
        """(main loop) A pull ended: off the board of pulls, and the store changed (the next report
        lists it); the state starts the task, holds it for its gang, ends it, or unpins the image."""
        self.pulls.done(event.key)
        if isinstance(event, ws.ImageFailed) and self.state.waits_for_image(event.key):
            self.metrics.exits.labels("start_failed").inc()
        self._handle(event)
        if event.key in self.state.prepared:  # the gang waits for the image on its other nodes
            a = self.state.tasks[event.key].assignment
            log.info("image ready, task held for its gang task=%s image=%s", a.key, a.image)

    # ---- state file: re-adopting tasks after a restart ------------------------------------------

    def _save_state(self) -> None:
        """(main loop) Write the state file (synapse.worker.statefile)."""
        statefile.save(self.data_dir, self.state)

    def _load_state(self) -> None:
        """(before the threads start) Go on from the state file, if there is one: its tasks that have
        a process are re-adopted (the rules: WorkerState.restore)."""
        restored = statefile.load(self.data_dir, self.state.stop_grace, self.runtime.find)
        if restored is None:
            return
        self.state = restored
        self.view = self.state.view()
        for task in self.state.tasks.values():
            assert task.handle is not None
            log.info("re-adopting task=%s pid=%d alive=%s cgroup=%s", task.assignment.key, task.handle.pid,
                     alive(task.handle), task.handle.cgroup or "-")
