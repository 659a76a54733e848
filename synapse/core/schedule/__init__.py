"""Scheduling: which pending gangs to place in a round, where, and what to preempt. Pure.

The round (`scheduler`), reservations and backfill (`reservations`), placement (`placement`, over
the free-capacity indexes of `topology`), queue admission, eligibility, preemption, spares, elastic
sizes, run-time prediction and fair share. These modules read the cluster through `view.ClusterRead`
(never the state machine itself: tests/unit/test_layout.py); they never change it.
"""
