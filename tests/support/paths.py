"""Where the repository is, for tests that read its files (docs, examples, configs) or run its scripts."""

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]  #: the repository's root (this file is tests/support/paths.py)


def script(name: str) -> ModuleType:
    """The module of scripts/NAME.py, loaded from its file (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
