import pytest

# The shared helpers' asserts (tests/support) report the values they compared, as a test's own do.
pytest.register_assert_rewrite("tests.support")
