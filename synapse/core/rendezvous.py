"""The rendezvous port of a gang's attempt (MASTER_PORT): chosen by rule, checked on rank 0's node.

Every rank of an attempt must be given the same port, and every replica that serves one of the
gang's nodes must give that same port without asking anyone; so the port is a pure function of
(job id, attempt), which dispatch computes from the state wherever it runs. Nothing is chosen in
apply, and a requeued job's next attempt gets another port.

The ports come from a range, `MASTER_PORTS` unless the cluster file sets `rendezvous_ports`:
20000-29999, below Linux's default ephemeral range (32768-60999, where the kernel picks the local
ports of outgoing connections, so a port there may be taken at any moment) and below Kubernetes'
NodePort range (30000-32767), less the ports in `RESERVED` that other software listens on by
default. Every replica that serves one of a gang's nodes computes the port from its own cluster
file, so every master must have the same range: a replica with another one would give its ranks
another port (the ranks of that attempt would not meet, and it fails). The default has not changed
since the port was first chosen so, which is why it is not moved above synapse-local's own ports
or elsewhere: during a rolling upgrade an older replica computes from it, and a newer one must give
the same port. A setting changes that only where an operator sets it, all masters alike. A node
whose ephemeral range reaches into the range is warned about at its worker's start
(`ephemeral_overlap`, with the worker's `--rendezvous-ports`).

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

import functools
import zlib

#: Where rendezvous ports come from unless the cluster file says otherwise: below the kernel's
#: default ephemeral range and Kubernetes' NodePort range (see the module's docstring).
MASTER_PORTS = range(20000, 30000)
#: Ports in that range that well-known software listens on by default: torchrun's c10d rendezvous
#: (29400) and torch.distributed's MASTER_PORT (29500), for a job someone starts by hand on a node;
#: GlusterFS (24007-24008), CockroachDB (26257), MongoDB (27017-27019).
RESERVED = frozenset({24007, 24008, 26257, 27017, 27018, 27019, 29400, 29500})
#: The fewest ports a range may offer: fewer, and two gangs with rank 0 on one node draw the same often.
MIN_PORTS = 100


@functools.lru_cache(maxsize=8)
def _candidates(ports: range) -> tuple[int, ...]:
    return tuple(p for p in ports if p not in RESERVED)


def master_port(job_id: str, attempt: int, ports: range = MASTER_PORTS) -> int:
    """The rendezvous port of one attempt: the same on every replica, spread over `ports`."""
    candidates = _candidates(ports)
    return candidates[zlib.crc32(f"{job_id}/{attempt}".encode()) % len(candidates)]


def ephemeral_overlap(low: int, high: int, ports: range = MASTER_PORTS) -> range:
    """The ports of `ports` inside a node's ephemeral range low-high (empty if none)."""
    return range(max(low, ports.start), min(high + 1, ports.stop))


def parse_ports(text: str) -> range:
    """A rendezvous port range from "LOW-HIGH" (both included); ValueError says what is wrong."""
    low, sep, high = str(text).strip().partition("-")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f"must be LOW-HIGH, e.g. 20000-29999, not {text!r}")
    ports = range(int(low), int(high) + 1)
    if not (1024 <= ports.start and ports.stop <= 65536):
        raise ValueError(f"{text}: ports from 1024 to 65535 (below 1024 a task may not bind them)")
    if len(_candidates(ports)) < MIN_PORTS:
        raise ValueError(f"{text}: at least {MIN_PORTS} ports, or gangs whose rank 0 shares a node draw the same")
    return ports


def format_ports(ports: range) -> str:
    """"LOW-HIGH", as `parse_ports` reads it."""
    return f"{ports.start}-{ports.stop - 1}"
