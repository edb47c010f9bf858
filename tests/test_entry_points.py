"""Every `python -m specexp.X` command answers --help with its usage (exit 0, no traceback)."""

import pytest

from tests.commands import run_each, run_module

ENTRY_POINTS = ["specexp", "specexp.profile", "specexp.collect", "specexp.figures", "specexp.predict",
                "specexp.dashboard", "specexp.distill", "specexp.ngram", "specexp.pairing"]


@pytest.fixture(scope="module")
def help_answers() -> dict:
    """`python -m X --help` for every entry point, in one interpreter (each as `python -m` runs it)."""
    return run_each({module: (module, ["--help"]) for module in ENTRY_POINTS})


@pytest.mark.xdist_group("help_answers")  # one worker: the batch runs once
@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_every_entry_point_answers_help(module, help_answers):
    out = help_answers[module]
    assert out.returncode == 0, out.stderr[-2000:]
    text = (out.stdout + out.stderr).lower()
    assert "traceback" not in text and ("usage" in text or "powered by hydra" in text), text[-2000:]  # Hydra's own help


def test_commands_in_the_shared_interpreter_keep_their_own_status_and_output():
    """tests/command_server.py, which runs a test process's commands one after another: a failing
    command's exit status and its one error line stay its own, and the next command runs afresh after it."""
    runs = run_each({"bad": ("specexp", ["draft=ngram_typo"]), "good": ("specexp", ["--cfg", "job", "draft.k=7"])})
    bad, good = runs["bad"], runs["good"]
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown draft 'ngram_typo'") and not bad.stdout
    assert good.returncode == 0 and "k: 7" in good.stdout and "error" not in good.stderr


def test_the_profile_command_turns_a_bad_override_into_one_line():
    out = run_module("specexp.profile", "not_an_override", timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert [line for line in out.stderr.splitlines() if line.startswith("error: ")], out.stderr
