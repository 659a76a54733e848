"""When an ended task's cgroup goes (synapse.worker.tasks.due_releases): not inside the start of the
gang it makes room for, since removing one takes the kernel's cgroup lock its starts need."""

from synapse.worker.tasks import RELEASE_AFTER_S, RELEASE_LATEST_S, RELEASE_QUIET_S, due_releases


def test_an_ended_tasks_cgroup_goes_once_its_node_is_quiet_and_at_the_latest_after_a_while():
    ended = 100.0
    releases = [(ended, "old"), (ended + 1.0, "newer")]
    quiet_since = ended - 10.0  # no start here since long before
    assert due_releases(releases, ended + RELEASE_AFTER_S / 2, quiet_since) == []  # not at once
    assert due_releases(releases, ended + RELEASE_AFTER_S, quiet_since) == ["old"]
    started = ended + RELEASE_AFTER_S  # a task started here just now (the next gang's)
    assert due_releases(releases, started + RELEASE_QUIET_S / 2, started) == []
    assert due_releases(releases, started + RELEASE_QUIET_S, started) == ["old"]
    assert due_releases(releases, ended + RELEASE_LATEST_S, ended + RELEASE_LATEST_S) == ["old"]  # starts forever
    assert due_releases(releases, ended + 1.0 + RELEASE_LATEST_S, ended + 1.0 + RELEASE_LATEST_S) == ["old", "newer"]
