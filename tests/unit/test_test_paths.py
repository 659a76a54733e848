"""Every test file the repository names (in docs, code comments, configs, scripts, other tests) exists,
with the test it names after `::`: tests move between tests/unit and tests/cluster, and a page
pointing at the old place would send a reader nowhere."""

from __future__ import annotations

import ast
import re

from tests.support.paths import ROOT

#: Where test files are named: everything a reader or a tool follows, not generated output.
SOURCES = ("README.md", "mkdocs.yml", "pyproject.toml", ".ci/run", "docs/**/*.md", "examples/**/*.md",
           "scripts/*", "synapse/**/*.py", "bench/**/*.py", "chaos/**/*.py", "cluster-configs/**/*.y*ml",
           "tests/**/*.py")
NAMED = re.compile(r"\btests/[a-z_/]+\.py(?:::[a-z_0-9]+)?")


def named_paths() -> dict[str, set[str]]:
    """Each test path named anywhere, with the files that name it."""
    found: dict[str, set[str]] = {}
    for pattern in SOURCES:
        for path in ROOT.glob(pattern):
            if path.is_file() and ".venv" not in path.parts:
                for ref in NAMED.findall(path.read_text(errors="replace")):
                    found.setdefault(ref, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_named_test_file_and_test_exists():
    named = named_paths()
    assert len(named) > 50  # the pattern still finds what the docs name
    missing = []
    for ref, where in sorted(named.items()):
        path, _, test = ref.partition("::")
        if not (ROOT / path).is_file():
            missing.append(f"{ref} (named in {', '.join(sorted(where))})")
        elif test:
            tree = ast.parse((ROOT / path).read_text())
            if not any(getattr(node, "name", None) == test for node in tree.body):
                missing.append(f"{ref}: no such test (named in {', '.join(sorted(where))})")
    assert not missing, "\n".join(missing)


def test_no_test_file_imports_another():
    """Shared helpers live in tests/support; a test file imports no other test file."""
    offenders = []
    for path in ROOT.glob("tests/**/test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                names = [a.name for a in node.names]
                if parts[0] == "tests" and (any(p.startswith(("test_", "conftest")) for p in parts)
                                            or any(n.startswith("test_") for n in names)):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} from {node.module}")
    assert not offenders, "\n".join(offenders)
