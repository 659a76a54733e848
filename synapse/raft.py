"""The cluster state on pysyncobj: one replicated door, snapshots as plain data, safe defaults.

What pysyncobj 0.3.17 does not do for us, and how this module makes up for it:

* One door, forever at the same id: pysyncobj numbers `@replicated` methods by sorted name, so the
  consumer has exactly one, `apply(bytes)`, and the command inside is a versioned protobuf.
* Apply must never raise (an exception stops that replica applying for good): `ClusterState.apply`
  catches everything, and the listener hook below is wrapped too.
* Snapshots pickle the consumer's attributes: `_serialize` hands pysyncobj the plain-data
  snapshot of the state instead, and `_deserialize` rebuilds the indexes from it.
* Its port unpickles what arrives and binds 0.0.0.0 by default: `raft_config` refuses to build a
  configuration without a password and always sets the bind address.
* Batching makes every synchronous write wait a tick (~100 ms): it is turned off. Elections are
  tuned to one round, and a cut-off leader falls back before a new one can be elected.
* Results: `propose` always passes a timeout and maps pysyncobj's outcomes to `ProposeError`
  kinds, distinguishing "surely not applied" from "maybe applied".
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, SyncObjException, replicated

from synapse import codec
from synapse import commands as c
from synapse.fsm import ClusterState
from synapse.model import DEFAULT_LEVELS

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RaftTimeouts:
    """Timing of the Raft layer, in seconds (defaults measured for a one-round election)."""

    election_min: float = 0.4
    election_max: float = 1.0
    heartbeat: float = 0.05  #: appendEntriesPeriod
    connection: float = 5.0  #: larger than election_max, so an idle link does not eat a vote
    leader_fallback: float = 0.35  #: below election_min: a cut-off leader steps down first


class ProposeError(Exception):
    """A proposal that did not produce a result. `maybe_applied` says whether it may still commit."""

    def __init__(self, kind: str, maybe_applied: bool, leader: str | None = None) -> None:
        super().__init__(kind)
        self.kind = kind
        self.maybe_applied = maybe_applied
        self.leader = leader  #: a redirect hint, never proof


#: pysyncobj outcomes after which the command may still be (or already be) committed.
_MAYBE_APPLIED = {FAIL_REASON.LEADER_CHANGED, FAIL_REASON.UNKNOWN_OUTCOME, FAIL_REASON.DISCARDED}
_FAIL_NAMES = {getattr(FAIL_REASON, n): n for n in dir(FAIL_REASON) if n.isupper()}


class ReplicatedState(SyncObjConsumer):
    """A ClusterState applied through the Raft log. Read it under `lock`."""

    def __init__(self, levels: tuple[str, ...] = DEFAULT_LEVELS) -> None:
        super().__init__()
        self.lock = threading.RLock()  #: held by apply and by every compound read
        self.state = ClusterState(levels)  #: replaced wholesale when a snapshot is loaded
        #: called on the tick thread after each apply; must be trivial (e.g. set an Event)
        self.listener: Callable[[c.Command | None, c.Result], None] | None = None

    @replicated
    def apply(self, data: bytes) -> tuple[bool, str, str]:
        """The one replicated door: a versioned, encoded command."""
        with self.lock:
            cmd, result = self.state.apply_entry(data)
        listener = self.listener
        if listener is not None:
            try:
                listener(cmd, result)
            except Exception:  # noqa: BLE001 - a raising callback makes pysyncobj apply twice
                log.exception("apply listener failed")
        return (result.ok, result.error, result.value)

    def _serialize(self) -> dict:
        with self.lock:
            return self.state.to_snapshot()

    def _deserialize(self, data: dict) -> None:
        state = ClusterState.from_snapshot(data)
        with self.lock:
            self.state = state

    def digest(self) -> tuple[int, str]:
        """(commands applied, state digest), read together."""
        with self.lock:
            return self.state.applied, self.state.digest()


def raft_config(*, bind_address: str, data_dir: str, password: str,
                timeouts: RaftTimeouts = RaftTimeouts(), **extra: object) -> SyncObjConf:
    """A SyncObjConf with Synapse's mandatory settings; refuses to run without a password."""
    if not password:
        raise ValueError("a Raft password is required: pysyncobj unpickles whatever reaches its port")
    os.makedirs(data_dir, exist_ok=True)
    return SyncObjConf(
        password=password,
        bindAddress=bind_address,
        journalFile=os.path.join(data_dir, "raft.journal"),
        fullDumpFile=os.path.join(data_dir, "raft.dump"),
        appendEntriesUseBatch=False,
        raftMinTimeout=timeouts.election_min,
        raftMaxTimeout=timeouts.election_max,
        appendEntriesPeriod=timeouts.heartbeat,
        connectionTimeout=timeouts.connection,
        leaderFallbackTimeout=timeouts.leader_fallback,
        dynamicMembershipChange=True,
        **extra,
    )


class RaftNode:
    """One replica: a SyncObj carrying a ReplicatedState."""

    def __init__(self, self_address: str, partners: list[str], conf: SyncObjConf,
                 levels: tuple[str, ...] = DEFAULT_LEVELS) -> None:
        self.replicated = ReplicatedState(levels)
        self.sync = SyncObj(self_address, partners, conf=conf, consumers=[self.replicated])

    def propose(self, cmd: c.Command, timeout: float = 5.0) -> c.Result:
        """Append a command and wait for its result on this replica; raises ProposeError."""
        try:
            ok, error, value = self.replicated.apply(codec.encode_command(cmd), sync=True, timeout=timeout)
        except SyncObjException as exc:
            code = exc.errorCode
            if code == "Timeout":
                raise ProposeError("timeout", maybe_applied=True, leader=self.leader()) from exc
            name = _FAIL_NAMES.get(code, str(code))
            raise ProposeError(name, maybe_applied=code in _MAYBE_APPLIED, leader=self.leader()) from exc
        return c.Result(ok, error, value)

    async def propose_async(self, cmd: c.Command, timeout: float = 5.0) -> c.Result:
        """Like `propose`, without blocking the event loop: pysyncobj's callback resolves a future."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def resolve(res: object, err: int) -> None:
            if not future.done():
                future.set_result((res, err))

        def on_done(res: object, err: int) -> None:  # on the tick thread: trivial, never raises
            try:
                loop.call_soon_threadsafe(resolve, res, err)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

        self.replicated.apply(codec.encode_command(cmd), callback=on_done)
        try:
            res, err = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise ProposeError("timeout", maybe_applied=True, leader=self.leader()) from None
        if err != FAIL_REASON.SUCCESS:
            raise ProposeError(_FAIL_NAMES.get(err, str(err)), maybe_applied=err in _MAYBE_APPLIED,
                               leader=self.leader())
        ok, error, value = res  # type: ignore[misc]
        return c.Result(ok, error, value)

    def is_leader(self) -> bool:
        return self.sync._isLeader()

    def leader(self) -> str | None:
        """The leader as this replica believes it: a hint, possibly stale."""
        leader = self.sync._getLeader()
        return None if leader is None else str(leader.address if hasattr(leader, "address") else leader)

    def term(self) -> int:
        return self.sync.raftCurrentTerm

    def status(self) -> dict:
        return self.sync.getStatus()

    def destroy(self) -> None:
        self.sync.destroy()
