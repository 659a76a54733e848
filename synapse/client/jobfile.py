"""Job files: the YAML a user writes, read and validated before anything is sent."""

from __future__ import annotations

from pathlib import Path

import yaml

from synapse.core.jobspec import JobFileError, parse_job
from synapse.core.model import JobSpec


def load_job_file(path: str | Path, levels: tuple[str, ...] = ("zone", "block", "rack")) -> JobSpec:
    """Read and validate a YAML job file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise JobFileError("(file)", f"cannot read {path}: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise JobFileError("(file)", f"not valid YAML: {exc}") from None
    return parse_job(doc, levels)
