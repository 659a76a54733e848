"""A bare pysyncobj replica carrying the Synapse state machine, for bench/ha.py's baseline.

    python bench/support/raw_raft.py SELF PARTNERS DATA_DIR   (password in SYNAPSE_RAFT_PASSWORD)

Reads lines on stdin: `leader?` -> `yes`/`no`; `load N C HEX` -> proposes the command N times
from C threads (a fresh job id each) and prints `ops_per_s`. EOF stops it.
"""

import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from synapse.core import codec  # noqa: E402
from synapse.core import commands as c  # noqa: E402
from synapse.master.raft import RaftNode, raft_config  # noqa: E402


def main() -> None:
    self_addr, partners, data_dir = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
    node = RaftNode(self_addr, partners, raft_config(bind_address=self_addr, data_dir=data_dir,
                                                     password=os.environ["SYNAPSE_RAFT_PASSWORD"]))
    for line in sys.stdin:
        words = line.split()
        if words[0] == "leader?":
            print("yes" if node.is_leader() else "no", flush=True)
        elif words[0] == "load":
            n, threads, template = int(words[1]), int(words[2]), codec.decode_command(bytes.fromhex(words[3]))
            assert isinstance(template, c.SubmitJob)

            def worker(k: int, n: int = n, threads: int = threads, template: c.SubmitJob = template) -> None:
                for i in range(k, n, threads):
                    cmd = c.SubmitJob(at=time.time(), job_id=f"raw-{i}", request_id=f"raw-{i}", spec=template.spec)
                    node.propose(cmd, timeout=10)

            start = time.perf_counter()
            pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
            print(f"{n / (time.perf_counter() - start):.1f}", flush=True)
    node.destroy()


if __name__ == "__main__":
    main()
