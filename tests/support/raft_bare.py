"""A bare pysyncobj node WITHOUT a password: the control for the Raft-port attack test.

    python -m tests.support.raft_bare HOST:PORT      (runs until killed)
"""

import sys
import time

from pysyncobj import SyncObj, SyncObjConf

if __name__ == "__main__":
    node = SyncObj(sys.argv[1], [], conf=SyncObjConf(bindAddress=sys.argv[1]))
    while True:
        time.sleep(1)
