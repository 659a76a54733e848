"""The README's main job: `synapse-local demo` must pass, quickly, and leave nothing running."""

import time

import pytest

from synapse.local.cluster import free_base_port
from synapse.local.demo import demo

pytestmark = pytest.mark.slow


def test_demo_passes_and_cleans_up(tmp_path):
    lines: list[str] = []
    started = time.monotonic()
    assert demo(tmp_path / "demo", free_base_port(3), say=lines.append), "\n".join(lines)
    assert time.monotonic() - started < 60
    text = "\n".join(lines)
    assert "Demo passed." in text and "new leader" in text and "ended SUCCEEDED (attempt 1)" in text
    ranks = [line for line in lines if line.strip().startswith("rank ")]
    assert len(ranks) == 2 and len({line.split("(")[1].split(")")[0] for line in ranks}) == 1  # one rack
