"""The table of state-machine commands in docs/architecture/commands.md, made from the code.

Every command kind is named twice, and the two must agree: `synapse.core.versions.KIND_VERSIONS` (the
command-set version that introduced each kind: what the codec stamps and decodes) and
`synapse.core.state.registry.HANDLERS` (the function that applies each kind: what apply
dispatches on). Each kind's docstring says what it does. This script renders them between the
page's markers, so the page cannot drift from the code:

    python3 scripts/command_table.py           # rewrite the table in the page
    python3 scripts/command_table.py --check   # exit 1 if the page's table is not what the code gives

tests/cluster/test_docs.py runs the check. It also refuses a kind without a docstring of its own, and a
kind the state machine has no handler for (or a handler for a kind the codec lacks).
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse.core import versions  # noqa: E402
from synapse.core.state.registry import HANDLERS  # noqa: E402

PAGE = Path(__file__).resolve().parent.parent / "docs" / "architecture" / "commands.md"
BEGIN, END = "<!-- commands:begin (scripts/command_table.py writes this table) -->", "<!-- commands:end -->"


class TableError(Exception):
    """The registry and the code disagree, or a kind says nothing of itself."""


def summary(kind: type) -> str:
    """A kind's docstring, first paragraph, on one line (a dataclass without one gets its signature)."""
    doc = kind.__doc__ or ""
    if not doc or doc.startswith(f"{kind.__name__}("):
        raise TableError(f"command {kind.__name__} has no docstring: say what it does")
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split()).replace("|", "\\|")


def handler_name(kind: type) -> str:
    """The handler of a kind as `module.function` within synapse.core.state (where to read its rules)."""
    handler = HANDLERS[kind]
    return f"{handler.__module__.removeprefix('synapse.core.state.')}.{handler.__name__}"


def table() -> str:
    handled = set(HANDLERS)
    registered = set(versions.KIND_VERSIONS)
    if handled != registered:
        raise TableError("the state machine's handlers (state.registry.HANDLERS) and versions.KIND_VERSIONS differ: "
                         f"{sorted(k.__name__ for k in handled ^ registered)}")
    rows = ["| Command | Since | Applied by | What it does |", "|---|---|---|---|"]
    for kind, version in sorted(versions.KIND_VERSIONS.items(), key=lambda kv: (kv[1], kv[0].__name__)):
        rows.append(f"| `{kind.__name__}` | {version} | `{handler_name(kind)}` | {summary(kind)} |")
    return "\n".join(rows)


def rendered(page: str) -> str:
    if BEGIN not in page or END not in page:
        raise TableError(f"{PAGE.name} lacks the markers {BEGIN!r} and {END!r}")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page's table is stale")
    args = parser.parse_args()
    page = PAGE.read_text()
    try:
        fresh = rendered(page)
    except TableError as exc:
        print(f"command_table: {exc}", file=sys.stderr)
        return 1
    if args.check:
        if fresh != page:
            print(f"command_table: {PAGE.name} is stale: run python3 scripts/command_table.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
