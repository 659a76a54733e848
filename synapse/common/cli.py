"""What every Synapse command line shares: `-h`/`--help`, `--version`, and how it fails."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

import click

from synapse import __version__

#: click settings for every entry point, so each answers `-h` as well as `--help`.
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


_F = TypeVar("_F", bound=Callable[..., object])


def version_option(prog: str) -> Callable[[_F], _F]:
    """`--version` for an entry point: prints `PROG VERSION`."""
    return click.version_option(__version__, "--version", prog_name=prog, message="%(prog)s %(version)s")


def fail(prog: str, message: str, code: int = 2) -> NoReturn:
    """One line on stderr, prefixed with the program's name, then exit with `code`."""
    click.echo(f"{prog}: {message}", err=True)
    sys.exit(code)
