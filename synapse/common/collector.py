"""How a process holding a large, long-lived cluster state sets Python's cyclic garbage collector.

With the default thresholds (700, 10, 10), a master holding 10,000 nodes and thousands of running
gangs runs a young collection every 700 allocations and a full one every hundred of those; a
planning pass over the state allocates enough to trigger a full collection every few passes, and a
full collection walks the whole state (about 60 ms at that size, longer than the plan itself).
Refcounting frees almost everything the scheduler allocates (it makes no cycles), so the young
generation may grow far larger before a collection pays: with these thresholds full collections
become rare. `bench/preemption.py` measures plans under both settings.
"""

from __future__ import annotations

import gc

#: objects allocated before a young collection, and young (then middle) collections before an older one
THRESHOLDS = (50_000, 20, 20)


def tune_for_large_state() -> None:
    gc.set_threshold(*THRESHOLDS)
