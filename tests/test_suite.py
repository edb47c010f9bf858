"""The suite's own machinery: tests that share one expensive fixture run on one worker."""

import pytest


@pytest.mark.xdist_group("suite_check")
def test_an_xdist_group_reaches_the_scheduler(request):
    """Under pytest-xdist's --dist loadgroup (the default addopts) a test marked xdist_group carries
    its group in its node id, which is what the scheduler groups by; without it, each case of a
    batched fixture (tests.commands.run_each) would run its batch again on each worker."""
    if not getattr(request.config.option, "loadgroup", False):  # set on an xdist worker under --dist loadgroup
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    assert request.node.nodeid.endswith("@suite_check"), request.node.nodeid
