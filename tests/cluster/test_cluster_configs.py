"""The example systemd units verify where systemd exists (the cluster files are loaded in
tests/unit/test_cluster_configs.py)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support.paths import ROOT


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_units_verify(tmp_path):
    for unit in (ROOT / "cluster-configs" / "systemd").glob("*.service"):
        target = tmp_path / unit.name.replace("@.service", "@m1.service")
        target.write_text(unit.read_text())
        run = subprocess.run(["systemd-analyze", "verify", str(target)], capture_output=True, text=True)
        # The binaries are not installed at /usr/local/bin on a test machine; anything else counts.
        problems = [line for line in run.stderr.splitlines()
                    if line.strip() and "is not executable: No such file or directory" not in line]
        assert not problems, run.stderr
