"""Log tickets: a master's signed permission to read one task's log, checked by the worker.

The worker needs no user table: the master signs (job, attempt, task, expiry) with the node's
credential (an HMAC only masters can make, which that node received at registration), so only
that node can check it and no other node's log opens with it.
"""

from __future__ import annotations

import hashlib
import hmac

#: How long a ticket lets a stream start; a stream already started may run on (`logs -f`).
TICKET_TTL_S = 300.0


def _mac(credential: str, job_id: str, attempt: int, index: int, expires: int) -> str:
    message = f"synapse-log\0{job_id}\0{attempt}\0{index}\0{expires}".encode()
    return hmac.new(credential.encode(), message, hashlib.sha256).hexdigest()


def sign(credential: str, job_id: str, attempt: int, index: int, expires: float) -> str:
    """A ticket for task `index` of `job_id`'s attempt, valid until `expires` (epoch seconds)."""
    at = int(expires)
    return f"{at}.{_mac(credential, job_id, attempt, index, at)}"


def problem(credential: str, ticket: str, job_id: str, attempt: int, index: int, now: float) -> str:
    """Why `ticket` does not open this task's log now, or ''."""
    expires, _, mac = ticket.partition(".")
    if not expires.isdigit() or not mac:
        return "malformed log ticket"
    if not credential or not hmac.compare_digest(mac, _mac(credential, job_id, attempt, index, int(expires))):
        return "the log ticket is not for this task on this node"
    if now > int(expires):
        return "the log ticket has expired; ask again"
    return ""
