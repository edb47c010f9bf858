"""A new draft is one file and one YAML (CONTRIBUTING.md, "Adding a draft").

A toy draft is written into a temporary folder, outside the package: its strategy as one `.py` on
the Python path and its config as one YAML in a config folder a user adds with `hydra.searchpath`.
Nothing else is touched, and it then runs everywhere a shipped draft runs: the registry reads its
card, its bad option is refused in one line, the exactness grid's sampled case passes for it, and a
study, a hardware profile, the pairing replay and the figures run with it from the command line."""

import json
import os
import textwrap

import pandas as pd
import pytest

from tests.commands import default_env, run_module
from tests.conftest import tiny_model
from tests.drafters import config_builder
from tests.ngram.test_ngram_cached import assert_refused_in_one_line
from tests.test_exactness import assert_follows_the_target, pair  # noqa: F401 (the grid's fixture)

STRATEGY = '''
"""Lag copy: propose the tokens that followed the token `lag` positions before the tip, as if the
text repeated with period `lag` (lag=1 repeats the tip)."""

from specexp.core.interface import DraftTraits
from specexp.drafts.parts.base import check_k, committed_tokens, one_hot_proposal
from specexp.errors import UserInputError


class LagCopyDrafter:
    def __init__(self, target, k=2, lag=1):
        check_k(k)
        if lag < 1:
            raise UserInputError(f"draft.lag={lag} is not allowed; it must be an integer >= 1")
        self.traits = DraftTraits(k_max=k)
        self.vocab_size, self.lag = target.vocab_size, lag

    def reset(self, ctx):
        pass

    def propose(self, ctx, k, sampling, generator):
        rows = []
        for seq in committed_tokens(ctx, [0] * ctx.tokens.shape[0]):
            out = []
            for i in range(k if len(seq) >= self.lag else 0):
                out.append((seq + out)[len(seq) - self.lag + i])
            rows.append(out)
        return one_hot_proposal(rows, self.vocab_size, ctx.tokens.device)

    def update(self, ctx, proposal, n_accepted):
        pass
'''

CONFIG = '''
# Lag copy (a toy draft of tests/drafts/test_new_draft.py).
name: lag_copy
_target_: toy_lag_copy.LagCopyDrafter
_partial_: true
k: 3
k_max: 4
lag: 2
card:
  label: lag copy
  colour: "#8000ff"
  tests:
    exactness: {overrides: {lag: 1}}
    bad_options:
      - {set: {lag: 0}, error: "draft.lag=0 is not allowed; it must be an integer >= 1"}
'''


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """(folder on the Python path, config folder) holding the toy draft's two files."""
    root = tmp_path_factory.mktemp("toy_draft")
    (root / "py").mkdir()
    (root / "py" / "toy_lag_copy.py").write_text(textwrap.dedent(STRATEGY))
    (root / "conf" / "draft").mkdir(parents=True)
    (root / "conf" / "draft" / "lag_copy.yaml").write_text(textwrap.dedent(CONFIG))
    return root / "py", root / "conf"


def test_a_toy_draft_is_registered_refuses_its_bad_option_and_passes_the_exactness_grid(toy, pair,  # noqa: F811
                                                                                        tmp_path, monkeypatch):
    from specexp.drafts.registry import draft_cards

    code, conf = toy
    monkeypatch.syspath_prepend(str(code))
    card = draft_cards((str(conf),))["lag_copy"]
    assert (card.label, card.colour, card.exactness) == ("lag copy", "#8000ff", {"overrides": {"lag": 1}})
    assert "lag_copy" not in draft_cards()  # the shipped registry is untouched
    for case in card.bad_options:
        assert_refused_in_one_line((tiny_model(0, vocab_size=64), {"store": "", "lm": ""}), tmp_path, "lag_copy",
                                   dict(case["set"]), case["error"], config_dirs=(str(conf),))
    assert_follows_the_target(pair, "config:lag_copy", 3, "t1",
                              build=config_builder("lag_copy", card.exactness["overrides"], (str(conf),)))


def test_a_toy_draft_runs_a_study_a_profile_the_pairing_replay_and_the_figures(toy, tiny_local_conf, tmp_path):
    from specexp.reporting.figure_tables import study_jobs

    code, conf = toy
    env = default_env() | {"PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))}
    user = [f"hydra.searchpath=[file://{tiny_local_conf},file://{conf}]", "target=tiny_local"]
    small = ["size=smoke", "data.limit=2", "max_new_tokens=8"]
    run, profile, pairing, figures = (tmp_path / name for name in ("run", "profile.json", "pairing", "figures"))

    study = run_module("specexp", *user, *small, "draft=lag_copy", f"hydra.run.dir={run}", env=env)
    assert study.returncode == 0, study.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["draft"] == "lag_copy" and summary["greedy_match"] == 1.0
    rounds = pd.read_parquet(run / "rounds.parquet")
    assert rounds.loc[rounds["mode"] == "spec", "proposed"].sum() > 0

    out = run_module("specexp.profile", *user, "size=smoke", "draft=lag_copy", "--out", str(profile), env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [name for name in json.loads(profile.read_text())["drafts"] if name.startswith("LagCopyDrafter-")]

    out = run_module("specexp.pairing", "--targets", "tiny_local", "--drafts", "lag_copy", "--out", str(pairing),
                     *user[:1], *small, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    predicted = pd.read_parquet(pairing / "pairing.parquet")
    assert set(predicted["draft"]) == {"lag_copy"} and predicted["k"].max() == 3  # K = 0..the fixed draft.k priced

    out = run_module("specexp.figures", str(run), "--out", str(figures), env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert list(figures.glob("*.pdf"))
    jobs = study_jobs([run])
    assert list(jobs["draft"]) == ["lag copy"] and list(jobs["draft_colour"]) == ["#8000ff"]  # its card's label, colour
