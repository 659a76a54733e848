"""Who shares the cluster: queues and their limits, users and their roles, and the join tokens that
register nodes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from synapse.core.model.node import Resources

#: The queue of jobs that name none. It exists without being defined (no limits, anyone may submit);
#: an admin may define it like any other queue to give it limits.
DEFAULT_QUEUE = "default"
#: In a queue's `max` or `lending_limit`, an amount meaning "no limit" for that resource.
UNLIMITED = -1

#: The longest an interactive job may run when its queue says nothing (MosaicML's `--max-duration`,
#: a working day): its time limit defaults to it.
DEFAULT_INTERACTIVE_MAX_S = 8 * 3600.0


@dataclass(frozen=True, slots=True)
class Queue:
    """A share of the cluster (see synapse.core.queues for the rules a queue file must follow)."""

    name: str
    parent: str = ""  #: the organisation above this team; "" for a top-level queue
    weight: float = 1.0  #: for fair share
    guaranteed: Resources = Resources()
    max: Resources = Resources(UNLIMITED, UNLIMITED, UNLIMITED)  #: UNLIMITED per resource: no cap
    lending_limit: Resources = Resources(UNLIMITED, UNLIMITED, UNLIMITED)
    users: tuple[str, ...] = ()  #: who may submit; with `groups` empty too: everyone
    groups: tuple[str, ...] = ()
    preemption_rules: tuple[str, ...] = ()  #: of reclaim, priority, fair_share
    min_runtime: float = 0.0  #: seconds a gang runs before it may be preempted
    max_grace: float = 0.0  #: cap, in seconds, on a job's grace when preempted and on its checkpoint notice; 0: no cap
    #: per user: the most GPUs one user's live tasks in this queue may hold (admission waits beyond it);
    #: UNLIMITED: no limit (command-set version 7)
    user_gpu: int = UNLIMITED
    #: per user: the most unfinished jobs (pending or running) one user may have in this queue (a
    #: submission beyond it is refused); UNLIMITED: no limit (command-set version 7)
    user_jobs: int = UNLIMITED
    #: the longest an interactive job of this queue may run, in seconds: its time limit defaults to it
    #: and may not exceed it; 0: DEFAULT_INTERACTIVE_MAX_S (command-set version 7)
    interactive_max: float = 0.0

    @property
    def has_limits(self) -> bool:
        """True when it sets what needs command-set version 7 (per-user limits, an interactive maximum)."""
        return self.user_gpu != UNLIMITED or self.user_jobs != UNLIMITED or bool(self.interactive_max)

    @property
    def interactive_max_duration(self) -> float:
        """Seconds an interactive job of this queue may run at most."""
        return self.interactive_max or DEFAULT_INTERACTIVE_MAX_S

    def capped(self, seconds: float) -> float:
        """`seconds` (a grace or a checkpoint notice) within this queue's max_grace."""
        return min(seconds, self.max_grace) if self.max_grace else seconds


class Role(enum.StrEnum):
    """What a user may do: `admin` everything; `user` submit, read, and cancel its own jobs."""

    ADMIN = "admin"
    USER = "user"


@dataclass(slots=True)
class User:
    """A user of the cluster. Only the token's keyed hash is kept (see synapse.master.access)."""

    name: str
    role: Role
    groups: tuple[str, ...]
    token_hash: str
    created_at: float
    created_by: str
    token_set_at: float


@dataclass(slots=True)
class JoinToken:
    """A bootstrap credential that allows one thing: registering a new node (only its keyed hash is kept)."""

    id: str  #: shown by `synctl node token list`; names it for revocation
    token_hash: str
    created_at: float
    created_by: str
    expires_at: float  #: seconds since the epoch; 0 = never
    max_uses: int  #: registrations it allows; 0 = any number
    uses: int = 0  #: registrations it made so far
    nodes: tuple[str, ...] = ()  #: the nodes it registered, oldest first (at most JOIN_TOKEN_NODES kept)

    def unusable(self, at: float) -> str:
        """Why this token cannot register a node at time `at`, or ''."""
        if self.expires_at and at >= self.expires_at:
            return f"join token {self.id} expired"
        if self.max_uses and self.uses >= self.max_uses:
            return f"join token {self.id} is used up ({self.uses} of {self.max_uses} uses)"
        return ""


#: How many registered node ids a join token remembers (for `synctl node token list`).
JOIN_TOKEN_NODES = 32
