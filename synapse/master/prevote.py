"""PreVote for pysyncobj (Raft thesis 9.6, as etcd runs it), and a follower that campaigns at once
when its link to the leader closes: a part of synapse.master.safesyncobj.SafeSyncObj.

pysyncobj starts an election, raising its term, whenever its election timer fires. A replica cut
off from the leader did so over and over, and when it came back its higher term deposed a healthy
leader. Here a replica whose timer fires first asks its peers whether they would vote for it at
the next term, without changing any term; a peer says yes only if it has not heard from a leader
for most of an election timeout and the asker's log is at least as up to date as its own. Only
with a majority of yeses does the replica start the real election. A partitioned follower thus
keeps its term, and healing the partition changes no leader. A refusal carries the refuser's term,
and a replica refused by a peer at a higher term takes that term (etcd's rule): without it, a
replica whose log was ahead but whose term was behind, and a peer the other way round, refused
each other for ever.

Its state lives on SafeSyncObj, made before SyncObj.__init__ (see there): this class only reads
and writes it, from the tick thread.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic
from pysyncobj.node import Node
from pysyncobj.syncobj import _RAFT_STATE

log = logging.getLogger(__name__)


class PreVote(SyncObj):  # type: ignore[misc]  # pysyncobj has no types: SyncObj is Any to the checker
    """SyncObj whose replicas ask their peers before they campaign, and ask soon once the leader's link closed."""

    PREVOTE = True  #: off only to show, in a test, what happens without it
    PREVOTE_HOLDS = True  #: the same, for the hold on pysyncobj's own election check (see SafeSyncObj._onTick)
    REJOIN_WAIT = True  #: the same, for the wait of a replica back from a cut (see _answer_prevote)
    PREVOTE_YIELDS = True  #: the same, for standing aside in a contest of pre-votes (see _yield_to)
    FAST_FAILOVER = True  #: off only to show, in a test, what happens without it (see _leader_link_lost)

    _prevote_term: int
    _prevotes: frozenset[Node]
    _campaign: bool
    _leader_contact: float
    _rejoined: float
    _lost_logged: float
    _lost_leader: object
    prevotes_denied: int
    raftCurrentTerm: int
    _SyncObj__raftElectionDeadline: float  #: pysyncobj's, read and moved here

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
            if self._lost_logged < self._leader_contact:  # the first since a leader: an election delayed
                self._lost_logged = now
                log.info("pre-vote round lost term=%d yes=%d of=%d", self._prevote_term, len(self._prevotes),
                         len(self._SyncObj__otherNodes) + 1)
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

    def _answer_prevote(self, node: Node, message: dict[str, Any]) -> None:
        conf = self._SyncObj__conf
        lease = conf.raftMinTimeout - 2 * conf.appendEntriesPeriod  # heard a leader this recently: it lives
        mine = (self._SyncObj__getCurrentLogTerm(), self._SyncObj__getCurrentLogIndex())
        theirs = (message.get("last_log_term", -1), message.get("last_log_index", -1))
        now = monotonic()
        granted = (isinstance(message.get("term"), int) and message["term"] > self.raftCurrentTerm
                   and self._SyncObj__raftState != _RAFT_STATE.LEADER
                   and now - self._leader_contact >= lease
                   # back from a cut, it has heard from no leader for the whole cut: it first
                   # gives the leader, if there is one, a minimum election timeout to reach it
                   and (not self.REJOIN_WAIT or now - self._rejoined >= conf.raftMinTimeout)
                   and theirs >= mine)
        if granted and self.PREVOTE_YIELDS:
            granted = self._yield_to(node, message["term"], theirs > mine, now)
        self._SyncObj__transport.send(node, {"type": "pre_vote_response", "term": message.get("term"),
                                             "granted": granted, "current_term": self.raftCurrentTerm})

    def _yield_to(self, node: Node, term: int, ahead: bool, now: float) -> bool:
        """Whether to grant a pre-vote the log rules allow; if so, stand aside for the asker.

        Two replicas whose timers fire within a message's time of each other both won their
        pre-votes and split the real vote: a term lost, and a second timeout (1.7-2.6 s elections
        in the chaos run, where a tick can wait tens of ms for the GIL). So a replica about to
        campaign, or asking for the same term itself, yields only to a lower address (one of the
        two goes first; an asker whose log is ahead is always granted: its own round could never
        win that asker's vote). A replica that grants gives up its own round and holds its timer
        for a minimum election timeout, so the asker's vote request finds it still a follower.
        Timers decide who campaigns, never what is safe: votes keep Raft's rules."""
        contest = not ahead and (self._campaign or (self._prevote_term >= term
                                                    and node.address > self._SyncObj__selfNode.address))
        if contest:
            return False
        self._prevote_term, self._campaign = 0, False
        self._SyncObj__raftElectionDeadline = max(self._SyncObj__raftElectionDeadline,
                                                  now + self._SyncObj__conf.raftMinTimeout)
        return True

    def _count_prevote(self, node: Node, message: dict[str, Any]) -> None:
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

    def _leader_link_lost(self, node: Node) -> None:
        """The TCP link to the leader closed: most likely its process died (kill -9, a crash, a
        restart all close its sockets), so campaign now rather than after an election timeout.

        Without it, a dead leader was replaced only when a follower's timer fired, 0.5-1 s after
        its last heartbeat (failover 0.75-0.93 s to the next acknowledged write, bench/ha.py).
        Here the follower stops counting the leader's lease, so it grants a peer's pre-vote (the
        other follower saw the same link close), and its own pre-vote goes out about a heartbeat
        later (jittered: two followers asking at once resolve by `_yield_to`).
        Timing only, never safety: votes and terms keep Raft's rules, so at most one leader per
        term, and a leader still alive keeps its place, because a peer that still hears it
        refuses the pre-vote (its lease). If a live leader's links to a majority all close at
        once, that majority elects another sooner than before; the old one cannot commit without
        a majority, every leader-only action is fenced by its term in apply, and reads that must
        be current go through the log (a Barrier), so none leans on the old leader's belief."""
        self._lost_leader = node
        if not (self.FAST_FAILOVER and self.PREVOTE):
            return
        self._leader_contact = float("-inf")
        # Half a heartbeat at least: the other follower reads the same link's end meanwhile (before
        # it, its lease makes it refuse the pre-vote, and the round waits a whole timeout again).
        soon = monotonic() + random.uniform(0.5, 1.5) * self._SyncObj__conf.appendEntriesPeriod
        self._SyncObj__raftElectionDeadline = min(self._SyncObj__raftElectionDeadline, soon)
