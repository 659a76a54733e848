"""What a leader is told once, for its whole term (`LeaderConfig`), and the queue policy it runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from synapse.core.schedule.reservations import Reservation
from synapse.core.schedule.scheduler import RoundMemo, RoundResult, schedule_round
from synapse.core.schedule.spares import SparePolicy
from synapse.core.state.fsm import ClusterState

#: A queue policy: (state, now, previous reservations, memo) -> the round's plans, as schedule_round.
QueuePolicy = Callable[[ClusterState, float, "Reservation | tuple[Reservation, ...] | None", "RoundMemo | None"],
                       RoundResult]


@dataclass(frozen=True, slots=True)
class LeaderConfig:
    """What a leader is told once, for its whole term."""

    heartbeat_timeout: float = 10.0  #: a READY node silent this long goes DOWN
    shard_silence: float = 3.0  #: a link shard whose digests stopped this long is silent
    #: a silent shard's nodes may take this long (at least the timeout) from its last digest to move
    shard_move: float = 0.0
    #: a node silent this long counts toward a mass silence (0: half the timeout); at most the
    #: timeout less the heartbeat interval, so all the nodes of a sudden silence count at once
    late_after: float = 0.0
    #: the guard holds expiring nodes while more than this share of the READY nodes is late ...
    mass_silence_share: float = 0.5
    #: ... and more than this many (a rack of a small cluster going dark is declared at once, and
    #: a 3-node test cluster never trips it)
    mass_silence_min: int = 10
    #: a mass silence must last this much longer (from when the guard engaged) for its nodes to
    #: go DOWN (0: one heartbeat timeout)
    mass_silence_hold: float = 0.0
    #: finished jobs are forgotten this long after they end (with history: after the store holds
    #: them); 0 keeps them
    job_retention: float = 3600.0
    history: bool = False  #: a history store is configured: never forget a job it does not hold yet
    max_unarchived: int = 0  #: with history: finished jobs kept unarchived at most; beyond, the oldest go (loudly)
    #: the decayed usage's half-life the state should have (synapse.core.schedule.fairshare); None: leave it be
    usage_half_life: float | None = None
    preempt: bool = True  #: plan preemptions (only for jobs of admin-defined queues)
    #: a job's changed checkpoint goes into the log at most this often (its attempt's first at once)
    checkpoint_record_interval: float = 15.0
    policy: QueuePolicy = schedule_round  #: the queue policy (the simulator runs baselines through it)
    spares: SparePolicy | None = None  #: spare nodes to keep (synapse.core.schedule.spares); None: none

