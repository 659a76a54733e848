"""The dashboard's sign-ins: a browser trades its token once (POST /login) for a random session id,
which is all its cookie holds.

Sessions are kept in this replica's memory and nowhere else: a sign-in holds on the replica that
took it only, and a restarted replica or another one asks again. That is acceptable for a
dashboard, and it keeps sign-ins out of the replicated state. The token stays in this process,
and every request is judged by `access.identify` exactly as that token sent as a bearer would be:
the access rules are the bearer's, and removing a user or rotating their token ends their sessions
at once. A session ends at its expiry (a fixed time after sign-in, however busy it is), at
/logout, or when the replica stops.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: How long a sign-in lasts (the cookie's Max-Age too).
SESSION_TTL_S = 8 * 3600.0
#: Sessions a replica keeps at most; past that the oldest is dropped (only token holders can add any).
MAX_SESSIONS = 10_000


@dataclass(frozen=True, slots=True)
class Session:
    """One sign-in."""

    token: str  #: the token it was opened with, judged again on every request
    expires_at: float  #: on the store's clock


class Sessions:
    """Session id -> sign-in, on one replica; safe to use from the HTTP server's threads."""

    def __init__(self, ttl_s: float = SESSION_TTL_S, clock: Callable[[], float] = time.monotonic,
                 limit: int = MAX_SESSIONS) -> None:
        self.ttl_s = ttl_s
        self.clock = clock  #: monotonic by default: a wall-clock step neither ends nor extends a sign-in
        self.limit = limit
        self._lock = threading.Lock()
        #: session id -> its sign-in, oldest first; open, close and expiry change it, under _lock
        self._sessions: dict[str, Session] = {}

    def open(self, token: str) -> str:
        """A new session for a token the caller has already checked; returns its id (256 random bits)."""
        session_id = secrets.token_urlsafe(32)
        now = self.clock()
        with self._lock:
            for old in [k for k, s in self._sessions.items() if s.expires_at <= now]:
                del self._sessions[old]
            while len(self._sessions) >= self.limit:
                del self._sessions[next(iter(self._sessions))]
            self._sessions[session_id] = Session(token, now + self.ttl_s)
        return session_id

    def token(self, session_id: str) -> str:
        """The token of a live session, or '' for an unknown, closed or expired one."""
        if not session_id:
            return ""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return ""
            if session.expires_at <= self.clock():
                del self._sessions[session_id]
                return ""
            return session.token

    def close(self, session_id: str) -> None:
        """Revoke a session (unknown ids are ignored)."""
        with self._lock:
            self._sessions.pop(session_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)
