"""SafeSyncObj: pysyncobj 0.3.17's SyncObj with the corrections a Synapse replica needs.

Each correction, and why (the class docstring and the methods hold the details):

* **AppendEntries receiver rules.** A follower truncated its log after every AppendEntries whose
  entries it already held, so a repeated or split append dropped committed (even applied) entries
  while the leader still counted them as replicated: a committed write could vanish and replicas
  diverge. Here the entries already held are skipped, the log is truncated only from the first real
  conflict, nothing is committed past the last entry the leader vouched for, and a replica that
  meets a conflict at an index it has already applied records `diverged` (the master stops it).
  `held_prefix` is the pure part of that rule (`tests/cluster/test_append_entries.py`).
* **PreVote.** pysyncobj raises its term whenever its election timer fires: a replica cut off from
  the others deposed a healthy leader when it came back. A replica asks its peers before it
  campaigns, a refusal at a higher term hands that term over, a replica back from a cut waits for
  the leader before it grants a pre-vote, and pysyncobj's own election check is held until a
  pre-vote is won (synapse.master.prevote; `tests/cluster/test_prevote.py`).
* **Pauses.** A leader whose own process stalled (a loaded machine) counted the time it did not
  run against its followers and stepped down with nothing wrong: after a late tick it first reads
  what waited, and the stall is not counted.
* **Links to the leader.** Replaying an old membership change that removed today's leader dropped
  the link to it for good, and the replica never caught up: the link to the leader a follower
  listens to is kept until it is a member again or another leads (`tests/cluster/test_raft_links.py`).
* **A leader's link lost.** A follower whose TCP link to its leader closes (the leader's process
  died: its sockets closed with it) campaigns at once instead of waiting out an election timeout
  (synapse.master.prevote; `tests/cluster/test_fast_failover.py`).
* **Snapshot writer.** pysyncobj forks a multi-threaded gRPC server to write its dump: the first
  tick installs `SnapshotWriter` (synapse.master.durability), which writes from a thread.
* **Dump loading and journal trimming.** A replica stopped between writing a snapshot and trimming
  its journal started with a journal beginning before the snapshot, and pysyncobj cleared all of
  it, acknowledged entries after the snapshot included: the entries after it are kept, and the
  journal is cut in memory only (synapse.master.snapshot_guard; `tests/cluster/test_snapshots.py`).
* **No snapshot after a stop.** A consumer that stops applying at an entry it must not apply (a
  corrupt one, or one its code does not know) leaves its state before that entry while pysyncobj
  counts the entry as applied: a snapshot then would record the entry as applied, and the
  replica, restarted with code that knows it, would never apply it. `stopped` holds compaction.
* **Command versions.** A follower tells the leader the highest command-set version its code
  applies in every answer to an AppendEntries (an extra key older releases ignore), and the leader
  keeps the last one per peer, forgotten when the link drops (`member_versions`): the leader
  proposes a command kind only once every member knows its version
  (synapse.master.raft.RaftNode.check_cluster_version).
* **One message for an entry and the commit before it.** With batching off (a write is sent at
  once, not at the next heartbeat), pysyncobj's leader sent every follower an AppendEntries for
  each new entry and another one, empty but for the new commit index, after each apply. Under load
  the next entry follows within a tick or two (raft.RaftNode proposes the next batch as soon as
  the previous one's results are back), and its AppendEntries carries the same commit index. Here,
  while proposals wait for the next entry (`more_coming`), the leader holds the commit-only
  message up to COMMIT_HOLD_S for that entry to carry it, and sends it alone only if none went
  out: no write waits for it (the leader applies and answers as before), followers apply at most
  that much later, and a loaded leader sends (and encrypts, and hears answers to) about half as
  many messages (`_SyncObj__applyLogEntries`, `_settle_commit`). With nothing waiting, the commit
  index goes out at once: followers (which serve the workers' assignments) lag no write on an
  idle cluster; nor is it held after entries that change what a worker runs (a gang's placement,
  a stop: `commit_at_once`), which the workers watching a follower would otherwise wait for.
* **The transport's seal.** pysyncobj seals every message with Fernet, a tenth of a loaded
  leader's CPU; `encryptor` is synapse.master.cipher's RaftCipher instead: AES-GCM once every
  member reads it (the cluster version), Fernet until then, both always read.
* **The transport's framing.** pysyncobj compresses every message with zlib, which lets go of
  Python's lock and, on a loaded replica, paid ~20 us to get it back for each one: small messages
  go as stored zlib streams built in Python instead (synapse.master.frames), read by any release.
* **Snapshot contents.** pysyncobj pickles every attribute set after its own `__init__` into its
  snapshots, and a replica loading one takes them over: every attribute of SafeSyncObj exists
  before `SyncObj.__init__` runs (`snapshot_extras` lists any that slipped through).

It works through pysyncobj's name-mangled internals (`_INTERNALS`): importing this module with a
pysyncobj that lacks one fails at once rather than running without a correction.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, NoReturn

from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic
from pysyncobj.node import Node
from pysyncobj.serializer import Serializer
from pysyncobj.syncobj import _RAFT_STATE

from synapse.master import frames
from synapse.master.cipher import RaftCipher
from synapse.master.durability import JournalFlush, SnapshotWriter
from synapse.master.prevote import PreVote
from synapse.master.snapshot_guard import SnapshotGuard

log = logging.getLogger(__name__)


def held_prefix(term_at: Callable[[int], int | None], entries: list[tuple[bytes, int, int]]) -> int:
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
              "_SyncObj__doChangeCluster", "_SyncObj__updateClusterConfiguration", "_SyncObj__loadDumpFile",
              "_SyncObj__tryLogCompaction", "_SyncObj__onNodeConnected", "_SyncObj__onNodeDisconnected",
              "_SyncObj__applyLogEntries", "_SyncObj__sendAppendEntries", "_checkCommandsToApply")
_missing = [name for name in _INTERNALS if not hasattr(SyncObj, name)]
if _missing:
    raise ImportError(f"this pysyncobj lacks {_missing}: synapse.master.safesyncobj.SafeSyncObj needs "
                      "pysyncobj 0.3.x")


def _before_transport(*args: object) -> NoReturn:
    """What stands for the transport's functions until SyncObj.__init__ has made the transport."""
    raise RuntimeError("pysyncobj's transport is not made yet")


class SafeSyncObj(PreVote, SnapshotGuard):
    """SyncObj with Raft's receiver rules for AppendEntries, PreVote, and no step-down for a pause.

    **AppendEntries.** pysyncobj 0.3.17 deletes every entry after `prevLogIdx` before appending,
    even entries equal to the ones it receives. An append the leader repeats with fewer entries
    (after a reset, or split by `appendEntriesBatchSizeBytes`) thus removes entries the follower has
    acknowledged, and that the leader keeps counting through its match index: a crash in between
    loses committed entries. Here the entries the log already holds are dropped from the message
    first; pysyncobj then truncates only at a real conflict. A conflict at an index already applied
    means this replica's state differs from the leader's: it records `diverged` and ignores the
    message, and the master stops (a rebuild from the peers is the cure).

    **PreVote** (synapse.master.prevote): a replica asks its peers before it campaigns.

    **Pauses.** A leader counts the followers that answered within `leaderFallbackTimeout` and
    steps down without a majority. When its own process was starved of CPU (a loaded machine, a
    long collection), the answers waited unread, or were never asked for: it stepped down with
    nothing wrong with the cluster. After a tick arrives late, the replica first reads what is
    waiting, and a leader does not count the time it was not running against its followers.

    **Stops and versions** (see the module docstring): no snapshot once `stopped()` names a reason
    (synapse.master.snapshot_guard);
    `command_version` rides on every AppendEntries answer, and a leader reads what its peers told
    it with `member_versions`.
    """

    #: A tick this much later than the previous one's end means this thread did not run meanwhile.
    STALL_S = 0.1
    #: Every replica says something to each peer this often. pysyncobj drops a connection on which
    #: nothing was read for `connectionTimeout` (5 s), and checks only when it next sends on it;
    #: followers never talk to each other, so the first pre-vote after a leader's death found the
    #: link between them idle for longer, dropped it unsent, and the election waited a second
    #: round (elections of 1.4-1.9 s in a 30-minute chaos run). 0 turns it off (tests).
    KEEPALIVE_S = 1.0
    #: A member whose version was last heard longer ago than this counts as unknown (not upgraded).
    VERSION_HEARD_S = 2.0
    #: How long a leader holds a commit index for the next entry's AppendEntries to carry (0: sent
    #: at once, as pysyncobj does). Well under a heartbeat: only followers' apply waits for it.
    COMMIT_HOLD_S = 0.005

    _SyncObj__serializer: Serializer  #: pysyncobj's, replaced here by a SnapshotWriter

    def __init__(self, *args: object, command_version: int = 0, stopped: Callable[[], str] | None = None,
                 reads_sealed: bool = True, **kwargs: object) -> None:
        # Every attribute of this class exists before SyncObj.__init__ lists its own: pysyncobj
        # pickles any attribute set later into its snapshots, and a replica loading one takes them
        # over (a bound method set later made every snapshot fail: "Failed to store full dump").
        conf = kwargs.get("conf", args[2] if len(args) > 2 else None)
        password = getattr(conf, "password", None)
        #: what seals the transport's messages (`encryptor`); None without a password
        self.cipher = RaftCipher(password, reads_sealed=reads_sealed) if password else None
        self.diverged = ""  #: why this replica can no longer be trusted, once it cannot
        #: why the consumer stopped applying ('' while it applies); fixed at construction
        self._stopped: Callable[[], str] = stopped or (lambda: "")
        self.command_version = command_version  #: the highest command-set version this replica applies; fixed
        #: peer node -> (command-set version it last told on its current link, monotonic time it
        #: did); written by the tick thread only
        self._versions: dict[Node, tuple[int, float]] = {}
        self._send: Callable[[Node, object], bool] = _before_transport  #: the transport's own send
        self._prevote_term = 0  #: the term a pre-vote round under way asks about (0: none)
        self._prevotes: frozenset[Node] = frozenset()  #: peers that said yes in that round (and this replica)
        self._campaign = False  #: a pre-vote round was won: the next election timeout starts an election
        self._leader_contact = float("-inf")  #: when a current leader's AppendEntries last arrived
        self._heard_any = float("-inf")  #: when any peer's message last arrived
        #: when a peer's message arrived after a silence longer than a live cluster keeps (a cut
        #: healed): the replica waits a while for the leader before it grants a pre-vote
        self._rejoined = float("-inf")
        self._last_tick = 0.0  #: when the previous tick ended
        self.prevotes_denied = 0  #: pre-vote rounds that ended without a majority (a disruption avoided)
        self._lost_logged = float("-inf")  #: when a lost round was last logged (once per leader lost)
        self._keepalive_sent = 0.0  #: when this replica last said something to every peer (KEEPALIVE_S)
        self._kept_links: set[Node] = set()  #: leaders a membership change removed while this replica follows them
        #: the leader whose link this follower saw close, until a leader's AppendEntries arrives again
        self._lost_leader = None
        self._drop_link: Callable[[Node], None] = _before_transport  #: the transport's own dropNode and addNode
        self._add_link: Callable[[Node], None] = _before_transport
        #: (leads, term) as the last tick left them, set as one object: another thread reading
        #: the state and then the term could see a leader of a term it never led (after a pause,
        #: a deposed leader briefly started leader loops for the new term)
        self.role: tuple[bool, int] = (False, 0)
        #: the journal's flush (durability.fsync_durable), which a leader's new entries leave until
        #: they have gone to the followers; None: the journal is not flushed (durability: none)
        self.journal_flush: JournalFlush | None = None
        #: (the leader's next-heartbeat time, monotonic time) when it applied entries whose commit
        #: index no message has carried yet; None: nothing owed. The first changes with every send.
        self._commit_owed: tuple[float, float] | None = None
        self._commit_urgent = False  #: the entries being applied must reach the followers at once
        self._poll_messages: Callable[[float], None] = _before_transport  #: the poller's own poll
        #: whether proposals wait for the next entry (raft.RaftNode sets it; None: take it that they do)
        self.more_coming: Callable[[], bool] | None = None
        frames.install()  # before SyncObj.__init__ opens the transport
        super().__init__(*args, **kwargs)
        transport = self._SyncObj__transport
        self._drop_link, self._add_link = transport.dropNode, transport.addNode
        transport.dropNode, transport.addNode = self._guarded_drop, self._guarded_add
        self._send, transport.send = transport.send, self._send_with_version
        self._poll_messages, self._poller.poll = self._poller.poll, self._poll

    @property
    def encryptor(self) -> RaftCipher | None:
        """What pysyncobj's transport seals and opens messages with: AES-GCM once every peer reads it,
        Fernet until then (synapse.master.cipher), in place of pysyncobj's Fernet alone."""
        return self.cipher

    def _getEncryptor(self) -> RaftCipher | None:
        return self.cipher

    def _guarded_drop(self, node: Node) -> None:
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

    def _guarded_add(self, node: Node) -> None:
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

    def _send_with_version(self, node: Node, message: object) -> bool:
        """The transport's send; an answer to a leader's AppendEntries also carries this replica's
        command-set version (pysyncobj builds a fresh dict per message, and ignores unknown keys)."""
        if self.command_version and isinstance(message, dict) and message.get("type") == "next_node_idx":
            message["command_version"] = self.command_version
        return self._send(node, message)

    def member_versions(self) -> dict[str, int]:
        """Each member's command-set version by address, this replica's own included, as last heard
        on its current link (0: not heard on it within VERSION_HEARD_S, or a release that does not
        tell). Only a leader hears its followers'. Safe from any thread.

        A version is forgotten when the link to its member drops or is made again: a member
        restarted with other code would otherwise keep the version its previous process told."""
        now = monotonic()
        members = {getattr(self.selfNode, "address", str(self.selfNode)): self.command_version}
        for node in self.otherNodes:
            version, heard = self._versions.get(node, (0, float("-inf")))
            members[getattr(node, "address", str(node))] = version if now - heard <= self.VERSION_HEARD_S else 0
        return members

    def _SyncObj__onNodeConnected(self, node: Node) -> None:  # noqa: N802 - overrides the mangled name
        self._versions.pop(node, None)
        SyncObj._SyncObj__onNodeConnected(self, node)

    def _SyncObj__onNodeDisconnected(self, node: Node) -> None:  # noqa: N802 - overrides the mangled name
        self._versions.pop(node, None)
        SyncObj._SyncObj__onNodeDisconnected(self, node)
        if node == self._SyncObj__raftLeader and node is not self._lost_leader \
                and self._SyncObj__raftState == _RAFT_STATE.FOLLOWER:
            self._leader_link_lost(node)

    def _SyncObj__applyLogEntries(self) -> bool:  # noqa: N802 - overrides the mangled name
        send: bool = SyncObj._SyncObj__applyLogEntries(self)
        if not send or self._SyncObj__raftState != _RAFT_STATE.LEADER or not self.COMMIT_HOLD_S:
            return send
        if self.more_coming is not None and not self.more_coming():
            return send  # no entry is on its way to carry it
        if self._commit_urgent:
            self._commit_urgent = False
            return send  # workers wait for it on the followers they watch from (commit_at_once)
        if self._commit_owed is None or self._commit_owed[0] != self._SyncObj__newAppendEntriesTime:
            self._commit_owed = (self._SyncObj__newAppendEntriesTime, monotonic())
        return False  # _settle_commit sends it, unless the next entry's AppendEntries carries it first

    def commit_at_once(self) -> None:
        """(tick thread, while applying) The entries being applied change what some worker runs: the
        followers, which serve most workers their lists (link shards), learn the commit at once,
        not up to COMMIT_HOLD_S later with the next entry."""
        self._commit_urgent = True

    def _checkCommandsToApply(self) -> None:  # noqa: N802 - overrides pysyncobj's
        flush = self.journal_flush
        if flush is not None:
            flush.deferring = True  # the new entries go to the followers before this replica flushes them
        try:
            SyncObj._checkCommandsToApply(self)  # the tick's command intake: each new entry is sent at once
        finally:
            if flush is not None:
                flush.settle()  # before this tick ends: a commit counts this copy only on a later one
        self._settle_commit(monotonic())

    def _settle_commit(self, now: float) -> None:
        """Send the commit index owed once COMMIT_HOLD_S has passed with no message to carry it."""
        owed = self._commit_owed
        if owed is None:
            return
        if owed[0] != self._SyncObj__newAppendEntriesTime or self._SyncObj__raftState != _RAFT_STATE.LEADER:
            self._commit_owed = None  # an AppendEntries carried it (or this replica no longer leads)
        elif now - owed[1] >= self.COMMIT_HOLD_S:
            self._commit_owed = None
            self._SyncObj__sendAppendEntries()

    def _poll(self, timeout: float) -> None:
        """The tick's wait for messages, cut short when a held commit index falls due."""
        owed = self._commit_owed
        if owed is not None:
            timeout = max(0.0, min(timeout, owed[1] + self.COMMIT_HOLD_S - monotonic()))
        self._poll_messages(timeout)

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N802,N803 - overrides pysyncobj's tick
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
        if self.KEEPALIVE_S and self._last_tick - self._keepalive_sent >= self.KEEPALIVE_S:
            self._keepalive_sent = self._last_tick
            for node in self._SyncObj__otherNodes:  # a release without it ignores the unknown type
                self._SyncObj__transport.send(node, {"type": "keepalive"})

    def _after_stall(self, gap: float) -> None:
        self._poller.poll(0)  # what arrived meanwhile: heartbeats, votes, answers
        if self._SyncObj__raftState == _RAFT_STATE.LEADER:
            responded = self._SyncObj__lastResponseTime
            for node, when in responded.items():
                responded[node] = when + gap  # the time it did not run is not the followers' silence

    def _term_at(self, index: int) -> int | None:
        entries = self._SyncObj__getEntries(index, 1)
        return entries[0][2] if entries else None

    def _SyncObj__onMessageReceived(self, node: Node, message: dict[str, Any]) -> None:  # noqa: N802 - overrides the mangled name
        now = monotonic()
        conf = self._SyncObj__conf
        # The first word after a silence longer than a live cluster keeps (not the first ever: a
        # start is no cut). A leader's death silences a follower too, until another follower's
        # timer fires, up to raftMaxTimeout later: with that as the bound, a pre-vote arriving a
        # moment after it was taken for a healed cut and refused, and the election took a second
        # timeout (1.6-1.7 s in a 30-minute chaos run).
        if now - self._heard_any > conf.raftMaxTimeout + conf.raftMinTimeout and self._heard_any > float("-inf"):
            self._rejoined = now
        self._heard_any = now
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "next_node_idx":  # a follower's answer to an AppendEntries
            version = message.get("command_version")
            self._versions[node] = (version if isinstance(version, int) else 0, now)
        if kind == "keepalive":
            return  # read: the link lives (and this replica is not cut off: see _rejoined)
        if kind == "pre_vote":
            self._answer_prevote(node, message)
            return
        if kind == "pre_vote_response":
            self._count_prevote(node, message)
            return
        if kind == "append_entries" and isinstance(message.get("term"), int) \
                and message["term"] >= self.raftCurrentTerm:
            self._leader_contact = monotonic()  # a current leader lives: refuse pre-votes for a while
            self._lost_leader = None
            if "prevLogIdx" in message and message.get("transmission") is None:
                message = self._screen_append(node, message)
                if message is None:
                    return
        SyncObj._SyncObj__onMessageReceived(self, node, message)

    def _screen_append(self, node: Node, message: dict[str, Any]) -> dict[str, Any] | None:
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
                self._diverge(conflict, applied, message)
                return None
        elif last_local > last_sent and not entries and last_sent < applied:
            self._diverge(last_sent + 1, applied, message)  # would drop applied entries
            return None
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

    def _diverge(self, index: int, applied: int, message: dict[str, Any]) -> None:
        self.diverged = (f"the leader's log differs from this replica's at index {index}, which it has "
                         f"already applied (applied {applied}, leader term {message['term']}): "
                         "this replica's state has diverged; rebuild it from its peers")
        log.critical("%s", self.diverged)
        return None
