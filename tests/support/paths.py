"""Where the repository is, for tests that read its files (docs, examples, configs) or run its scripts."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  #: the repository's root (this file is tests/support/paths.py)
