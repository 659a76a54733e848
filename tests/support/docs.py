"""The documentation's runnable blocks: where the pages are, the marker, and the extractor."""

from __future__ import annotations

from tests.support.paths import ROOT

DOCS = ROOT / "docs"


MARKER = "<!-- runnable -->"


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
