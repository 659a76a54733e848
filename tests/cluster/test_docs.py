"""The documentation a user reads: the site builds with --strict, the README stays short and its two
commands stay two, every link resolves, and the shell blocks marked runnable run against a real
local cluster.

A runnable block is a ```sh fence preceded by the line `<!-- runnable -->` (an HTML comment: MkDocs
renders the block as any other). A page's runnable blocks run in order in one `bash` with
`set -euo pipefail`, in an empty working directory, against a cluster started for that page with
`synapse-local up` (its export line in the environment, its data dir at
`$XDG_STATE_HOME/synapse-local`, where `synapse-local` keeps it by default) and stopped afterwards
with `synapse-local down --data-dir`. So a command whose name, flags, output or exit code drifts
from what the page says fails here.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from synapse.local.cluster import free_base_port
from tests.support.paths import ROOT

DOCS = ROOT / "docs"
MARKER = "<!-- runnable -->"
#: Where runnable blocks may live: the README, the quickstart, and the pages for users and operators.
RUNNABLE_PAGES = [ROOT / "README.md", DOCS / "quickstart.md",
                  *sorted((DOCS / "using").glob("*.md")), *sorted((DOCS / "operating").glob("*.md"))]
#: The cluster each page's blocks run against: the Quickstart's shape.
CLUSTER_ARGS = ["--tls", "--workers", "4", "--racks", "2", "--gpus-per-worker", "8"]
#: Seconds one page's blocks may take, all together.
PAGE_TIMEOUT_S = 90
#: The README's "Two commands", exactly: CI extracts them from the README and runs them verbatim.
TWO_COMMANDS = [
    "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/synapse-local demo",
    "bash scripts/install-test-packages.sh && python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' "
    "&& .venv/bin/python -m pytest -q -n 2",
]
README_MAX_LINES = 300


# ---- reading pages -------------------------------------------------------------------------------

def runnable_blocks(text: str) -> list[str]:
    """The bodies of the ```sh blocks marked runnable, in page order. A marker that is not followed
    by a sh fence is an error: it would silently test nothing."""
    lines = text.splitlines()
    blocks: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != MARKER:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j >= len(lines) or lines[j].strip() not in ("```sh", "```bash"):
            raise ValueError(f"line {i + 1}: {MARKER} must be followed by a ```sh block")
        end = j + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end >= len(lines):
            raise ValueError(f"line {j + 1}: the runnable block is never closed")
        blocks.append("\n".join(lines[j + 1:end]))
        i = end + 1
    return blocks


def section(text: str, heading: str) -> str:
    """The text under a `## heading`, up to the next heading of that level or higher (lines inside
    fenced code, such as a shell comment, are not headings)."""
    out: list[str] | None = None
    fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        if not fence and re.match(r"#{1,2} ", line):
            if out is not None:
                break
            if line == f"## {heading}":
                out = []
                continue
        if out is not None:
            out.append(line)
    if out is None:
        raise ValueError(f"no section '## {heading}'")
    return "\n".join(out) + "\n"


def fenced_blocks(text: str, lang: str = "sh") -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, re.M | re.S)


def commands(block: str) -> list[str]:
    """The command lines of a shell block: neither blank nor a comment."""
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def relative_links(text: str) -> list[str]:
    """Link and image targets that point into the repository (no scheme, not a bare #anchor),
    outside fenced code."""
    prose = re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S)
    targets = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", prose)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def nav_pages(nav: list) -> list[str]:
    """Every page the mkdocs nav names."""
    out: list[str] = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        out.extend(nav_pages(value) if isinstance(value, list) else [value])
    return out


def mkdocs_config() -> dict:
    # mkdocs.yml may use tags like !ENV; a plain safe load is enough for what these tests read.
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


# ---- running blocks ------------------------------------------------------------------------------

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


# ---- the site, the README, the links -------------------------------------------------------------

def test_site_builds_strictly(tmp_path):
    """mkdocs is a dev dependency: without it this fails, it does not skip."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (tmp_path / "site" / "index.html").exists()


def test_readme_is_short_and_its_two_commands_are_two():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    blocks = fenced_blocks(section(readme, "Two commands"))
    assert len(blocks) == 1, "## Two commands must hold exactly one ```sh block"
    assert commands(blocks[0]) == TWO_COMMANDS


def test_every_relative_link_in_the_readme_resolves():
    readme = (ROOT / "README.md").read_text()
    links = relative_links(readme)
    assert links, "the README should link into the docs"
    missing = [t for t in links if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_the_nav_names_every_page_and_only_pages_that_exist():
    pages = nav_pages(mkdocs_config()["nav"])
    missing = [p for p in pages if not (DOCS / p).is_file()]
    assert not missing, f"mkdocs nav names pages that do not exist: {missing}"
    unlisted = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if str(p.relative_to(DOCS)) not in pages)
    assert not unlisted, f"pages missing from the nav: {unlisted}"


def test_every_page_link_resolves():
    """mkdocs --strict checks these too; this says which, without building the site."""
    bad = []
    for page in DOCS.rglob("*.md"):
        for target in relative_links(page.read_text()):
            if not (page.parent / target.split("#")[0]).resolve().exists():
                bad.append(f"{page.relative_to(ROOT)}: {target}")
    assert not bad, bad


# ---- the extractor and the runner, on samples ----------------------------------------------------

SAMPLE = """# A page

```sh
echo "not marked: never run"; exit 1
```

<!-- runnable -->
```sh
echo one > file
```

Prose between.

<!-- runnable -->

```sh
test "$(cat file)" = one      # the same process and working directory as the block before
```
"""


def test_the_extractor_takes_only_marked_blocks_in_order():
    assert runnable_blocks(SAMPLE) == ["echo one > file", 'test "$(cat file)" = one      '
                                       "# the same process and working directory as the block before"]


def test_a_marker_without_a_sh_block_is_an_error():
    with pytest.raises(ValueError, match="must be followed"):
        runnable_blocks(f"{MARKER}\n```yaml\na: 1\n```\n")
    with pytest.raises(ValueError, match="never closed"):
        runnable_blocks(f"{MARKER}\n```sh\ntrue\n")


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


def test_the_readme_and_quickstart_have_runnable_blocks():
    """So a refactoring of the marker cannot quietly turn the page tests into no tests."""
    for page in (ROOT / "README.md", DOCS / "quickstart.md"):
        assert runnable_blocks(page.read_text()), page


# ---- the runnable blocks, against a real cluster -------------------------------------------------

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
