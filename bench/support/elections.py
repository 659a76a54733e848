"""Count Raft elections during a benchmark's phases: a fault-free phase must have none.

An election raises the term, so the elections in a phase are how far the highest term any replica
reports rose across it. A phase with no fault that saw one is a finding (a leader lost to load,
not to a failure), and the benchmark fails instead of carrying on with figures it cannot trust.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from synapse.client.master_client import MasterClient
from synapse.local.cluster import client_tls


class Elections:
    def __init__(self, state: dict) -> None:
        self.addresses = [m["api_address"] for m in state["masters"]]
        self.client = MasterClient(self.addresses, state["token"], tls=client_tls(state))
        self.counts: dict[str, int] = {}  #: phase -> elections seen during it

    def highest_term(self) -> int:
        terms = []
        for address in self.addresses:
            try:
                terms.append(self.client.replica_status(address, timeout=2).term)
            except Exception:  # noqa: BLE001 - a replica down (a failover phase): the others tell
                pass
        return max(terms, default=0)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        before = self.highest_term()
        try:
            yield
        finally:
            self.counts[name] = self.counts.get(name, 0) + self.highest_term() - before

    def fault_free(self) -> int:
        """Elections in every phase counted (the benchmarks count only fault-free ones)."""
        return sum(self.counts.values())

    def report(self) -> None:
        """Print the count; exit 1 when a fault-free phase saw an election."""
        print(f"elections in fault-free phases: {self.fault_free()} {self.counts}")
        if self.fault_free():
            print("FAIL: the leader changed with no fault injected", file=sys.stderr)
            sys.exit(1)

    def close(self) -> None:
        self.client.close()
