"""Job files: the YAML a user writes, read and validated before anything is sent.

A command argument or an env value that starts with `./` or `../` names a file next to the job
file: it is made absolute against the job file's directory when the file is read, so
`command: [python3, ./train.py]` runs the train.py beside train.yaml wherever `synctl submit` is run
from. (A task runs in a directory of its worker's, so a relative path would otherwise name nothing
useful.) The workers must see that path too: a local cluster does, a real one through a shared
filesystem. Other arguments and values are passed as written.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import yaml

from synapse.core.jobspec import JobFileError, parse_job
from synapse.core.model import JobSpec


def load_job_file(path: str | Path, levels: tuple[str, ...] = ("zone", "block", "rack")) -> JobSpec:
    """Read and validate a YAML job file; its `./` and `../` paths become absolute."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise JobFileError("(file)", f"cannot read {path}: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise JobFileError("(file)", f"not valid YAML: {exc}") from None
    return resolve_paths(parse_job(doc, levels), os.path.dirname(os.path.abspath(path)))


def resolve_paths(spec: JobSpec, base: str) -> JobSpec:
    """`spec` with every command argument and env value that starts with `./` or `../` made
    absolute against the directory `base`."""
    def absolute(value: str) -> str:
        if not value.startswith(("./", "../")):
            return value
        return os.path.normpath(os.path.join(base, value)) + ("/" if value.endswith("/") else "")

    return dataclasses.replace(spec, command=tuple(absolute(arg) for arg in spec.command),
                               env=tuple((key, absolute(value)) for key, value in spec.env))
