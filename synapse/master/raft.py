"""The Raft layer on pysyncobj: a replica (`RaftNode`) carrying the replicated door, safe defaults,
and the proposal pipeline.

What pysyncobj 0.3.17 does not do for us, and how this module makes up for it (the corrections to
pysyncobj's Raft itself, PreVote and the AppendEntries receiver rules among them, live in
`synapse.master.safesyncobj`):

* One door, forever at the same id, that never raises, with snapshots as plain data: the
  consumer, `ReplicatedState`, is synapse.master.replicated's.
* Its port unpickles what arrives and binds 0.0.0.0 by default: `raft_config` refuses to build a
  configuration without a password and always sets the bind address.
* Batching makes every synchronous write wait a tick (~100 ms): it is turned off. Elections are
  tuned to one round, and a cut-off leader falls back about when a new one can be elected.
* Results: `propose` always passes a timeout and maps pysyncobj's outcomes to `ProposeError`
  kinds, distinguishing "surely not applied" from "maybe applied". `propose_async` groups the
  proposals made while earlier entries travel into one entry (group commit); `propose_all_async`
  puts several commands in one entry, never split.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pysyncobj import FAIL_REASON, SyncObjConf, SyncObjException

from synapse.core import codec, versions
from synapse.core import commands as c
from synapse.core.model import DEFAULT_LEVELS
from synapse.master.config import GROUP_COMMIT_DELAY_S, RAFT_HEARTBEAT_S
from synapse.master.durability import DumpFailureWatch, fsync_durable, seal
from synapse.master.replicated import OWN_KINDS, ReplicatedState
from synapse.master.safesyncobj import SafeSyncObj

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RaftTimeouts:
    """Timing of the Raft layer, in seconds.

    etcd's rule: an election timeout of at least ten heartbeats, so a late heartbeat or two never
    starts an election, and a leader steps down only after a whole (minimum) election timeout
    without hearing from a majority: a cut-off leader is gone about when the others' first
    election can start, and a leader whose process was merely slow keeps its place (see
    synapse.master.safesyncobj on pauses)."""

    election_min: float = 0.5
    election_max: float = 1.0
    heartbeat: float = RAFT_HEARTBEAT_S  #: appendEntriesPeriod
    connection: float = 5.0  #: larger than election_max, so an idle link does not eat a vote
    leader_fallback: float = 0.5  #: one minimum election timeout without a majority
    #: pysyncobj retries a failed link only this often (default 5 s): a replica restarted during a
    #: failover could not reach its peer's vote in time, and elections took 4 s instead of one round
    reconnect: float = 0.25


class LoopInbox:
    """Hands work from pysyncobj's tick thread to an asyncio loop with few wake-ups.

    `post` appends to a deque and wakes the loop only when no drain is already pending, so a burst
    of applied entries costs one self-pipe write instead of one per entry. Safe to call from the
    tick thread: it never raises.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: collections.deque[tuple[Callable[..., None], tuple[object, ...]]] = collections.deque()
        self._scheduled = False

    def post(self, fn: Callable[..., None], *args: object) -> None:
        self._items.append((fn, args))
        if not self._scheduled:
            self._scheduled = True
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    def _drain(self) -> None:
        self._scheduled = False  # before popping: a post from now on schedules another drain
        while self._items:
            fn, args = self._items.popleft()
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - one bad handler must not stop the others
                log.exception("loop inbox handler failed")


class ProposeError(Exception):
    """A proposal that did not produce a result. `maybe_applied` says whether it may still commit.

    Kinds besides pysyncobj's outcomes: `timeout`; `HALTED`, the entry committed but this replica
    stopped applying before it (maybe applied: the others apply it); `CLUSTER_VERSION`, refused
    before proposing because a member's code could not apply the command (never applied)."""

    def __init__(self, kind: str, maybe_applied: bool, leader: str | None = None, *, needed: int = 0,
                 behind: tuple[tuple[str, int], ...] = ()) -> None:
        super().__init__(kind)
        self.kind = kind
        self.maybe_applied = maybe_applied
        self.leader = leader  #: a redirect hint, never proof
        self.needed = needed  #: CLUSTER_VERSION: the command-set version the command needs
        #: CLUSTER_VERSION: (raft address, version it reported, 0 if none) of each member below `needed`
        self.behind = behind


#: pysyncobj outcomes after which the command may still be (or already be) committed.
_MAYBE_APPLIED = {FAIL_REASON.LEADER_CHANGED, FAIL_REASON.UNKNOWN_OUTCOME, FAIL_REASON.DISCARDED}
_FAIL_NAMES = {getattr(FAIL_REASON, n): n for n in dir(FAIL_REASON) if n.isupper()}
#: Most commands one group-commit log entry carries.
MAX_BATCH = 256
#: Group commit's delay (PostgreSQL's commit_delay, Kafka's linger.ms): under load, when an entry
#: is resolved and proposals wait for the next one, it waits this long for more to join it, unless
#: GROUP_COMMIT_FULL already wait. A proposal made with nothing in flight goes at once, so an idle
#: cluster never waits. Every entry costs each replica a journal write, an fsync, a sealed message
#: per peer and an apply whatever it carries: on bench/ha.py's loaded cluster 3 ms took an entry
#: from about 5 submissions to about 8 and the leader's CPU per submission down by a tenth or more
#: (docs/benchmarks.md). `group_commit_delay` in the cluster file sets it; GROUP_COMMIT_DELAY_S
#: (synapse.master.config) is its default.
#: GROUP_COMMIT_FULL: proposals that make an entry worth sending without waiting out the delay.
GROUP_COMMIT_FULL = 16
#: Log entries in flight at once; later proposals wait and travel together in the next one. One:
#: the leader's CPU, not the round trip, limits a loaded cluster here, and each entry costs every
#: replica a journal write, an fsync, an encrypted message and an apply whatever it carries. With
#: two, bench/ha.py's entries carried about 4 submissions and the leader spent 0.97-1.09 ms of CPU
#: on each; with one, about 6 and 0.82-0.85 ms (the followers 0.24 ms instead of 0.30-0.37).
MAX_IN_FLIGHT = 1
#: A slot whose entry has had no outcome for this long is freed (the proposal itself times out).
IN_FLIGHT_TIMEOUT_S = 5.0


#: What a proposal's future gets: (one result per command, or None when this replica stopped
#: applying first; pysyncobj's FAIL_REASON, or _TIMED_OUT / _HALTED below).
Outcome = tuple[list[c.Result] | None, object]

#: The outcome a proposal's future gets when its timeout passes first.
_TIMED_OUT = object()
#: The outcome of a proposal that committed after this replica stopped applying (see `_failure`).
_HALTED = object()


def _expire(future: asyncio.Future[Outcome]) -> None:
    if not future.done():
        future.set_result((None, _TIMED_OUT))


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
        connectionRetryTime=timeouts.reconnect,
        leaderFallbackTimeout=timeouts.leader_fallback,
        dynamicMembershipChange=True,
        **extra,
    )


class RaftNode:
    """One replica: a SyncObj carrying a ReplicatedState."""

    def __init__(self, self_address: str, partners: list[str], conf: SyncObjConf,
                 levels: tuple[str, ...] = DEFAULT_LEVELS, durable: bool = True,
                 commands: codec.CommandSet = codec.CURRENT,
                 group_commit_delay: float = GROUP_COMMIT_DELAY_S) -> None:
        self.commands = commands  #: the command kinds and versions this replica's code applies
        #: how long the next entry waits for more proposals under load (see GROUP_COMMIT_DELAY_S)
        self.group_commit_delay = group_commit_delay
        self.replicated = ReplicatedState(levels, commands)
        self.dump_watch = DumpFailureWatch()
        logging.getLogger("pysyncobj.syncobj").addHandler(self.dump_watch)
        self.sync = SafeSyncObj(self_address, partners, conf=conf, consumers=[self.replicated],
                                command_version=commands.known, stopped=self.replicated.stop_reason,
                                reads_sealed=commands.known >= versions.SEALED_TRANSPORT_VERSION)
        if self.sync.cipher is not None:
            # Messages go out sealed with AES-GCM once the replicated cluster version says every
            # member reads it (synapse.master.cipher); it only rises. Read by the tick thread.
            self.sync.cipher.sealed = \
                lambda: self.replicated.state.cluster_version >= versions.SEALED_TRANSPORT_VERSION
        if durable:
            self.sync.journal_flush = fsync_durable(self.sync)
        #: groups of commands proposed together, each with its future, waiting for this loop turn
        self._queued: list[tuple[tuple[c.Command, ...] | list[c.Command], asyncio.Future[Outcome]]] = []
        self._flush_scheduled = False
        self._delayed: asyncio.TimerHandle | None = None  #: a flush waiting out the group-commit delay
        self._in_flight = 0  #: log entries proposed and not yet resolved
        self.inbox: LoopInbox | None = None  #: set by `bind_loop`; results come back through it
        self._waiting: set[asyncio.Future[Outcome]] = set()  #: futures of proposals sent and not yet resolved
        self._changes: set[asyncio.Future[object]] = set()  #: futures of membership changes not yet resolved
        self._releases: set[Callable[[], None]] = set()  #: frees each in-flight slot still held
        # The leader holds a commit index for the next entry's AppendEntries only while proposals
        # wait for that entry (read by the tick thread: a list's truth is one atomic read).
        self.sync.more_coming = lambda: bool(self._queued)
        self.entries_proposed = 0  #: log entries proposed from this replica
        self.commands_proposed = 0  #: commands inside them (entries < commands when batching helps)

    def propose(self, cmd: c.Command, timeout: float = 5.0) -> c.Result:
        """Append a command and wait for its result on this replica; raises ProposeError."""
        self.check_cluster_version(cmd)
        try:
            results: list[c.Result] | None = self.replicated.apply(
                seal(codec.encode_command(cmd, self.commands)), sync=True, timeout=timeout)
        except SyncObjException as exc:
            raise self._failure(exc.errorCode) from exc
        if results is None:
            raise self._failure(_HALTED)
        [result] = results
        return result

    def check_cluster_version(self, cmd: c.Command) -> None:
        """Raise ProposeError CLUSTER_VERSION unless every member's code can apply `cmd`.

        A replica stops at a log entry its code does not know. So a command of a kind introduced by
        command-set version V is proposed only once every member of the configuration has told
        this replica (its leader) that it knows V: etcd's cluster version. During a rolling upgrade
        the new kinds wait for the last replica; a member not heard from counts as not upgraded.
        """
        needed = self.commands.version_of(cmd)
        if needed <= max(versions.BASE_VERSION, self.replicated.state.cluster_version):
            return  # every member applies these (every release, or the cluster's version): even with one down
        behind = tuple(sorted((member, version) for member, version in self.member_versions().items()
                              if version < needed))
        if behind:
            raise ProposeError("CLUSTER_VERSION", maybe_applied=False, leader=self.leader(), needed=needed,
                               behind=behind)

    def member_versions(self) -> dict[str, int]:
        """Each member's command-set version by Raft address, as this replica last heard it (0: not
        heard lately, or a release that does not tell); only a leader hears its followers'."""
        return self.sync.member_versions()

    def cluster_version(self) -> int:
        """The highest command-set version every member is known to apply: the replicated cluster
        version (SetClusterVersion, which only rises), or higher while every member is heard to
        know more (on a leader; a member not heard from counts as the base version)."""
        return max(versions.BASE_VERSION, min(self.member_versions().values()), self.replicated.state.cluster_version)

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> LoopInbox:
        """Use `loop` for asynchronous proposals and hand-offs from the tick thread."""
        self.inbox = LoopInbox(loop)
        return self.inbox

    async def propose_async(self, cmd: c.Command, timeout: float = 5.0) -> c.Result:
        """Like `propose`, without blocking the event loop, and with pipelined group commit.

        At most MAX_IN_FLIGHT log entries are in flight at once. Proposals made while they are
        travelling wait, and go into the next entry together (a Batch, applied in order, each
        command with its own result). Under load one Raft round then carries many commands; when
        idle a proposal goes out at once.
        """
        return (await self.propose_all_async((cmd,), timeout))[0]

    async def propose_all_async(self, cmds: tuple[c.Command, ...] | list[c.Command],
                                timeout: float = 5.0) -> list[c.Result]:
        """Propose `cmds` as one group: they travel in one log entry, in order (with other
        proposals' groups, never split), so they commit together or not at all, and a leader change
        can never leave the first half applied without the second. One result per command."""
        if not cmds:
            return []
        for cmd in cmds:
            self.check_cluster_version(cmd)
        loop = asyncio.get_running_loop()
        if self.inbox is None or self.inbox.loop is not loop:
            self.bind_loop(loop)
        future: asyncio.Future[Outcome] = loop.create_future()
        self._queued.append((cmds, future))
        # With the pipeline full, the slot's release schedules the flush (one wake-up per entry,
        # not one per proposal that could not go anyway).
        if not self._flush_scheduled and self._in_flight < MAX_IN_FLIGHT:
            self._flush_scheduled = True
            loop.call_soon(self._flush, loop)
        elif self._delayed is not None and len(self._queued) >= GROUP_COMMIT_FULL:
            self._delayed.cancel()  # enough to share an entry: it need not wait any longer
            self._delayed = None
            loop.call_soon(self._flush, loop)
        expiry = loop.call_later(timeout, _expire, future)  # cheaper than wait_for + shield per proposal
        try:
            res, err = await future
        finally:
            expiry.cancel()
            self._waiting.discard(future)
        if err != FAIL_REASON.SUCCESS:
            raise self._failure(err)
        if res is None:  # committed, but this replica stopped applying before it
            raise self._failure(_HALTED)
        return res

    def _failure(self, outcome: object) -> ProposeError:
        """The ProposeError for a proposal's outcome other than success: a pysyncobj FAIL_REASON,
        SyncObjException's 'Timeout', this module's _TIMED_OUT, or _HALTED (committed, but this
        replica stopped applying before it: the others apply it)."""
        if outcome is _TIMED_OUT or outcome == "Timeout":
            return ProposeError("timeout", maybe_applied=True, leader=self.leader())
        if outcome is _HALTED:
            return ProposeError("HALTED", maybe_applied=True, leader=self.leader())
        return ProposeError(_FAIL_NAMES.get(outcome, str(outcome)), maybe_applied=outcome in _MAYBE_APPLIED,
                            leader=self.leader())

    def _take_batch(self) -> list[tuple[tuple[c.Command, ...] | list[c.Command], asyncio.Future[Outcome]]]:
        """The groups the next entry carries: queued groups in order while they hold at most
        MAX_BATCH commands together (a larger group travels alone: groups are never split)."""
        size, n = 0, 0
        for cmds, _ in self._queued:
            if n and size + len(cmds) > MAX_BATCH:
                break
            size += len(cmds)
            n += 1
        batch, self._queued = self._queued[:n], self._queued[n:]
        return batch

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        inbox = self.inbox
        if inbox is None:  # not reached: propose_all_async binds the loop before it schedules a flush
            raise RuntimeError("a flush before a loop was bound")
        self._flush_scheduled = False
        self._delayed = None
        while self._queued and self._in_flight < MAX_IN_FLIGHT:
            batch = self._take_batch()
            cmds = [cmd for group, _ in batch for cmd in group]
            data = seal(codec.encode_command(cmds[0], self.commands) if len(cmds) == 1
                        else codec.encode_batch(cmds, self.commands))
            futures = [f for _, f in batch]
            self._waiting.update(futures)
            self.entries_proposed += 1
            self.commands_proposed += len(cmds)
            self._in_flight += 1
            slot: dict[str, Any] = {"open": True}  #: "open", and "release": the slot's release below

            def release(slot: dict[str, Any] = slot) -> None:
                if slot["open"]:
                    slot["open"] = False
                    self._releases.discard(slot["release"])
                    self._in_flight -= 1
                    if self._queued and not self._flush_scheduled:
                        self._flush_scheduled = True
                        if self.group_commit_delay > 0 and len(self._queued) < GROUP_COMMIT_FULL:
                            self._delayed = loop.call_later(self.group_commit_delay, self._flush, loop)
                        else:
                            loop.call_soon(self._flush, loop)

            slot["release"] = release
            self._releases.add(release)

            sizes = [len(group) for group, _ in batch]

            def resolve(res: list[c.Result] | None, err: object, futures: list[asyncio.Future[Outcome]] = futures,
                        release: Callable[[], None] = release, sizes: list[int] = sizes) -> None:
                release()
                start = 0
                for f, size in zip(futures, sizes, strict=True):
                    if not f.done():
                        f.set_result((res[start:start + size] if res else None, err))
                    start += size

            def on_done(res: object, err: int, resolve: Callable[[list[c.Result] | None, object], None] = resolve,
                        inbox: LoopInbox = inbox) -> None:
                inbox.post(resolve, res, err)  # tick thread: trivial, never raises

            loop.call_later(IN_FLIGHT_TIMEOUT_S, release)  # a lost callback must not stall the pipeline
            if all(type(cmd) in OWN_KINDS for cmd in cmds):
                self.replicated.proposing(data, cmds)
            self.replicated.apply(data, callback=on_done)

    def abandon(self) -> int:
        """Fail every proposal (and membership change) still waiting, because this replica stopped
        leading or is stopping; returns how many.

        pysyncobj keeps a deposed leader's proposals waiting until their entries are applied or
        replaced, and a leader cut off from its peers learns neither until the partition heals:
        its clients would wait out their whole timeout. Entries already sent may still commit
        under the new leader (LEADER_CHANGED: maybe applied; clients retry with the same request
        id); queued ones never left this replica (NOT_LEADER) and are dropped.
        """
        queued, self._queued = self._queued, []
        failed = 0
        for outcome, futures in ((FAIL_REASON.NOT_LEADER, [f for _, f in queued]),
                                 (FAIL_REASON.LEADER_CHANGED, list(self._waiting))):
            for f in futures:
                if not f.done():
                    f.set_result((None, outcome))
                    failed += 1
        self._waiting.clear()
        for f in list(self._changes):
            if not f.done():
                f.set_result(FAIL_REASON.LEADER_CHANGED)
                failed += 1
        for release in list(self._releases):
            release()  # a new term starts with an empty pipeline
        return failed

    async def change_membership(self, action: str, raft_address: str, timeout: float = 10.0) -> None:
        """Add ('add') or remove ('remove') a replica through pysyncobj's membership entries."""
        loop = asyncio.get_running_loop()
        inbox = self.inbox if self.inbox is not None and self.inbox.loop is loop else self.bind_loop(loop)
        future: asyncio.Future[object] = loop.create_future()

        def resolve(res: object, err: int) -> None:
            if not future.done():
                future.set_result(err)

        def on_done(res: object, err: int) -> None:  # tick thread
            inbox.post(resolve, res, err)

        change = self.sync.addNodeToCluster if action == "add" else self.sync.removeNodeFromCluster
        change(raft_address, callback=on_done)
        self._changes.add(future)
        try:
            err = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise self._failure(_TIMED_OUT) from None
        finally:
            self._changes.discard(future)
        if err != FAIL_REASON.SUCCESS:
            raise self._failure(err)

    def partners(self) -> list[str]:
        """Raft addresses of the other current members, as this replica knows them (read off the
        tick thread, as pysyncobj's status is; without building all of that status)."""
        return sorted(node.id for node in self.sync.otherNodes)

    def partners_connected(self) -> tuple[int, int]:
        """(how many of the other current members this replica has a link to, how many there are)."""
        nodes = self.sync.otherNodes
        return sum(1 for node in nodes if self.sync.isNodeConnected(node)), len(nodes)

    def is_leader(self) -> bool:
        return bool(self.sync._isLeader())

    def leader(self) -> str | None:
        """The leader as this replica believes it: a hint, possibly stale."""
        leader = self.sync._getLeader()
        return None if leader is None else str(leader.address if hasattr(leader, "address") else leader)

    def corruption(self) -> str:
        """Why this replica must stop ('' while its stored data is sound)."""
        return self.replicated.corruption or self.dump_watch.failure or self.sync.diverged

    def unknown_entry(self) -> str:
        """Why this replica must stop at a log entry its code cannot apply ('' while there is none)."""
        return self.replicated.unknown_entry

    def apply_failure(self) -> str:
        """Why this replica must stop at a log entry whose apply raised midway ('' while none did)."""
        return self.replicated.apply_failure

    def leader_if_connected(self) -> str | None:
        """The leader's address if this replica leads or currently has a live link to it."""
        node = self.sync._getLeader()
        if node is None:
            return None
        if not self.sync._isLeader() and not self.sync.isNodeConnected(node):
            return None
        return str(node.address if hasattr(node, "address") else node)

    def term(self) -> int:
        return self.sync.raftCurrentTerm

    def role(self) -> tuple[bool, int]:
        """(leads, term), read together as the tick thread last left them."""
        return self.sync.role

    def status(self) -> dict[str, Any]:
        """pysyncobj's status of this replica (its keys: SyncObj.getStatus)."""
        status: dict[str, Any] = self.sync.getStatus()
        return status

    def log_start(self) -> int:
        """The first index the log holds: entries before it live only in the snapshot."""
        try:
            return int(self.sync._SyncObj__raftLog[0][1])
        except (IndexError, TypeError):  # read off the tick thread: a log being replaced
            return 0

    def destroy(self) -> None:
        self.sync.destroy()

    def wait_destroyed(self, timeout: float) -> None:
        """Wait, at most `timeout` seconds, for the tick thread to close the journal after `destroy`."""
        deadline = time.monotonic() + timeout
        while self.sync.tick_thread_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        logging.getLogger("pysyncobj.syncobj").removeHandler(self.dump_watch)
