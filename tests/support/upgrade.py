"""Two releases of one code base for the upgrade tests: this release's command set and the next one's,
in which AddUser is new, and a command of each kind."""

from __future__ import annotations

from synapse.core import codec, versions
from synapse.core import commands as c
from synapse.core.model import Resources, Role

#: This release's command-set version (the older release's), and the next release's, in which AddUser is new.
V = versions.COMMAND_VERSION
N = V + 1
#: The next release's command set (AddUser new in it), and the release before, which lacks AddUser.
NEWER = codec.CommandSet({**versions.KIND_VERSIONS, c.AddUser: versions.COMMAND_VERSION + 1},
                         versions.COMMAND_VERSION + 1)
OLDER = codec.CommandSet(NEWER.introduced, versions.COMMAND_VERSION)

REGISTER = c.RegisterNode(at=1, node_id="n1", address="h:1", topology=("z", "b", "r"),
                          capacity=Resources(8000, 1 << 30, 8))
ADD_USER = c.AddUser(at=2, by="admin", name="alice", role=Role.USER, groups=(), token_hash="ab" * 32)
