"""Prometheus metrics of a master replica.

State gauges (jobs, GPUs, nodes, queues) are computed from the replicated state when scraped, so
every replica that has caught up reports the same values, and nothing can drift from the truth.
Raft and link-shard gauges describe this replica. Counters (API calls) live in the process. No
label carries a job, task, user or node id: cardinality stays bounded by the cluster's shape
(states, queues, racks, methods, codes, replicas). `cluster-configs/prometheus/metrics.yaml` is
the contract a test holds this module to.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from synapse.core import commands as c
from synapse.core import goodput
from synapse.core.model import DEFAULT_QUEUE, JobStatus, NodeStatus, topology_path
from synapse.core.schedule.scheduler import PENDING_REASONS
from synapse.core.shards import hosts
from synapse.master.durability import FSYNC_SECONDS

#: Histogram buckets, seconds: for work on the scale of milliseconds, and of a queue's wait.
FAST = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
SLOW = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)

if TYPE_CHECKING:
    from synapse.master.replica import Master


class StateCollector(Collector):
    """Reads the replica's state and Raft status at scrape time."""

    def __init__(self, master: Master) -> None:
        self.m = master

    def collect(self) -> Iterator[Metric]:
        yield from self._raft()
        yield from self._state()
        yield from self._history()
        yield from self._shard()

    def _shard(self) -> Iterator[Metric]:
        """This replica's link shard, and on the leader what it hears of every shard."""
        shard, view = self.m.shard, self.m.leader_view()
        if shard is None:  # main makes it before serving metrics
            return
        yield _gauge("synapse_shard_nodes", "nodes whose heartbeats this replica absorbed within the heartbeat timeout",
                     shard.attached())
        yield _counter("synapse_shard_heartbeats_total", "heartbeats this replica absorbed", shard.absorbed)
        yield _counter("synapse_shard_redirects_total", "heartbeats absorbed of nodes whose shard is another "
                       "replica's (the reply sends them there)", shard.redirects)
        if self.m.beats is not None:
            datagrams = CounterMetricFamily("synapse_heartbeat_datagrams", "heartbeats by datagram "
                                            "(synapse.master.beats), by outcome", labels=["outcome"])
            datagrams.add_metric(["answered"], self.m.beats.answered)
            datagrams.add_metric(["refused"], self.m.beats.refused)
            datagrams.add_metric(["dropped"], self.m.beats.dropped)
            yield datagrams
            reports = CounterMetricFamily("synapse_report_datagrams", "task reports by datagram this replica "
                                          "answered (synapse.master.beats), by outcome", labels=["outcome"])
            reports.add_metric(["taken"], self.m.beats.reports_taken)
            reports.add_metric(["refused"], self.m.beats.reports_refused)
            yield reports
        digests = CounterMetricFamily("synapse_shard_digests", "liveness digests this replica sent the leader, "
                                      "by result", labels=["result"])
        digests.add_metric(["delivered"], shard.delivered)
        digests.add_metric(["failed"], shard.failed)
        yield digests
        yield _gauge("synapse_shard_last_digest_age_seconds", "seconds since this replica's last digest reached a "
                     "leader (since it started, if none has)", time.monotonic() - shard.delivered_at)
        yield _gauge("synapse_shard_serving", "1 while this replica lets workers attach (it leads or reaches a leader)",
                     1 if shard.serving() else 0)
        silence = GaugeMetricFamily("synapse_leader_shard_silence_seconds", "seconds since each link shard's last "
                                    "digest reached this leader (leader only)", labels=["shard"])
        if view is not None:
            shards = hosts(shard.map.members, self.m.replica.api)
            for name, seconds in sorted(view.shard_silences(shards, time.monotonic()).items()):
                silence.add_metric([name], seconds)
        yield silence
        yield _gauge("synapse_nodes_held_silent", "silent nodes the mass-silence guard holds back from DOWN "
                     "(leader only)", view.held_silent if view is not None else 0)

    def _history(self) -> Iterator[Metric]:
        history = self.m.history
        with self.m.lock:
            unarchived, dropped = len(self.m.state.unarchived), self.m.state.history_dropped
        yield _gauge("synapse_history_unarchived_jobs", "finished jobs the history store does not hold yet",
                     unarchived)
        yield _gauge("synapse_history_max_unarchived", "the cap on unarchived finished jobs (0: no history store)",
                     history.settings.max_unarchived if history is not None else 0)
        yield _counter("synapse_history_dropped_total", "finished jobs forgotten before the store held them",
                       dropped)
        yield _gauge("synapse_history_store_failing", "1 while this replica's history exporter cannot write",
                     1 if history is not None and history.error else 0)
        yield _counter("synapse_history_exported_jobs_total", "job rows this replica's exporter wrote",
                       history.exported if history is not None else 0)
        yield _counter("synapse_history_store_errors_total", "failed attempts of this replica's exporter",
                       history.errors if history is not None else 0)

    def _raft(self) -> Iterator[Metric]:
        raft = self.m.raft
        status = raft.status()
        leader = raft.leader_if_connected()
        yield _gauge("synapse_raft_has_leader", "1 if this replica knows a leader it is connected to",
                     1 if leader or raft.is_leader() else 0)
        yield _gauge("synapse_raft_is_leader", "1 if this replica leads", 1 if raft.is_leader() else 0)
        yield _gauge("synapse_raft_term", "the Raft term this replica is in", status.get("raft_term", 0))
        yield _gauge("synapse_raft_commit_index", "the highest log index known committed", status.get("commit_idx", 0))
        yield _gauge("synapse_raft_applied_index", "the highest log index applied here", status.get("last_applied", 0))
        yield _counter("synapse_raft_leader_changes_seen_total", "times this replica saw the leader change",
                       self.m.leader_changes)
        yield _counter("synapse_raft_entries_proposed_total", "log entries this replica proposed as leader",
                       raft.entries_proposed)

    def _state(self) -> Iterator[Metric]:
        now = time.time()
        jobs = GaugeMetricFamily("synapse_jobs", "jobs by state and queue", labels=["state", "queue"])
        gpus = GaugeMetricFamily("synapse_gpus", "GPUs by state: used, free, unavailable (down or cordoned)",
                                 labels=["state"])
        rack_gpus = GaugeMetricFamily("synapse_rack_gpus", "GPUs per rack by state", labels=["rack", "state"])
        nodes = GaugeMetricFamily("synapse_nodes", "nodes by status and schedulability",
                                  labels=["status", "schedulable"])
        queue_used = GaugeMetricFamily("synapse_queue_gpus_used", "GPUs a queue's gangs hold now", labels=["queue"])
        queue_guaranteed = GaugeMetricFamily("synapse_queue_gpus_guaranteed", "a queue's guaranteed GPUs",
                                             labels=["queue"])
        with self.m.lock:
            state = self.m.state
            counts: dict[tuple[str, str], int] = {(s.value, DEFAULT_QUEUE): 0 for s in JobStatus}
            oldest = 0.0
            for job in state.jobs.values():
                key = (job.status.value, state.queue_of(job))
                counts[key] = counts.get(key, 0) + 1
                if job.status is JobStatus.PENDING:
                    oldest = max(oldest, now - job.submitted_at)
            by_state = {"used": 0, "free": 0, "unavailable": 0}
            by_rack: dict[tuple[str, str], int] = {}
            node_counts: dict[tuple[str, str], int] = {}
            suspect = sum(1 for node in state.nodes.values() if node.suspect)
            for node in state.nodes.values():
                rack = topology_path(node.topology)
                available = node.status is NodeStatus.READY and node.schedulable
                used = node.used.gpu
                free = node.capacity.gpu - used
                by_state["used"] += used
                by_state["free" if available else "unavailable"] += free
                for st, amount in (("used", used), ("free" if available else "unavailable", free)):
                    by_rack[(rack, st)] = by_rack.get((rack, st), 0) + amount
                nk = (node.status.value, "true" if node.schedulable else "false")
                node_counts[nk] = node_counts.get(nk, 0) + 1
            queues = {DEFAULT_QUEUE: 0, **{name: q.guaranteed.gpu for name, q in state.queues.items()}}
            usage = {name: state.queue_usage.get(name) for name in queues}
            pending = len(state.pending)
            spent: dict[str, goodput.Goodput] = {name: goodput.Goodput() for name in queues}
            for job in state.jobs.values():
                if job.runs or job.status.has_gang:
                    queue = state.queue_of(job)
                    spent[queue] = spent.get(queue, goodput.Goodput()) + goodput.of_job(job, now)
        for (st, queue), n in sorted(counts.items()):
            jobs.add_metric([st, queue], n)
        for st, n in by_state.items():
            gpus.add_metric([st], n)
        for (rack, st), n in sorted(by_rack.items()):
            rack_gpus.add_metric([rack, st], n)
        for (st, sched), n in sorted(node_counts.items()):
            nodes.add_metric([st, sched], n)
        for name, guaranteed in sorted(queues.items()):
            used = usage[name]
            queue_used.add_metric([name], used.gpu if used else 0)
            queue_guaranteed.add_metric([name], guaranteed)
        yield from (jobs, gpus, rack_gpus, nodes, queue_used, queue_guaranteed)
        yield from _goodput(spent)
        yield _gauge("synapse_jobs_pending", "jobs waiting to be placed", pending)
        yield _gauge("synapse_nodes_suspect", "nodes cordoned as suspects: gangs of different jobs ended there by a "
                     "node-side cause within the window (an admin's uncordon clears it)", suspect)
        yield _gauge("synapse_free_gpus_largest_rack", "the most free GPUs in one rack: the largest rack-packed "
                     "gang that could start now", max((n for (_, st), n in by_rack.items() if st == "free"), default=0))
        reasons = GaugeMetricFamily("synapse_jobs_pending_reason", "pending jobs by why they wait (leader only)",
                                    labels=["reason"])
        view = self.m.leader_view()
        waiting = view.waiting() if view is not None else {}
        for code in PENDING_REASONS:
            reasons.add_metric([code], sum(1 for w in waiting.values() if w.code == code))
        yield reasons
        yield _gauge("synapse_oldest_pending_seconds", "how long the oldest pending job has waited", oldest)


#: The parts of a queue's GPU time synapse_goodput_gpu_hours gives (synapse.core.goodput).
GOODPUT_PARTS = ("held", "kept", "lost_failures", "lost_restarts", "lost_other", "requeue_wait")


def _goodput(spent: dict[str, goodput.Goodput]) -> Iterator[Metric]:
    """Each queue's GPU-hours by where they went, and its goodput, over the jobs the state holds
    (running, and finished within the retention)."""
    hours = GaugeMetricFamily("synapse_goodput_gpu_hours", "GPU-hours of the jobs the state holds, per queue, by "
                              "part: held, kept, lost to failures, restarts and other stops (of held), and the "
                              "requeue wait (not held)", labels=["queue", "part"])
    ratio = GaugeMetricFamily("synapse_goodput", "kept over held GPU-hours of the jobs the state holds, per queue "
                              "(absent while a queue held nothing)", labels=["queue"])
    for name, g in sorted(spent.items()):
        for part in GOODPUT_PARTS:
            hours.add_metric([name, part], getattr(g, part) / 3600)
        if g.held > 0:
            ratio.add_metric([name], g.goodput)
    yield from (hours, ratio)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc)
    family.add_metric([], value)
    return family


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name.removesuffix("_total"), doc)
    family.add_metric([], value)
    return family


class Metrics:
    """The registry a replica serves, and the counters and histograms the process updates."""

    def __init__(self, master: Master) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(StateCollector(master))
        self.registry.register(FSYNC_SECONDS)
        self.proposals = Counter("synapse_raft_proposals", "commands this replica proposed, by outcome",
                                 ["result"], registry=self.registry)
        #: the two outcomes of every proposal that committed, looked up once (not a labels() per command)
        self.proposals_applied = self.proposals.labels("applied")
        self.proposals_rejected = self.proposals.labels("rejected")
        self.commit_seconds = Histogram("synapse_raft_commit_seconds", "proposal to applied here, on success",
                                        buckets=FAST, registry=self.registry)
        self.round_seconds = Histogram("synapse_scheduling_round_seconds", "one scheduling round (leader)",
                                       buckets=FAST, registry=self.registry)
        self.queue_wait = Histogram("synapse_queue_wait_seconds", "submission (or requeue) to gang placed",
                                    buckets=SLOW, registry=self.registry)
        self.gang_start = Histogram("synapse_gang_start_seconds", "gang placed to all its tasks running",
                                    buckets=SLOW, registry=self.registry)
        self.racks_spanned = Histogram("synapse_gang_racks_spanned", "racks a placed gang spans",
                                       buckets=(1, 2, 3, 4, 6, 8, 16, 32, 64), registry=self.registry)
        self.requests = Counter("synapse_api_requests", "API calls by method and status code",
                                ["method", "code"], registry=self.registry)
        self.redirects = Counter("synapse_api_redirects", "API calls a follower sent to the leader",
                                 ["method"], registry=self.registry)
        watch_lists = Counter("synapse_watch_lists", "nodes' assignment lists this replica's watches built, by "
                              "outcome: sent (changed, or a keepalive) or unchanged (a wake-up for nothing)",
                              ["outcome"], registry=self.registry)
        self.watch_lists_sent, self.watch_lists_unchanged = watch_lists.labels("sent"), watch_lists.labels("unchanged")
        self._placed_at: dict[tuple[str, int], float] = {}  #: (job, attempt) -> when placed, until running

    def applied(self, master: Master, cmds: list[c.Command]) -> None:
        """Observe what applied commands say about gangs (on the loop; every replica alike)."""
        with master.lock:
            state = master.state
            for cmd in cmds:
                if isinstance(cmd, c.CommitPlan):
                    job = state.jobs.get(cmd.job_id)
                    if job is None:
                        continue
                    queued = job.events[-2].at if len(job.events) > 1 and job.events[-2].kind == "Requeued" \
                        else job.submitted_at
                    self.queue_wait.observe(max(0.0, cmd.at - queued))
                    racks = {state.nodes[p.node_id].topology for p in cmd.placements if p.node_id in state.nodes}
                    self.racks_spanned.observe(len(racks))
                    self._placed_at[(job.id, cmd.attempt)] = cmd.at
                elif isinstance(cmd, c.TaskStarted):
                    job = state.jobs.get(cmd.job_id)
                    placed = self._placed_at.get((cmd.job_id, cmd.attempt))
                    if job is not None and placed is not None and job.status is JobStatus.RUNNING:
                        self.gang_start.observe(max(0.0, job.started_at - placed))
                        del self._placed_at[(cmd.job_id, cmd.attempt)]
            if len(self._placed_at) > 100_000:
                self._placed_at.clear()
