"""A bare replica process for the replication test: a RaftNode driven by JSON lines on stdin.

    python -m tests.support.replica_proc SELF PARTNER,PARTNER DATA_DIR   (password in SYNAPSE_RAFT_PASSWORD)

Requests: {"op": "propose", "cmd": "<hex of an encoded command>"} -> {"ok", "error", "value"} or
{"propose_error": kind}; {"op": "status"} -> {"leader", "is_leader", "applied", "digest"};
{"op": "compact"} forces a snapshot. EOF on stdin stops the replica.
"""

import json
import os
import sys

from synapse.core import codec
from synapse.master.raft import ProposeError, RaftNode, raft_config


def main() -> None:
    self_addr, partners, data_dir = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
    conf = raft_config(bind_address=self_addr, data_dir=data_dir,
                       password=os.environ["SYNAPSE_RAFT_PASSWORD"])
    node = RaftNode(self_addr, partners, conf)
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "propose":
            try:
                res = node.propose(codec.decode_command(bytes.fromhex(req["cmd"])), timeout=5)
                out = {"ok": res.ok, "error": res.error, "value": res.value}
            except ProposeError as exc:
                out = {"propose_error": exc.kind}
        elif req["op"] == "status":
            applied, digest = node.replicated.digest()
            out = {"leader": node.leader(), "is_leader": node.is_leader(), "applied": applied,
                   "digest": digest}
        elif req["op"] == "compact":
            node.sync.forceLogCompaction()
            out = {"ok": True}
        else:
            out = {"error": f"unknown op {req['op']}"}
        print(json.dumps(out), flush=True)
    node.destroy()


if __name__ == "__main__":
    main()
