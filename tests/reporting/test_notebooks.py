"""The analysis notebooks: stored without outputs, and each executes top to bottom against
smoke sweeps made here (the study CLI and the distillation CLI on the default target)."""

from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from tests.commands import REPO, run_module

NOTEBOOKS = sorted((REPO / "analysis").glob("*.ipynb"))


def test_there_is_a_notebook_per_study_and_none_stores_outputs():
    assert {p.stem for p in NOTEBOOKS} >= {"k_sweep", "draft_compare", "temperature_sweep", "batch_sweep",
                                            "prompt_sets", "distill_ablation", "tree_sweep"}
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip outputs (nbstripout)"


def run(module: str, *args: str) -> None:
    out = run_module(module, *args, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]


SMOKE_SWEEPS = {  # the notebook's study at smoke size, cut to what the notebook needs to draw
    # (a sweep given on the command line replaces the experiment's for that key)
    "temperature_sweep": ["experiment=temperature_sweep", "size=smoke", "sampling.temperature=0.0,0.7",
                          "draft=prompt_lookup"],
    # a fixed K, unpriced: a profile per batch size is not what the notebook draws
    "batch_sweep": ["experiment=batch_sweep", "size=smoke", "batch_size=1,2", "draft.k=4", "profile.enabled=false"],
    "prompt_sets": ["experiment=prompt_sets", "size=smoke", "draft=prompt_lookup"],
}
# sweeps other tests check too, made once per test run (tests/conftest.py); their tests share a worker
SHARED_SWEEPS = {
    "k_sweep": "smoke_k_sweep", "tree_sweep": "smoke_tree_sweep", "pairing": "smoke_pairing_sweep",
    # five of the experiment's six drafts on MT-bench at K = 1, 2, auto: its own smoke run (cut to
    # MT-bench and a draft of each kind) repeated three of these jobs under another name
    "draft_compare": "smoke_k_sweep"}


@pytest.fixture(scope="session")
def kernel():
    """One Python kernel per test process runs every notebook it is given (~3 s of imports each saved):
    each notebook starts with its names cleared (%reset), its environment and folder set."""
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(REPO / "analysis"))
    yield manager
    manager.shutdown_kernel(now=True)


def execute_fresh(notebook: nbformat.NotebookNode, kernel: KernelManager, env: dict[str, str | None]) -> None:
    """Runs the notebook top to bottom in the kernel as if it were new to it (imported modules stay)."""
    setup = ["%reset -f", "import os", *(f"os.environ[{k!r}] = {v!r}" if v is not None
                                         else f"os.environ.pop({k!r}, None)" for k, v in env.items()),
             f"os.chdir({str(REPO / 'analysis')!r})", "del os"]
    notebook.cells.insert(0, nbformat.v4.new_code_cell("\n".join(setup)))
    NotebookClient(notebook, km=kernel, timeout=600).execute()


@pytest.mark.default_target
# a notebook that reads a shared sweep runs on the worker of the other tests of that sweep, never waiting for another's
@pytest.mark.parametrize("name", [*(pytest.param(name, marks=pytest.mark.xdist_group(fixture))
                                    for name, fixture in SHARED_SWEEPS.items()), *SMOKE_SWEEPS, "distill_ablation"])
def test_notebook_executes_on_a_smoke_sweep(name, tmp_path, kernel, request):
    sweep = tmp_path / name
    if name in SHARED_SWEEPS:
        sweep, out = request.getfixturevalue(SHARED_SWEEPS[name])
        assert out.returncode == 0, out.stderr[-3000:]
    if name == "pairing":
        # the command draws the matrix too
        run("specexp.figures", str(sweep), "--out", str(tmp_path / "command_figures"))
        assert (tmp_path / "command_figures" / "pairing_matrix.pdf").exists()
    elif name == "distill_ablation":
        run("specexp.distill", "experiment=distill_ablation", f"hydra.sweep.dir={sweep}",
            f"data.cache_dir={tmp_path}/cache",
            "data.corpus.prompt_limit=4", "data.corpus.prompt_tokens=12", "data.corpus.generation_tokens=16",
            "data.block_size=32", "draft_vocab_size=512", "trainer.max_steps=4", "trainer.val_check_interval=2",
            "objective=forward_kl,tvd", "on_policy.ratio=0.0", "student=tiny")
    elif name not in SHARED_SWEEPS:
        run("specexp", *SMOKE_SWEEPS[name], f"hydra.sweep.dir={sweep}")
    notebook = nbformat.read(REPO / "analysis" / f"{name}.ipynb", as_version=4)
    execute_fresh(notebook, kernel, {"SPECEXP_SWEEP": str(sweep), "SPECEXP_FIGURES": str(tmp_path / "figures"),
                                     "SPECEXP_WANDB_PROJECT": None})
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert list((tmp_path / "figures").glob("*.pdf"))  # the notebook saved its figures
    check_figures_on_real_results(name, sweep)


def check_figures_on_real_results(name: str, sweep: Path) -> None:
    """The plotting functions on this real sweep draw the series its factors call for."""
    from specexp.reporting import figure_tables as tables
    from specexp.reporting import plots

    if name == "distill_ablation":
        ax = plots.distillation_curves(tables.distillation_history([sweep])).axes[0]
        assert {t.get_text() for t in ax.get_legend().get_texts()} == {"forward_kl", "tvd"}
        return
    jobs = tables.study_jobs([sweep])
    if name == "pairing":  # 2 targets x 2 drafts, one pair skipped: 3 cells (alpha: where a job drafted)
        fig = plots.pairing_matrix(jobs)
        cells = [sum(bool(t.get_text()) for t in ax.texts) for ax in fig.axes[:2]]
        assert len(jobs) == 3 and cells == [3, int(jobs["alpha"].notna().sum())]
        return
    if name in ("temperature_sweep", "batch_sweep"):
        factor = "temperature" if name == "temperature_sweep" else "batch_size"
        fig = plots.effect_of(jobs, factor, factor)
        xs = {float(x) for ax in fig.axes for line in ax.lines for x in line.get_xdata()}
        assert xs == ({0.0, 0.7} if name == "temperature_sweep" else {1.0, 2.0})
    elif name in ("draft_compare", "prompt_sets"):
        ax = plots.category_heatmap(jobs, "tau").axes[0]
        categories = [c for c in jobs.columns if c.startswith("tau.")]
        annotated = jobs.groupby("draft")[categories].mean().notna().to_numpy().sum()
        assert len(ax.texts) == annotated > 0
