"""Pairing studies (issue 33): a pair whose draft does not apply to its target is skipped with one line
in a sweep (and is a one-line error alone), and the sweep goes on; collect says which. The prediction
command (`python -m specexp.pairing`) prices every K, ranks, skips, and refuses bad input in one line
(its replay is tests/study/test_replay.py's)."""

import pandas as pd
import pytest
from omegaconf import OmegaConf

from specexp.paths import CONFIG_DIR
from specexp.reporting.job_table import collect
from specexp.study.pairing_prediction import fixed_k_config
from tests.commands import run_each, run_module, run_specexp


@pytest.mark.default_target
@pytest.mark.xdist_group("smoke_pairing_sweep")  # with the notebook that draws the same sweep
def test_a_pairing_sweep_skips_a_draft_that_is_its_target_and_runs_the_rest(smoke_pairing_sweep):
    """experiment=pairing cut to two targets (the default, a user's tiny one of its tokenizer), prompt
    lookup and SmolLM2: SmolLM2 is the default target itself and skipped; it drafts for the tiny one."""
    sweep, out = smoke_pairing_sweep
    assert out.returncode == 0, out.stderr[-3000:]
    skipped = [line for line in out.stdout.splitlines() if line.startswith("[skipped]")]
    assert len(skipped) == 1 and "draft=smollm2_135m is the target 'SmolLM2-135M-Instruct' itself" in skipped[0]
    assert out.stdout.count("[done]") == 3
    table = collect([sweep]).set_index(["choice.target", "choice.draft"])
    skip = table.loc[("default", "smollm2_135m")]
    assert skip["status"] == "skipped" and "itself" in skip["error"]
    assert table.loc[("default", "prompt_lookup"), "status"] == "ok"
    assert table.loc[("default", "prompt_lookup"), "target"] == "SmolLM2-135M-Instruct"
    assert (table.loc["tiny_local", "status"] == "ok").all()


@pytest.mark.default_target
def test_a_single_run_of_a_pair_that_does_not_apply_is_a_one_line_error(tmp_path):
    run_dir = tmp_path / "run"
    out = run_specexp("draft=smollm2_135m", "size=smoke", f"hydra.run.dir={run_dir}")
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert out.returncode == 2 and len(errors) == 1 and "is the target" in errors[0], out.stderr[-2000:]
    assert not run_dir.exists()


@pytest.mark.default_target
def test_the_pairing_command_predicts_every_k_ranks_and_skips_what_does_not_apply(tmp_path):
    """Prompt lookup and the shipped EAGLE-3 head (the published architecture, replayed on the target's features)."""
    out = run_module("specexp.pairing", "--drafts", "prompt_lookup,eagle,smollm2_135m", "--out", str(tmp_path),
                     "size=smoke", "data.limit=2", "max_new_tokens=16")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[skipped] target=default draft=smollm2_135m: draft=smollm2_135m is the target" in out.stdout
    everything = pd.read_parquet(tmp_path / "pairing.parquet")
    assert set(everything["draft"]) == {"prompt_lookup", "eagle"}
    head = everything[everything["draft"] == "eagle"]
    assert head["k"].tolist() == list(range(0, 9)) and head["predicted_speedup"].notna().all()
    assert 0 < head["predicted_alpha"].iloc[1] <= 1  # a trained head's first tokens are accepted
    table = everything[everything["draft"] == "prompt_lookup"]
    assert table["k"].tolist() == list(range(0, 9))  # K = 0: AR
    assert table.loc[table["k"] == 0, "predicted_speedup"].item() == pytest.approx(1.0)
    assert table["predicted_speedup"].notna().all() and (table["predicted_tau"] >= 1).all()
    assert table["is_best_k"].sum() == 1 and 0 <= table["predicted_alpha"].iloc[1] <= 1
    # a fixed-K prompt lookup caps short matches (draft.k=auto does not): each K is replayed as built
    assert table.loc[table["k"] >= 1, "replayed_at_k"].all() and not table.loc[table["k"] == 0, "replayed_at_k"].item()
    assert (tmp_path / "pairing.csv").exists() and "ranked per target" in out.stdout


def test_a_k_whose_study_builds_another_draft_is_replayed_as_that_draft():
    """draft.k=3 gives a prompt lookup caps on short matches that draft.k=auto leaves off, so its K = 3
    is not the auto build's rounds cut at 3; a small LM at draft.k=3 is the auto build but for K."""
    lookup = OmegaConf.load(f"{CONFIG_DIR}/draft/prompt_lookup.yaml")
    fixed = fixed_k_config(lookup, 3)
    assert fixed is not None and fixed.k == 3 and fixed.max_tokens_after_match is None
    assert fixed_k_config(OmegaConf.merge(lookup, {"max_tokens_after_match": []}), 3) is None  # HF's rule: no caps
    assert fixed_k_config(OmegaConf.load(f"{CONFIG_DIR}/draft/small_lm.yaml"), 3) is None


BAD_PAIRING_INPUT = {
    "missing_profile": (("--profile", "/no/such/profile.json"), "--profile /no/such/profile.json does not exist"),
    "unknown_draft": (("--drafts", "prompt_lookup,nope"), "nope"),
    "option_without_value": (("--targets",), "argument --targets: expected one argument"),
}


@pytest.fixture(scope="module")
def bad_pairing_runs(tmp_path_factory) -> dict:
    """Each BAD_PAIRING_INPUT command in one interpreter: case -> (its --out folder, CompletedProcess)."""
    folder = tmp_path_factory.mktemp("bad_pairing")
    calls = {case: ("specexp.pairing", ["--out", str(folder / case), *args])
             for case, (args, _) in BAD_PAIRING_INPUT.items()}
    return {case: (folder / case, out) for case, out in run_each(calls).items()}


@pytest.mark.xdist_group("bad_pairing_runs")  # one worker: the batch runs once
@pytest.mark.parametrize("case", BAD_PAIRING_INPUT)
def test_bad_pairing_input_is_one_line(case, bad_pairing_runs):
    out_dir, out = bad_pairing_runs[case]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert out.returncode == 2 and len(errors) == 1 and BAD_PAIRING_INPUT[case][1] in errors[0], out.stderr[-2000:]
    assert not out_dir.exists()
