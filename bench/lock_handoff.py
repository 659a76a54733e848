"""What letting go of Python's lock costs a busy process: calls timed alone and beside a busy thread.

    python bench/lock_handoff.py [--rounds 3] [--json]
    python bench/lock_handoff.py --quick      # a few seconds, the same code paths (CI)

A C call that releases the GIL for a few microseconds is cheap alone; on a loaded master, whose
event loop, gRPC threads and Raft tick thread want the lock at once, getting it back costs a
switch. This times, in this thread's CPU time, with nothing beside it and then beside one thread
spinning in Python (as a loaded event loop does):

- the Raft transport's framing of a message (synapse.master.frames) against pysyncobj's own
  `zlib.compress(data, 3)` / `zlib.decompress`, for a 190-byte answer and a 1.5 KB AppendEntries;
- the history store's export to SQLite, per job, 120 jobs a batch (as the exporter writes under
  load), with its multi-row statements and with one row a statement (the driver's executemany,
  which releases the lock at every row).

Each figure is the median of `--rounds` interleaved rounds; the 1-minute load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse.core.goodput import Goodput  # noqa: E402
from synapse.core.history import JobRecord, RunRecord  # noqa: E402
from synapse.history.store import HistoryStore  # noqa: E402
from synapse.master import frames  # noqa: E402

BATCH = 120


class Busy:
    """A thread spinning in Python while the block runs (or nothing, when `on` is False)."""

    def __init__(self, on: bool) -> None:
        self.on, self.stop = on, False
        self.thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        n = 0
        while not self.stop:
            n += 1

    def __enter__(self) -> Busy:
        if self.on:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop = True
        if self.on:
            self.thread.join()


def in_thread(fn: Callable[[], float]) -> float:
    """fn's result, run in a thread of its own (as the tick thread and the executor are)."""
    out: list[float] = []
    worker = threading.Thread(target=lambda: out.append(fn()))
    worker.start()
    worker.join()
    return out[0]


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    started = time.thread_time_ns()
    for _ in range(calls):
        fn()
    return (time.thread_time_ns() - started) / calls / 1000


def record(i: int, with_run: bool) -> JobRecord:
    job_id = f"job-{i:08d}"
    runs = (RunRecord(job_id, 1, "alice", "default", 1.0, 2.0, 3.0, ("n1", "n2"), 8, 16_000, 64 << 30, 8,
                      "Completed", "", 0, 16.0, 32.0),) if with_run else ()
    return JobRecord(job_id, "bench", "alice", "default", 0, 1.0, 1.0, 1.0 if with_run else 0.0, 3.0, "CANCELLED",
                     "Cancelled", "cancelled by alice", 0, 1 if with_run else 0, 8, ("n1", "n2") if with_run else (),
                     16_000, 64 << 30, 8, 16.0 if with_run else 0.0, 32.0 if with_run else 0.0, 0.0, "alice", 0, i,
                     runs, Goodput())


def export_us(multirow: bool, with_run: bool, batches: int) -> float:
    """Thread CPU per job of HistoryStore.export into a fresh SQLite file, median over the batches."""
    with tempfile.TemporaryDirectory(prefix="synapse-bench-lock-") as tmp:
        store = HistoryStore(f"sqlite:///{tmp}/history.sqlite")
        store.migrate()
        if not multirow:
            upserts = store._upserts()
            for upsert in (upserts.jobs, upserts.runs, upserts.usage):
                upsert._group = ""  # one row a statement: the driver's executemany
        cursor, times = 0, []
        for n in range(batches + 2):
            records = [record(cursor + k, with_run) for k in range(BATCH)]
            started = time.thread_time_ns()
            store.export(records, cursor, cursor + BATCH, 5.0)
            if n >= 2:  # the first batches warm the connection and the statements
                times.append((time.thread_time_ns() - started) / BATCH / 1000)
            cursor += BATCH
        store.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="one round, few calls (CI)")
    args = parser.parse_args()
    calls, batches = (200, 3) if args.quick else (3000, 25)
    rounds = 1 if args.quick else args.rounds
    small = b"s" * 190
    message = bytes(range(256)) * 2 + b"synapse " * 128  # 1,536 bytes, some of it compressible
    cases: dict[str, Callable[[], float]] = {}
    for label, data in (("190 B", small), ("1.5 KB", message)):
        deflated, framed = zlib.compress(data, 3), frames.compress(data)
        cases[f"{label} zlib.compress(3)"] = lambda d=data: per_call_us(lambda: zlib.compress(d, 3), calls)
        cases[f"{label} frames.compress"] = lambda d=data: per_call_us(lambda: frames.compress(d), calls)
        cases[f"{label} zlib.decompress"] = lambda z=deflated: per_call_us(lambda: zlib.decompress(z), calls)
        cases[f"{label} frames.decompress"] = lambda f=framed: per_call_us(lambda: frames.decompress(f), calls)
    for with_run in (False, True):
        kind = "job with a run" if with_run else "job that never ran"
        cases[f"export per {kind}, one row a statement"] = \
            lambda w=with_run: export_us(False, w, batches)
        cases[f"export per {kind}, multi-row"] = lambda w=with_run: export_us(True, w, batches)
    load = os.getloadavg()[0]
    samples: dict[str, dict[str, list[float]]] = {name: {"alone": [], "busy": []} for name in cases}
    for _ in range(rounds):
        for busy in (False, True):
            for name, case in cases.items():
                with Busy(busy):
                    samples[name]["busy" if busy else "alone"].append(in_thread(case))
    report = {"load_average_1m": round(load, 2), "rounds": rounds,
              "us": {name: {k: round(statistics.median(v), 1) for k, v in s.items()} for name, s in samples.items()}}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"thread CPU per call (µs), median of {rounds} round(s); 1-minute load average {load:.2f} before")
    print(f"  {'':52s} {'alone':>8s} {'busy thread beside':>20s}")
    for name, figures in report["us"].items():
        print(f"  {name:52s} {figures['alone']:8.1f} {figures['busy']:20.1f}")
    if args.quick:
        print("(--quick: too few calls to judge)")


if __name__ == "__main__":
    main()
