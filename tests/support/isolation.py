"""Sizes for the confinement tests."""

from __future__ import annotations

MI = 1 << 20
