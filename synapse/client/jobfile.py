"""Job files: the YAML a user writes, read and validated before anything is sent.

A command argument or an env value that starts with `./` or `../` names a file next to the job
file: it is made absolute against the job file's directory when the file is read, so
`command: [python3, ./train.py]` runs the train.py beside train.yaml wherever `synctl submit` is run
from. (A task runs in a directory of its worker's, so a relative path would otherwise name nothing
useful.) The workers must see that path too: a local cluster does, a real one through a shared
filesystem. Other arguments and values are passed as written.

A job's `secrets:` ({NAME: ref}) are read here, by the client that submits, and nowhere else: a
ref is `env:VARIABLE` (of the submitting shell) or `file:PATH` (or a bare path; a relative one is
taken from the job file's directory, as above). A file's one trailing newline is dropped.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from synapse.core.jobs.jobspec import JobFileError, check_secret_value, parse_job, secret_refs
from synapse.core.model import JobSpec


def _read(path: str | Path) -> object:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise JobFileError("(file)", f"cannot read {path}: {exc.strerror}") from None
    import yaml  # here: PyYAML's import is a tenth of synctl's start, and `run` reads no file

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise JobFileError("(file)", f"not valid YAML: {exc}") from None


def load_job_file(path: str | Path, levels: tuple[str, ...] = ("zone", "block", "rack")) -> JobSpec:
    """Read and validate a YAML job file; its `./` and `../` paths become absolute."""
    return resolve_paths(parse_job(_read(path), levels), os.path.dirname(os.path.abspath(path)))


def load_secrets(path: str | Path, environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    """The values of a job file's `secrets:` by name, read from the files and variables they name."""
    base = os.path.dirname(os.path.abspath(path))
    values = {}
    for name, ref in secret_refs(_read(path)):
        if ref.startswith("env:"):
            variable = ref.removeprefix("env:")
            if variable not in environ:
                raise JobFileError(f"secrets.{name}", f"environment variable {variable} is not set")
            value = environ[variable]
        else:
            file = os.path.join(base, os.path.expanduser(ref.removeprefix("file:")))
            try:
                value = Path(file).read_text().removesuffix("\n")
            except (OSError, UnicodeDecodeError) as exc:
                why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
                raise JobFileError(f"secrets.{name}", f"cannot read {file}: {why}") from None
        check_secret_value(name, value)
        values[name] = value
    return values


def resolve_paths(spec: JobSpec, base: str) -> JobSpec:
    """`spec` with every command argument and env value that starts with `./` or `../` made
    absolute against the directory `base`."""
    def absolute(value: str) -> str:
        if not value.startswith(("./", "../")):
            return value
        return os.path.normpath(os.path.join(base, value)) + ("/" if value.endswith("/") else "")

    return dataclasses.replace(spec, command=tuple(absolute(arg) for arg in spec.command),
                               env=tuple((key, absolute(value)) for key, value in spec.env))
