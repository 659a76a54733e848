"""The cluster's own records: the command-set version every member applies, the master replicas
added at run time, and the barrier.

State: `cluster_version`, `replicas`. Commands: SetClusterVersion, SetReplica, Barrier.
"""

from __future__ import annotations

from synapse.core import commands as c
from synapse.core.commands import Result
from synapse.core.state.tables import ClusterTables


def set_cluster_version(state: ClusterTables, cmd: c.SetClusterVersion) -> Result:
    """Raise the command-set version every member applies; it never goes down (a lower one changes
    nothing)."""
    if cmd.version <= state.cluster_version:
        return Result(True, value=f"already at version {state.cluster_version}")
    state.cluster_version = cmd.version
    state.emit(cmd.at, "Normal", "cluster", "ClusterVersion", "", f"every member applies command-set version "
                                                                  f"{cmd.version}")
    return Result(True, value=str(cmd.version))


def set_replica(state: ClusterTables, cmd: c.SetReplica) -> Result:
    """Record a master replica's raft and API addresses, or forget it (`removed`)."""
    if not cmd.id:
        return Result.rejected("replica id must not be empty")
    if cmd.removed:
        state.replicas.pop(cmd.id, None)
        return Result(True)
    if not cmd.raft_address or not cmd.api_address:
        return Result.rejected(f"replica {cmd.id}: raft and api addresses are required")
    state.replicas[cmd.id] = (cmd.raft_address, cmd.api_address)
    return Result(True)


def barrier(state: ClusterTables, cmd: c.Barrier) -> Result:
    """Nothing changes: committing a Barrier proves its proposer still leads."""
    return Result(True)
