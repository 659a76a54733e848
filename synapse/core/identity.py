"""Who may be a user: names and groups, checked the same way by the API and by apply."""

from __future__ import annotations

import re

#: The identity of the cluster token (the bootstrap admin), and of callers of a cluster that has no
#: token at all (a development setting): neither is a stored user, so neither name can be one.
BOOTSTRAP_ADMIN = "admin"
ANONYMOUS = "anonymous"
RESERVED_NAMES = frozenset({BOOTSTRAP_ADMIN, ANONYMOUS, "system"})

#: Unix-like names: they end up in listings, events and (later) quota accounting.
_NAME_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
MAX_GROUPS = 64


def user_name_problem(name: str) -> str:
    """Why `name` cannot name a user, or ''."""
    if not _NAME_RE.match(name):
        return (f"user name {name[:40]!r}: 1-32 characters, lower-case letters, digits, '_', '.' or '-', "
                "starting with a letter or '_'")
    if name in RESERVED_NAMES:
        return f"user name {name!r} is reserved"
    return ""


def groups_problem(groups: tuple[str, ...]) -> str:
    """Why these groups cannot be a user's, or ''."""
    if len(groups) > MAX_GROUPS:
        return f"groups: at most {MAX_GROUPS}"
    bad = [g for g in groups if not _NAME_RE.match(g)]
    if bad:
        return f"group name {bad[0][:40]!r}: the same rules as user names"
    if len(set(groups)) != len(groups):
        return "groups: each at most once"
    return ""
