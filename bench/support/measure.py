"""Helpers shared by the benchmarks."""

from __future__ import annotations


def percentile(samples: list[float], q: float) -> float:
    """The q-quantile (0..1) of the samples, nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    import os

    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def counter_by(http_address: str, name: str, label: str, ca: str = "") -> dict[str, float]:
    """A counter's totals by the value of one `label`, from one read of a master's /metrics (HTTPS
    with `ca`)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from synapse.common.tls import http_base

    base, context = http_base(http_address, ca)
    with urllib.request.urlopen(base + "/metrics", timeout=5, context=context) as reply:
        text = reply.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == f"{name}_total":
                totals[s.labels.get(label, "")] = totals.get(s.labels.get(label, ""), 0.0) + s.value
    return totals


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU time of the whole machine so far, in clock ticks (Linux /proc/stat)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)
