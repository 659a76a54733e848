"""A queue file with a two-level tree, guarantees and limits."""

from __future__ import annotations

FILE = """
queues:
  - name: research
    guaranteed: {gpu: 16}
  - name: a
    parent: research
    weight: 2
    guaranteed: {gpu: 16, cpu: 64, memory: 256Gi}
    max: {gpu: 32}
    users: [alice]
    preemption: {rules: [reclaim, priority], min_runtime: 10m, max_grace: 30s}
  - name: b
    guaranteed: {gpu: 16}
    max: {gpu: 32}
"""
