"""CI runs the README's two commands as written: the extractor, held to the README and to .ci/run."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.support.paths import ROOT

_spec = importlib.util.spec_from_file_location("readme_commands", ROOT / "scripts" / "readme_commands.py")
readme_commands = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_commands)


def test_the_readme_has_two_commands_and_the_first_makes_a_virtual_environment():
    install_demo, install_test = readme_commands.two_commands((ROOT / "README.md").read_text())
    assert "venv" in install_demo and "synapse-local demo" in install_demo
    assert "venv" in install_test and "pytest" in install_test


def test_ci_runs_what_the_extractor_finds():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/readme_commands.py README.md" in ci and '"${readme[0]}"' in ci and '"${readme[1]}"' in ci


@pytest.mark.parametrize("block, problem", [
    ("```sh\na\nb\nc\n```", "3 command line(s)"),
    ("```sh\n# only a comment\na\n```", "1 command line(s)"),
    ("```python\na\nb\n```", "not a shell block"),
    ("no block at all", "no fenced block"),
    ("```sh\na \\\n  b\nc\n```", "continues on the next line"),
])
def test_a_drifted_section_is_refused(block, problem):
    with pytest.raises(readme_commands.ReadmeError, match=re.escape(problem)):
        readme_commands.two_commands(f"# X\n\n## Two commands\n\n{block}\n\n## Next\n")


def test_comments_and_blank_lines_are_skipped():
    text = "## Two commands\n```sh\n# demo\nfirst && one\n\n# tests\nsecond\n```\n"
    assert readme_commands.two_commands(text) == ["first && one", "second"]
