"""The documentation a user reads, without building or running it: the README stays short and its two
commands stay two, every link resolves, the nav names every page, and the extractor of the blocks
marked runnable takes what it should (tests/cluster/test_docs.py builds the site and runs them).

A runnable block is a ```sh fence preceded by the line `<!-- runnable -->` (an HTML comment: MkDocs
renders the block as any other). A page's runnable blocks run in order in one `bash` with
`set -euo pipefail`, in an empty working directory, against a cluster started for that page with
`synapse-local up` (its export line in the environment, its data dir at
`$XDG_STATE_HOME/synapse-local`, where `synapse-local` keeps it by default) and stopped afterwards
with `synapse-local down --data-dir`. So a command whose name, flags, output or exit code drifts
from what the page says fails here.
"""

from __future__ import annotations

import re

import pytest
import yaml

from tests.support.docs import DOCS, MARKER, SAMPLE, runnable_blocks
from tests.support.paths import ROOT

#: The README's "Two commands", exactly: CI extracts them from the README and runs them verbatim.
TWO_COMMANDS = [
    "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/synapse-local demo",
    "bash scripts/install-test-packages.sh && python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' "
    "&& .venv/bin/python -m pytest -q -n 2",
]
README_MAX_LINES = 300


# ---- reading pages -------------------------------------------------------------------------------


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


# ---- the site, the README, the links -------------------------------------------------------------


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


def test_the_extractor_takes_only_marked_blocks_in_order():
    assert runnable_blocks(SAMPLE) == ["echo one > file", 'test "$(cat file)" = one      '
                                       "# the same process and working directory as the block before"]


def test_a_marker_without_a_sh_block_is_an_error():
    with pytest.raises(ValueError, match="must be followed"):
        runnable_blocks(f"{MARKER}\n```yaml\na: 1\n```\n")
    with pytest.raises(ValueError, match="never closed"):
        runnable_blocks(f"{MARKER}\n```sh\ntrue\n")


def test_the_readme_and_quickstart_have_runnable_blocks():
    """So a refactoring of the marker cannot quietly turn the page tests into no tests."""
    for page in (ROOT / "README.md", DOCS / "quickstart.md"):
        assert runnable_blocks(page.read_text()), page


# ---- the runnable blocks, against a real cluster -------------------------------------------------


