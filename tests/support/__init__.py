"""Helpers shared by the test suites (tests/unit, tests/cluster): builders of states and jobs, clients of
a running cluster, in-process Raft nodes, images. Test files import from here, never from each other."""
