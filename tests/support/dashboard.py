"""The dashboard's pages parsed (GPU cells, links, rows) and a clock the test moves."""

from __future__ import annotations

from html.parser import HTMLParser


class Page(HTMLParser):
    """Collects what the tests look at: GPU cells, links, table rows (their class, head's title and
    cells' text), and that the document parses."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.gpu_cells: list[dict] = []
        self.links: list[str] = []
        self.scripts = 0
        self.rows: list[dict] = []  #: {"class", "title" (of its th), "cells": [text of each th/td]}
        self.in_cell = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "td" and "gpu" in (a.get("class") or "").split():
            self.gpu_cells.append(a)
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag == "script":
            self.scripts += 1
        if tag == "tr":
            self.rows.append({"class": a.get("class") or "", "title": "", "cells": []})
        if tag in ("td", "th") and self.rows:
            self.rows[-1]["cells"].append("")
            self.in_cell = True
            if tag == "th" and a.get("title"):
                self.rows[-1]["title"] = a["title"]

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.in_cell = False

    def handle_data(self, data):
        if self.in_cell:
            self.rows[-1]["cells"][-1] += data

    def row_of(self, text: str) -> dict | None:
        """The first row whose first cell contains `text`."""
        return next((r for r in self.rows if r["cells"] and text in r["cells"][0]), None)


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
