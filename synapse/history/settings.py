"""The cluster file's `history:` section, as the master's config loader gives it (no database here)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HistorySettings:
    """Where finished jobs are archived, and how long the state and the store keep them."""

    url: str  #: a checked SQLAlchemy URL, its driver explicit (synapse.history.store.check_url)
    retention: float = 0.0  #: seconds rows stay in the store; 0 keeps them forever
    max_unarchived: int = 50_000  #: finished jobs the state keeps while the store lags, at most
