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
  tuned to one round, and a cut-off leader falls back about when a new one can be elected.
* No PreVote: a replica cut off from the others raised its term at every election timeout and
  deposed a healthy leader when it came back. `SafeSyncObj` asks before it campaigns, and a leader
  whose own process stalled no longer steps down for it.
* A follower truncated its log after every AppendEntries whose entries it already held, so a
  repeated or split append dropped committed (even applied) entries while the leader still
  counted them as replicated: a committed write could vanish and replicas diverge. `SafeSyncObj`
  applies Raft's receiver rule instead (skip the entries already held, truncate only from the first
  conflict, never commit past the last entry the leader vouched for), and fail-stops a replica
  that meets a conflict at an index it has already applied.
* Results: `propose` always passes a timeout and maps pysyncobj's outcomes to `ProposeError`
  kinds, distinguishing "surely not applied" from "maybe applied".
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, SyncObjException, replicated
from pysyncobj.journal import FileJournal
from pysyncobj.monotonic import monotonic
from pysyncobj.syncobj import _RAFT_STATE

from synapse.core import codec
from synapse.core import commands as c
from synapse.core.fsm import ClusterState
from synapse.core.model import DEFAULT_LEVELS
from synapse.core.snapshot import snapshot_digest
from synapse.master.config import RAFT_HEARTBEAT_S
from synapse.master.durability import CorruptionError, DumpFailureWatch, SnapshotWriter, fsync_durable, seal, unseal

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RaftTimeouts:
    """Timing of the Raft layer, in seconds.

    etcd's rule: an election timeout of at least ten heartbeats, so a late heartbeat or two never
    starts an election, and a leader steps down only after a whole (minimum) election timeout
    without hearing from a majority: a cut-off leader is gone about when the others' first
    election can start, and a leader whose process was merely slow keeps its place (see
    SafeSyncObj on pauses)."""

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
        self._items: collections.deque = collections.deque()
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
    """A proposal that did not produce a result. `maybe_applied` says whether it may still commit."""

    def __init__(self, kind: str, maybe_applied: bool, leader: str | None = None) -> None:
        super().__init__(kind)
        self.kind = kind
        self.maybe_applied = maybe_applied
        self.leader = leader  #: a redirect hint, never proof


#: pysyncobj outcomes after which the command may still be (or already be) committed.
_MAYBE_APPLIED = {FAIL_REASON.LEADER_CHANGED, FAIL_REASON.UNKNOWN_OUTCOME, FAIL_REASON.DISCARDED}
_FAIL_NAMES = {getattr(FAIL_REASON, n): n for n in dir(FAIL_REASON) if n.isupper()}
#: Most commands one group-commit log entry carries.
MAX_BATCH = 256
#: Log entries in flight at once; later proposals wait and travel together in the next one.
MAX_IN_FLIGHT = 2
#: A slot whose entry has had no outcome for this long is freed (the proposal itself times out).
IN_FLIGHT_TIMEOUT_S = 5.0


class ReplicatedState(SyncObjConsumer):
    """A ClusterState applied through the Raft log. Read it under `lock`."""

    def __init__(self, levels: tuple[str, ...] = DEFAULT_LEVELS) -> None:
        super().__init__()
        self.lock = threading.RLock()  #: held by apply and by every compound read
        self.state = ClusterState(levels)  #: replaced wholesale when a snapshot is loaded
        #: set (and never cleared) when stored data fails its checksum: this replica must stop
        self.corruption = ""
        self._digest_cache: tuple[int, str] = (-1, "")  #: (applied, digest) last computed
        #: called on the tick thread once per applied log entry with its (command, result) pairs;
        #: must be trivial (hand off to another thread)
        self.listener: Callable[[list[tuple[c.Command | None, c.Result]]], None] | None = None

    @replicated
    def apply(self, data: bytes) -> list[c.Result]:
        """The one replicated door: a sealed (checksummed), versioned, encoded command or batch."""
        try:
            payload = unseal(data)
        except CorruptionError as exc:
            # Only a damaged copy fails its CRC: applying it (even as a rejection) would make this
            # replica diverge from the others. Stop applying; the master process stops serving.
            self.corruption = self.corruption or f"corrupt log entry: {exc}"
            log.critical("%s; this replica stops applying", self.corruption)
            return [c.Result.rejected(self.corruption)]
        with self.lock:
            applied = self.state.apply_entry(payload)
        listener = self.listener
        if listener is not None:
            try:
                listener(applied)
            except Exception:  # noqa: BLE001 - a raising callback makes pysyncobj apply twice
                log.exception("apply listener failed")
        return [result for _, result in applied]

    def _serialize(self) -> dict:
        with self.lock:
            snapshot = self.state.to_snapshot()
        return {"sha256": snapshot_digest(snapshot), "state": snapshot}

    def _deserialize(self, data: dict) -> None:
        snapshot = data.get("state") if isinstance(data, dict) else None
        if snapshot is None or data.get("sha256") != snapshot_digest(snapshot):
            self.corruption = self.corruption or "the snapshot fails its SHA-256"
            log.critical("%s; this replica stops", self.corruption)
            return
        state = ClusterState.from_snapshot(snapshot)
        with self.lock:
            self.state = state

    def digest(self) -> tuple[int, str]:
        """(commands applied, state digest), read together. Only the copy holds the lock that
        apply needs; hashing happens outside it, and the result is reused until a command applies."""
        with self.lock:
            applied = self.state.applied
            cached = self._digest_cache
            if cached[0] == applied:
                return cached
            snapshot = self.state.to_snapshot()
        result = (applied, snapshot_digest(snapshot))
        self._digest_cache = result
        return result

    def applied(self) -> int:
        with self.lock:
            return self.state.applied


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


def held_prefix(term_at: Callable[[int], int | None], entries: list) -> int:
    """How many leading entries of an AppendEntries (command, index, term) the local log already
    holds at the same index with the same term (`term_at` answers None past the log's end)."""
    held = 0
    for _command, index, term in entries:
        if term_at(index) != term:
            break
        held += 1
    return held


#: The pysyncobj internals SafeSyncObj works through; a release without them must not run silently.
_INTERNALS = ("_SyncObj__onMessageReceived", "_SyncObj__getEntries", "_SyncObj__getCurrentLogIndex",
              "_SyncObj__getCurrentLogTerm", "_SyncObj__sendNextNodeIdx", "_SyncObj__connectedToAnyone",
              "_SyncObj__generateRaftTimeout", "_SyncObj__setCurrentTerm", "_SyncObj__setState", "_onTick",
              "_SyncObj__doChangeCluster", "_SyncObj__updateClusterConfiguration", "_SyncObj__loadDumpFile")
_missing = [name for name in _INTERNALS if not hasattr(SyncObj, name)]
if _missing:
    raise ImportError(f"this pysyncobj lacks {_missing}: synapse.raft.SafeSyncObj needs pysyncobj 0.3.x")


class SafeSyncObj(SyncObj):
    """SyncObj with Raft's receiver rules for AppendEntries, PreVote, and no step-down for a pause.

    **AppendEntries.** pysyncobj 0.3.17 deletes every entry after `prevLogIdx` before appending,
    even entries equal to the ones it receives. An append the leader repeats with fewer entries
    (after a reset, or split by `appendEntriesBatchSizeBytes`) thus removes entries the follower has
    acknowledged, and that the leader keeps counting through its match index: a crash in between
    loses committed entries. Here the entries the log already holds are dropped from the message
    first; pysyncobj then truncates only at a real conflict. A conflict at an index already applied
    means this replica's state differs from the leader's: it records `diverged` and ignores the
    message, and the master stops (a rebuild from the peers is the cure).

    **PreVote** (Raft thesis 9.6, as etcd runs it). pysyncobj starts an election, raising its term,
    whenever its election timer fires. A replica cut off from the leader did so over and over, and
    when it came back its higher term deposed a healthy leader. Here a replica whose timer fires
    first asks its peers whether they would vote for it at the next term, without changing any
    term; a peer says yes only if it has not heard from a leader for most of an election timeout
    and the asker's log is at least as up to date as its own. Only with a majority of yeses does
    the replica start the real election. A partitioned follower thus keeps its term, and healing
    the partition changes no leader. A refusal carries the refuser's term, and a replica refused
    by a peer at a higher term takes that term (etcd's rule): without it, a replica whose log was
    ahead but whose term was behind, and a peer the other way round, refused each other for ever
    (a two-member cluster in the long chaos run had no leader for 54 minutes).

    **Pauses.** A leader counts the followers that answered within `leaderFallbackTimeout` and
    steps down without a majority. When its own process was starved of CPU (a loaded machine, a
    long collection), the answers waited unread, or were never asked for: it stepped down with
    nothing wrong with the cluster. After a tick arrives late, the replica first reads what is
    waiting, and a leader does not count the time it was not running against its followers.
    """

    #: A tick this much later than the previous one's end means this thread did not run meanwhile.
    STALL_S = 0.1
    PREVOTE = True  #: off only to show, in a test, what happens without it
    PREVOTE_HOLDS = True  #: the same, for the hold on pysyncobj's own election check (see _onTick)
    REJOIN_WAIT = True  #: the same, for the wait of a replica back from a cut (see _answer_prevote)

    def __init__(self, *args, **kwargs) -> None:
        # Every attribute of this class exists before SyncObj.__init__ lists its own: pysyncobj
        # pickles any attribute set later into its snapshots, and a replica loading one takes them
        # over (a bound method set later made every snapshot fail: "Failed to store full dump").
        self.diverged = ""  #: why this replica can no longer be trusted, once it cannot
        self._prevote_term = 0  #: the term a pre-vote round under way asks about (0: none)
        self._prevotes: frozenset = frozenset()  #: peers that said yes in that round (and this replica)
        self._campaign = False  #: a pre-vote round was won: the next election timeout starts an election
        self._leader_contact = float("-inf")  #: when a current leader's AppendEntries last arrived
        self._heard_any = float("-inf")  #: when any peer's message last arrived
        #: when a peer's message arrived after a silence longer than an election timeout (a cut
        #: healed): the replica waits a while for the leader before it grants a pre-vote
        self._rejoined = float("-inf")
        self._last_tick = 0.0  #: when the previous tick ended
        self.prevotes_denied = 0  #: pre-vote rounds that ended without a majority (a disruption avoided)
        self._kept_links: set = set()  #: leaders a membership change removed while this replica follows them
        self._drop_link: Callable | None = None  #: the transport's own dropNode and addNode
        self._add_link: Callable | None = None
        #: (leads, term) as the last tick left them, set as one object: another thread reading
        #: the state and then the term could see a leader of a term it never led (after a pause,
        #: a deposed leader briefly started leader loops for the new term)
        self.role: tuple[bool, int] = (False, 0)
        super().__init__(*args, **kwargs)
        transport = self._SyncObj__transport
        self._drop_link, self._add_link = transport.dropNode, transport.addNode
        transport.dropNode, transport.addNode = self._guarded_drop, self._guarded_add

    def snapshot_extras(self) -> list[str]:
        """Attributes pysyncobj would pickle into a snapshot besides its own (none, if all is well)."""
        own = self._SyncObj__properies
        return sorted(k for k in self.__dict__ if k not in own and not k.startswith("_SyncObj__"))

    def _guarded_drop(self, node) -> None:
        """Drop a peer's link, unless it is the leader this follower listens to.

        pysyncobj drops a peer's TCP link as soon as an entry removing it reaches the log, and
        refuses links from peers it does not know. A follower catching up (a replica started empty
        or from an old snapshot) replays old membership changes: replaying the removal of a replica
        that is now the leader cut it off from that leader for good — the later entry that adds the
        leader back could never arrive (a replaced replica did not catch up in the chaos runs).
        The leader's link is kept until the leader is a member again or another leads."""
        if node == self._SyncObj__raftLeader and self._SyncObj__raftState != _RAFT_STATE.LEADER:
            self._kept_links.add(node)
            return
        self._kept_links.discard(node)
        self._drop_link(node)

    def _guarded_add(self, node) -> None:
        if node in self._kept_links:  # its link was never dropped
            self._kept_links.discard(node)
            return
        self._add_link(node)

    def _release_links(self) -> None:
        """Drop the kept links of peers that are neither members again nor the leader."""
        for node in list(self._kept_links):
            if node in self._SyncObj__otherNodes:
                self._kept_links.discard(node)
            elif node != self._SyncObj__raftLeader or self._SyncObj__raftState == _RAFT_STATE.LEADER:
                self._kept_links.discard(node)
                self._drop_link(node)

    def _onTick(self, timeToWait=0.0):  # noqa: N802,N803 - overrides pysyncobj's tick
        if type(self._SyncObj__serializer) is not SnapshotWriter:  # before the first tick can compact
            conf = self._SyncObj__conf
            if conf.fullDumpFile and conf.serializer is None:
                self._SyncObj__serializer = SnapshotWriter(conf.fullDumpFile, conf.logCompactionBatchSize)
        if self._kept_links:
            self._release_links()
        now = monotonic()
        if self._last_tick and now - self._last_tick > self.STALL_S:
            self._after_stall(now - self._last_tick)
        may_campaign = self._maybe_prevote(monotonic())
        # pysyncobj starts an election in its own tick when the election deadline has passed by
        # its own clock reading, taken after the one above: a deadline falling in between started
        # a real election, term raised, without PreVote (a cut-off follower then deposed the
        # leader on its return, seen once in 14 follower partitions). Unless this tick may
        # campaign, pysyncobj sees no deadline; a deadline a message sets meanwhile stands.
        hold = (self.PREVOTE and self.PREVOTE_HOLDS and not may_campaign
                and self._SyncObj__raftState != _RAFT_STATE.LEADER)
        deadline = self._SyncObj__raftElectionDeadline
        if hold:
            self._SyncObj__raftElectionDeadline = math.inf
        try:
            SyncObj._onTick(self, timeToWait)
        finally:
            if hold and self._SyncObj__raftElectionDeadline == math.inf:
                self._SyncObj__raftElectionDeadline = deadline
        self.role = (self._SyncObj__raftState == _RAFT_STATE.LEADER, self.raftCurrentTerm)
        self._last_tick = monotonic()

    def _after_stall(self, gap: float) -> None:
        self._poller.poll(0)  # what arrived meanwhile: heartbeats, votes, answers
        if self._SyncObj__raftState == _RAFT_STATE.LEADER:
            responded = self._SyncObj__lastResponseTime
            for node, when in responded.items():
                responded[node] = when + gap  # the time it did not run is not the followers' silence

    def _maybe_prevote(self, now: float) -> bool:
        """Run PreVote when the election deadline has passed; True when this tick may start the
        real election (a pre-vote was won, or a leadership transfer asks for it)."""
        if not self.PREVOTE:
            return True
        if self._SyncObj__raftState == _RAFT_STATE.LEADER or self._SyncObj__selfNode is None:
            self._prevote_term, self._campaign = 0, False
            return False
        if self._SyncObj__transferInProgress:
            return True
        if self._SyncObj__raftElectionDeadline >= now or not self._SyncObj__connectedToAnyone():
            return False
        if self._campaign:
            self._campaign = False  # pysyncobj's tick starts the election now
            return True
        if self._prevote_term:
            self.prevotes_denied += 1
        self._SyncObj__raftElectionDeadline = now + self._SyncObj__generateRaftTimeout()
        self._prevote_term = self.raftCurrentTerm + 1
        self._prevotes = frozenset({self._SyncObj__selfNode})
        if self._won_prevote():
            return False  # alone: the next tick campaigns
        message = {"type": "pre_vote", "term": self._prevote_term,
                   "last_log_index": self._SyncObj__getCurrentLogIndex(),
                   "last_log_term": self._SyncObj__getCurrentLogTerm()}
        for node in self._SyncObj__otherNodes:
            self._SyncObj__transport.send(node, message)
        return False

    def _won_prevote(self) -> bool:
        if len(self._prevotes) > (len(self._SyncObj__otherNodes) + 1) / 2:
            self._prevote_term, self._campaign = 0, True
            self._SyncObj__raftElectionDeadline = 0  # campaign at the next tick
            return True
        return False

    def _answer_prevote(self, node, message: dict) -> None:
        conf = self._SyncObj__conf
        lease = conf.raftMinTimeout - 2 * conf.appendEntriesPeriod  # heard a leader this recently: it lives
        mine = (self._SyncObj__getCurrentLogTerm(), self._SyncObj__getCurrentLogIndex())
        now = monotonic()
        granted = (isinstance(message.get("term"), int) and message["term"] > self.raftCurrentTerm
                   and self._SyncObj__raftState != _RAFT_STATE.LEADER
                   and now - self._leader_contact >= lease
                   # back from a cut, it has heard from no leader for the whole cut: it first
                   # gives the leader, if there is one, a minimum election timeout to reach it
                   and (not self.REJOIN_WAIT or now - self._rejoined >= conf.raftMinTimeout)
                   and (message.get("last_log_term", -1), message.get("last_log_index", -1)) >= mine)
        self._SyncObj__transport.send(node, {"type": "pre_vote_response", "term": message.get("term"),
                                             "granted": granted, "current_term": self.raftCurrentTerm})

    def _count_prevote(self, node, message: dict) -> None:
        current = message.get("current_term")
        if not message.get("granted") and isinstance(current, int) and current > self.raftCurrentTerm:
            # Refused by a peer at a higher term: take its term (as etcd does), without a vote. A
            # replica whose log is ahead but whose term is behind could otherwise never be elected,
            # and the peer, whose log is behind, never either: with two members, no leader ever.
            self._SyncObj__setCurrentTerm(current, None)
            self._SyncObj__setState(_RAFT_STATE.FOLLOWER)
            self._prevote_term = 0
            return
        if message.get("granted") and self._prevote_term and message.get("term") == self._prevote_term \
                and self._SyncObj__raftState != _RAFT_STATE.LEADER:
            self._prevotes = self._prevotes | {node}
            self._won_prevote()

    def _term_at(self, index: int) -> int | None:
        entries = self._SyncObj__getEntries(index, 1)
        return entries[0][2] if entries else None

    def _SyncObj__loadDumpFile(self, clearJournal):  # noqa: N802,N803 - overrides the mangled name
        """Load the snapshot, keeping the journal's entries after it (Raft's rule for snapshots).

        A snapshot replaces `raft.dump` first; the journal's entries up to it are deleted on a
        later tick. A replica stopped in between (kill -9, a restart) started with a journal that
        still began before the snapshot, and pysyncobj, finding the journal's first entries unlike
        the snapshot's, cleared the whole journal: every entry after the snapshot was gone,
        acknowledged ones too (pysyncobj then warns that the commit index exceeds the journal's
        end). When the journal holds the snapshot's last two entries, what comes before them is
        dropped instead, as if the replica had not stopped in between (`tests/test_snapshots.py`)."""
        serializer = self._SyncObj__serializer
        try:
            data = serializer.deserialize()
        except Exception:  # noqa: BLE001 - pysyncobj reads it again and reports the failure
            return SyncObj._SyncObj__loadDumpFile(self, clearJournal)
        if not clearJournal:  # data[1]: the snapshot's last entry; data[2]: the one before it
            self._trim_journal_to(data[2], data[1])
        serializer.deserialize = lambda: data  # read once: pysyncobj's load reads the same file
        try:
            SyncObj._SyncObj__loadDumpFile(self, clearJournal)
        finally:
            del serializer.deserialize
        journal = self._SyncObj__raftLog
        log.info("snapshot loaded index=%s from=%s journal=%s..%s", data[1][1] if isinstance(data[1], tuple) else "-",
                 "leader" if clearJournal else "disk", journal[0][1] if len(journal) else "-",
                 journal[len(journal) - 1][1] if len(journal) else "-")

    def _trim_journal_to(self, first: tuple, last: tuple) -> None:
        """Drop the journal's entries before `first` if the journal holds `first` and `last` at
        their indexes: `last` is the snapshot's last entry, and `first` the one before it, which a
        journal trimmed to the snapshot begins with.

        Only the journal's list in memory is cut. pysyncobj's own trim rewrites the whole file
        (an empty journal first, then every entry kept), and a kill during that loop would leave a
        part of it; the file keeps its older records instead until the next snapshot rewrites it,
        and the next start cuts them again."""
        journal = self._SyncObj__raftLog
        if len(journal) < 2 or not isinstance(first, tuple) or journal[0] == first:
            return
        offset = first[1] - journal[0][1]
        if not 0 < offset < len(journal) - 1 or journal[offset] != first or journal[offset + 1] != last:
            return
        log.warning("journal starts at %d, before the snapshot at %d (stopped between writing the snapshot and "
                    "trimming the journal): keeping the %d entries after it", journal[0][1], last[1],
                    len(journal) - offset - 2)
        if isinstance(journal, FileJournal):
            journal._FileJournal__journal = journal._FileJournal__journal[offset:]
        else:
            journal.deleteEntriesTo(offset)

    def _SyncObj__onMessageReceived(self, node, message):  # noqa: N802 - overrides the mangled name
        now = monotonic()
        if now - self._heard_any > self._SyncObj__conf.raftMaxTimeout and self._heard_any > float("-inf"):
            self._rejoined = now  # the first word after a silence (not the first ever: a start is no cut)
        self._heard_any = now
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "pre_vote":
            return self._answer_prevote(node, message)
        if kind == "pre_vote_response":
            return self._count_prevote(node, message)
        if kind == "append_entries" and isinstance(message.get("term"), int) \
                and message["term"] >= self.raftCurrentTerm:
            self._leader_contact = monotonic()  # a current leader lives: refuse pre-votes for a while
            if "prevLogIdx" in message and message.get("transmission") is None:
                message = self._screen_append(node, message)
                if message is None:
                    return
        SyncObj._SyncObj__onMessageReceived(self, node, message)

    def _screen_append(self, node, message: dict) -> dict | None:
        if self.diverged:
            return None
        prev_index, prev_term = message["prevLogIdx"], message["prevLogTerm"]
        if self._term_at(prev_index) != prev_term:
            return message  # pysyncobj answers the mismatch (the leader backs off)
        entries = list(message.get("entries") or [])
        held = held_prefix(self._term_at, entries)
        last_sent = entries[held - 1][1] if held else prev_index
        applied = self._SyncObj__raftLastApplied
        last_local = self._SyncObj__getCurrentLogIndex()
        if held < len(entries):
            conflict = entries[held][1]
            if self._term_at(conflict) is not None and conflict <= applied:
                return self._diverge(conflict, applied, message)
        elif last_local > last_sent and not entries and last_sent < applied:
            return self._diverge(last_sent + 1, applied, message)  # would drop applied entries
        if held == 0:
            return message
        trimmed = dict(message)
        trimmed["prevLogIdx"], trimmed["prevLogTerm"] = last_sent, entries[held - 1][2]
        trimmed["entries"] = entries[held:]
        if held < len(entries) or last_local == last_sent:
            return trimmed  # pysyncobj truncates at the conflict (if any) and appends the rest
        # Every entry is already held and the log goes further: acknowledge without truncating,
        # and commit no further than the last entry this message vouches for.
        del trimmed["prevLogIdx"], trimmed["prevLogTerm"], trimmed["entries"]
        trimmed["commit_index"] = min(message["commit_index"], last_sent)
        SyncObj._SyncObj__onMessageReceived(self, node, trimmed)
        self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=last_sent + 1, success=True)
        return None

    def _diverge(self, index: int, applied: int, message: dict) -> None:
        self.diverged = (f"the leader's log differs from this replica's at index {index}, which it has "
                         f"already applied (applied {applied}, leader term {message['term']}): "
                         "this replica's state has diverged; rebuild it from its peers")
        log.critical("%s", self.diverged)
        return None


class RaftNode:
    """One replica: a SyncObj carrying a ReplicatedState."""

    def __init__(self, self_address: str, partners: list[str], conf: SyncObjConf,
                 levels: tuple[str, ...] = DEFAULT_LEVELS, durable: bool = True) -> None:
        self.replicated = ReplicatedState(levels)
        self.dump_watch = DumpFailureWatch()
        logging.getLogger("pysyncobj.syncobj").addHandler(self.dump_watch)
        self.sync = SafeSyncObj(self_address, partners, conf=conf, consumers=[self.replicated])
        if durable:
            fsync_durable(self.sync)
        self._queued: list[tuple[c.Command, asyncio.Future]] = []  #: proposals waiting for this loop turn
        self._flush_scheduled = False
        self._in_flight = 0  #: log entries proposed and not yet resolved
        self.inbox: LoopInbox | None = None  #: set by `bind_loop`; results come back through it
        self._waiting: set[asyncio.Future] = set()  #: futures of proposals sent and not yet resolved
        self._changes: set[asyncio.Future] = set()  #: futures of membership changes not yet resolved
        self._releases: set[Callable[[], None]] = set()  #: frees each in-flight slot still held
        self.entries_proposed = 0  #: log entries proposed from this replica
        self.commands_proposed = 0  #: commands inside them (entries < commands when batching helps)

    def propose(self, cmd: c.Command, timeout: float = 5.0) -> c.Result:
        """Append a command and wait for its result on this replica; raises ProposeError."""
        try:
            [result] = self.replicated.apply(seal(codec.encode_command(cmd)), sync=True, timeout=timeout)
        except SyncObjException as exc:
            code = exc.errorCode
            if code == "Timeout":
                raise ProposeError("timeout", maybe_applied=True, leader=self.leader()) from exc
            name = _FAIL_NAMES.get(code, str(code))
            raise ProposeError(name, maybe_applied=code in _MAYBE_APPLIED, leader=self.leader()) from exc
        return result

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
        loop = asyncio.get_running_loop()
        if self.inbox is None or self.inbox.loop is not loop:
            self.bind_loop(loop)
        future: asyncio.Future = loop.create_future()
        self._queued.append((cmd, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush, loop)
        try:
            res, err = await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            raise ProposeError("timeout", maybe_applied=True, leader=self.leader()) from None
        finally:
            self._waiting.discard(future)
        if err != FAIL_REASON.SUCCESS:
            raise ProposeError(_FAIL_NAMES.get(err, str(err)), maybe_applied=err in _MAYBE_APPLIED,
                               leader=self.leader())
        return res

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        self._flush_scheduled = False
        while self._queued and self._in_flight < MAX_IN_FLIGHT:
            batch, self._queued = self._queued[:MAX_BATCH], self._queued[MAX_BATCH:]
            cmds = [cmd for cmd, _ in batch]
            data = seal(codec.encode_command(cmds[0]) if len(cmds) == 1 else codec.encode_batch(cmds))
            futures = [f for _, f in batch]
            self._waiting.update(futures)
            self.entries_proposed += 1
            self.commands_proposed += len(cmds)
            self._in_flight += 1
            slot = {"open": True}

            def release(slot: dict = slot) -> None:
                if slot["open"]:
                    slot["open"] = False
                    self._releases.discard(slot["release"])
                    self._in_flight -= 1
                    if self._queued and not self._flush_scheduled:
                        self._flush_scheduled = True
                        loop.call_soon(self._flush, loop)

            slot["release"] = release
            self._releases.add(release)

            def resolve(res: object, err: int, futures: list[asyncio.Future] = futures, release=release) -> None:
                release()
                for i, f in enumerate(futures):
                    if not f.done():
                        f.set_result((res[i] if res else None, err))  # type: ignore[index]

            def on_done(res: object, err: int, resolve=resolve, inbox: LoopInbox = self.inbox) -> None:
                inbox.post(resolve, res, err)  # tick thread: trivial, never raises

            loop.call_later(IN_FLIGHT_TIMEOUT_S, release)  # a lost callback must not stall the pipeline
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
        future: asyncio.Future = loop.create_future()

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
            raise ProposeError("timeout", maybe_applied=True, leader=self.leader()) from None
        finally:
            self._changes.discard(future)
        if err != FAIL_REASON.SUCCESS:
            raise ProposeError(_FAIL_NAMES.get(err, str(err)), maybe_applied=err in _MAYBE_APPLIED,
                               leader=self.leader())

    def partners(self) -> list[str]:
        """Raft addresses of the other current members, as this replica knows them."""
        prefix = "partner_node_status_server_"
        return sorted(k[len(prefix):] for k in self.status() if k.startswith(prefix))

    def is_leader(self) -> bool:
        return self.sync._isLeader()

    def leader(self) -> str | None:
        """The leader as this replica believes it: a hint, possibly stale."""
        leader = self.sync._getLeader()
        return None if leader is None else str(leader.address if hasattr(leader, "address") else leader)

    def corruption(self) -> str:
        """Why this replica must stop ('' while its stored data is sound)."""
        return self.replicated.corruption or self.dump_watch.failure or self.sync.diverged

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

    def status(self) -> dict:
        return self.sync.getStatus()

    def log_start(self) -> int:
        """The first index the log holds: entries before it live only in the snapshot."""
        try:
            return int(self.sync._SyncObj__raftLog[0][1])
        except (IndexError, TypeError):  # read off the tick thread: a log being replaced
            return 0

    def destroy(self) -> None:
        self.sync.destroy()
        logging.getLogger("pysyncobj.syncobj").removeHandler(self.dump_watch)
