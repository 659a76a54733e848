"""The history of a chaos run: one JSON object per line, so other tools can write and read it.

Record types (field `type`), times in seconds since the epoch:

* `op` — one client operation: `id` (unique), `client`, `f` (submit | get | cancel | list),
  `key` (the request id a submission used), `input`, `output`, `invoke`, `complete` (null when
  the outcome is unknown), `status` (ok | fail | unknown), `error`.
* `task` — a task as a worker saw it: `node`, `job`, `attempt`, `index`, `event`
  (start | exit | adopt | lost), `time`, `code` (exit code, for exit).
* `fault` — an injected fault: `kind`, `targets`, `start`, `end`, `detail`.
* `replica` — each master replica at the end: `id`, `applied`, `digest`, `data_dir`.
* `meta` — run parameters: `seed`, `duration`, `masters`, `workers`, `stop_grace`,
  `heartbeat_timeout`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO


class History:
    """Append-only, thread-safe JSON-lines writer."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: TextIO = open(self.path, "a", buffering=1)
        self._lock = threading.Lock()
        self._next_id = 0

    def next_id(self) -> int:
        with self._lock:
            self._next_id += 1
            return self._next_id

    def write(self, record_type: str, **fields: Any) -> None:
        line = json.dumps({"type": record_type, **fields}, sort_keys=True, default=str)
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        self._file.close()


def read(path: str | Path) -> Iterator[dict[str, Any]]:
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                yield json.loads(line)
