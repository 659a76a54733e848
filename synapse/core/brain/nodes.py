"""The leader's decisions about nodes: a heartbeat brings a DOWN node back, records a health change
or a GPU fault (one proposal at a time per node for each); a monitor pass declares silent nodes
DOWN, unless the mass-silence guard holds them (Kubernetes' node lifecycle controller stops evicting
when most of a zone goes unready at once: the leader's own view is then the likelier fault)."""

from __future__ import annotations

import logging

from synapse.core import commands as c
from synapse.core import versions
from synapse.core.brain.config import LeaderConfig
from synapse.core.brain.heartbeat import HeartbeatTracker, Silence, gpu_fault_change, health_change
from synapse.core.brain.inflight import InFlight
from synapse.core.brain.stimuli import Heartbeat, Instruction, LivenessDigest, MonitorDue, Propose
from synapse.core.model import NodeStatus
from synapse.core.state.fsm import ClusterState

log = logging.getLogger(__name__)


class NodeWatch:
    """Heartbeats and digests in; NodeUp, health, GPU-fault and NodeDown proposals out."""

    def __init__(self, config: LeaderConfig, inflight: InFlight) -> None:
        self.config = config  #: fixed for the term
        self.inflight = inflight  #: the leader's ledger of proposals on their way (shared)
        #: last heartbeat per node (monotonic); handle only
        self.heartbeats = HeartbeatTracker(config.heartbeat_timeout, config.shard_silence,
                                           config.shard_move, config.late_after)
        #: monotonic time the mass-silence guard engaged, or None while it is off; handle only
        self.mass_silence_since: float | None = None
        #: silent nodes the guard held back from DOWN at the last monitor pass; handle only (a metric)
        self.held_silent = 0

    def heartbeat(self, state: ClusterState, s: Heartbeat, version: int) -> list[Instruction]:
        """A node was heard from, with every member applying command-set `version`."""
        node = state.nodes.get(s.node_id)
        if node is None:
            return []
        self.heartbeats.beat(s.node_id, s.mono)
        inflight = self.inflight
        out: list[Instruction] = []
        if node.status is NodeStatus.DOWN and not inflight.holds("node up", s.node_id):
            out.append(inflight.propose(c.NodeUp(at=s.at, node_id=s.node_id)))
        if s.health is not None and not inflight.holds("health", s.node_id):
            # From version 3 a failing check's drain is a DrainNode (its gangs requeue uncharged) after
            # the health cordon, and level-triggered: proposed while the node is health-cordoned with
            # gangs wanted on it, so a drain lost to a leader change is made by the next heartbeat.
            drain = s.health.drain and versions.may_propose(c.DrainNode, version)
            cmd = health_change(node, s.health.unhealthy, s.health.message, s.health.drain and not drain, s.at)
            reason = f"health check failed: {s.health.message or 'health check failed'}"
            if cmd is not None:
                out.append(inflight.propose(cmd))
                if drain and isinstance(cmd, c.SetNodeHealth) and not cmd.healthy:
                    out.append(Propose(c.DrainNode(at=s.at, node_id=s.node_id, cordon=False, reason=reason)))
            elif drain and s.health.unhealthy and node.health_cordon \
                    and any(wanted for _, wanted in state.tasks_on_node(node.id)):
                out.append(inflight.propose(c.DrainNode(at=s.at, node_id=s.node_id, cordon=False, reason=reason)))
        if s.gpu_errors and not inflight.holds("gpu fault", s.node_id) and versions.may_propose(c.GpuFault, version):
            # Below version 4 a GPU error is not acted on: an older replica knows no GpuFault.
            fault = gpu_fault_change(node, s.gpu_errors, state.tasks_on_node(node.id), s.at)
            if fault is not None:
                out.append(inflight.propose(fault))
        return out

    def digest(self, state: ClusterState, s: LivenessDigest) -> list[Instruction]:
        """A link shard's digest feeds heartbeat expiry."""
        self.heartbeats.digest(s.shard, s.mono, s.ages)
        return []

    def expired(self, state: ClusterState, mono: float) -> list[tuple[str, float]]:
        """The READY nodes to declare DOWN now, with how long each was silent."""
        ready = [n.id for n in state.nodes.values() if n.status is NodeStatus.READY]
        return self._declarable(self.heartbeats.silence(ready, mono), len(ready), mono)

    @staticmethod
    def down(declared: list[tuple[str, float]], s: MonitorDue) -> list[Instruction]:
        """The NodeDown (from version 3, NodeLost: its gangs requeue uncharged) of each declared node."""
        down = c.NodeLost if versions.may_propose(c.NodeLost, s.cluster_version) else c.NodeDown
        out: list[Instruction] = []
        for node_id, silent in declared:
            log.warning("node silent node=%s silent_s=%.1f; declaring it down", node_id, silent)
            out.append(Propose(down(at=s.at, node_id=node_id, reason=f"no heartbeat for {silent:.1f}s")))
        return out

    def _declarable(self, silence: Silence, ready: int, now: float) -> list[tuple[str, float]]:
        """The expired nodes to declare DOWN now: all of them, unless a mass silence holds them."""
        config = self.config
        hold = config.mass_silence_hold or config.heartbeat_timeout
        mass = silence.late > config.mass_silence_min and silence.late > config.mass_silence_share * ready
        if not mass:
            if self.mass_silence_since is not None:
                log.warning("mass silence over late=%d ready=%d held_s=%.1f", silence.late, ready,
                            now - self.mass_silence_since)
            self.mass_silence_since, self.held_silent = None, 0
            return silence.expired
        if not silence.expired:  # late, none expired yet: nothing to hold (a stall that ends in time)
            self.held_silent = 0
            return []
        if self.mass_silence_since is None:
            self.mass_silence_since = now
            log.warning("mass silence late=%d ready=%d expired=%d; holding NodeDowns for %.1fs (the leader's "
                        "own view is the likelier fault)", silence.late, ready, len(silence.expired), hold)
        if now - self.mass_silence_since > hold:
            self.held_silent = 0
            return silence.expired
        self.held_silent = len(silence.expired)
        return []

    def validate(self) -> None:
        """Raise AssertionError if the guard's memory contradicts itself."""
        assert self.mass_silence_since is not None or not self.held_silent, "nodes held with no mass silence"
