"""Tickets: a master's signed permission to read one task's log, to attach to the task (its output,
stdin and signals: `synctl run`) or to start one command in its sandbox (`synctl exec`), checked by
the worker. Each purpose signs differently, so a log ticket never attaches, and an exec ticket
starts only the command it was given for.

The worker needs no user table: the master signs (job, attempt, task, expiry) with the node's
credential (an HMAC only masters can make, which that node received at registration), so only
that node can check it and no other node's log opens with it.
"""

from __future__ import annotations

import hashlib
import hmac

#: How long a ticket lets a stream start; a stream already started may run on (`logs -f`).
TICKET_TTL_S = 300.0


#: What a ticket allows: read the task's log (the first purpose: its signature has not changed).
LOG = "log"
#: Attach to the running task: its output, rank 0's stdin, signals to its process group.
ATTACH = "attach"


def exec_purpose(command: tuple[str, ...] | list[str]) -> str:
    """The purpose of a ticket that starts exactly `command` in the task's sandbox."""
    return "exec\x1f" + "\x1f".join(command)


def _mac(credential: str, job_id: str, attempt: int, index: int, expires: int, purpose: str) -> str:
    head = "synapse-log" if purpose == LOG else f"synapse-{purpose}"
    message = f"{head}\0{job_id}\0{attempt}\0{index}\0{expires}".encode()
    return hmac.new(credential.encode(), message, hashlib.sha256).hexdigest()


def sign(credential: str, job_id: str, attempt: int, index: int, expires: float, purpose: str = LOG) -> str:
    """A ticket for task `index` of `job_id`'s attempt, for `purpose`, valid until `expires` (epoch seconds)."""
    at = int(expires)
    return f"{at}.{_mac(credential, job_id, attempt, index, at, purpose)}"


def problem(credential: str, ticket: str, job_id: str, attempt: int, index: int, now: float,
            purpose: str = LOG) -> str:
    """Why `ticket` does not allow `purpose` on this task now, or ''."""
    what = "log" if purpose == LOG else purpose.partition("\x1f")[0]
    expires, _, mac = ticket.partition(".")
    if not expires.isdigit() or not mac:
        return f"malformed {what} ticket"
    if not credential or not hmac.compare_digest(mac, _mac(credential, job_id, attempt, index, int(expires),
                                                           purpose)):
        return f"the {what} ticket is not for this " + ("command in this task" if what == "exec" else "task") \
            + " on this node"
    if now > int(expires):
        return f"the {what} ticket has expired; ask again"
    return ""
