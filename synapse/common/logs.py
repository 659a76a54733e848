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
    logging.getLogger("pysyncobj").setLevel(logging.WARNING)
