"""The leader's one ledger of proposals on their way: what it proposed and has not heard back about.

A decision that must not be proposed twice while the first is on its way (a NodeUp for a node, a
ResizeGang for a gang...) records its command here when it proposes it (`propose`); the command's
outcome (the `Proposed` stimulus, committed or not) clears it (`heard`); the deciders ask `holds`.
Which commands are followed, under which name and key, is one table (`FOLLOWED`): a new kind of
decision is one line there.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from synapse.core import commands as c
from synapse.core.brain.stimuli import Propose
from synapse.core.jobs import dependencies
from synapse.core.state.fsm import ClusterState


@dataclass(frozen=True, slots=True)
class Followed:
    """How the ledger follows one kind of command."""

    name: str  #: what is on its way (kinds that share a name share their keys: one at a time for both)
    key: Callable[[Any], Hashable | None]  #: a command's key; None: this command is not followed
    names: str = ""  #: what the key names, which must exist while it is on its way: "node", "job" or ""


def _node(cmd: Any) -> Hashable:
    node_id: str = cmd.node_id
    return node_id


def _attempt(cmd: Any) -> Hashable:
    return cmd.job_id, cmd.attempt


def _unsatisfiable(cmd: c.FailAttempt) -> Hashable | None:
    return (cmd.job_id, cmd.attempt) if cmd.cause == dependencies.NEVER_SATISFIED else None


#: The commands the ledger follows, by kind.
FOLLOWED = MappingProxyType({
    c.NodeUp: Followed("node up", _node, "node"),
    # A health cordon and a health drain: one health change at a time per node.
    c.SetNodeHealth: Followed("health", _node, "node"),
    c.DrainNode: Followed("health", _node, "node"),
    c.GpuFault: Followed("gpu fault", _node, "node"),
    c.SetSpares: Followed("spares", lambda cmd: ()),
    # Recorded only for an eviction from spares; any Preempt's outcome for the attempt clears it.
    c.Preempt: Followed("eviction", _attempt, "job"),
    c.ResizeGang: Followed("resize", lambda cmd: cmd.job_id, "job"),
    c.CheckpointNotice: Followed("notice", _attempt, "job"),
    c.RecordProgress: Followed("progress", _attempt),
    # Only the failure of a job whose dependency can never be met.
    c.FailAttempt: Followed("unsatisfiable", _unsatisfiable, "job"),
    # Only the cluster's own cancels (no user's): an idle allocation's (monitors.idle_timeout).
    c.CancelJob: Followed("idle", lambda cmd: None if cmd.by else cmd.job_id, "job"),
})


class InFlight:
    """The proposals on their way, by name and key. Changed only by the leader's `handle`."""

    def __init__(self) -> None:
        #: name -> the keys of the proposals of that name on their way; handle only
        self._on_way: dict[str, set[Hashable]] = {f.name: set() for f in FOLLOWED.values()}

    def propose(self, cmd: c.Command) -> Propose:
        """Record `cmd` as on its way, and the instruction that proposes it."""
        followed = FOLLOWED[type(cmd)]
        key = followed.key(cmd)
        assert key is not None, f"{type(cmd).__name__} is not followed"
        self._on_way[followed.name].add(key)
        return Propose(cmd)

    def heard(self, cmd: c.Command) -> None:
        """The outcome of `cmd` came back: it is no longer on its way (whether it committed or not)."""
        followed = FOLLOWED.get(type(cmd))
        if followed is not None:
            key = followed.key(cmd)
            if key is not None:
                self._on_way[followed.name].discard(key)

    def holds(self, name: str, key: Hashable = ()) -> bool:
        """Whether a proposal of `name` for `key` is on its way."""
        return key in self._on_way[name]

    def any(self, name: str) -> bool:
        """Whether any proposal of `name` is on its way."""
        return bool(self._on_way[name])

    def keys(self, name: str) -> frozenset[Hashable]:
        """The keys of the proposals of `name` on their way."""
        return frozenset(self._on_way[name])

    def validate(self, state: ClusterState) -> None:
        """Raise AssertionError if a proposal is on its way for a node or job the state does not hold."""
        for followed in FOLLOWED.values():
            for key in self._on_way[followed.name]:
                if followed.names == "node":
                    assert key in state.nodes, f"a {followed.name} in flight for an unknown node {key}"
                elif followed.names == "job":
                    job_id = str(key[0] if isinstance(key, tuple) else key)
                    assert state.jobs.get(job_id) is not None, f"a {followed.name} in flight for no job {job_id}"
