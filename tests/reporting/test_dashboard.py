"""`python -m specexp.dashboard`: the workspace's panels read keys the logger really writes, and
without a key or network it prints what it would save and exits 0."""

import os
import subprocess

import pytest

from specexp.reporting.workspace import Key, build_workspace, referenced_keys
from tests.commands import run_module
from tests.conftest import cli_once_per_run
from tests.wandb_reader import offline_run


def run_dashboard(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_module("specexp.dashboard", *args, timeout=120, env=env)


def written_keys(run: dict) -> set[Key]:
    """Every key an offline run holds, in the dashboard's sections (nested config flattened)."""

    def flat(d: dict, prefix: str = "") -> set[str]:
        out = set()
        for key, value in d.items():
            out |= flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}"}
        return out

    keys = {Key("history", k) for row in run["history"] for k in row}
    keys |= {Key("summary", k) for k in run["summary"]} | {Key("config", k) for k in flat(run["config"])}
    keys |= {Key("table", name) for name in run["tables"]}
    keys |= {Key(f"table:{name}", c) for name, table in run["tables"].items() for c in table["columns"]}
    if run["group"]:
        keys.add(Key("run", "group"))
    if run["job_type"]:
        keys.add(Key("run", "jobType"))
    return keys | {Key("run", "displayName")}  # every run has a name


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory) -> dict:
    """One study job logged by logger=wandb, offline, read back from its .wandb file (run once per
    test run). K is fixed: draft.k=auto may rightly choose plain AR steps throughout on a machine
    where verifying costs more, and a run that drafted nothing writes no acceptance curve."""
    folder, out = cli_once_per_run(tmp_path_factory, "dashboard_logged_run", [
        "logger=wandb", "size=smoke", "data.limit=2", "max_new_tokens=6", "draft.k=8",
        "hydra.run.dir={folder}/run"], 600)
    assert out.returncode == 0, out.stderr[-3000:]
    (wandb_dir,) = (folder / "run" / "wandb").glob("offline-run-*")
    return offline_run(wandb_dir)


@pytest.mark.default_target
@pytest.mark.xdist_group("dashboard_logged_run")  # the tests of one logged run share a worker: none waits for it
def test_every_key_the_dashboard_reads_is_written_by_the_logger(logged_run):
    workspace = build_workspace("specexp", "me", group="default")
    missing = referenced_keys(workspace) - written_keys(logged_run)
    assert not missing, f"the dashboard reads keys no run writes: {sorted(missing, key=str)}"


@pytest.mark.default_target
@pytest.mark.xdist_group("dashboard_logged_run")
def test_the_logged_history_draws_speedup_against_k_and_the_acceptance_curve(logged_run):
    summary = logged_run["summary"]
    (headline,) = [row for row in logged_run["history"] if "k_max" in row]
    assert headline["k_max"] == 8 and headline["speedup"] == pytest.approx(summary["speedup"])
    curve = [(row["position"], row["acceptance"]) for row in logged_run["history"] if "position" in row]
    expected = [tuple(row[:2]) for row in logged_run["tables"]["acceptance_curve"]["data"]]  # position, acceptance
    assert curve and [p for p, _ in curve] == [p for p, _ in expected]
    assert [a for _, a in curve] == pytest.approx([a for _, a in expected])
    ci = [(row.get("acceptance_ci95_lo"), row.get("acceptance_ci95_hi"))
          for row in logged_run["history"] if "position" in row]
    # a position reached by one prompt has no interval (in the history as in the table)
    assert [lo is None for lo, _ in ci] == [row[2] is None for row in logged_run["tables"]["acceptance_curve"]["data"]]
    assert all(lo <= a <= hi for (lo, hi), (_, a) in zip(ci, curve, strict=True) if lo is not None)
    assert headline["speedup_ci95_lo"] <= headline["speedup"] <= headline["speedup_ci95_hi"]
    assert logged_run["config"]["choice"] == {"draft": "prompt_lookup", "data": "mt_bench", "sampling": "greedy",
                                              "target": "default"}


def test_the_workspace_has_the_panels_the_issue_names():
    workspace = build_workspace("proj", "ent", group="k_sweep")
    panels = {(type(p).__name__, getattr(p, "title", None) or p.chart_strings.get("title"))
              for s in workspace.sections for p in s.panels}
    assert panels == {("LinePlot", "speedup over AR against K (with its 95% interval's ends)"),
                      ("LinePlot", "P(accept position i | earlier accepted)"),
                      ("ScatterPlot", "alpha against draft cost c (the cost/quality plane)"),
                      ("CustomChart", "speedup per category"), ("CustomChart", "tau per category"),
                      ("ParallelCoordinatesPlot", "speedup by target x draft")}
    assert [g.name for g in workspace.runset_settings.groupby] == ["Group", "JobType"]
    assert "k_sweep" in workspace.runset_settings.filters
    view = workspace._to_model()  # what save() would send: it must serialise
    assert view.spec.section.panel_bank_config.sections[0].name == "Speedup and acceptance"


def test_help_and_the_offline_run_exit_0_with_a_clear_message(tmp_path):
    assert run_dashboard("--help").returncode == 0
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "WANDB_MODE")}
    env["HOME"] = str(tmp_path)  # no ~/.netrc: no key
    out = run_dashboard("--project", "specexp", "--group", "k_sweep", env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "not saved: no W&B API key" in out.stdout and "speedup over AR against K" in out.stdout
    assert "Traceback" not in out.stderr
    dry = run_dashboard("--project", "specexp", "--entity", "me", "--dry-run")
    assert dry.returncode == 0 and "not saved: --dry-run" in dry.stdout and "me/specexp" in dry.stdout
    missing = run_dashboard()
    assert missing.returncode == 2 and "--project" in missing.stderr
