"""Studies: experiments compose, a smoke sweep runs and collects, W&B offline and failing,
failure isolation, resume, and a SIGKILLed job."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specexp.paths import CONFIG_DIR
from tests.commands import REPO, run_module, run_specexp
from tests.wandb_reader import offline_run

ALL_EXPERIMENTS = sorted(p.stem for p in (Path(CONFIG_DIR) / "experiment").glob("*.yaml"))
EXPERIMENTS = [e for e in ALL_EXPERIMENTS if not e.startswith("distill_")]  # studies; distill_* are specexp.distill's


@pytest.mark.parametrize("size", ["default", "smoke"])
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_as_a_multirun(experiment, size):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={experiment}", f"size={size}"], return_hydra_config=True)
    assert cfg.hydra.mode.name == "MULTIRUN" and cfg.hydra.sweeper.params
    assert cfg.experiment_name == experiment
    if size == "smoke":
        assert cfg.data.limit == 2 and cfg.max_new_tokens == 8


@pytest.mark.parametrize("experiment", [e for e in ALL_EXPERIMENTS if e.startswith("distill_")])
def test_every_distill_experiment_composes(experiment):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("distill", overrides=[f"experiment={experiment}"], return_hydra_config=True)
    assert cfg.experiment_name == experiment
    # one live pass gives features too
    feature_head = experiment in ("distill_eagle", "distill_eagle3", "distill_medusa")
    assert cfg.draft_vocab_size == 8192 and cfg.teacher_top_k == (None if feature_head else 64)
    if feature_head:
        assert cfg.student._target_.startswith("specexp.distill.features.")
    # All read the same corpus (and so share its caches): the defaults of corpus=self_chat.
    assert cfg.data.corpus.prompts == "self" and cfg.data.block_size == 128


def test_task_opener_corpus_extends_self_chat():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        plain = compose("distill", overrides=["corpus=self_chat"]).data.corpus
        tasks = compose("distill", overrides=["corpus=self_chat_tasks"]).data.corpus
    assert "Write" in tasks.openers and "openers" not in plain  # so the plain corpus keeps its cache key
    assert {k: v for k, v in tasks.items() if k != "openers"} == dict(plain.items())


@pytest.mark.parametrize("launcher", ["basic", "joblib", "submitit_slurm", "submitit_local"])
@pytest.mark.parametrize("logger", ["none", "wandb"])
def test_launchers_and_loggers_compose(launcher, logger):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["experiment=k_sweep", f"hydra/launcher={launcher}", f"logger={logger}"],
                      return_hydra_config=True)
    assert cfg.hydra.launcher._target_.startswith("hydra")
    assert cfg.logger._target_.startswith("specexp.study.tracking.")


@pytest.mark.default_target
@pytest.mark.xdist_group("smoke_k_sweep")  # with the notebook that reads the same sweep (no worker waits for it)
def test_smoke_k_sweep_runs_collects_and_plots(smoke_k_sweep, tmp_path):
    sweep, out = smoke_k_sweep
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("[done]") == 15  # one line per finished job
    out = run_module("specexp.collect", str(sweep))
    assert out.returncode == 0, out.stderr
    table = pd.read_parquet(sweep / "collected.parquet")
    assert len(table) == 15 and set(table["status"]) == {"ok"}
    assert {"cfg.draft.k", "choice.draft", "alpha", "tau", "speedup", "cost_ratio_c", "predicted_speedup",
            "realized_over_predicted", "predicted_speedup_iid", "acceptance_pos1", "greedy_match"} <= set(table.columns)
    assert sorted(table["cfg.draft.k"].astype(str).unique()) == ["1", "2", "auto"]
    assert set(table["choice.draft"]) == {"prompt_lookup", "target_prefix", "distilled", "eagle", "medusa"}
    assert (table["greedy_match"] == 1.0).all()
    assert table["predicted_speedup"].notna().all()  # every job priced by this machine's profile
    assert (sweep / "collected.csv").exists() and "15 jobs" in out.stdout
    out = run_module("specexp.figures", str(sweep), "--out", str(tmp_path / "figures"))
    assert out.returncode == 0, out.stderr
    made = {p.name for p in (tmp_path / "figures").iterdir()}
    assert {"speedup_vs_k.pdf", "acceptance_curve.pdf", "cost_quality_plane.png", "realized_vs_predicted.pdf",
            "headline.tex"} <= made
    assert "skipped temperature_effect: needs 2 or more temperatures" in out.stdout
    # The plotting functions on the real tables: a series per draft of the sweep, its model curve and best K.
    from specexp.reporting import figure_tables as tables
    from specexp.reporting import job_profiles, plots

    jobs = tables.study_jobs([sweep])
    drafts = {"prompt_lookup", "target_prefix", "distilled", "eagle", "medusa"}
    model, label = job_profiles.model_curves(jobs)
    assert set(model["draft"]) == drafts and sorted(model["k"].unique()) == [1, 2] and label
    ax = plots.speedup_vs_k(jobs, tables.per_prompt_table(jobs), model, label).axes[0]
    assert drafts <= {t.get_text() for t in ax.get_legend().get_texts()}
    assert len([line for line in ax.lines if line.get_marker() == "*"]) == 5  # the model's best K per draft
    positions = tables.acceptance_by_position(jobs)
    assert set(positions["draft"]) == drafts and positions["position"].min() == 1 and positions["position"].max() <= 8
    plane = plots.cost_quality_plane(jobs, *job_profiles.plane_pricing(jobs)).axes[0]
    assert {t.get_text() for t in plane.get_legend().get_texts()} == drafts
    assert plane.get_title().startswith("contours: cost model on")
    # The sweep re-priced under a profile written by hand: a machine whose passes over n tokens cost
    # no more than its cheapest and whose drafts are free predicts more speedup for every job than
    # the machine's own profile (both hold every draft the sweep ran: each job recorded the profile
    # as it stood when it ran, without the drafts profiled after it).
    profiles = [job_profiles.job_profile(path) for path in jobs["path"]]
    own, entries = profiles[0], {name: entry for profile in profiles for name, entry in profile.drafts.items()}
    measured = dict(own.record(), drafts=entries)
    flat = dict(measured, target_s=[[min(row)] * len(row) for row in own.target_s],
                drafts={name: dict(entry, draft_s=[0.0] * len(entry["draft_s"]), pass_s=None)
                        for name, entry in entries.items()})
    repriced = {}
    for name, record in {"measured": measured, "flat": flat}.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(record))
        out = run_module("specexp.reprice", str(sweep), "--profile", str(tmp_path / f"{name}.json"), "--out",
                         str(tmp_path / name))
        assert out.returncode == 0, out.stderr
        repriced[name] = pd.read_csv(tmp_path / name / "reprice.csv")
        assert len(repriced[name]) == 15 and repriced[name]["predicted"].notna().all()
    assert repriced["flat"]["predicted_own"].notna().all()
    assert (repriced["flat"]["predicted"] >= repriced["measured"]["predicted"] * 0.999).all()
    assert (tmp_path / "flat" / "reprice.pdf").exists()


@pytest.mark.default_target
def test_wandb_offline_run_is_written_and_read_back(tmp_path):
    run_dir = tmp_path / "run"
    out = run_specexp("logger=wandb", "size=smoke", "data.limit=2", "max_new_tokens=6", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    (wandb_dir,) = (run_dir / "wandb").glob("offline-run-*")
    run = offline_run(wandb_dir)
    assert run["summary"]["speedup"] == pytest.approx(summary["speedup"])
    assert run["summary"]["alpha"] == pytest.approx(summary["alpha"])
    assert run["group"] == "default" and run["job_type"] == "prompt_lookup"
    assert {"target=default", "draft=prompt_lookup", "k=auto"} <= set(run["tags"])
    assert run["config"]["choice"]["target"] == "default"  # pairing runs: filter and group by target
    assert run["config"]["draft"]["k"] == "auto" and run["config"]["max_new_tokens"] == 6
    curve = run["tables"]["acceptance_curve"]
    assert curve["columns"] == ["position", "acceptance", "acceptance_ci95_lo", "acceptance_ci95_hi"]
    cis = zip(summary["acceptance_curve"], summary["acceptance_curve_ci95"], strict=True)
    expected = [[i + 1, a, *(ci or (None, None))] for i, (a, ci) in enumerate(cis) if a is not None]
    assert run["summary"]["speedup_ci95_lo"] == pytest.approx(summary["speedup_ci95"][0])
    assert [x for row in curve["data"] for x in row] == pytest.approx([x for row in expected for x in row])
    assert len(run["tables"]["samples"]["data"]) == 2
    samples = run["tables"]["samples"]  # greedy and identical: no first divergence, no gap
    assert samples["columns"][-2:] == ["first_divergence", "gap_rounding_steps"]
    assert all(row[-2:] == [None, None] for row in samples["data"])
    assert set(run["tables"]) >= {"per_category", "rounds_sample", "samples"}
    lengths = run["tables"]["accepted_lengths"]
    assert lengths["data"] == [[n, count] for n, count in enumerate(summary["accepted_length_histogram"])]


@pytest.mark.default_target
def test_failing_wandb_keeps_local_results_and_the_job(tmp_path):
    run_dir = tmp_path / "run"
    out = run_specexp("logger=wandb", "logger.dir=/dev/null/wandb", "size=smoke", "data.limit=1", "max_new_tokens=4",
                      f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "W&B disabled for this run" in out.stdout + out.stderr  # Hydra's job logging prints to stdout
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "ok"


def test_a_wandb_run_that_cannot_start_is_a_warning_and_logs_nothing(caplog):
    """W&B refusing its settings fails where an unwritable folder does (the study above): the run is
    dropped with a warning, and logging to it is a no-op."""
    from specexp.study.tracking import WandbTracker

    with caplog.at_level("WARNING"):
        tracker = WandbTracker({"seed": 0}, mode="no-such-mode")
    assert tracker.run is None and "W&B disabled for this run" in caplog.text and "no-such-mode" in caplog.text
    tracker.log_run({"k": 2}, pd.DataFrame(), [])
    tracker.finish()


@pytest.mark.default_target
def test_failing_job_is_isolated_and_rerun_skips_finished_jobs(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "draft.k=-1,2", "size=smoke", "data.limit=1", f"hydra.sweep.dir={sweep}"]
    out = run_specexp(*args)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[failed] data.limit=1,draft.k=-1" in out.stderr and "[done] data.limit=1,draft.k=2" in out.stdout
    # sorted keys
    failed, ok = sweep / "data.limit=1,draft.k=-1,size=smoke", sweep / "data.limit=1,draft.k=2,size=smoke"
    assert "draft.k=-1 is not allowed" in json.loads((failed / "error.json").read_text())["error"]
    assert not (failed / "summary.json").exists()
    finished = (ok / "summary.json").stat().st_mtime_ns
    rerun = run_specexp(*args)
    assert rerun.returncode == 0
    assert "[skip] data.limit=1,draft.k=2" in rerun.stdout and "[failed] data.limit=1,draft.k=-1" in rerun.stderr
    assert (ok / "summary.json").stat().st_mtime_ns == finished
    forced = run_specexp(*args, "force=true")
    assert "[done] data.limit=1,draft.k=2" in forced.stdout and (ok / "summary.json").stat().st_mtime_ns != finished
    table = run_module("specexp.collect", str(sweep))
    collected = pd.read_parquet(sweep / "collected.parquet")
    assert table.returncode == 0 and sorted(collected["status"]) == ["failed", "ok"]


@pytest.mark.default_target
def test_sigkilled_job_leaves_no_partial_results_and_rerun_fills_the_gap(tmp_path):
    sweep = tmp_path / "sweep"
    # size=smoke: a quick profile and one timing pass (the kill and the rerun are what is tested)
    args = [sys.executable, "-m", "specexp", "-m", "draft.k=1,2", "size=smoke", "data.limit=2", "max_new_tokens=16",
            f"hydra.sweep.dir={sweep}"]
    first, second = (sweep / f"data.limit=2,draft.k={k},max_new_tokens=16,size=smoke" for k in (1, 2))
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 240
    # The event: the second job's staging folder holds its answers file, so it is decoding.
    while not (second / ".partial" / "answers.jsonl").exists():
        assert time.time() < deadline and proc.poll() is None, "the second job never started"
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (first / "summary.json").exists()
    assert not any((second / name).exists() for name in ("summary.json", "rounds.parquet", "answers.jsonl"))
    out = run_specexp(*args[3:])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[skip] data.limit=2,draft.k=1" in out.stdout and "[done] data.limit=2,draft.k=2" in out.stdout
    assert json.loads((second / "summary.json").read_text())["status"] == "ok"
    assert not (second / ".partial").exists()
    collected = run_module("specexp.collect", str(sweep))
    assert collected.returncode == 0 and "2 jobs" in collected.stdout
    assert OmegaConf.load(second / "config.yaml").draft.k == 2


@pytest.mark.default_target
def test_smoke_exit_layer_sweep_is_exact_and_trained_heads_accept_more(tmp_path):
    """experiment=exit_layer_sweep at one K and the first and last of its exit layers, with the
    untrained and the shipped trained head: greedy identical to AR, the trained heads accepting more."""
    sweep = tmp_path / "exit_layer_sweep"
    # K fixed: no job needs the cost model (the early-exit draft's profile: test_distill's exit-head study)
    out = run_specexp("experiment=exit_layer_sweep", "size=smoke", "draft.k=2", "draft.exit_layer=6,18",
                      "max_new_tokens=16", "profile.enabled=false", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    from specexp.reporting import figure_tables as tables
    from specexp.reporting import paper_figures as figures
    from specexp.reporting import plots
    from specexp.reporting.job_table import collect

    table = collect([sweep])  # (the collect and figures commands: test_smoke_k_sweep_runs_collects_and_plots)
    assert len(table) == 4 and set(table["status"]) == {"ok"} and (table["greedy_match"] == 1.0).all()
    assert sorted(table["cfg.draft.exit_layer"].unique()) == [6, 18]
    alpha = table.groupby("cfg.draft.head")["alpha"].mean()
    assert alpha["trained"] > alpha["untrained"] + 0.05
    written, _ = figures.make_figures([sweep], tmp_path / "figures")
    assert "exit_layer_effect.pdf" in written
    jobs = tables.study_jobs([sweep])
    assert set(jobs["draft"]) == {"early_exit/untrained/shared", "early_exit/trained/shared"}
    ax = plots.effect_of(jobs, "exit_layer", "exit layer L").axes[0]
    assert sorted({x for line in ax.lines for x in line.get_xdata()}) == [6, 18]


@pytest.mark.default_target
@pytest.mark.xdist_group("smoke_tree_sweep")  # with the notebook that reads the same sweep
def test_smoke_tree_sweep_runs_records_depths_and_plots(smoke_tree_sweep, tmp_path):
    """experiment=tree_sweep size=smoke for the shipped distilled draft at two node budgets, as a
    chain and as a 2-branch tree: every job decodes as the target, keeps its per-depth acceptance
    and accepted-length histogram, and the figures command draws tree_budget."""
    sweep, out = smoke_tree_sweep
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("[done]") == 4
    for job in sweep.glob("*/summary.json"):
        summary = json.loads(job.read_text())
        rounds = pd.read_parquet(job.parent / "rounds.parquet")
        spec = rounds[rounds["mode"] == "spec"]
        assert summary["greedy_match"] == 1.0
        assert sum(summary["accepted_length_histogram"]) == len(spec)
        assert summary["nodes_per_pass"] == pytest.approx(spec["proposed"].mean())
        assert len(summary["acceptance_curve"]) == summary["k_max"]
        branches = OmegaConf.load(job.parent / "config.yaml").draft.branches
        if branches == 1:  # a chain: depth is the tokens proposed
            assert (spec["depth"] == spec["proposed"]).all()
        else:  # two root children, then at most two per level
            assert (spec["depth"] <= spec["proposed"]).all() and (spec["depth"] < spec["proposed"]).any()
    out = run_module("specexp.figures", str(sweep), "--out", str(tmp_path / "figures"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "figures" / "tree_budget.pdf").exists()
    from specexp.reporting import figure_tables as tables

    jobs = tables.study_jobs([sweep])
    assert set(jobs["branches"]) == {1, 2} and jobs[["accepted_per_pass", "nodes_per_pass"]].notna().all().all()
