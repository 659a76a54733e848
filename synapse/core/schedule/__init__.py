"""Scheduling: which pending gangs to place in a round, where, and what to preempt. Pure.

The round (`scheduler`), placement on a read-only view (`placement`, over the free-capacity
indexes of `topology`), queue admission, eligibility, preemption, spares, elastic sizes, run-time
prediction and fair share. These modules read the cluster; they never change it.
"""
