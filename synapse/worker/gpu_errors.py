"""GPU errors: what the worker watches on its GPUs, and reports in its heartbeats at once.

A training task on a GPU that fails seldom exits: it hangs in a collective, or crawls. So the worker
looks for itself, every `--gpu-check-interval` seconds (10 by default; 0 turns it off) when it found
GPUs through NVML or `nvidia-smi` (not with `--gpus N`), with one call of
`nvidia-smi --query-gpu=index,ecc.errors.uncorrected.volatile.total --format=csv,noheader,nounits`:

* a GPU with uncorrectable ECC errors since the driver loaded (the errors behind Xid 48, 63, 64, 94
  and 95), or whose fields read "GPU requires reset";
* a GPU that discovery found and that the listing no longer shows (fallen off the bus: Xid 79);
* nvidia-smi failing or hanging altogether: an error of the node's GPUs as a whole (`NODE_GPUS`).

Xid events themselves are in the kernel log, which a worker need not be able to read: a site that
wants them may add its own `--health-check` (which cordons or drains the node, HealthCheckFailed).

The worker sends what it sees in every heartbeat, and one at once when it changes; the leader
records an error the state does not hold yet (a GpuFault, synapse.core.brain.heartbeat.gpu_fault_change):
the gangs on those GPUs requeue, uncharged, off the node, and the node is cordoned until an admin
uncordons it.

The test hook: with `SYNAPSE_TEST_GPU_ERRORS` set in the worker's environment, the worker reads
that file instead (`{node}` in its path becomes the node id, so one setting serves a whole local
cluster), every TEST_HOOK_INTERVAL; each line is `INDEX MESSAGE` (INDEX `*`: the node's GPUs as a
whole); a missing file means no error. It fakes the report, not the failure: the tasks keep running
until the cluster stops them.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from synapse.core.brain.heartbeat import MAX_GPU_ERRORS, NODE_GPUS, GpuErrorReport

log = logging.getLogger(__name__)

TEST_HOOK_ENV = "SYNAPSE_TEST_GPU_ERRORS"
#: Seconds between reads of the test hook's file.
TEST_HOOK_INTERVAL = 0.2
QUERY = ["nvidia-smi", "--query-gpu=index,ecc.errors.uncorrected.volatile.total", "--format=csv,noheader,nounits"]
#: Seconds nvidia-smi may take before the GPUs count as failed.
QUERY_TIMEOUT_S = 30.0
#: Longest message kept of one error.
MAX_MESSAGE = 160

Probe = Callable[[], tuple[GpuErrorReport, ...]]


def parse_hook(text: str) -> tuple[GpuErrorReport, ...]:
    """The errors a test hook file names: `INDEX MESSAGE` a line (`*`: the node's GPUs); blank lines,
    `#` comments and lines that name no index are left out."""
    out = []
    for line in text.splitlines():
        index, _, message = line.strip().partition(" ")
        if index == "*":
            out.append(GpuErrorReport(NODE_GPUS, message.strip()[:MAX_MESSAGE] or "GPU error"))
        elif index.isdigit():
            out.append(GpuErrorReport(int(index), message.strip()[:MAX_MESSAGE] or "GPU error"))
    return tuple(out[:MAX_GPU_ERRORS])


def parse_query(text: str, expected: Iterable[int]) -> tuple[GpuErrorReport, ...]:
    """The errors in QUERY's output, given the GPU indices discovery found (`expected`)."""
    out, listed = [], set()
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        index = int(parts[0])
        listed.add(index)
        if any("requires reset" in p.lower() for p in parts[1:]):
            out.append(GpuErrorReport(index, "GPU requires reset"))
        elif parts[1].isdigit() and int(parts[1]) > 0:
            out.append(GpuErrorReport(index, f"uncorrectable ECC errors: {parts[1]}"))
    out += [GpuErrorReport(i, "not listed by nvidia-smi (fallen off the bus?)") for i in sorted(set(expected) - listed)]
    return tuple(out[:MAX_GPU_ERRORS])


def query_nvidia_smi(expected: tuple[int, ...]) -> tuple[GpuErrorReport, ...]:
    """One look at the GPUs through nvidia-smi (QUERY)."""
    try:
        run = subprocess.run(QUERY, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return (GpuErrorReport(NODE_GPUS, f"nvidia-smi gave no answer within {QUERY_TIMEOUT_S:g}s"),)
    except OSError as exc:
        return (GpuErrorReport(NODE_GPUS, f"nvidia-smi cannot run: {exc.strerror or exc}"),)
    errors = parse_query(run.stdout, expected)
    if run.returncode != 0 and not any(line.split(",")[0].strip().isdigit() for line in run.stdout.splitlines()):
        first = next((line.strip() for line in (run.stdout + run.stderr).splitlines() if line.strip()), "")
        return (GpuErrorReport(NODE_GPUS, (first or f"nvidia-smi exited with code {run.returncode}")[:MAX_MESSAGE]),)
    return errors


class GpuWatch:
    """Looks at the GPUs every `interval` seconds; each look gives the errors seen (none: all well)."""

    def __init__(self, probe: Probe, interval: float, source: str) -> None:
        self.probe = probe
        self.interval = interval  #: seconds between the start of one look and the next
        self.source = source  #: what it looks at (logged): "nvidia-smi" or the test hook's file

    def poll(self) -> tuple[GpuErrorReport, ...]:
        return self.probe()


def hook_watch(node_id: str, environ: Mapping[str, str] = os.environ) -> GpuWatch | None:
    """The test hook's watch, when SYNAPSE_TEST_GPU_ERRORS is set (see the module docstring)."""
    template = environ.get(TEST_HOOK_ENV, "")
    if not template:
        return None
    path = Path(template.replace("{node}", node_id))

    def read() -> tuple[GpuErrorReport, ...]:
        try:
            return parse_hook(path.read_text())
        except OSError:
            return ()

    return GpuWatch(read, TEST_HOOK_INTERVAL, f"test hook {path}")


def watch_for(node_id: str, gpu_source: str, gpus: int, interval: float) -> GpuWatch | None:
    """What this worker watches: the test hook if set, else nvidia-smi when discovery found GPUs
    (through NVML or nvidia-smi) and `interval` is above 0, else nothing."""
    hook = hook_watch(node_id)
    if hook is not None:
        return hook
    if interval <= 0 or gpus <= 0 or gpu_source not in ("nvml", "nvidia-smi") or shutil.which("nvidia-smi") is None:
        return None
    expected = tuple(range(gpus))
    return GpuWatch(lambda: query_nvidia_smi(expected), interval, "nvidia-smi")
