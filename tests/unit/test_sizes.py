"""Units stay small enough to read: no module, class or function in `synapse/` past its limit, and a
core whose top level a newcomer can take in at a glance (docs/architecture/code.md). Generated code
(`synapse/proto`) is not measured. A unit that outgrows its limit is split by concern, not cut in
half: the limits say when, the architecture page says where.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import paths

ROOT = paths.ROOT / "synapse"

#: The most lines a hand-written module, class or function may have (a class or function counted
#: from its `def`/`class` line to its last line, as ast gives them; decorators aside).
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 100
#: The most modules `synapse/core/` may hold at its top level (its sub-packages hold the rest).
MAX_CORE_TOP_MODULES = 15
#: Generated code, not measured.
GENERATED = ("proto",)


def oversized(root: Path) -> list[str]:
    """Every module, class and function under `root` past its limit, as 'path:line kind name (n lines)'."""
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in GENERATED:
            continue
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{rel}:1 module ({lines} lines > {MAX_MODULE_LINES})")
        units = []
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.ClassDef):
                kind, limit = "class", MAX_CLASS_LINES
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                kind, limit = "function", MAX_FUNCTION_LINES
            else:
                continue
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            if size > limit:
                units.append((node.lineno, f"{rel}:{node.lineno} {kind} {node.name} ({size} lines > {limit})"))
        found += [entry for _, entry in sorted(units)]
    return found


def top_modules(package: Path) -> list[str]:
    """The modules a package holds at its top level, besides its __init__."""
    return sorted(p.name for p in package.glob("*.py") if p.name != "__init__.py")


def test_no_module_class_or_function_is_past_its_limit():
    assert oversized(ROOT) == [], "split these by concern (docs/architecture/code.md says where things live)"


def test_the_core_holds_few_modules_at_its_top_level():
    modules = top_modules(ROOT / "core")
    assert len(modules) <= MAX_CORE_TOP_MODULES, f"{len(modules)} modules at synapse/core's top: group some by " \
        f"concern into a sub-package: {modules}"


def test_the_size_check_catches_each_kind_and_skips_generated_code(tmp_path):
    """The checker itself: a long module, class and (nested) function are caught at their limits
    and not below them; generated code is not measured."""
    root = tmp_path / "pkg"
    (root / "proto").mkdir(parents=True)
    (root / "proto" / "api_pb2.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 50))
    (root / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (root / "fits.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    body = "        x = 1\n"
    (root / "big.py").write_text("class Big:\n" + "    y = 1\n" * MAX_CLASS_LINES)
    (root / "small.py").write_text("class Small:\n" + "    y = 1\n" * (MAX_CLASS_LINES - 1))
    (root / "units.py").write_text(
        "class Holder:\n    @staticmethod\n    def long():\n" + body * MAX_FUNCTION_LINES
        + "    async def fits():\n" + body * (MAX_FUNCTION_LINES - 1)
        + "def outer():\n    def inner():\n" + body * MAX_FUNCTION_LINES)
    outer = 4 + 2 * MAX_FUNCTION_LINES  # after Holder's header, long and fits
    assert oversized(root) == [
        f"big.py:1 class Big ({MAX_CLASS_LINES + 1} lines > {MAX_CLASS_LINES})",
        f"long.py:1 module ({MAX_MODULE_LINES + 1} lines > {MAX_MODULE_LINES})",
        f"units.py:3 function long ({MAX_FUNCTION_LINES + 1} lines > {MAX_FUNCTION_LINES})",
        f"units.py:{outer} function outer ({MAX_FUNCTION_LINES + 2} lines > {MAX_FUNCTION_LINES})",
        f"units.py:{outer + 1} function inner ({MAX_FUNCTION_LINES + 1} lines > {MAX_FUNCTION_LINES})",
    ]
    (root / "__init__.py").write_text("")
    assert top_modules(root) == ["big.py", "fits.py", "long.py", "small.py", "units.py"]
