"""The suite's own machinery: tests that share one expensive fixture run on one worker, and commands share one
interpreter."""

import pytest


@pytest.mark.xdist_group("suite_check")
def test_an_xdist_group_reaches_the_scheduler(request):
    """Under pytest-xdist's --dist loadgroup (the default addopts) a test marked xdist_group carries
    its group in its node id, which is what the scheduler groups by; without it, each case of a
    batched fixture (tests.commands.run_each) would run its batch again on each worker."""
    if not getattr(request.config.option, "loadgroup", False):  # set on an xdist worker under --dist loadgroup
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    assert request.node.nodeid.endswith("@suite_check"), request.node.nodeid


def test_what_libraries_set_in_this_process_keeps_commands_in_the_shared_interpreter(monkeypatch):
    """Lightning's seed_everything, an in-process compile or a W&B run write their state into this
    process's environment: a command started after them still runs in the command server (a new
    interpreter costs ~6 s of imports); a variable a test sets on purpose does send it to a new one."""
    import lightning

    from tests.commands import changed_since_start, default_env

    lightning.seed_everything(0, workers=True)
    monkeypatch.setenv("WANDB_SERVICE", "some-port")
    assert changed_since_start(default_env()) == []
    monkeypatch.setenv("SPECEXP_CACHE", "/elsewhere")
    assert changed_since_start(default_env()) == ["SPECEXP_CACHE"]
