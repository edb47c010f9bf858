"""Every `python -m specexp.X` command answers --help with its own page (exit 0, no traceback): its usage
line and words only that command's page says, never Hydra's generic page."""

import re

import pytest

from tests.commands import run_each, run_module

# command -> what its own page says (its usage line, and words of its own)
OWN_WORDS = {
    "specexp": ["usage: python -m specexp [overrides ...]", "one study: a draft against its target", "draft="],
    "specexp.profile": ["usage: python -m specexp.profile [--out file]", "hardware profile", "--out"],
    "specexp.collect": ["usage: python -m specexp.collect", "every job of one or more sweeps as one table"],
    "specexp.figures": ["usage: python -m specexp.figures", "every paper figure a sweep supports"],
    "specexp.reprice": ["usage: python -m specexp.reprice", "--profile"],
    "specexp.dashboard": ["usage: python -m specexp.dashboard", "--project"],
    "specexp.distill": ["usage: python -m specexp.distill [overrides ...]", "train a draft on its target", "student="],
    "specexp.ngram": ["usage: python -m specexp.ngram", "datastore"],
    "specexp.pairing": ["usage: python -m specexp.pairing [--targets a,b]", "--drafts", "pairing: true"],
    "specexp.export": ["usage: python -m specexp.export", "speculators format", "--verifier"],
}
ENTRY_POINTS = list(OWN_WORDS)


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
    assert "traceback" not in text and "powered by hydra" not in text, text[-2000:]
    assert all(words.lower() in text for words in OWN_WORDS[module]), text[-2000:]


# a command composing Hydra configs lists only its own groups and experiments, and its top-level keys
NOT_ITS_OWN = {"specexp": ["student:", "distill_eagle3", "trainer_logger:"],
               "specexp.distill": ["draft:", "sampling:", "k_sweep", "aa_control"]}
OWN_KEYS = {"specexp": ["max_new_tokens=64", "experiment: aa_control"],
            "specexp.distill": ["objective=tvd", "experiment: distill_ablation"]}


@pytest.mark.xdist_group("help_answers")
@pytest.mark.parametrize("module", NOT_ITS_OWN)
def test_a_configured_command_lists_only_its_own_groups_experiments_and_keys(module, help_answers):
    text = help_answers[module].stdout
    assert all(words in text for words in OWN_KEYS[module]), text
    assert not [words for words in NOT_ITS_OWN[module] if words in text], text


ARGPARSE_COMMANDS = [m for m in ENTRY_POINTS if m not in NOT_ITS_OWN]


def options_without_help(page: str) -> list[str]:
    """The options an argparse page lists with no help text (nothing after the option, nor below it)."""
    lines = page.splitlines()
    bare = []
    for i, line in enumerate(lines):
        if re.match(r"  -", line) and len(re.split(r"\s{2,}", line.strip())) == 1:
            below = lines[i + 1] if i + 1 < len(lines) else ""
            if not re.match(r" {6,}\S", below) or re.match(r"  -", below):
                bare.append(line.strip())
    return bare


@pytest.mark.xdist_group("help_answers")
@pytest.mark.parametrize("module", ARGPARSE_COMMANDS)
def test_every_option_of_a_command_says_what_it_does(module, help_answers):
    assert options_without_help(help_answers[module].stdout) == []


def test_an_option_without_help_is_found():
    page = "options:\n  -h, --help            show this help\n  --device DEVICE\n  --seed SEED           seeds it\n"
    assert options_without_help(page) == ["--device DEVICE"]


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
