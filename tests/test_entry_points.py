"""Every `python -m specexp.X` command answers --help with its usage (exit 0, no traceback)."""

import pytest

from tests.commands import run_module

ENTRY_POINTS = ["specexp", "specexp.profile", "specexp.collect", "specexp.figures", "specexp.predict",
                "specexp.dashboard", "specexp.distill", "specexp.ngram", "specexp.pairing"]


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_every_entry_point_answers_help(module):
    out = run_module(module, "--help", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    text = (out.stdout + out.stderr).lower()
    assert "traceback" not in text and ("usage" in text or "powered by hydra" in text), text[-2000:]  # Hydra's own help


def test_the_profile_command_turns_a_bad_override_into_one_line():
    out = run_module("specexp.profile", "not_an_override", timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert [line for line in out.stderr.splitlines() if line.startswith("error: ")], out.stderr
