"""Static checks in the default test run: ruff over the tree, and mypy, strict on the whole `synapse`
package (its config is pyproject.toml's [tool.mypy]; the generated protobuf code through its stubs)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import ROOT


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing():
    done = run("ruff", "check", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_package_type_checks_strictly():
    done = run("mypy")  # files (all of synapse/) and strictness from pyproject.toml
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success" in done.stdout


def test_the_type_checker_would_see_a_wrong_type(tmp_path):
    """The check is real: the same config refuses a function that returns the wrong type."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f() -> int:\n    return 'a'\n")
    done = run("mypy", "--config-file", str(ROOT / "pyproject.toml"), str(bad))
    assert done.returncode == 1 and "Incompatible return value type" in done.stdout, done.stdout
