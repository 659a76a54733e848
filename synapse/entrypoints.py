"""Console entry points for components that are not built yet: each says so and exits non-zero
rather than pretending to work."""

from __future__ import annotations

import sys


def worker() -> None:
    print("synapse-worker: not available in this version yet (arrives with the worker agent)", file=sys.stderr)
    sys.exit(2)
