"""Console entry points. The master, worker, CLI and local cluster are built in later milestones;
until each lands, its command says so and exits non-zero rather than pretending to work."""

from __future__ import annotations

import sys


def _not_yet(name: str, milestone: str) -> None:
    print(f"{name}: not available in this version yet ({milestone})", file=sys.stderr)
    sys.exit(2)


def master() -> None:
    _not_yet("synapse-master", "arrives with the highly available master")


def worker() -> None:
    _not_yet("synapse-worker", "arrives with the worker agent")


def synctl() -> None:
    _not_yet("synctl", "arrives with the highly available master")


def local() -> None:
    _not_yet("synapse-local", "arrives with the highly available master")
