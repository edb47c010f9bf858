"""`python -m specexp`: config composition, one-line errors, and the default study end to end."""

import json
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from specexp.configs import unknown_choice
from specexp.paths import CONFIG_DIR
from specexp.reporting.report import with_interval
from specexp.study.summary import RunSummary
from tests.commands import run_each, run_module, run_specexp
from tests.conftest import tiny_model

GROUP_OPTIONS = {group: sorted(p.stem for p in (Path(CONFIG_DIR) / group).glob("*.yaml"))
                 for group in ("target", "draft", "data", "sampling")}
REQUIRED = {"target=hf": ["target.name_or_path=org/name"], "draft=small_lm": ["draft.model=org/name"],
            "data=hf": ["data.name_or_path=prompts.jsonl"]}


@pytest.mark.parametrize("choice", [f"{g}={o}" for g, opts in GROUP_OPTIONS.items() for o in opts])
def test_every_config_composes(choice):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[choice, *REQUIRED.get(choice, [])])
    group = choice.split("=")[0]
    assert cfg[group]["_target_"].startswith("specexp.")
    if group == "sampling":
        assert instantiate(cfg.sampling).temperature >= 0
    if choice in ("data=mt_bench", "data=spec_bench"):
        prompts = instantiate(cfg.data)
        assert len(prompts) == cfg.data.limit and all(p.category for p in prompts)


def test_unknown_choice_names_value_and_allowed():
    assert unknown_choice(["draft=prompt_lookup", "draft.k=3"]) is None
    assert unknown_choice(["draft=nope"]) == f"unknown draft 'nope'; allowed: {', '.join(GROUP_OPTIONS['draft'])}"
    assert unknown_choice(["sampling=greedy,hot"]).startswith("unknown sampling 'hot'")
    assert unknown_choice(["draft=choice(a,b)", "hydra/launcher=basic"]) is None


def test_cfg_job_shows_overrides():
    out = run_specexp("--cfg", "job", "draft=small_lm", "draft.model=some/model", "draft.k=8",
                      "sampling.temperature=0.7")
    assert out.returncode == 0, out.stderr
    assert "k: 8" in out.stdout and "temperature: 0.7" in out.stdout and "model: some/model" in out.stdout


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("prompts")
    (folder / "empty.jsonl").write_text("")
    (folder / "long.jsonl").write_text(json.dumps({"text": "word " * 9000}) + "\n")
    tiny_model(0, vocab_size=64).model.save_pretrained(folder / "tiny_draft")
    return {"empty": folder / "empty.jsonl", "long": folder / "long.jsonl", "tiny": folder / "tiny_draft"}


BAD_INPUTS = {
    "unknown_draft": (["draft=ngram_typo"], "unknown draft 'ngram_typo'; allowed: "),
    "k_below_0": (["draft.k=-1"], "draft.k=-1 is not allowed"),
    "k_for_no_draft": (["draft=none", "draft.k=2"], "draft.k=2 is not allowed for draft=none"),
    "missing_model_path": (["draft=small_lm", "draft.model=/no/such/model"],
                           "model path '/no/such/model' does not exist"),
    "vocab_mismatch": (["draft=small_lm", "draft.model={tiny}"], "vocab mismatch"),
    "empty_prompt_set": (["data=hf", "data.name_or_path={empty}"], "is empty"),
    "prompt_too_long": (["data=hf", "data.name_or_path={long}"], "exceeds the target's context of 8192"),
    "exit_layer_out_of_range": (["draft=early_exit", "draft.exit_layer=30"],
                                "exit_layer=30 is not allowed; it must be in 1..29"),
    "lookup_caps_past_max_n": (["draft=prompt_lookup", "draft.max_tokens_after_match=[1,2,3,4]"],
                               "draft.max_tokens_after_match=[1, 2, 3, 4] is not allowed"),
    "min_confidence_out_of_range": (["draft=distilled", "draft.min_confidence=1.5"],
                                    "draft.min_confidence=1.5 is outside [0, 1)"),
    "quantize_unknown": (["draft=distilled", "draft.quantize=int4"],
                         "draft.quantize=int4 is not allowed; use null or one of int8, auto"),
    "missing_exit_head": (["draft=early_exit", "draft.head=/no/such/head"], "exit head '/no/such/head' does not exist"),
    # what Hydra would answer over lines, or a traceback through it, answered before it writes a run folder
    "unknown_key": (["foo=1"], "unknown key 'foo'; python -m specexp has: experiment_name, force, seed"),
    "unknown_draft_key": (["draft.kk=3"], "unknown key 'draft.kk'; draft=prompt_lookup has: name, k, k_max"),
    "extra_draft_argument": (["+draft.kk=3"], "draft=prompt_lookup takes no key 'kk'; its keys: k_max, tree, k"),
    "device_not_here": (["device=cuda:99"], "device=cuda:99 is not available"),
    "device_unknown": (["device=gpu"], "device=gpu is not a device torch knows; allowed here: auto, cpu"),
    "experiment_of_distill": (["experiment=distill_eagle3"],
                              "experiment 'distill_eagle3' is python -m specexp.distill's, not python -m specexp's"),
    "group_of_distill": (["student=eagle3"],
                         "'student' is not a config group of python -m specexp; its groups: target"),
    "sweep_without_multirun": (["draft.k=1,2"], "Ambiguous value for argument 'draft.k=1,2'"),
    "k_not_integer": (["draft.k=1.5"], "draft.k=1.5 is not allowed; give an integer >= 1"),
    "cfg_job_checks_values": (["--cfg", "job", "draft.k=-1"], "draft.k=-1 is not allowed"),
    "unknown_k_policy": (["draft.k=sometimes"], "draft.k=sometimes is not allowed; give an integer >= 1"),
}


@pytest.fixture(scope="module")
def bad_input_runs(prompt_files, tmp_path_factory) -> dict:
    """Each BAD_INPUTS case as `python -m specexp OVERRIDES` (one interpreter for all, each run as
    `python -m` runs it): case -> (its run folder, the command's CompletedProcess)."""
    folder = tmp_path_factory.mktemp("bad_inputs")
    calls = {case: ("specexp", [*(o.format(**prompt_files) for o in overrides), f"hydra.run.dir={folder / case}"])
             for case, (overrides, _) in BAD_INPUTS.items()}
    return {case: (folder / case, out) for case, out in run_each(calls).items()}


def test_an_unknown_option_or_a_missing_value_is_answered_before_the_study_imports(tmp_path):
    """Before torch and transformers load (seconds): a fresh interpreter reports them with none imported."""
    script = (
        "import runpy, sys\n"
        "for args in (['draft=nosuch'], ['draft=small_lm', 'hydra.run.dir=RUN']):\n"
        "    sys.argv = ['specexp', *args]\n"
        "    try:\n"
        "        runpy.run_module('specexp', run_name='__main__', alter_sys=True)\n"
        "    except SystemExit as stop:\n"
        "        print(stop.code)\n"
        "    from hydra.core.global_hydra import GlobalHydra\n"
        "    GlobalHydra.instance().clear()\n"
        "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'pandas') if m in sys.modules))\n"
    ).replace("RUN", str(tmp_path / "run"))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.stdout.split() == ["2", "2", "[]"], out.stderr[-2000:]
    assert "unknown draft 'nosuch'" in out.stderr and "draft.model is required by draft=small_lm" in out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.default_target
@pytest.mark.xdist_group("bad_input_runs")  # one worker: the batch runs once
@pytest.mark.parametrize("case", BAD_INPUTS.keys())
def test_bad_input_is_one_line_error_and_nothing_written(case, bad_input_runs):
    run_dir, out = bad_input_runs[case]
    assert out.returncode == 2, out.stderr
    error_lines = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1 and BAD_INPUTS[case][1] in error_lines[0], out.stderr
    assert "Traceback" not in out.stderr
    assert not run_dir.exists()


@pytest.mark.default_target
def test_default_study_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    # the default profile's code (every K timed, none interpolated) at two context lengths, one turn
    # per timing and 8-token decodes (cold, one thread: 9 s; at the default's 1024 too, 25-36 s);
    # the default timing passes within a few seconds (how many depends on this machine's noise);
    # in a new interpreter, as the README's first command runs it
    out = run_module("specexp", "data.limit=2", "max_new_tokens=12", "profile.context_lengths=[64,256]",
                     "profile.repeats=1", "profile.new_tokens=8", "timing.budget_s=4", f"hydra.run.dir={run_dir}",
                     fresh=True)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary) == {f.name for f in fields(RunSummary)}  # the record's schema, key by key
    assert summary["predicted_speedup"] is not None and summary["realized_over_predicted"] is not None
    assert summary["greedy_match"] == 1.0 and summary["k_policy"] == "auto"  # K chosen per round, up to k_max = 8
    assert len(summary["acceptance_curve"]) == 8 and summary["n_prompts"] == 2
    assert set(summary["time_split"]) == {"draft", "draft_reencode", "target", "verify", "prefill"}
    assert summary["time_split"]["draft_reencode"] == 0.0 and summary["reencode_ms_per_round"] == 0.0  # one tokenizer
    assert len(summary["per_category"]) == 2
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    expected = {"prompt_id", "category", "round", "k", "k_chosen", "context", "group", "accepted", "emitted", "draft_s",
                "target_s", "verify_s"}
    assert expected <= set(rounds.columns)
    spec = rounds[rounds["mode"] == "spec"]
    assert sum(summary["accepted_length_histogram"]) == len(spec) and (spec["depth"] == spec["proposed"]).all()
    answers = [json.loads(line) for line in (run_dir / "answers.jsonl").read_text().splitlines()]
    assert len(answers) == 2 and all(a["spec_tokens"] == a["ar_tokens"] and a["spec_text"] for a in answers)
    assert all(len(a["ar_tokens"]) <= 12 for a in answers)
    assert (run_dir / "config.yaml").exists() and "speedup" in out.stdout
    # Intervals on every headline number, printed and kept; the default timing passes (timing.*) ran.
    assert summary["speedup_ci95"][0] <= summary["speedup"] <= summary["speedup_ci95"][1]
    assert summary["tau_ci95"][0] <= summary["tau"] <= summary["tau_ci95"][1]
    assert len(summary["acceptance_curve_ci95"]) == 8 and "alpha_ci95" in summary
    assert summary["timing"]["passes"] >= 1 and summary["timing"]["target_halfwidth"] == 0.03
    # the printed row is the stored interval (two prompts: bounds past 10 are honest with one degree of freedom)
    assert re.search(r"speedup \[95% CI\].*" + re.escape(with_interval(summary, "speedup")), out.stdout)
    batches = pd.read_parquet(run_dir / "batches.parquet")
    # 2 arms x 2 batches x 2 timings a pass (A B B A): each arm first equally often in every batch
    assert len(batches) == 2 * 2 * 2 * summary["timing"]["passes"] and set(batches["first"]) == {"ar", "spec"}
    spec_firsts = batches[batches["mode"] == "spec"].groupby("batch")["first"]
    assert spec_firsts.apply(lambda firsts: (firsts == "spec").sum() == (firsts == "ar").sum()).all()


@pytest.mark.default_target
def test_small_lm_draft_from_a_local_folder(tmp_path):
    """The real local-path code path: the target's first 2 layers saved as an HF folder."""
    from specexp.models import first_layers
    from specexp.models.embedded import load_embedded_target

    draft = first_layers(load_embedded_target("float32", "cpu"), 2)
    draft.model.save_pretrained(tmp_path / "draft")
    draft.tokenizer.save_pretrained(tmp_path / "draft")
    run_dir = tmp_path / "run"
    out = run_specexp("draft=small_lm", f"draft.model={tmp_path / 'draft'}", "draft.k=3", "size=smoke", "data.limit=1",
                      "max_new_tokens=10", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["greedy_match"] == 1.0 and summary["draft"] == "small_lm"
    assert summary["cost_ratio_c"] > 0


def test_a_job_that_never_drafted_reports_its_line():
    """draft.k=auto may draft nothing (batch 16 on a CPU): alpha is None and the job still ends well."""
    from specexp.reporting.report import done_line

    line = done_line("draft.k=auto", {"alpha": None, "tau": 1.0, "speedup": 1.015})
    assert line == "[done] draft.k=auto: alpha=- tau=1.000 speedup=1.015"
    line = done_line("draft.k=2", {"alpha": 0.5, "alpha_ci95": [0.4, 0.6], "tau": 1.0, "speedup": 1.015,
                                   "speedup_ci95": [0.98, 1.05]})
    assert line == "[done] draft.k=2: alpha=0.500 [0.400, 0.600] tau=1.000 speedup=1.015 [0.980, 1.050]"


OTHER_COMMANDS_BAD_INPUTS = {
    "distill_experiment_of_a_study": ("specexp.distill", ["experiment=k_sweep"],
                                      "experiment 'k_sweep' is python -m specexp's, not python -m specexp.distill's"),
    "distill_group_of_a_study": ("specexp.distill", ["draft=eagle"], "'draft' is not a config group of python -m "
                                 "specexp.distill"),
    "distill_unknown_key": ("specexp.distill", ["optim.lrr=1"], "unknown key 'optim.lrr'; optim has: lr, weight_decay"),
    "distill_unknown_objective": ("specexp.distill", ["objective=kl"], "objective 'kl' is unknown; allowed: "),
    "sweep_unknown_key": ("specexp", ["-m", "draft.kk=1,2"], "unknown key 'draft.kk'; draft=prompt_lookup has: "),
    "collect_out_in_no_folder": ("specexp.collect", ["{sweep}", "--out", "{missing}/x"],
                                 "the folder {missing} does not exist"),
    "figures_of_nothing": ("specexp.figures", ["{empty}"], "nothing to plot under {empty}"),
    "reprice_of_a_missing_sweep": ("specexp.reprice", ["{missing}", "--profile", "{missing}/p.json"],
                                   "argument paths: '{missing}' does not exist"),
}


def test_every_command_answers_bad_input_in_one_line_and_writes_nothing(tmp_path):
    sweep, empty = tmp_path / "sweep", tmp_path / "empty"
    (sweep / "job" / ".hydra").mkdir(parents=True)
    (sweep / "job" / ".hydra" / "config.yaml").write_text("draft: {name: none}\n")
    empty.mkdir()
    places = {"sweep": sweep, "empty": empty, "missing": tmp_path / "missing"}
    before = {p for p in tmp_path.rglob("*")}
    calls = {}
    for case, (module, args, _) in OTHER_COMMANDS_BAD_INPUTS.items():
        run_dirs = [f"hydra.run.dir={tmp_path / case}", f"hydra.sweep.dir={tmp_path / case}"]
        calls[case] = (module, [a.format(**places) for a in args] + (
            run_dirs if module in ("specexp", "specexp.distill") else []))
    for case, out in run_each(calls).items():
        expected = OTHER_COMMANDS_BAD_INPUTS[case][2].format(**places)
        error_lines = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
        assert out.returncode == 2 and "Traceback" not in out.stderr, (case, out.stderr[-2000:])
        assert len(error_lines) == 1 and expected in error_lines[0], (case, out.stderr[-2000:])
    assert {p for p in tmp_path.rglob("*")} == before  # no run folder, no figures/, no collected.*
