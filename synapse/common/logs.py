"""Logging, configured in one place. Messages carry their ids as key=value pairs."""

from __future__ import annotations

import logging
import sys


def configure(component: str, ident: str = "", level: str = "INFO") -> None:
    """`ts level component[ident] logger: message key=value ...` on stderr."""
    tag = f"{component}[{ident}]" if ident else component
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s.%(msecs)03d %(levelname)s {tag} %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # The format names no thread, process or source line: do not gather them for every record (a
    # quarter of a line's cost; a leader logs one per submission).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None
    logging.getLogger("pysyncobj").setLevel(logging.WARNING)
