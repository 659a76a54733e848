"""Print the README's two commands, one per line, exactly as written (CI runs them verbatim).

    python3 scripts/readme_commands.py [README.md]

They are the command lines of the one ```sh block under "## Two commands": the first installs and
runs the demo, the second installs and runs the tests. Anything else there (more or fewer command
lines, no such block) is an error, so the README and CI cannot drift apart unseen.
"""

from __future__ import annotations

import sys
from pathlib import Path


class ReadmeError(ValueError):
    """The README's "Two commands" section is not one block of exactly two command lines."""


def two_commands(text: str) -> list[str]:
    """The two command lines of the ```sh block under "## Two commands" (comments and blanks skipped)."""
    lines = text.splitlines()
    try:
        start = lines.index("## Two commands")
    except ValueError:
        raise ReadmeError('no "## Two commands" section') from None
    section = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        section.append(line)
    try:
        opening = next(i for i, line in enumerate(section) if line.strip().startswith("```"))
        closing = next(i for i in range(opening + 1, len(section)) if section[i].strip() == "```")
    except StopIteration:
        raise ReadmeError('"## Two commands" holds no fenced block') from None
    if section[opening].strip() not in ("```sh", "```bash", "```shell"):
        raise ReadmeError(f"the block is {section[opening].strip()!r}, not a shell block")
    block = [line.strip() for line in section[opening + 1:closing]]
    commands = [line for line in block if line and not line.startswith("#")]
    if any(c.endswith("\\") for c in commands):
        raise ReadmeError("a command continues on the next line: write each on one line")
    if len(commands) != 2:
        raise ReadmeError(f"the block holds {len(commands)} command line(s), not 2: {commands}")
    return commands


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "README.md")
    try:
        print("\n".join(two_commands(path.read_text())))
    except ReadmeError as exc:
        sys.exit(f"readme_commands: {path}: {exc}")


if __name__ == "__main__":
    main()
