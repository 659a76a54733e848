"""The rendezvous port of a gang's attempt (MASTER_PORT): chosen by rule, checked on rank 0's node.

Every rank of an attempt must be given the same port, and every replica that serves one of the
gang's nodes must give that same port without asking anyone; so the port is a pure function of
(job id, attempt), which dispatch computes from the state wherever it runs. Nothing is chosen in
apply, and a requeued job's next attempt gets another port.

The ports come from `MASTER_PORTS`: 20000-29999, below Linux's default ephemeral range (32768-60999,
where the kernel picks the local ports of outgoing connections, so a port there may be taken at any
moment) and below Kubernetes' NodePort range (30000-32767), less the ports in `RESERVED` that other
software listens on by default. The range is fixed here rather than set in a master's config file:
a setting could differ between replicas, and two replicas serving the same gang would then give its
ranks different ports. A node whose ephemeral range reaches into it is warned about at its
worker's start (`ephemeral_overlap`).

A port from the range may still be in use on rank 0's node. So the worker that runs rank 0 tries to
bind the port just before it starts the task (the other ranks only connect to it), and if it cannot,
it does not start rank 0 and reports it ended `MasterPortInUse` ("MASTER_PORT N in use on node X").
That stops the attempt, and the job is requeued at its next attempt, with a new port, using none of
its restarts: the clash is the node's, not the job's. The gang's other ranks may have started by
then; they are stopped with the attempt, and until then they knock at a port that whatever holds
it answers, or not. This costs one attempt, rarely, instead of a round trip to the leader before
every gang starts (rank 0's worker confirming the port before the others are told it). What this check cannot
see is a process that binds the port in the moment between it and the task's own bind; outside the
ephemeral range only another program binding that very port can.
"""

from __future__ import annotations

import zlib

#: Where rendezvous ports come from: below the kernel's default ephemeral range and Kubernetes'
#: NodePort range (see the module's docstring).
MASTER_PORTS = range(20000, 30000)
#: Ports in that range that well-known software listens on by default: torchrun's c10d rendezvous
#: (29400) and torch.distributed's MASTER_PORT (29500), for a job someone starts by hand on a node;
#: GlusterFS (24007-24008), CockroachDB (26257), MongoDB (27017-27019).
RESERVED = frozenset({24007, 24008, 26257, 27017, 27018, 27019, 29400, 29500})
_CANDIDATES = tuple(p for p in MASTER_PORTS if p not in RESERVED)


def master_port(job_id: str, attempt: int) -> int:
    """The rendezvous port of one attempt: the same on every replica, spread over the range."""
    return _CANDIDATES[zlib.crc32(f"{job_id}/{attempt}".encode()) % len(_CANDIDATES)]


def ephemeral_overlap(low: int, high: int) -> range:
    """The ports of `MASTER_PORTS` inside a node's ephemeral range low-high (empty if none)."""
    return range(max(low, MASTER_PORTS.start), min(high + 1, MASTER_PORTS.stop))
