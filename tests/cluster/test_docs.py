"""The documentation site builds with --strict, the command table is what the code gives, and the shell
blocks marked runnable run against a real local cluster (the README, links, nav and the block
extractor are checked in tests/unit/test_docs.py)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from synapse.local.cluster import free_base_port
from tests.support.docs import DOCS, MARKER, SAMPLE, runnable_blocks
from tests.support.paths import ROOT

#: Where runnable blocks may live: the README, the quickstart, and the pages for users and operators.
RUNNABLE_PAGES = [ROOT / "README.md", DOCS / "quickstart.md",
                  *sorted((DOCS / "using").glob("*.md")), *sorted((DOCS / "operating").glob("*.md"))]


#: The cluster each page's blocks run against: the Quickstart's shape.
CLUSTER_ARGS = ["--tls", "--workers", "4", "--racks", "2", "--gpus-per-worker", "8"]


#: Seconds one page's blocks may take, all together.
PAGE_TIMEOUT_S = 90


def shims(bin_dir: Path) -> Path:
    """An executable per [project.scripts] entry point that runs this checkout's code with this
    interpreter, whatever is installed: the commands the pages name, as a user has them."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, target in scripts.items():
        module, func = target.split(":")
        code = f"import sys; sys.argv[0] = {name!r}; from {module} import {func}; sys.exit({func}())"
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(code)} \"$@\"\n")
        path.chmod(0o755)
    return bin_dir


def run_blocks(blocks: list[str], cwd: Path, env: dict[str, str],
               timeout: float = PAGE_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run `blocks` in order in one bash, stopping at the first failing command."""
    script = "set -euo pipefail\n" + "\n".join(blocks) + "\n"
    # A session of its own, so that a block still running at the timeout goes with everything it started.
    proc = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n(timed out after {timeout:g} s)"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def base_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNAPSE_")}
    env["PATH"] = f"{shims(tmp / 'bin')}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["XDG_STATE_HOME"] = str(tmp / "state")
    return env


def exported(output: str) -> dict[str, str]:
    """The variables of the `export …` line `synapse-local up` prints."""
    for line in output.splitlines():
        if line.startswith("export "):
            return dict(word.split("=", 1) for word in shlex.split(line)[1:])
    raise AssertionError(f"synapse-local up printed no export line:\n{output}")


def test_site_builds_strictly(tmp_path):
    """mkdocs is a dev dependency: without it this fails, it does not skip."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (tmp_path / "site" / "index.html").exists()


@pytest.mark.parametrize("block", [
    "false",                                  # a command that fails
    "synctl --no-such-flag get jobs",         # a drifted command line
    "echo \"$NO_SUCH_VARIABLE\"",             # set -u
    "false | cat",                            # pipefail
    "synctl get no-such-thing; echo 'never reached'",
])
def test_a_failing_block_fails_the_page(tmp_path, block):
    env = base_env(tmp_path)
    page = f"{MARKER}\n```sh\ntrue\n```\n\n{MARKER}\n```sh\n{block}\n```\n"
    proc = run_blocks(runnable_blocks(page), tmp_path, env, timeout=60)
    assert proc.returncode != 0
    assert "never reached" not in proc.stdout


def test_a_passing_sample_passes(tmp_path):
    proc = run_blocks(runnable_blocks(SAMPLE), tmp_path, base_env(tmp_path), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "not marked" not in proc.stdout


PAGES_WITH_BLOCKS = [p for p in RUNNABLE_PAGES if MARKER in p.read_text()]


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES_WITH_BLOCKS, ids=[str(p.relative_to(ROOT)) for p in PAGES_WITH_BLOCKS])
def test_runnable_blocks(tmp_path, page):
    blocks = runnable_blocks(page.read_text())
    env = base_env(tmp_path)
    data_dir = Path(env["XDG_STATE_HOME"]) / "synapse-local"
    work = tmp_path / "work"
    work.mkdir()
    up = subprocess.run(["synapse-local", "up", *CLUSTER_ARGS, "--data-dir", str(data_dir),
                         "--base-port", str(free_base_port(3))],
                        cwd=work, env=env, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    try:
        assert up.returncode == 0, f"synapse-local up failed:\n{up.stdout}\n{up.stderr}"
        env.update(exported(up.stdout))
        proc = run_blocks(blocks, work, env)
        assert proc.returncode == 0, (f"{page.relative_to(ROOT)}: a runnable block failed (exit "
                                      f"{proc.returncode})\n--- stdout\n{proc.stdout[-4000:]}\n"
                                      f"--- stderr\n{proc.stderr[-4000:]}")
    finally:
        subprocess.run(["synapse-local", "down", "--data-dir", str(data_dir)], env=env, capture_output=True,
                       timeout=60, stdin=subprocess.DEVNULL)


def test_the_command_table_is_what_the_code_gives():
    """docs/architecture/commands.md's table is written from versions.KIND_VERSIONS and the commands'
    docstrings (scripts/command_table.py); a new kind without a docstring or a handler fails too."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "command_table.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
